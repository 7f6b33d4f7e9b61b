"""A top-1 mixture-of-experts layer under torch.compile, with a load-balancing check in forward."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class MoE(nn.Module):
    def __init__(self, d=32, n_experts=4, hidden=64):
        super().__init__()
        self.router = nn.Linear(d, n_experts)
        self.w_in = nn.Parameter(torch.randn(n_experts, d, hidden) * d ** -0.5)
        self.w_out = nn.Parameter(torch.randn(n_experts, hidden, d) * hidden ** -0.5)

    def forward(self, x):
        gates = F.softmax(self.router(x), dim=-1)
        weight, expert = gates.max(dim=-1)
        if weight.mean() < 0.3:
            x = x * 0.5
        h = torch.einsum("nd,ndh->nh", x, self.w_in[expert])
        y = torch.einsum("nh,nhd->nd", F.gelu(h), self.w_out[expert])
        return x + weight.unsqueeze(-1) * y


class Model(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.moe = MoE(d)
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        return self.out(self.moe(F.relu(self.inp(x)))).squeeze(-1)


def main():
    model = Model().to(device)
    compiled = torch.compile(model, backend="aot_eager")   # debugging backend: no C++ toolchain needed
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(6):
        x = torch.randn(128, 16, device=device)
        y = x[:, :4].sum(-1)
        loss = F.mse_loss(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
