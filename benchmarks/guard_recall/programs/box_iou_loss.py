"""Box regression head trained with an IoU loss computed box by box."""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class BoxHead(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, feats):
        raw = self.mlp(feats)
        xy = raw[:, :2].sigmoid()
        wh = raw[:, 2:].sigmoid() * 0.5
        return torch.cat([xy, xy + wh], dim=1)     # (x1, y1, x2, y2)


def iou_loss(pred, target):
    n = pred.shape[0]
    ious = torch.zeros(n, device=pred.device)
    for i in range(n):
        ix1 = torch.max(pred[i, 0], target[i, 0])
        iy1 = torch.max(pred[i, 1], target[i, 1])
        ix2 = torch.min(pred[i, 2], target[i, 2])
        iy2 = torch.min(pred[i, 3], target[i, 3])
        inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
        area_p = (pred[i, 2] - pred[i, 0]) * (pred[i, 3] - pred[i, 1])
        area_t = (target[i, 2] - target[i, 0]) * (target[i, 3] - target[i, 1])
        ious[i] = inter / (area_p + area_t - inter + 1e-6)
    return (1 - ious).mean()


def main():
    feats = torch.randn(256, 32)
    xy = torch.rand(256, 2) * 0.5
    boxes = torch.cat([xy, xy + 0.1 + torch.rand(256, 2) * 0.3], dim=1)
    model = BoxHead().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        idx = torch.randint(0, 256, (48,))
        fb, bb = feats[idx].to(device), boxes[idx].to(device)
        loss = iou_loss(model(fb), bb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"iou loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
