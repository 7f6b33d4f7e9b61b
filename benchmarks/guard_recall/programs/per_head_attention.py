"""Sentiment classifier with a from-scratch multi-head self-attention layer (one Linear per head)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Head(nn.Module):
    def __init__(self, d_model, d_head):
        super().__init__()
        self.query = nn.Linear(d_model, d_head, bias=False)
        self.key = nn.Linear(d_model, d_head, bias=False)
        self.value = nn.Linear(d_model, d_head, bias=False)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model=64, n_heads=8):
        super().__init__()
        self.d_head = d_model // n_heads
        self.heads = nn.ModuleList([Head(d_model, self.d_head) for _ in range(n_heads)])
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, pad_mask):
        outputs = []
        for head in self.heads:
            q = head.query(x)
            k = head.key(x)
            v = head.value(x)
            scores = torch.bmm(q, k.transpose(1, 2)) / self.d_head ** 0.5
            scores = scores.masked_fill(~pad_mask[:, None, :], float("-inf"))
            weights = F.softmax(scores, dim=-1)
            outputs.append(torch.bmm(weights, v))
        return self.out(torch.cat(outputs, dim=-1))


class Classifier(nn.Module):
    def __init__(self, vocab=1000, d_model=64, n_classes=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model, padding_idx=0)
        self.attn = MultiHeadSelfAttention(d_model)
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        pad_mask = tokens != 0
        x = self.emb(tokens)
        x = self.norm(x + self.attn(x, pad_mask))
        pooled = (x * pad_mask.unsqueeze(-1)).sum(1) / pad_mask.sum(1, keepdim=True)
        return self.fc(pooled)


def main():
    n, seq = 512, 20
    tokens = torch.randint(1, 1000, (n, seq))
    lengths = torch.randint(5, seq + 1, (n,))
    tokens[torch.arange(seq)[None, :] >= lengths[:, None]] = 0
    labels = torch.randint(0, 2, (n,))
    model = Classifier().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(1):
        for i in range(0, 256, 32):
            tb, yb = tokens[i:i + 32].to(device), labels[i:i + 32].to(device)
            loss = F.cross_entropy(model(tb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
