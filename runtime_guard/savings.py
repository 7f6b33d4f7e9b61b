"""Savings estimates: time the suggested alternative at the observed shapes on this device.

The estimators live with their rules (`rules/<rule>/runtime.py`, registered with
`registry.estimator` for the `kind` of the estimate specs they time); this module runs them and
holds what they share: paired timing (`time_pair`), inputs (`Inputs`), the per-shape cache
(`cached`) and the time budget.

Runs after the guarded code (never inside the user's step), draws inputs from a private
generator (the user's RNG streams are untouched), caches timings per shape, and stops at a
time budget. Each estimate is milliseconds per step and says how it was made.
"""
from __future__ import annotations

import contextlib
import math
from time import perf_counter
from dataclasses import dataclass

import torch

from . import registry

_cache: dict = {}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
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


def noop() -> None:
    return None


class Inputs:
    """Tensors of given shapes drawn from a private generator (the user's RNG streams are untouched)."""

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


def cached(key, compute):
    """`compute()`'s timing, once per key (shapes, dtype, device) for the whole process."""
    if key not in _cache:
        _cache[key] = compute()
    return _cache[key]


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    # the CPU allocator raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _free_cached_memory() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def launch_ms(device: str) -> float:
    """Host time to issue one small kernel on `device` (a bf16 cast of a few elements), median of
    200 issued back to back; measured once per process."""
    def compute() -> float:
        x = torch.ones(8, device=device)
        for _ in range(20):
            x.to(torch.bfloat16)
        _sync(device)
        times = []
        for _ in range(200):
            start = perf_counter()
            x.to(torch.bfloat16)
            times.append(perf_counter() - start)
        _sync(device)
        return sorted(times)[len(times) // 2] * 1e3

    return cached(("launch", device), compute)


def capped_saving(evidence: dict, saved: float, lo: float, hi: float, step_ms: float | None,
                  gpu_wait_ms: float | None, kernel_time_only: bool) -> tuple:
    """(saved, lo, hi, capped, capped by the GPU wait): a saving and its interval capped by the step
    time, and a fix that only shortens kernels by how long the host waited for the GPU (see
    `estimate`); the caps that bound are recorded in `evidence`."""
    capped = step_ms is not None and saved > step_ms
    if capped:
        evidence["estimate_capped_at_step_ms"] = round(step_ms, 4)
        saved, lo, hi = step_ms, min(lo, step_ms), min(hi, step_ms)
    waited = kernel_time_only and gpu_wait_ms is not None and saved > gpu_wait_ms
    if waited:
        evidence["estimate_capped_at_gpu_wait_ms"] = round(gpu_wait_ms, 4)
        saved, lo, hi = gpu_wait_ms, min(lo, gpu_wait_ms), min(hi, gpu_wait_ms)
    return saved, lo, hi, capped or waited, waited


def estimate(findings, budget_s: float = 3.0, on_error=None, step_ms: float | None = None,
             gpu_wait_ms: float | None = None) -> None:
    """Fill `estimated_savings_ms` and evidence["estimate_method"] where an estimator applies, with
    evidence["estimate_interval_ms"] (~95%, per step) and evidence["estimate_reliable"]. Every
    estimate and its interval are capped by the measured step time `step_ms` (a fix cannot save
    more than the step), and a fix that only shortens kernels (an estimator registered `kernel_time_only`) by
    `gpu_wait_ms`, how long the host waited for the GPU once it had issued a step: the host's own
    time stays. Where that cap binds, the host bounds the step, and each kernel the fix adds (a
    spec's `added_launches` per step: autocast's casts) lengthens it by the host time of issuing
    one (`launch_ms`): that is taken off, and a fix that makes the step slower saves 0. A capped
    estimate is not reliable, but it is the better estimate.

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
        registered = registry.estimators()
        for f in findings:
            spec = f.extra.get("estimate")
            if spec is None:
                continue
            if not budget.left:
                f.evidence["estimate_method"] = "not estimated: time budget used up"
                continue
            out_of_memory = False
            try:
                ms, method = registered[spec.kind].fn(spec, budget)
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
                saved, lo, hi, capped, waited = capped_saving(f.evidence, saved, lo, hi, step_ms, gpu_wait_ms,
                                                              registered[spec.kind].kernel_time_only)
                if waited:
                    launches = getattr(spec, "added_launches", 0)
                    if launches:
                        added = launches * launch_ms("cuda" if torch.cuda.is_available() else "cpu")
                        f.evidence["estimate_less_added_launches_ms"] = round(added, 4)
                        saved, lo, hi = saved - added, lo - added, hi - added
                shown = round(max(saved, 0.0), 4)
                if step_ms is not None and shown > step_ms:  # rounding lifted it over the step: round down
                    shown = math.floor(max(saved, 0.0) * 1e4) / 1e4
                f.estimated_savings_ms = shown
                f.evidence["estimate_method"] = method
                f.evidence["estimate_interval_ms"] = [round(lo, 4), round(hi, 4)]
                f.evidence["estimate_reliable"] = not capped and reliable(saved, lo, hi, pairs)
            if out_of_memory:  # after the except block: the traceback no longer holds the tensors
                _free_cached_memory()
