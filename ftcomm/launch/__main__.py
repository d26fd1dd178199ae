"""``python -m ftcomm.launch ...`` is ``ftcomm-run ...``."""
import sys

from .run import main

sys.exit(main())
