"""On CUDA: which boolean-mask spellings wait for the GPU (torch's sync detector, mode "error")."""
import torch

x = torch.randn(1024, device="cuda")
mask = x > 0
v = torch.randn(1024, device="cuda")
t = torch.randn(1024, 5, device="cuda")
labels = torch.randint(0, 5, (1024,), device="cuda")
cases = {
    "x[mask] = 0.0": lambda: x.__setitem__(mask, 0.0),
    "x[mask] = 0-d cuda tensor": lambda: x.__setitem__(mask, torch.zeros((), device="cuda")),
    "x[mask] = v[mask]": lambda: x.__setitem__(mask, v[mask]),
    "x[mask] (read)": lambda: x[mask],
    "x[mask] -= 1": lambda: x.__setitem__(mask, x[mask] - 1),
    "x.masked_fill_(mask, 0)": lambda: x.masked_fill_(mask, 0.0),
    "torch.where(mask, x, 0)": lambda: torch.where(mask, x, 0.0),
    "t[mask, :] = 0.0": lambda: t.__setitem__((mask, slice(None)), 0.0),
    "t[mask, :] (read)": lambda: t[mask, :],
    "t[mask, 4] (read)": lambda: t[mask, 4],
    "t[mask, labels] = 1": lambda: t.__setitem__((mask, labels), 1),
    "any(not isfinite(p).all() ...)": lambda: any(not torch.isfinite(p).all() for p in (x, t)),
}
for name, fn in cases.items():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        synced = "no sync"
    except RuntimeError as exc:
        synced = "SYNC" if "synchroniz" in str(exc) else f"error: {exc}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    print(f"{name:32s} {synced}")
