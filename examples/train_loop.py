"""A classifier training loop that synchronizes with the GPU on every step."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 16, (4096,)))
    train_loader = DataLoader(data, batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 16)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(3):
        running_loss = 0.0
        correct = 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            correct += int((logits.argmax(-1) == y).sum())
        print(f"epoch {epoch}: loss {running_loss / len(train_loader):.4f}, acc {correct / len(data):.3f}")


if __name__ == "__main__":
    main()
