"""The model's prediction for one run with a known number of failures (``ftcomm-goodput
predict``), to hold against what ``ftcomm-report`` measured in that run."""
from __future__ import annotations

from .inputs import Costs


def predict_run(costs: Costs, world_size: int, steps: int, failures: int, policy: str = "spares",
                k: int = 1, ranks_per_failure: int = 1) -> dict:
    """Goodput of a run of ``steps`` steps at ``world_size`` ranks with ``failures`` failures, by
    the model's accounting (docs/GOODPUT.md): wall = the steps at their step time + one
    in-memory recovery stall (``Costs.memory_stall_s``) per failure; ideal = the steps at the
    first world size without replication (k x ``replication_share`` of a step). With
    ``policy="shrink"`` each failure removes ``ranks_per_failure`` ranks and the steps after it
    take step_s x world_size / ranks left (strong scaling; the failures evenly spread over the
    run); with ``"spares"`` the world size stays.

    Returns:
        dict: ``goodput``, ``wall_s``, ``ideal_s``, ``steps_s``, ``failures_s`` (seconds).

    Raises:
        ValueError: a policy other than shrink or spares, negative counts, or a shrink below one
            rank.
    """
    if policy not in ("shrink", "spares"):
        raise ValueError(f"policy must be shrink or spares, not {policy!r}")
    if steps < 1 or failures < 0 or world_size < 1:
        raise ValueError("steps and world_size must be >= 1, failures >= 0")
    t = costs.step_s
    if policy == "spares":
        steps_s = steps * t
    else:
        if world_size - failures * ranks_per_failure < 1:
            raise ValueError(f"{failures} failures of {ranks_per_failure} rank(s) leave no rank of {world_size}")
        edges = [round(steps * j / (failures + 1)) for j in range(failures + 2)]
        steps_s = sum((edges[j + 1] - edges[j]) * t * world_size / (world_size - j * ranks_per_failure)
                      for j in range(failures + 1))
    failures_s = failures * costs.memory_stall_s(spares=policy == "spares")
    ideal = steps * t * (1 - k * costs.replication_share)
    wall = steps_s + failures_s
    return {"goodput": ideal / wall, "wall_s": wall, "ideal_s": ideal, "steps_s": steps_s, "failures_s": failures_s,
            "stall_per_failure_s": costs.memory_stall_s(spares=policy == "spares")}
