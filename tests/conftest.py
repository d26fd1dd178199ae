import sys
from pathlib import Path

# Job scripts and tests import the harness as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
