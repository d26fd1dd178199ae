"""Goodput: what failures cost a run, measured from its logs and modelled at cluster scale.

``ftcomm-report`` reads a run's JSON-lines event logs (``logs``), sums them up (``summary``) and
draws the recovery timeline (``timeline``). ``ftcomm-goodput`` models a long training run on up
to 100,000 ranks: the inputs (``inputs``: cluster, costs measured by benchmarks/mttr.py or
``ftcomm-report``, policy), closed forms (``model``) and a Monte Carlo simulation
(``montecarlo``) for ftcomm with shrink, with spares and with its disk fallback, against
checkpoint-restart at the Young/Daly interval and an idealized torchft-style replica-group
recovery. docs/GOODPUT.md describes the model.
"""
