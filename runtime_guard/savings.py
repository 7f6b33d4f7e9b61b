"""Savings estimates: time the suggested alternative at the observed shapes on this device.

Runs after the guarded code (never inside the user's step), draws inputs from a private
generator (the user's RNG streams are untouched), caches timings per shape, and stops at a
time budget. Each estimate is milliseconds per step and says how it was made.
"""
from __future__ import annotations

import contextlib
import math
from time import perf_counter
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

_cache: dict = {}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}


class _Budget:
    def __init__(self, seconds: float):
        self.deadline = perf_counter() + seconds

    @property
    def left(self) -> bool:
        return perf_counter() < self.deadline

    @property
    def seconds(self) -> float:
        return max(0.0, self.deadline - perf_counter())


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


RELIABLE_HALF_WIDTH = 0.25   # an estimate is reliable when its interval is within ±25% and above 0
MIN_PAIRS, MAX_PAIRS = 12, 400  # 6 rounds of two pairs: the fewest whose [min, max] bounds the median at 95%


def reliable(saved: float, lo: float, hi: float, pairs: int) -> bool:
    """An estimate from enough pairs for its ~95% interval, above 0 and within ±25% of it."""
    return pairs >= MIN_PAIRS and lo > 0 and (hi - lo) / 2 <= RELIABLE_HALF_WIDTH * saved


@dataclass(frozen=True)
class Timed:
    """The original and the fix timed in alternating pairs: medians, the median over rounds of two
    pairs of their mean difference (what the fix saves per call) and a distribution-free ~95%
    interval of it; `pairs` is even."""
    slow_ms: float
    fast_ms: float
    saved_ms: float
    lo_ms: float
    hi_ms: float
    pairs: int

    @property
    def reliable(self) -> bool:
        return reliable(self.saved_ms, self.lo_ms, self.hi_ms, self.pairs)

    def scaled(self, k: float) -> tuple:
        """(saved, lo, hi) times k (calls per step), and the pairs they come from."""
        return self.saved_ms * k, self.lo_ms * k, self.hi_ms * k, self.pairs


