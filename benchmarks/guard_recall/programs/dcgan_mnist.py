"""A small fully-connected GAN on MNIST-sized images (random data stands in for the data set)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
nz, img = 32, 28 * 28


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(nz, 128), nn.LeakyReLU(0.2),
            nn.Linear(128, 256), nn.BatchNorm1d(256), nn.LeakyReLU(0.2),
            nn.Linear(256, img), nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(img, 256), nn.LeakyReLU(0.2),
            nn.Linear(256, 128), nn.LeakyReLU(0.2),
            nn.Linear(128, 1), nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x)


def main():
    data = torch.rand(512, img) * 2 - 1
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
    netG, netD = Generator().to(device), Discriminator().to(device)
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    fixed_noise = torch.randn(16, nz, device=device)
    for epoch in range(1):
        for i, real in enumerate(loader):
            real = real.to(device)
            b = real.size(0)
            real_label = torch.ones(b, 1).to(device)
            fake_label = torch.zeros(b, 1).to(device)

            netD.zero_grad()
            out_real = netD(real)
            errD_real = criterion(out_real, real_label)
            noise = torch.randn(b, nz, device=device)
            fake = netG(noise)
            errD_fake = criterion(netD(fake.detach()), fake_label)
            errD = errD_real + errD_fake
            errD.backward()
            optD.step()

            netG.zero_grad()
            errG = criterion(netD(fake), real_label)
            errG.backward()
            optG.step()

            print(f"[{epoch}][{i}/{len(loader)}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f} D(x): {out_real.mean().item():.4f}")
    with torch.no_grad():
        samples = netG(fixed_noise)
    print(samples.shape)


if __name__ == "__main__":
    main()
