"""Character-level language model with a hand-written Elman RNN (Karpathy's min-char-rnn, in torch)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

TEXT = ("to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
        "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles ") * 20


class CharRNN(nn.Module):
    def __init__(self, vocab, emb=32, hidden=128):
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, emb)
        self.W_xh = nn.Linear(emb, hidden)
        self.W_hh = nn.Linear(hidden, hidden, bias=False)
        self.W_hy = nn.Linear(hidden, vocab)

    def forward(self, idx, h):
        x = self.embed(idx)                      # (B, T, emb)
        logits = []
        for t in range(idx.shape[1]):
            xh = self.W_xh(x[:, t])
            hh = self.W_hh(h)
            h = torch.tanh(xh + hh)
            logits.append(self.W_hy(h))
        return torch.stack(logits, dim=1), h


def batches(data, batch, seq):
    while True:
        ix = torch.randint(0, len(data) - seq - 1, (batch,))
        x = torch.stack([data[i:i + seq] for i in ix])
        y = torch.stack([data[i + 1:i + seq + 1] for i in ix])
        yield x.to(device), y.to(device)


def main():
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in TEXT], dtype=torch.long)
    model = CharRNN(len(chars)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = batches(data, batch=16, seq=24)
    h = torch.zeros(16, model.hidden, device=device)
    for it in range(8):
        x, y = next(loader)
        logits, h = model(x, h.detach())
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % 100 == 0:
            print(it, loss.item())


if __name__ == "__main__":
    main()
