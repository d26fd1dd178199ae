"""State checks of a training loop: ``divergence.py`` (the ranks' model and optimizer states
compared by fingerprint) and ``grad_outliers.py`` (a rank's gradient norm far from the others').
Calls ``group`` and ``zero`` in ``ftcomm.torch``.
"""
