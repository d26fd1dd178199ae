"""ftcomm-check: does this install work? A 4-rank job under ftcomm-run, in seconds, that tries
what a user relies on and says, check by check, what works:

- the MPI and whether it runs with ULFM (``ftcomm.ulfm_status()``);
- an allreduce against numpy;
- bad input (one rank's buffer of another length): ``InvalidInputError`` on every rank, naming it;
- the torch backend (``init_process_group("ftcomm")``, an ``all_reduce`` against numpy), when
  torch is installed;
- recovery: a rank SIGKILLed inside an allreduce; the survivors shrink and redo it, exactly;
- fencing: a rank SIGSTOPped inside an allreduce; the survivors fence it within FTCOMM_TIMEOUT
  (5 s here) and go on without it;
- the CUDA build (``ftcomm.cuda_status()``), said as it is (a GPU is not needed).

    ftcomm-check            # exit status 0: everything needed works; 1: something does not

Each rank writes what it saw to a JSON file; this process reads them and prints the verdicts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import settings

RANKS = 4
KILLED, STOPPED, BAD = 3, 2, 1  # world ranks: killed in check "recovery", stopped in "fencing"
ELEMENTS = 1 << 16


def _expected(members) -> "np.ndarray":
    import numpy as np

    return sum(np.arange(ELEMENTS, dtype=np.float64) % 97 * (w + 1) for w in members)


def _contribution(world_rank: int):
    import numpy as np

    return (np.arange(ELEMENTS, dtype=np.float64) % 97 * (world_rank + 1))


def _allreduce_until_done(comm, what: str, out: dict):
    """The allreduce, recovering after a rank failure as a training loop would; records what the
    first failure was. Returns the communicator it completed on."""
    import numpy as np

    from .errors import ProcFailedError

    while True:
        buf = _contribution(comm.world_rank)
        try:
            comm.allreduce(buf)
        except ProcFailedError as error:
            out.setdefault(what + "_error", f"{type(error).__name__}: {error}")
            comm = comm.recover()
            continue
        out[what + "_members"] = list(comm.world_ranks)
        out[what + "_exact"] = bool(np.array_equal(buf, _expected(comm.world_ranks)))
        return comm


def _torch_backend(out: dict) -> None:
    try:
        import torch
        import torch.distributed as dist

        from . import torch as _backend  # noqa: F401  (registers the "ftcomm" backend)
    except ImportError as error:
        out["torch"] = f"not installed ({error})"
        return
    dist.init_process_group("ftcomm")
    tensor = torch.from_numpy(_contribution(dist.get_rank()))
    dist.all_reduce(tensor)
    out["torch"] = f"torch {torch.__version__}"
    out["torch_exact"] = bool(torch.equal(tensor, torch.from_numpy(_expected(range(dist.get_world_size())))))
    dist.destroy_process_group()


def worker(out_dir: str) -> None:
    """One rank's checks, written to ``out_dir/rank<world rank>.json`` as they complete."""
    import numpy as np

    from .core import cuda, fault
    from .core.communicator import Communicator
    from .core.runtime import ulfm_status
    from .errors import InvalidInputError

    comm = Communicator()
    me = comm.world_rank
    out = {"world_rank": me, "ulfm": ulfm_status(), "ft": bool(comm.ft_enabled),
           "cuda": ("CUDA code compiled in" if cuda.cuda_compiled_in() else "built without CUDA (no nvcc)")
           + f"; {cuda.cuda_status()}"}
    path = Path(out_dir) / f"rank{me}.json"

    def save():
        path.write_text(json.dumps(out))

    comm = _allreduce_until_done(comm, "allreduce", out)
    save()
    try:
        comm.allreduce(np.zeros(ELEMENTS + (7 if me == BAD else 0)))
        out["bad_input"] = "no error"
    except InvalidInputError as error:
        out["bad_input"] = f"{type(error).__name__}: {error}"
    save()
    _torch_backend(out)
    save()
    if not comm.ft_enabled:
        return  # a failure would end the job: said by the driver
    fault.inject("allgather", rank=KILLED, kind="kill")
    comm = _allreduce_until_done(comm, "recovery", out)
    fault.clear()
    save()
    fault.inject("allgather", rank=STOPPED, kind="stop")
    comm = _allreduce_until_done(comm, "fencing", out)
    fault.clear()
    save()


