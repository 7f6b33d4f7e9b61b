"""The same loop keeping its running statistics on the device: one sync per epoch."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 16, (4096,)))
    train_loader = DataLoader(data, batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 16)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")

    for epoch in range(3):
        running_loss = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running_loss += loss.detach()
            correct += (logits.argmax(-1) == y).sum()
        print(f"epoch {epoch}: loss {running_loss.item() / len(train_loader):.4f}, "
              f"acc {correct.item() / len(data):.3f}")


if __name__ == "__main__":
    main()
