"""On CUDA: a GradScaler step under the guard reports no MAT502 (its one check per step is
torch's own), while the user's own `loss.item()` once a step is reported."""
import torch
import torch.nn as nn

from matlint.runtime_guard import guard

model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda")
x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
g = guard(json_path=None, report=False, estimate_savings=False, select=["MAT502"])
with g:
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        logged = loss.item()
for f in g.findings:
    print(f.row, f.message[:120])
