"""A small harness for fault tests: start a whole ftcomm-run job with a hard timeout, let the
injected fault kill a rank, and collect what each surviving rank reported.

No pytest MPI plugin can pass a test in which a rank is meant to die, so fault tests run their
job as a subprocess. A job script reports with ``report(**values)`` (one JSON line per call on
stdout, tagged with the world rank); the test reads ``JobResult.reports``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs"
# Where a DDP gradient bucket meets an FTCOMM_FAULT on each torch data plane: ftcomm's ring (its
# reduce-scatter) or an inner gloo group under ftcomm's control plane (FTCOMM_DATA_PLANE=gloo).
BUCKET_POINT = {"ring": "reduce_scatter", "gloo": "data_plane"}
_TAG = "FTCOMM-REPORT "
# A report longer than this goes out in parts, each line written whole by one write(): MPICH's
# mpiexec interleaves the ranks' output at the size of a pipe write, not at lines (a line over
# 4 KiB, or print()'s text and newline written apart, can be cut by another rank's output).
_PART_TAG = "FTCOMM-REPORT-PART "
_PART_CHARS = 3000
_TORCH_RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def report(**values) -> None:
    """Called inside a job: writes one tagged JSON line at once (a kill may follow), or, when it is
    long, numbered part lines that ``parse_reports`` puts together."""
    from mpi4py import MPI

    values.setdefault("world_rank", MPI.COMM_WORLD.Get_rank())
    text = json.dumps(values)  # ASCII: characters are bytes
    if len(text) <= _PART_CHARS:
        lines = [_TAG + text]
    else:
        pieces = [text[i:i + _PART_CHARS] for i in range(0, len(text), _PART_CHARS)]
        lines = [f"{_PART_TAG}{values['world_rank']} {k} {len(pieces)} {piece}" for k, piece in enumerate(pieces)]
    sys.stdout.flush()  # what the job printed before comes first
    for line in lines:
        os.write(sys.stdout.fileno(), (line + "\n").encode())


def parse_reports(stdout: str) -> list[dict]:
    """The reports in a job's stdout, in the order they were completed (``report``)."""
    reports, parts = [], {}
    for line in stdout.splitlines():
        if line.startswith(_TAG):
            reports.append(json.loads(line[len(_TAG):]))
        elif line.startswith(_PART_TAG):
            rank, k, n, piece = line[len(_PART_TAG):].split(" ", 3)
            parts.setdefault(rank, []).append(piece)
            if int(k) == int(n) - 1:
                reports.append(json.loads("".join(parts.pop(rank))))
    return reports


def cross_entropy_backward(model, opt, x, y, batch) -> float:
    """Called inside a training job: the body of its ``train_step`` for ftcomm.elastic.run, the
    cross-entropy of this rank's samples summed and divided by the global batch size (the
    driver's convention), gradients zeroed then computed. Returns the loss (a float)."""
    import torch

    idx = torch.from_numpy(batch.indices)
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum") / batch.global_size
    opt.zero_grad()
    loss.backward()
    return loss.item()


def ddp_toy_data(samples: int, batch: int, drop_last: bool = False):
    """Called inside a torch job: the two DDP jobs' data, the same on every rank (seeded): X
    (samples x 16 float32), Y (4 classes, a linear rule), and a DataLoader of (x, y, sample id)
    with a shuffling DistributedSampler (seed 3) and ``batch`` samples per rank (``drop_last``:
    the DataLoader's). Returns (X, Y, sampler, loader)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(samples, 16)
    y = (x @ torch.randn(16, 4)).argmax(1)
    dataset = TensorDataset(x, y, torch.arange(samples))
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    return x, y, sampler, DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last)


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    reports: list = field(default_factory=list)
    wall_s: float = 0.0  # seconds from the launch to the launcher's end

    def by_rank(self, **match) -> dict:
        """Last report of each world rank whose fields equal ``match``."""
        out = {}
        for r in self.reports:
            if all(r.get(k) == v for k, v in match.items()):
                out[r["world_rank"]] = r
        return out

    def survivors_of_a_fencing(self, fenced: int, n: int) -> dict:
        """The final reports (``kind="final"``) of an n-rank DDP job in which world rank ``fenced``
        fenced itself: asserts that the job ended well, said so, and every other rank reported at
        world size n - 1."""
        assert self.returncode == 0, self.describe()
        finals = self.by_rank(kind="final")
        assert sorted(finals) == [r for r in range(n) if r != fenced], self.describe()
        assert f"world rank {fenced} fences itself" in self.stderr
        assert all(rep["size"] == n - 1 for rep in finals.values())
        return finals

    def fenced_at(self, world_rank: int) -> list[str]:
        """The calls whose deadline fenced ``world_rank``, as the fencing peers named them on stderr
        ("allreduce step 6" from "...: did not arrive in allreduce step 6 by its deadline: ...")."""
        said = re.findall(rf"ftcomm: fencing world rank {world_rank} \(pid \d+\): did not arrive in (.+?) by its deadline",
                          self.stderr)
        return sorted(set(said))

    def describe(self) -> str:
        return f"rc={self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"


def job_environment(env: dict | None = None) -> dict:
    """This process's environment plus ``env``, without torch's rendezvous variables: set in this
    (pytest) process by a one-process test that imported ftcomm.torch, they must not leak into a
    multi-rank job (every rank would take RANK 0 and the same MASTER_PORT): each job agrees on
    its own."""
    full_env = {k: v for k, v in os.environ.items() if k not in _TORCH_RENDEZVOUS_ENV}
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    return full_env


PRRTE_NOT_STARTED = ("A daemon failed to report back after being spawned",
                     "The PMIx server's listener thread failed to start")


def run_job(script, n: int, *args, env: dict | None = None, timeout: float = 120.0,
            launcher_args=()) -> JobResult:
    """Runs ``ftcomm-run -n N python script args...`` with a hard timeout (the launcher kills
    the whole job and exits 124 when it expires; the subprocess timeout is a second fence)."""
    full_env = job_environment(env)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), full_env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(n), "--timeout", str(timeout), *launcher_args,
           sys.executable, str(script), *map(str, args)]
    for attempt in (1, 2):
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout + 30,
                              stdin=subprocess.DEVNULL)
        wall_s = time.monotonic() - start
        reports = parse_reports(proc.stdout)
        # PRRTE itself did not start (exit 213: a made-up node's daemon never reported back, seen in
        # CI right after a job whose node was crashed on purpose; its PMIx listener thread did not
        # start, seen under load): nothing of the job ran; launch it once more
        said = next((m for m in PRRTE_NOT_STARTED if m in proc.stdout + proc.stderr), None)
        if attempt == 1 and proc.returncode != 0 and not reports and said:
            print(f"harness: PRRTE did not start ({said!r}): launching again", file=sys.stderr)
            continue
        return JobResult(proc.returncode, proc.stdout, proc.stderr, reports, wall_s)


def live_processes():
    """(pid, command line, environment) of every running process but this one and zombies, as
    ``/proc`` shows them (NUL-separated bytes); processes that end meanwhile are left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            yield int(entry.name), (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
        except (OSError, IndexError):
            continue
