"""On CUDA: which boolean-mask spellings wait for the GPU (torch's sync detector, mode "error")."""
import torch

x = torch.randn(1024, device="cuda")
mask = x > 0
v = torch.randn(1024, device="cuda")
cases = {
    "x[mask] = 0.0": lambda: x.__setitem__(mask, 0.0),
    "x[mask] = 0-d cuda tensor": lambda: x.__setitem__(mask, torch.zeros((), device="cuda")),
    "x[mask] = v[mask]": lambda: x.__setitem__(mask, v[mask]),
    "x[mask] (read)": lambda: x[mask],
    "x[mask] -= 1": lambda: x.__setitem__(mask, x[mask] - 1),
    "x.masked_fill_(mask, 0)": lambda: x.masked_fill_(mask, 0.0),
    "torch.where(mask, x, 0)": lambda: torch.where(mask, x, 0.0),
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
