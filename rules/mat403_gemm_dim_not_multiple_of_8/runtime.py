"""MAT403 at runtime: half-precision GEMMs with dims that are not multiples of 8, and the timing
of the GEMM at padded dims. Imported only by the guard (needs torch)."""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import GEMM_OPS
from matlint.runtime_guard.checks import (common_evidence, dtype_str, finding, gemm_mnk, gemm_operands, gemm_total,
                                          gemm_weight)
from matlint.runtime_guard.registry import estimator, runtime_check

PAD_MIN_SHARE = 0.01         # a GEMM below this part of the step's GEMM work: quiet


class PadEstimate(NamedTuple):
    kind: str            # "pad"
    gemms: tuple         # ((op, the recorded signature: (shape, stride, dtype) per operand, per step), ...)


@runtime_check("MAT403", needs_gpu=True, drop_negligible=True)
def check_dims_multiple_of_8(rec, steps, ctx):
    """One finding per line: a Linear's forward GEMM and its two backward GEMMs have the same odd
    dim in three places (N, then K and M)."""
    if not ctx.tensor_cores:
        return
    total = gemm_total(rec, steps)
    by_site = defaultdict(list)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or key.device != "cuda":
            continue
        a, _ = gemm_operands(key)
        if a[2] not in (torch.bfloat16, torch.float16):
            continue
        m, n, k = gemm_mnk(key)
        bad = {name: d for name, d in (("M", m), ("N", n), ("K", k)) if d % 8}
        if not bad or max(m, n, k) < 64:
            continue
        by_site[key.site].append((key, stat, bad))
    for site, items in by_site.items():
        if total and sum(gemm_weight(key, stat, steps, rec) for key, stat, _ in items) / total < PAD_MIN_SHARE:
            continue  # too small a part of the step's GEMM work for padding to matter
        items.sort(key=lambda item: (item[0].backward, -item[1].count))
        first, stat, bad = items[0]
        dims = ", ".join(f"{name}={d}" for name, d in bad.items())
        more = sorted({f"{name}={d}" for _, _, other in items[1:] for name, d in other.items()} - {dims})
        also = f" (and {len(items) - 1} more GEMMs of this line: {', '.join(more)})" if more else ""
        msg = (f"{dtype_str(gemm_operands(first)[0][2])} GEMM with {dims} (not multiples of 8){also}: tensor cores "
               f"run it slowly; pad the dimension to a multiple of 8 (vocab, hidden or head size)")
        per_step = stat.count / steps
        ev = common_evidence(first, per_step, [s for _, s, _ in items], rec)
        ev["gemms"] = len(items)
        yield finding("MAT403", site, msg, ev,
                      PadEstimate("pad", tuple((key.op, key.sig, s.count / steps) for key, s, _ in items)))


def _replay_dense(op, sig, inputs):
    tensors = [inputs.tensor(shape, dtype) for shape, _, dtype in sig]
    fn = getattr(torch.ops.aten, op).default
    return lambda: fn(*tensors)


@estimator("pad", kernel_time_only=True)
def estimate_pad(spec: PadEstimate, budget):
    device = "cuda"
    inputs = savings.Inputs(device)

    def pad(shape):
        return tuple(shape[:-2]) + tuple(-(-d // 8) * 8 for d in shape[-2:])

    saved = lo = hi = 0.0
    pairs, parts = None, []
    for op, sig, per_step in spec.gemms:
        padded = tuple((pad(s[0]), None, s[2]) for s in sig)

        def compute(op=op, sig=sig, padded=padded):
            plain = [(s[0], None, s[2]) for s in sig]
            return savings.time_pair(_replay_dense(op, plain, inputs), _replay_dense(op, padded, inputs), device,
                                     budget=budget)

        t = savings.cached(("pad", op, sig), compute)
        one, one_lo, one_hi, n = t.scaled(per_step)
        saved, lo, hi = saved + one, lo + one_lo, hi + one_hi
        pairs = n if pairs is None else min(pairs, n)
        parts.append(f"{op} {t.slow_ms:.3f} / {t.fast_ms:.3f} ms")
    return (saved, lo, hi, pairs or 0), f"timed each GEMM at the observed and padded dims ({'; '.join(parts)})"
