"""A deep residual MLP trained with an exponential moving average of its weights (mean teacher)."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class DeepMLP(nn.Module):
    def __init__(self, d_in=32, width=64, depth=16, n_out=10):
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.head = nn.Linear(width, n_out)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = x + F.relu(layer(x))
        return self.head(x)


@torch.no_grad()
def update_ema(ema, model, decay=0.999):
    for p_ema, p in zip(ema.parameters(), model.parameters()):
        p_ema.mul_(decay).add_(p.detach(), alpha=1 - decay)


def main():
    x, y = torch.randn(1024, 32), torch.randint(0, 10, (1024,))
    model = DeepMLP().to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    for step in range(8):
        idx = torch.randint(0, 1024, (64,))
        xb, yb = x[idx].to(device), y[idx].to(device)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.grad.clamp_(-1.0, 1.0)
        grad_norms = [p.grad.norm() for p in model.parameters()]
        total_norm = torch.stack(grad_norms).norm()
        opt.step()
        update_ema(ema, model)
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f} grad norm {total_norm.item():.3f}")


if __name__ == "__main__":
    main()
