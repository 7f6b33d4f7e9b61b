"""Run by tests/test_guard_distributed.py as `torchrun --nproc_per_node 2 -m matlint run` of this
script: the process group is made inside the guard and destroyed before it reports."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    if rank == 1:
        [loss.item() for _ in range(2)]  # rank 1 only
dist.destroy_process_group()
