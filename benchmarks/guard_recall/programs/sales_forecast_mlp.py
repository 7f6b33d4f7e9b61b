"""Forecast next-week sales per store, and rank stores against each other (RankNet pairs)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Forecaster(nn.Module):
    def __init__(self, d_in=24, hidden=128):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    n_stores, d = 256, 24
    feats = torch.randn(n_stores, d)
    sales = (feats[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(n_stores, 1)).clamp(min=0)
    model = Forecaster(d).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    criterion = nn.MSELoss()
    for step in range(10):
        idx = torch.randperm(n_stores)[:64]
        xb, yb = feats[idx].to(device), sales[idx].to(device)
        pred = model(xb)
        mse = criterion(pred, yb)
        residual = pred - yb
        bias = residual.mean()
        s = pred.squeeze(1)
        pair_diff = s.unsqueeze(1) - s
        target_pref = (yb.squeeze(1).unsqueeze(1) > yb.squeeze(1)).float()
        rank_loss = nn.functional.binary_cross_entropy_with_logits(pair_diff, target_pref)
        loss = mse + 0.1 * rank_loss + 0.01 * bias.abs()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
