"""A tiny training script with a per-head matmul loop (MAT101); used by the `matlint run` tests."""
import json
import sys

import torch

assert __name__ == "__main__"
heads = int(sys.argv[1])
out_path = sys.argv[2]
w = torch.nn.Parameter(torch.randn(heads, 16, 16))
opt = torch.optim.SGD([w], lr=0.01)
x = torch.randn(heads, 4, 16)
for step in range(5):
    opt.zero_grad()
    y = torch.stack([x[h] @ w[h] for h in range(heads)])  # MAT101 here
    y.square().mean().backward()
    opt.step()
with open(out_path, "w") as fh:
    json.dump({"argv": sys.argv, "name": __name__}, fh)
sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
