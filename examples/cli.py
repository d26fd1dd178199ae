"""Command-line parsing for the examples, run before torch and MPI load.

Every rank of a job parses the same command line, so a typo would print its usage once per
rank, and only after the imports (half a minute on a busy machine). The examples therefore parse
first, with this parser:

- abbreviations are refused (``--kil 2@30`` is an error, not ``--kill``);
- the usage, the help and errors are printed by world rank 0 only (the launcher's rank
  variable; a process started without a launcher is rank 0), and every rank exits with status 2
  on an error, as argparse does.
"""
from __future__ import annotations

import argparse
import os
import sys

# Where each launcher puts the process's world rank (Open MPI / PRRTE, PMIx, MPICH's Hydra).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def launched_rank() -> int:
    """This process's world rank as its launcher set it; 0 without a launcher."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations, whose messages rank 0 alone prints."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def _print_message(self, message, file=None):
        if launched_rank() == 0:
            super()._print_message(message, file)


def kill_spec(text: str) -> tuple[int, int]:
    """--kill RANK@STEP, as (rank, step)."""
    rank, sep, step = text.partition("@")
    if not sep:
        raise argparse.ArgumentTypeError("expected RANK@STEP, for example 2@30")
    return int(rank), int(step)


def every(text: str):
    """--checkpoint-every: a number of steps, or "auto"."""
    return text if text == "auto" else int(text)


def add_device_argument(parser: argparse.ArgumentParser, on_cuda: str) -> None:
    """--device cpu|cuda; ``on_cuda`` says what moves to the GPU beyond the model."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help=f"cuda: each rank on GPU LOCAL_RANK mod the GPUs it sees; {on_cuda}")


def training_device(choice: str, script: str):
    """The torch device this rank trains on for ``--device choice``: the CPU, or the GPU LOCAL_RANK
    modulo the GPUs torch sees, made current. Where torch sees none, world rank 0 says so and
    every rank exits with status 2. Call it before ``init_process_group``."""
    import torch

    if choice != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if launched_rank() == 0:  # one message for the whole job
            print(f"{script}: --device cuda needs a CUDA device, and torch {torch.__version__} sees none",
                  file=sys.stderr, flush=True)
        sys.exit(2)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())
