"""What ``ftcomm-run --restarts`` makes of a launch that ended: was its end abnormal, and if so,
would a relaunch only fail the same way? Pure functions of what the launch left behind: the
launcher's exit status, the ranks' exit reports (``reports``), their ``committed-rank*`` files
and the hosts that lost their daemon (``sessions``).
"""
from __future__ import annotations

# ftcomm-run's exit status when it does not relaunch a failed job because the failure would
# only repeat (the program's own error on every rank, or no committed step). Like sysexits.h's
# EX_SOFTWARE: an error of the program, not of the machines.
WOULD_REPEAT = 70


def finished_normally(report: dict) -> bool:
    """True when the rank's exit report says it ended by itself with status 0."""
    return not report.get("uncaught_exception") and report.get("exit_status", 0) == 0


def abnormal_end(status: int, reports: list[dict]) -> str | None:
    """Why a launch ended abnormally, in words (e.g. "launcher status 1"), or None when it did not.
    Abnormal: no rank finished normally (with the launcher's status 0 too: mpirun of Open MPI
    5.0.x ends so after losing a host's daemon), or the launcher's status is not 0. Not
    abnormal: ranks that finished normally after recovering from lost ranks in the job (ULFM),
    whatever the launcher's status (a rank that ended by an exception may make it 1). A
    ``--timeout`` expiry is the caller's to handle (final, never relaunched)."""
    finished = [r for r in reports if finished_normally(r)]
    if not finished:
        launcher = f"launcher status {status}"
        return f"{launcher} but no rank finished" if status == 0 else f"{launcher}, no rank finished"
    if status != 0 and not any(r.get("lost") for r in finished):
        return f"launcher status {status}"
    return None


def program_error(reports: list[dict]) -> str | None:
    """The program's own error, in words, when every rank that wrote an exit report ended by an
    uncaught exception or by one and the same non-zero exit status (argparse's 2 on bad
    arguments); None otherwise, when no rank reported (ranks killed from outside), or when a
    rank's exception reports a failure (``"failure"``: ftcomm's ProcFailedError, StateLostError,
    a timeout; a relaunch resumes from the newest checkpoint)."""
    if not reports or any(r.get("failure") for r in reports):
        return None
    raised = sorted(r["world_rank"] for r in reports if r.get("uncaught_exception"))
    exited = sorted(r["world_rank"] for r in reports if not r.get("uncaught_exception"))
    statuses = {r.get("exit_status", 0) for r in reports if not r.get("uncaught_exception")}
    if 0 in statuses or len(statuses) > 1:
        return None
    parts = []
    if raised:
        parts.append(f"an uncaught exception on world rank(s) {raised}")
    if exited:
        parts.append(f"exit status {statuses.pop()} on world rank(s) {exited}")
    return "the program's own error: " + " and ".join(parts)


def repeat_reason(reports: list[dict], committed: bool, lost: set[str]) -> str | None:
    """Why a relaunch of an abnormally ended launch would only fail the same way, in words, or
    None when it may succeed. A launch that lost a host may: the next one runs without it.
    Otherwise a relaunch would fail the same way when the program failed on its own
    (``program_error``), or when the launch failed before its first committed step
    (``committed`` False: no ``committed-rank*`` file): it would start from the same state."""
    if lost:
        return None
    own = program_error(reports)
    if own:
        return own
    if not committed:
        return "the job failed before its first committed step"
    return None


def backoff(relaunch: int, first_s: float, cap_s: float) -> float:
    """Seconds to wait before relaunch number ``relaunch`` (1, 2, ...): ``first_s``, doubling each
    time, at most ``cap_s``."""
    return min(first_s * 2 ** (relaunch - 1), cap_s)
