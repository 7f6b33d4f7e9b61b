"""Two-tower retrieval model trained with in-batch negatives, scored against a document index."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Tower(nn.Module):
    def __init__(self, d_in, d_out=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Linear(128, d_out))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_tower = Tower(48)
        self.doc_tower = Tower(96)
        self.log_temp = nn.Parameter(torch.tensor(2.0))

    def forward(self, queries, docs):
        q = self.query_tower(queries)
        d = self.doc_tower(docs)
        d_t = d.t().contiguous()
        logits = q @ d_t * self.log_temp.exp()
        return logits


def main():
    queries, docs = torch.randn(512, 48), torch.randn(512, 96)
    model = DualEncoder().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    index = torch.randn(2000, 64, device=device)
    for step in range(8):
        idx = torch.randint(0, 512, (64,))
        qb, db = queries[idx].to(device), docs[idx].to(device)
        logits = model(qb, db)
        labels = torch.arange(logits.size(0), device=device)
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            q = model.query_tower(qb)
            hits = (q @ index.T.contiguous()).topk(10, dim=1).indices
    print(hits.shape, f"{loss.item():.3f}")


if __name__ == "__main__":
    main()
