"""Pipeline parallelism over send/recv on the ftcomm backend: the layers of an MLP split into one
stage per rank, GPipe's schedule (every micro-batch forward, then every one backward), and a rank
lost mid-step: the survivors re-split the layers over fewer stages and run the step again.

    ftcomm-run -n 3 python examples/pipeline_train.py                 # 3 stages
    ftcomm-run -n 3 python examples/pipeline_train.py --kill 1@40     # stage 1 dies in step 40

A step:

1. forward: stage s receives each micro-batch's activations from stage s-1 (``dist.recv``), runs
   its layers and sends the result to stage s+1 (``dist.send``); the last stage computes the loss;
2. backward, in reverse micro-batch order: the gradient of each activation goes back the same way;
3. commit: each stage's SGD update, then an ``all_gather_object`` of every stage's layers, so that
   every rank holds the whole model as of the last committed step (the in-memory copy a
   re-split rebuilds from; the model here is 0.1 MB).

A send or receive whose peer died raises ``ProcFailedError`` on that rank (point-to-point is
local); that rank revokes the group's communicator, so that every rank still waiting in the
step fails at once (``RevokedError``) rather than at its deadline. The step's last collective
then raises on every survivor, on a group already rebuilt over them; each survivor restores the
committed model, takes its share of the layers for the new number of stages, and runs the same
step again. Prints the loss every 20 steps and, on rank 0, ``test accuracy: A``; --result-json
writes the final numbers.
"""
import json
import os
import signal
import time

from cli import Parser, kill_spec  # examples/cli.py


def parse_args():
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4, help="hidden layers of 64 units, split over the stages")
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--kill", type=kill_spec, metavar="RANK@STEP",
                        help="demo only: SIGKILL world rank RANK in the forward pass of step STEP (from 1)")
    parser.add_argument("--result-json", help="write the final numbers here (rank 0)")
    return parser.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import ftcomm  # noqa: E402
import ftcomm.torch  # noqa: E402,F401  (registers "ftcomm")

WIDTH = 64


def build_model(hidden_layers: int) -> nn.Sequential:
    """The whole model, the same on every rank (seeded): 64 -> hidden_layers x (64, ReLU) -> 10."""
    torch.manual_seed(0)
    layers = []
    for _ in range(hidden_layers):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def stage_slice(n_modules: int, stage: int, stages: int) -> slice:
    """The modules of ``stage`` out of ``stages``: contiguous, as even as they split."""
    bounds = [round(i * n_modules / stages) for i in range(stages + 1)]
    return slice(bounds[stage], bounds[stage + 1])


def run_step(stage_modules: nn.Sequential, xb, yb, micro_batches: int, step: int) -> float:
    """One pipelined forward and backward (GPipe's schedule); the last stage's mean loss, else 0.
    Raises what a send or receive raised."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == stages - 1
    inputs, outputs, losses = [], [], []
    for m, (x, y) in enumerate(zip(xb.chunk(micro_batches), yb.chunk(micro_batches))):
        if not first:
            x = torch.empty(len(x), WIDTH)
            dist.recv(x, rank - 1, tag=m)
        if ARGS.kill == (dist.group.WORLD.comm.world_rank, step) and m == min(1, micro_batches - 1):  # demo only
            os.kill(os.getpid(), signal.SIGKILL)
        x.requires_grad_(not first)
        out = stage_modules(x)
        inputs.append(x)
        if last:
            losses.append(nn.functional.cross_entropy(out, y) / micro_batches)
        else:
            dist.send(out.detach(), rank + 1, tag=m)
        outputs.append(out)
    for m in reversed(range(len(outputs))):
        if last:
            losses[m].backward()
        else:
            grad = torch.empty_like(outputs[m])
            dist.recv(grad, rank + 1, tag=1000 + m)
            outputs[m].backward(grad)
        if not first:
            dist.send(inputs[m].grad, rank - 1, tag=1000 + m)
    return float(sum(loss.item() for loss in losses))


def commit(model: nn.Sequential, part: slice) -> None:
    """Every stage's layers to every rank: the whole model as of this step, on every rank."""
    mine = {name: t.detach().clone() for name, t in model[part].state_dict().items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (part.start, part.stop, mine))
    for start, stop, state in gathered:
        model[start:stop].load_state_dict(state)


def main() -> None:
    dist.init_process_group("ftcomm")
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    xtr, xte, ytr, yte = train_test_split(x, torch.tensor(y), test_size=0.25, random_state=0)
    model = build_model(ARGS.layers)
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    step, restarts, start = 1, [], time.perf_counter()
    while step <= ARGS.steps:
        if step == 1 or restarts and restarts[-1]["step"] == step:
            part = stage_slice(len(model), dist.get_rank(), dist.get_world_size())
            optimizer = torch.optim.SGD(model[part].parameters(), lr=ARGS.lr)
        batch = torch.randint(len(xtr), (ARGS.batch_size,), generator=torch.Generator().manual_seed(step))
        try:
            loss = run_step(model[part], xtr[batch], ytr[batch], ARGS.micro_batches, step)
            optimizer.step()
            optimizer.zero_grad()
        except ftcomm.FtError:
            loss = None
            dist.group.WORLD.comm.revoke()  # the others' pending sends and receives fail at once
        try:  # a collective on every rank: every survivor raises here if the step failed anywhere
            if loss is None:
                dist.barrier()  # joins the recovery (it raises on the revoked communicator)
            else:
                commit(model, part)
        except ftcomm.FtError as exc:
            model.load_state_dict(committed)  # the step's partial updates are dropped
            optimizer.zero_grad()
            restarts.append({"step": step, "error": type(exc).__name__, "stages": dist.get_world_size()})
            if dist.get_rank() == 0:
                print(f"step {step}: {type(exc).__name__}; restarting it on {dist.get_world_size()} stages",
                      flush=True)
            continue
        committed = {k: v.clone() for k, v in model.state_dict().items()}
        if step % 20 == 0 and dist.get_rank() == dist.get_world_size() - 1:
            print(f"step {step:4d}  stages {dist.get_world_size()}  loss {loss:.4f}", flush=True)
        step += 1
    with torch.no_grad():
        accuracy = (model(xte).argmax(1) == yte).float().mean().item()
    if dist.get_rank() == 0:
        print(f"test accuracy: {accuracy:.4f} after {ARGS.steps} steps, {time.perf_counter() - start:.1f} s, "
              f"{dist.get_world_size()} stages, {len(restarts)} step restart(s)", flush=True)
        if ARGS.result_json:
            with open(ARGS.result_json, "w") as f:
                json.dump({"accuracy": accuracy, "stages": dist.get_world_size(), "restarts": restarts}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
