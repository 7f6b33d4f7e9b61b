"""Offline batch inference: score a data set with a trained text classifier and collect predictions."""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class BagOfWords(nn.Module):
    def __init__(self, vocab=5000, dim=64, n_classes=5):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.fc = nn.Sequential(nn.Linear(dim, 128), nn.ReLU(), nn.Linear(128, n_classes))

    def forward(self, tokens):
        return self.fc(self.emb(tokens))


def main():
    model = BagOfWords().to(device).eval()
    tokens = torch.randint(0, 5000, (800, 30))
    loader = torch.utils.data.DataLoader(tokens, batch_size=100)
    predictions, confidences = [], []
    n_confident = 0
    with torch.no_grad():
        for batch in loader:
            logits = model(batch.to(device))
            probs = logits.softmax(dim=-1)
            conf, pred = probs.max(dim=-1)
            predictions.extend(pred.cpu().tolist())
            confidences.append(conf.cpu())
            n_confident += int((conf > 0.5).sum())
            for row in range(probs.shape[0]):
                if probs[row].max() < 0.22:
                    print("low confidence row", row)
    print(len(predictions), torch.cat(confidences).mean().item(), n_confident)


if __name__ == "__main__":
    main()
