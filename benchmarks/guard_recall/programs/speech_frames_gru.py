"""Frame classifier for speech features: even/odd filterbank channels, a time-major GRU, per-frame head."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class FrameClassifier(nn.Module):
    def __init__(self, n_mels=80, hidden=96, n_classes=40):
        super().__init__()
        self.even_proj = nn.Linear(n_mels // 2, hidden // 2)
        self.odd_proj = nn.Linear(n_mels // 2, hidden // 2)
        self.rnn = nn.GRU(hidden, hidden)             # time-major: (T, B, H)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, mels):                          # mels: (T, B, n_mels)
        T, B, F_ = mels.shape
        flat = mels.reshape(T * B, F_)
        x = torch.cat([self.even_proj(flat[:, ::2]), self.odd_proj(flat[:, 1::2])], dim=-1)
        out, _ = self.rnn(x.view(T, B, -1))
        logits = self.head(out.permute(1, 0, 2))       # (B, T, classes)
        return logits


def main():
    model = FrameClassifier().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(8):
        mels = torch.randn(50, 16, 80, device=device)
        frame_labels = torch.randint(0, 40, (16, 50), device=device)
        logits = model(mels[:, :, :])
        sub = logits[:, ::2]                          # every other frame for the auxiliary loss
        loss = F.cross_entropy(logits.reshape(-1, 40), frame_labels.reshape(-1))
        loss = loss + 0.1 * F.cross_entropy(sub.reshape(-1, 40), frame_labels[:, ::2].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
