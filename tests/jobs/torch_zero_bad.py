"""Job (3 ranks): bad input to ftcomm.torch.ZeroRedundancyOptimizer. Each case reports, per rank,
the error raised (type and text); the job then trains one step to show the group still works."""
import torch
import torch.distributed as dist
import torch.nn as nn

import ftcomm.torch
from harness import report

dist.init_process_group("ftcomm")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 2)


def case(name, make):
    try:
        make()
    except Exception as exc:  # noqa: BLE001 - the job reports whatever was raised
        report(kind="case", case=name, error=type(exc).__name__, text=str(exc))
    else:
        report(kind="case", case=name, error=None, text="")


Zero = ftcomm.torch.ZeroRedundancyOptimizer
case("lbfgs", lambda: Zero(model.parameters(), torch.optim.LBFGS))
case("adafactor", lambda: Zero(model.parameters(), torch.optim.Adafactor))
# rank 1 gives the bias its own learning rate: the groups differ between ranks
case("groups_differ", lambda: Zero(
    [{"params": [model.weight]}, {"params": [model.bias], "lr": 0.5}] if rank == 1 else model.parameters(),
    torch.optim.SGD, lr=0.1))
case("not_a_class", lambda: Zero(model.parameters(), "adam"))
frozen = nn.Linear(2, 2).requires_grad_(False)
case("frozen_params", lambda: Zero(frozen.parameters(), torch.optim.SGD, lr=0.1))

opt = Zero(model.parameters(), torch.optim.SGD, lr=0.1)
case("consolidate_to_bad_rank", lambda: opt.consolidate_state_dict(to=7))
case("state_dict_unconsolidated", lambda: opt.state_dict())
model(torch.ones(4, 8)).sum().backward()
before = model.weight.detach().clone()
grad = model.weight.grad.clone()
opt.step()
report(kind="after", stepped=torch.allclose(model.weight, before - 0.1 * grad, rtol=0, atol=1e-6))

# add_param_group after steps (collective): the existing state is kept, the new group starts
# fresh; compared with torch's SGD on the same parameters and gradients (the same on every rank)
torch.manual_seed(1)
net, extra = nn.Linear(8, 4), nn.Linear(4, 2)
ref_net, ref_extra = nn.Linear(8, 4), nn.Linear(4, 2)
ref_net.load_state_dict(net.state_dict())
ref_extra.load_state_dict(extra.state_dict())
sharded = Zero(net.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
plain = torch.optim.SGD(ref_net.parameters(), lr=0.1, momentum=0.9)
inputs = torch.randn(5, 8)
for step in range(4):
    if step == 2:
        sharded.add_param_group({"params": list(extra.parameters()), "lr": 0.05})
        plain.add_param_group({"params": list(ref_extra.parameters()), "lr": 0.05})
    for m, head, o in ((net, extra, sharded), (ref_net, ref_extra, plain)):
        o.zero_grad()
        (head(m(inputs)).square().sum() if step >= 2 else m(inputs).square().sum()).backward()
        o.step()
report(kind="add_group", diff=max((a - b).abs().max().item() for a, b in
                                  zip([*net.parameters(), *extra.parameters()],
                                      [*ref_net.parameters(), *ref_extra.parameters()])))
