"""Which aten ops a dispatch mode sees inside SDPA's math backend with enable_gqa=True (CUDA, fp32)."""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        self.seen.append((str(func), shapes, tuple(out.shape) if isinstance(out, torch.Tensor) else None))
        return out


for contiguous in (True, False):
    q = torch.randn(2, 8, 128, 64, device="cuda")
    kv = torch.randn(2, 2, 2, 128, 64, device="cuda").permute(1, 0, 2, 3, 4)
    k, v = (kv[0].contiguous(), kv[1].contiguous()) if contiguous else (kv[0], kv[1])
    with Ops() as o:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    print("contiguous k/v" if contiguous else "strided k/v")
    for row in o.seen:
        print("  ", row)
