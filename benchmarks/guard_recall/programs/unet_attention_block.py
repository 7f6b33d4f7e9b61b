"""A small denoising network with a self-attention block on conv features (diffusion-UNet style),
trained to predict the noise added to images."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class SpatialSelfAttention(nn.Module):
    def __init__(self, channels, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(8, channels)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        h = self.norm(x).view(B, C, H * W)
        q, k, v = self.qkv(h).chunk(3, dim=1)                 # each (B, C, N)
        q = q.reshape(B, self.heads, C // self.heads, H * W).transpose(-2, -1)
        k = k.reshape(B, self.heads, C // self.heads, H * W).transpose(-2, -1)
        v = v.reshape(B, self.heads, C // self.heads, H * W).transpose(-2, -1)
        out = F.scaled_dot_product_attention(q, k, v)         # (B, heads, N, d)
        out = out.transpose(-2, -1).reshape(B, C, H * W)
        return x + self.proj(out).view(B, C, H, W)


class CrossAttention(nn.Module):
    def __init__(self, channels, ctx_dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(channels, channels)
        self.to_kv = nn.Linear(ctx_dim, 2 * channels)
        self.to_out = nn.Linear(channels, channels)

    def forward(self, x, context):
        B, C, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)                 # (B, N, C)
        q = self.to_q(tokens).view(B, -1, self.heads, C // self.heads).transpose(1, 2)
        k, v = self.to_kv(context).view(B, -1, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
        out = out.transpose(1, 2).reshape(B, -1, C)
        return x + self.to_out(out).transpose(1, 2).view(B, C, H, W)


class TinyDenoiser(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.attn = SpatialSelfAttention(ch)
        self.cross = CrossAttention(ch)
        self.up = nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)
        self.out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x, context):
        h = F.silu(self.inp(x))
        h = F.silu(self.down(h))
        h = self.attn(h)
        h = self.cross(h, context)
        return self.out(F.silu(self.up(h)))


def main():
    model = TinyDenoiser().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
    images = torch.rand(64, 3, 16, 16) * 2 - 1
    for step in range(6):
        x0 = images[torch.randint(0, 64, (8,))].to(device)
        context = torch.randn(8, 5, 32, device=device)
        t = torch.rand(8, 1, 1, 1, device=device)
        noise = torch.randn_like(x0)
        xt = (1 - t).sqrt() * x0 + t.sqrt() * noise
        loss = F.mse_loss(model(xt, context), noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
