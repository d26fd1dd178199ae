"""Mixture-of-experts token routing over ``all_to_all_single`` on the ftcomm backend: each rank
holds some of the experts, sends each of its tokens to the rank that holds the expert its router
chose (uneven split sizes), gets the expert outputs back by a second all-to-all, and checks them
against every expert applied locally. A rank lost in a step: the survivors re-assign the experts
over fewer ranks and run the step again.

    ftcomm-run -n 4 python examples/moe_all_to_all.py
    ftcomm-run -n 4 python examples/moe_all_to_all.py --kill 2@5    # world rank 2 dies in step 5

A step, on every rank: route the rank's tokens (router: argmax of a fixed linear gate); exchange
the split sizes (``all_to_all_single`` of one int64 per rank); send the tokens, sorted by
destination (``all_to_all_single`` with those splits); apply the experts this rank holds; send
the outputs back the same way, reversed. Every rank holds every expert's weights (seeded alike),
so it can check its own tokens' outputs against all experts applied locally: the largest
difference is printed and must be at float rounding. An all-to-all in which a rank dies raises
``ProcFailedError`` on every survivor, on a group already rebuilt over them: expert e is then held
by rank e mod the new world size, and the step is run again.
"""
import os
import signal

from cli import Parser, kill_spec  # examples/cli.py


def parse_args():
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--kill", type=kill_spec, metavar="RANK@STEP",
                        help="demo only: SIGKILL world rank RANK before the token all-to-all of step STEP (from 1)")
    return parser.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ftcomm  # noqa: E402
import ftcomm.torch  # noqa: E402,F401  (registers "ftcomm")


def exchange(rows: torch.Tensor, send_counts: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Sends ``rows[...]`` to each rank by ``send_counts`` (rows sorted by destination); returns
    the rows received, in source order, and how many came from each rank."""
    n = dist.get_world_size()
    recv_counts = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, torch.tensor(send_counts, dtype=torch.int64))
    received = torch.empty(int(recv_counts.sum()), rows.shape[1])
    dist.all_to_all_single(received, rows, output_split_sizes=recv_counts.tolist(), input_split_sizes=send_counts)
    return received, recv_counts.tolist()


def moe_step(tokens: torch.Tensor, gate: torch.Tensor, experts: torch.Tensor, step: int) -> torch.Tensor:
    """Each token through its chosen expert, the experts spread over the ranks."""
    n = dist.get_world_size()
    choice = (tokens @ gate).argmax(1)                 # the router: expert per token
    holder = choice % n                                # the rank that holds that expert
    order = torch.argsort(holder, stable=True)
    send_counts = torch.bincount(holder, minlength=n).tolist()
    if ARGS.kill == (dist.group.WORLD.comm.world_rank, step):  # demo only
        os.kill(os.getpid(), signal.SIGKILL)
    # the tokens and, as one more column, the expert each one chose
    rows = torch.cat([tokens[order], choice[order, None].float()], dim=1)
    arrived, recv_counts = exchange(rows, send_counts)
    chosen = arrived[:, -1].long()
    outputs = torch.einsum("td,tdk->tk", arrived[:, :-1], experts[chosen])
    back, _ = exchange(outputs, recv_counts)
    result = torch.empty_like(back)
    result[order] = back
    return result


def main() -> None:
    dist.init_process_group("ftcomm")
    torch.manual_seed(0)  # the same gate and experts on every rank
    gate = torch.randn(ARGS.dim, ARGS.experts)
    experts = torch.randn(ARGS.experts, ARGS.dim, ARGS.dim) / ARGS.dim ** 0.5
    me = dist.group.WORLD.comm.world_rank
    step, restarts, worst = 1, 0, 0.0
    while step <= ARGS.steps:
        tokens = torch.randn(ARGS.tokens, ARGS.dim, generator=torch.Generator().manual_seed(1000 * step + me))
        try:
            out = moe_step(tokens, gate, experts, step)
        except ftcomm.FtError as exc:
            restarts += 1
            if dist.get_rank() == 0:
                print(f"step {step}: {type(exc).__name__}; running it again over {dist.get_world_size()} ranks "
                      f"(expert e now on rank e mod {dist.get_world_size()})", flush=True)
            continue
        reference = torch.einsum("td,tdk->tk", tokens, experts[(tokens @ gate).argmax(1)])
        worst = max(worst, (out - reference).abs().max().item())
        step += 1
    if dist.get_rank() == 0:
        print(f"{ARGS.steps} steps of {ARGS.tokens} tokens per rank over {dist.get_world_size()} ranks, "
              f"{restarts} step(s) run again; largest difference from the local reference: {worst:.2e}", flush=True)
    if worst > 1e-4:
        raise SystemExit(f"world rank {me}: expert outputs differ from the local reference by {worst:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
