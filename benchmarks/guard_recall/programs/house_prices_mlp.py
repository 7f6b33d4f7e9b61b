"""Regress a house price from 13 tabular features with a small MLP."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_data(n=2048, d=13):
    x = torch.randn(n, d)
    w = torch.randn(d)
    y = x @ w + 0.1 * torch.randn(n)
    return x, y


class Regressor(nn.Module):
    def __init__(self, d_in, hidden=256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def main():
    x, y = make_data()
    model = Regressor(x.shape[1]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = 128
    history = []
    for step in range(10):
        idx = torch.randint(0, x.shape[0], (batch,))
        xb, yb = x[idx].to(device), y[idx].to(device)
        pred = model(xb)
        loss = F.mse_loss(pred, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mae = (pred.detach() - yb).abs().mean()
        history.append(loss.item())
        if step % 5 == 0:
            print(f"step {step} mse {history[-1]:.4f} mae {mae:.4f}")


if __name__ == "__main__":
    main()