def _verdicts(results: dict) -> list[tuple[str, bool | None, str]]:
    """(check, True / False / None for "said only", what was seen), from the ranks' results."""
    head = results.get(0, {})
    every = [results.get(w, {}) for w in range(RANKS)]
    out = [("MPI", head.get("ft"), head.get("ulfm", "rank 0 reported nothing"))]
    exact = all(r.get("allreduce_exact") for r in every)
    out.append(("allreduce", exact, f"a sum of {ELEMENTS} float64 at {RANKS} ranks "
                + ("equals numpy's on every rank" if exact else "differs from numpy's, or a rank did not finish")))
    raised = [r.get("bad_input", "") for r in every]
    named = all(s.startswith("InvalidInputError") and f"world rank {BAD}" in s for s in raised)
    out.append(("bad input", named, f"a buffer of another length on world rank {BAD}: "
                + ("InvalidInputError naming it on every rank" if named else f"seen: {raised}")))
    torch = head.get("torch", "")
    if "not installed" in torch:
        out.append(("torch backend", None, torch))
    else:
        ok = all(r.get("torch_exact") for r in every)
        out.append(("torch backend", ok, f"{torch}: all_reduce over the \"ftcomm\" group "
                    + ("equals numpy's" if ok else "wrong, or a rank did not finish")))
    if not head.get("ft"):
        out += [("recovery", False, "not tried: this MPI cannot survive a rank failure (see MPI above)"),
                ("fencing", False, "not tried: this MPI cannot survive a rank failure")]
    else:
        for check, victim, how, gone in (("recovery", KILLED, "SIGKILLed", {KILLED}),
                                         ("fencing", STOPPED, "SIGSTOPped", {KILLED, STOPPED})):
            left = [r for w, r in enumerate(every) if w not in gone]
            ok = all(r.get(check + "_exact") and victim not in r.get(check + "_members", [victim]) for r in left)
            error = next((r.get(check + "_error") for r in left if r.get(check + "_error")), "no error seen")
            out.append((check, ok, f"world rank {victim} {how} inside an allreduce: "
                        + (f"the survivors went on without it, exactly ({error.split(':')[0]}"
                           + (", fenced" if "fenced" in error else "") + ")" if ok else f"failed ({error})")))
    out.append(("CUDA build", None, head.get("cuda", "rank 0 reported nothing")))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ftcomm-check", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=180, help="seconds the whole job may take (default 180)")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    with tempfile.TemporaryDirectory(prefix="ftcomm-check-") as out_dir:
        cmd = [sys.executable, "-m", "ftcomm.launch.run", "-n", str(RANKS), "--timeout", str(args.timeout),
               sys.executable, "-m", "ftcomm.selfcheck", "--worker", out_dir]
        env = {**os.environ, settings.TIMEOUT.name: "5"}  # the stopped rank is fenced within 5 s
        started = time.monotonic()
        job = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        results = {}
        for path in Path(out_dir).glob("rank*.json"):
            result = json.loads(path.read_text())
            results[result["world_rank"]] = result
    verdicts = _verdicts(results)
    print(f"ftcomm-check: {RANKS} ranks under ftcomm-run, {seconds:.1f} s, exit status {job.returncode}")
    for check, ok, seen in verdicts:
        print(f"  {'ok  ' if ok else 'info' if ok is None else 'FAIL'}  {check:<14} {seen}")
    failed = [check for check, ok, _ in verdicts if ok is False]
    if failed or job.returncode != 0:
        print(f"ftcomm-check: not working: {', '.join(failed) or 'the job'}; the job's last output:\n"
              + (job.stdout + job.stderr)[-3000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
