"""GRU encoder-decoder with Luong attention and input feeding, trained with teacher forcing on a
toy reversal task."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VOCAB, SOS = 20, 1


class Seq2Seq(nn.Module):
    def __init__(self, vocab=VOCAB, emb=32, hidden=64):
        super().__init__()
        self.hidden = hidden
        self.src_emb = nn.Embedding(vocab, emb)
        self.tgt_emb = nn.Embedding(vocab, emb)
        self.encoder = nn.GRU(emb, hidden, batch_first=True)
        self.cell = nn.GRUCell(emb + hidden, hidden)
        self.combine = nn.Linear(2 * hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, tgt_in):
        enc_out, h = self.encoder(self.src_emb(src))      # (B, S, H), (1, B, H)
        h = h.squeeze(0)
        feed = torch.zeros(src.size(0), self.hidden, device=src.device)
        emb = self.tgt_emb(tgt_in)
        logits = []
        for t in range(tgt_in.size(1)):
            h = self.cell(torch.cat([emb[:, t], feed], dim=1), h)
            scores = torch.bmm(enc_out, h.unsqueeze(2)).squeeze(2)
            attn = F.softmax(scores, dim=1)
            ctx = torch.bmm(attn.unsqueeze(1), enc_out).squeeze(1)
            feed = torch.tanh(self.combine(torch.cat([h, ctx], dim=1)))
            logits.append(self.out(feed))
        return torch.stack(logits, dim=1)


def main():
    model = Seq2Seq().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(8):
        src = torch.randint(2, VOCAB, (32, 12), device=device)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((32, 1), SOS, device=device), tgt[:, :-1]], dim=1)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