def _median_interval(values) -> tuple:
    """(median, lo, hi): the order statistics that bound the median with ~95% confidence."""
    d = sorted(values)
    n = len(d)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return d[n // 2] if n % 2 else (d[n // 2 - 1] + d[n // 2]) / 2, d[k], d[n - 1 - k]


def _clock(fn, device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = perf_counter()
    fn()
    return (perf_counter() - t0) * 1e3


def time_pair(slow, fast, device: str, max_s: float = 0.5, budget: _Budget | None = None) -> Timed:
    """Time `slow` and `fast` in rounds of two pairs, slow first and then fast first: an order effect
    (whichever runs first pays more) or a drift of the machine's speed falls on both alike and
    cancels in the round's mean difference. The saving is the median of those means, with its
    interval; rounds are added until the interval is within ±10% of it, or MAX_PAIRS pairs, or
    max_s seconds (at most what is left of `budget`): fewer than MIN_PAIRS when one call is slow,
    at least one round."""
    if budget is not None:
        max_s = min(max_s, budget.seconds)
    start = perf_counter()
    for _ in range(3):  # warm-up: three calls each, fewer when they are slow
        slow()
        fast()
        _sync(device)
        if perf_counter() - start > max_s / 4:
            break
    slow_t, fast_t, saved = [], [], []
    start = perf_counter()
    while 2 * len(saved) < MAX_PAIRS:
        a1, b1 = _clock(slow, device), _clock(fast, device)
        b2, a2 = _clock(fast, device), _clock(slow, device)
        slow_t += (a1, a2)
        fast_t += (b1, b2)
        saved.append((a1 - b1 + a2 - b2) / 2)
        if perf_counter() - start > max_s:
            break
        if 2 * len(saved) >= MIN_PAIRS:
            mid, lo, hi = _median_interval(saved)
            if (hi - lo) / 2 <= 0.1 * abs(mid):
                break
    mid, lo, hi = _median_interval(saved)
    return Timed(_median_interval(slow_t)[0], _median_interval(fast_t)[0], mid, lo, hi, 2 * len(saved))


def _noop() -> None:
    return None


class _Inputs:
    def __init__(self, device: str):
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(1234)

    def tensor(self, shape, dtype, stride=None, requires_grad=False):
        if stride is None:
            t = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        else:
            t = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=self.device)
        if t.numel():
            t.normal_(generator=self.gen)
        return t.requires_grad_(requires_grad)


def _cached(key, compute):
    if key not in _cache:
        _cache[key] = compute()
    return _cache[key]


def _replay_gemm(op: str, sig, dtype, inputs: _Inputs):
    tensors = []
    for shape, stride, _ in sig:
        # keep the layout; a zero or overlapping stride would alias, so densify those
        dense = all(s > 0 for s in stride)
        tensors.append(inputs.tensor(shape, dtype, stride if dense else None))
    fn = getattr(torch.ops.aten, op).default
    return lambda: fn(*tensors)


def estimate_bf16(spec, budget):
    _, gemms = spec
    device = "cuda"
    inputs = _Inputs(device)
    saved = [0.0, 0.0, 0.0]
    pairs = MAX_PAIRS
    timed = 0
    total = sum(per_step for _, _, per_step in gemms)
    covered = 0.0
    for op, sig, per_step in sorted(gemms, key=lambda g: -g[2] * _flops(g[0], g[1])):
        if not budget.left:
            break
        if not all(isinstance(s[0], torch.Size) for s in sig):
            continue
        key = ("bf16", op, sig)

        def compute():
            return time_pair(_replay_gemm(op, sig, torch.float32, inputs),
                             _replay_gemm(op, sig, torch.bfloat16, inputs), device, budget=budget)

        t = _cached(key, compute)
        saved = [total_ms + part for total_ms, part in zip(saved, t.scaled(per_step))]
        pairs = min(pairs, t.pairs)
        covered += per_step
        timed += 1
    scale = total / covered if covered else 0.0
    method = (f"timed {timed} distinct fp32 GEMM shapes against bf16 on this GPU "
              f"({covered:g} of {total:g} GEMMs per step; the rest scaled alike); GEMMs only")
    return tuple(v * scale for v in saved) + (pairs,), method


def _flops(op, sig):
    a, b = (sig[1], sig[2]) if op in ("addmm", "baddbmm", "addbmm") else (sig[0], sig[1])
    return 2.0 * math.prod(a[0]) * b[0][-1]


class LoopEstimate(NamedTuple):
    kind: str            # "loop"
    op: str
    a_shape: tuple
    b_shape: tuple
    dtype: str
    device: str
    n: int               # GEMMs per loop
    loops_per_step: float
    grad: bool
    shared: str | None   # "second" (one weight), "first" (one input), "both", None (neither)


def estimate_loop(spec: LoopEstimate, budget):
    dt = _DTYPES.get(spec.dtype, torch.float32)
    inputs = _Inputs(spec.device)
    n, grad, device, shared = spec.n, spec.grad, spec.device, spec.shared
    m, k, cols = spec.a_shape[-2], spec.a_shape[-1], spec.b_shape[-1]
    key = spec._replace(loops_per_step=0.0)

    def compute():
        # gradients flow to the second operand (the weights), as in `x[i] @ w[i]` or a Linear; a
        # shared operand is one 2-d tensor used by every call, as the user's weight is
        a = inputs.tensor((m, k) if shared in ("first", "both") else (n, m, k), dt)
        b = inputs.tensor((k, cols) if shared in ("second", "both") else (n, k, cols), dt, requires_grad=grad)
        grad_out = torch.ones((n, m, cols), dtype=dt, device=device) if grad else None  # a dense incoming gradient

        def looped():
            out = torch.stack([(a if a.dim() == 2 else a[i]) @ (b if b.dim() == 2 else b[i]) for i in range(n)])
            if grad:
                out.backward(grad_out)

        def batched():
            if shared == "second":    # one call on the stacked inputs
                out = (a.reshape(n * m, k) @ b).view(n, m, cols)
            elif shared == "first":   # one GEMM on the concatenated weights
                out = (a @ b.permute(1, 0, 2).reshape(k, n * cols)).view(m, n, cols).transpose(0, 1)
            elif shared == "both":    # computed once
                out = (a @ b).expand(n, m, cols)
            else:
                out = torch.bmm(a, b)
            if grad:
                out.backward(grad_out)

        return time_pair(looped, batched, device, budget=budget)

    t = _cached(key, compute)
    t_loop, t_one = t.slow_ms, t.fast_ms
    one = {"second": "one GEMM on the stacked inputs", "first": "one GEMM on the concatenated weights",
           "both": "one GEMM reused"}.get(shared, "one bmm")
    method = (f"timed {n} separate {'fwd+bwd ' if grad else ''}GEMMs ({t_loop:.3f} ms) against {one} "
              f"({t_one:.3f} ms) at the observed shapes on {device}")
    return t.scaled(spec.loops_per_step), method


class SdpaEstimate(NamedTuple):
    kind: str            # "sdpa"
    bh: int              # batch × query heads
    s_q: int
    s_k: int
    d: int
    d_v: int
    dtype: str
    device: str
    mask: str | None     # "causal", "mask" (an explicit attn_mask) or None
    dropout_p: float
    grad: bool
    per_step: float
    softmax_dtype: str
    gqa_rep: int = 1     # K/V heads repeated this many times (enable_gqa=True)


def estimate_sdpa(spec: SdpaEstimate, budget):
    dt = _DTYPES.get(spec.dtype, torch.float32)
    upcast = spec.softmax_dtype == "float32" and dt != torch.float32  # autocast runs softmax in fp32
    inputs = _Inputs(spec.device)
    key = (spec._replace(per_step=0.0), upcast)
    device, grad, rep = spec.device, spec.grad, spec.gqa_rep

    def compute():
        q = inputs.tensor((1, spec.bh, spec.s_q, spec.d), dt, requires_grad=grad)
        k = inputs.tensor((1, spec.bh // rep, spec.s_k, spec.d), dt, requires_grad=grad)
        v = inputs.tensor((1, spec.bh // rep, spec.s_k, spec.d_v), dt, requires_grad=grad)
        allowed = torch.ones(spec.s_q, spec.s_k, dtype=torch.bool, device=device).tril()
        scale = 1.0 / math.sqrt(spec.d)

        def manual():
            kk, vv = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
            w = (q @ kk.transpose(-2, -1)) * scale
            if spec.mask:
                w = w.masked_fill(~allowed, float("-inf"))
            p = torch.softmax(w.float(), dim=-1).to(dt) if upcast else torch.softmax(w, dim=-1)
            if spec.dropout_p:
                p = F.dropout(p, spec.dropout_p)
            out = p @ vv
            if grad:
                out.sum().backward()

        def fused():
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=spec.mask == "causal", attn_mask=allowed if spec.mask == "mask" else None,
                dropout_p=spec.dropout_p, enable_gqa=rep > 1)
            if grad:
                out.sum().backward()

        return time_pair(manual, fused, device, budget=budget)

    t = _cached(key, compute)
    t_manual, t_fused = t.slow_ms, t.fast_ms
    mask = {"causal": "; causal mask as is_causal=True", "mask": "; the mask as an explicit attn_mask"}.get(spec.mask, "")
    method = (f"timed matmul-scale-{'mask-' if spec.mask else ''}softmax-matmul ({t_manual:.3f} ms) against "
              f"scaled_dot_product_attention ({t_fused:.3f} ms){' fwd+bwd' if grad else ''} at the observed "
              f"shapes on {device}{mask}")
    return t.scaled(spec.per_step), method


def estimate_copy(spec, budget):
    _, shape, stride, dtype, device, per_step = spec
    dt = _DTYPES.get(dtype, torch.float32)
    inputs = _Inputs(device)
    key = ("copy", shape, stride, dt, device)

    def compute():
        if all(s > 0 for s in stride):
            storage = 1 + sum((d - 1) * s for d, s in zip(shape, stride))
            source = torch.as_strided(inputs.tensor((storage,), dt), shape, stride)
        else:
            source = inputs.tensor(shape, dt).t() if len(shape) == 2 else inputs.tensor(shape, dt)
        return time_pair(lambda: source.clone(memory_format=torch.contiguous_format), _noop, device, budget=budget)

    t = _cached(key, compute)
    return t.scaled(per_step), f"timed the forced copy ({t.saved_ms:.4f} ms) on {device}"


def estimate_pad(spec, budget):
    _, op, sig, per_step = spec
    device = "cuda"
    inputs = _Inputs(device)

    def pad(shape):
        return tuple(shape[:-2]) + tuple(-(-d // 8) * 8 for d in shape[-2:])

    padded = tuple((pad(s[0]), None, s[2]) for s in sig)
    key = ("pad", op, sig)

    def compute():
        plain = [(s[0], None, s[2]) for s in sig]
        return time_pair(_replay_dense(op, plain, inputs), _replay_dense(op, padded, inputs), device, budget=budget)

    t = _cached(key, compute)
    t_obs, t_pad = t.slow_ms, t.fast_ms
    return t.scaled(per_step), f"timed the GEMM at the observed ({t_obs:.3f} ms) and padded ({t_pad:.3f} ms) dims"


def _replay_dense(op, sig, inputs):
    tensors = [inputs.tensor(shape, dtype) for shape, _, dtype in sig]
    fn = getattr(torch.ops.aten, op).default
    return lambda: fn(*tensors)


def estimate_tiny(spec, budget):
    _, numel, launches = spec
    device = "cuda"
    n = max(8, min(int(launches), 512))
    inputs = _Inputs(device)
    key = ("tiny", numel, n)

    def compute():
        xs = [inputs.tensor((numel,), torch.float32) for _ in range(n)]

        def eager():
            for x in xs:
                x.mul_(1.0)

        return time_pair(eager, lambda: torch._foreach_mul_(xs, 1.0), device, budget=budget)

    t = _cached(key, compute)
    t_eager, t_fused = t.slow_ms, t.fast_ms
    return t.scaled(launches / n), (f"timed {n} eager launches of {numel} elements ({t_eager:.3f} ms) against one "
                                   f"fused foreach launch ({t_fused:.3f} ms) on this GPU")


ESTIMATORS = {"bf16": estimate_bf16, "loop": estimate_loop, "sdpa": estimate_sdpa, "copy": estimate_copy,
              "pad": estimate_pad, "tiny": estimate_tiny}


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    # the CPU allocator raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _free_cached_memory() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# Fixes that only make kernels shorter (no fewer launches, no less host work).
KERNEL_TIME_ONLY = frozenset({"bf16", "pad"})


def estimate(findings, budget_s: float = 3.0, on_error=None, step_ms: float | None = None,
             gpu_wait_ms: float | None = None) -> None:
    """Fill `estimated_savings_ms` and evidence["estimate_method"] where an estimator applies, with
    evidence["estimate_interval_ms"] (~95%, per step) and evidence["estimate_reliable"]. Every
    estimate and its interval are capped by the measured step time `step_ms` (a fix cannot save
    more than the step), and a fix that only shortens kernels (`KERNEL_TIME_ONLY`) by
    `gpu_wait_ms`, how long the host waited for the GPU once it had issued a step: the host's own
    time stays. A capped estimate is not reliable, but it is the better estimate.

    An estimate that runs out of memory is skipped (its finding says so) and the others are
    still made; any other failure of an estimator is also passed to `on_error`, as the guard's
    own error. Estimates run with gradients on and autocast off, whatever the caller's context.
    """
    budget = _Budget(budget_s)
    with contextlib.ExitStack() as context:
        context.enter_context(torch.random.fork_rng(
            devices=[torch.cuda.current_device()] if torch.cuda.is_initialized() else []))
        context.enter_context(torch.inference_mode(False))
        context.enter_context(torch.enable_grad())
        context.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            context.enter_context(torch.autocast("cuda", enabled=False))
        for f in findings:
            spec = f.extra.get("estimate")
            if spec is None:
                continue
            if not budget.left:
                f.evidence["estimate_method"] = "not estimated: time budget used up"
                continue
            out_of_memory = False
            try:
                ms, method = ESTIMATORS[spec[0]](spec, budget)
            except Exception as exc:  # an estimate that cannot be made is said so, not raised
                out_of_memory = _is_out_of_memory(exc)
                if out_of_memory:
                    f.evidence["estimate_method"] = f"not estimated: out of memory ({type(exc).__name__})"
                else:
                    f.evidence["estimate_method"] = f"not estimated: {type(exc).__name__}: {exc}"
                    if on_error is not None:
                        on_error(exc, f"savings estimate for {f.code}")
            else:
                saved, lo, hi, pairs = ms
                capped = step_ms is not None and saved > step_ms
                if capped:
                    f.evidence["estimate_capped_at_step_ms"] = round(step_ms, 4)
                    saved, lo, hi = step_ms, min(lo, step_ms), min(hi, step_ms)
                if spec[0] in KERNEL_TIME_ONLY and gpu_wait_ms is not None and saved > gpu_wait_ms:
                    f.evidence["estimate_capped_at_gpu_wait_ms"] = round(gpu_wait_ms, 4)
                    saved, lo, hi = gpu_wait_ms, min(lo, gpu_wait_ms), min(hi, gpu_wait_ms)
                    capped = True
                f.estimated_savings_ms = round(max(saved, 0.0), 4)
                f.evidence["estimate_method"] = method
                f.evidence["estimate_interval_ms"] = [round(lo, 4), round(hi, 4)]
                f.evidence["estimate_reliable"] = not capped and reliable(saved, lo, hi, pairs)
            if out_of_memory:  # after the except block: the traceback no longer holds the tensors
                _free_cached_memory()
