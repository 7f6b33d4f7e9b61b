"""Checks the layout claims of MAT301-MAT303 on real tensors: which GEMM operands make
`matmul`/`linear`/`bmm` copy (an aten copy/clone op dispatched before the GEMM), and which
`.view` calls after a transpose raise. Needs torch; run on a GPU machine:

    python benchmarks/triage/layout_copies.py
"""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

COPY_OPS = {"clone", "contiguous", "copy_", "_unsafe_view_copy", "view_copy", "_reshape_copy"}


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def copies(fn):
    with Ops() as ops:
        fn()
    return [n for n in ops.names if n in COPY_OPS]


def kernels(fn):
    """CUDA kernels launched by `fn` (copies inside cuBLAS paths are invisible to a dispatch mode)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n[:48] for n in names]


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    r = lambda *s: torch.randn(*s, device=dev)
    x2, w2, wt = r(64, 128), r(128, 64), r(64, 128)
    q4, k4 = r(2, 16, 4, 32), r(2, 16, 4, 32)          # (B, T, heads, d)
    a4 = r(2, 4, 16, 16)                                # (B, H, N, N)
    t3 = r(8, 16, 32)
    lin = torch.nn.Linear(4, 4).to(dev)
    w16, y32, y16, b4 = r(16, 8), r(32, 16, 4), r(16, 32, 4), r(2, 4, 16, 32)
    cases = {
        # MAT301: needless copies (the copy is the only one) vs. the transposed view (no copy).
        "MAT301 x @ w.t().contiguous()": lambda: x2 @ wt.t().contiguous(),
        "MAT301 fixed: x @ w.t()": lambda: x2 @ wt.t(),
        "MAT301 bmm(a.mT.contiguous(), b)": lambda: torch.bmm(t3.mT.contiguous(), t3),
        "MAT301 fixed: bmm(a.mT, b)": lambda: torch.bmm(t3.mT, t3),
        "MAT301 quiet: a.mT @ w (3-D left, matrix right; matmul copies)": lambda: t3.mT @ w16,
        # MAT302 flagged shapes: a hidden copy inside the GEMM call.
        "MAT302 x[:, ::2] @ w[:64]": lambda: x2[:, ::2] @ w2[:64],
        "MAT302 linear(attn.permute(0, 2, 3, 1))": lambda: lin(a4.permute(0, 2, 3, 1)),
        "MAT302 matmul(q.permute(2,1,0,3), k.permute(2,1,3,0))": lambda: torch.matmul(q4.permute(2, 1, 0, 3), k4.permute(2, 1, 3, 0)),
        "MAT302 bmm(x.permute(2, 0, 1), y)": lambda: torch.bmm(t3.permute(2, 0, 1), y32),
        # Shapes MAT302 must never flag: free for cuBLAS.
        "free: x @ w.T": lambda: x2 @ wt.T,
        "free: x[::2] @ w": lambda: x2[::2] @ w2,
        "free: bmm(x.permute(1, 0, 2), y)": lambda: torch.bmm(t3.permute(1, 0, 2), y16),
        # Not free (matmul folds the two batch dims), quiet in MAT302 only when it cannot see the ranks.
        "copied: q.transpose(1, 2) @ k.transpose(1, 2).mT": lambda: q4.transpose(1, 2) @ k4.transpose(1, 2).mT,
        "free: a @ b.mT (contiguous 4-D, last-two transpose)": lambda: b4 @ b4.mT,
    }
    for name, fn in cases.items():
        launched = f"  kernels: {kernels(fn)}" if dev == "cuda" else ""
        print(f"{name:60s} copies: {copies(fn)}{launched}")
    y = r(2, 4, 16, 8)  # (B, nh, T, hs)
    for name, fn in {
        "MAT303 y.transpose(1, 2).view(B, T, C)": lambda: y.transpose(1, 2).view(2, 16, 32),
        "MAT303 fixed: .reshape(B, T, C)": lambda: y.transpose(1, 2).reshape(2, 16, 32),
        "quiet: pos.permute(0, 2, 3, 1).view(1, -1, C)": lambda: r(1, 8, 4, 4).permute(0, 2, 3, 1).view(1, -1, 8),
        "quiet: x.transpose(1, 2).view(B, C, H, W)": lambda: r(2, 16, 8).transpose(1, 2).view(2, 8, 4, 4),
    }.items():
        try:
            fn()
            print(f"{name:60s} works")
        except RuntimeError as exc:
            print(f"{name:60s} raises: {str(exc).splitlines()[0][:80]}")


if __name__ == "__main__":
    main()
