"""CIFAR-10-style CNN classifier (the PyTorch tutorial's network), random images."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    images, targets = torch.randn(320, 3, 32, 32), torch.randint(0, 10, (320,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, targets), batch_size=32)
    net = Net().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    correct, seen = 0, 0
    for epoch in range(1):
        for i, (inputs, labels) in enumerate(loader):
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            correct += (outputs.argmax(1) == labels).sum().item()
            seen += labels.size(0)
            print(f"[{epoch + 1}, {i + 1:5d}] loss: {loss.item():.3f} acc: {(outputs.argmax(1) == labels).float().mean().item():.3f}")
    print(f"train accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
