"""Text classifier on nn.TransformerEncoder, written the recommended way: autocast, fused optimizer
state updates, losses kept on the device."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TextClassifier(nn.Module):
    def __init__(self, vocab=2000, d_model=64, n_layers=4, n_classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 64, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens, pad):
        x = self.emb(tokens) + self.pos[:, :tokens.size(1)]
        x = self.encoder(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1))


def main():
    tokens = torch.randint(1, 2000, (256, 32))
    tokens[:, 24:] = 0
    labels = torch.randint(0, 4, (256,))
    model = TextClassifier().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total_loss = torch.zeros((), device=device)
    for step in range(8):
        idx = torch.randint(0, 256, (32,))
        tb, yb = tokens[idx].to(device), labels[idx].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = model(tb, tb == 0)
        loss = F.cross_entropy(logits.float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total_loss += loss.detach()
    print(f"mean loss {(total_loss / 8).item():.3f}")


if __name__ == "__main__":
    main()
