"""Runtime checks, keyed by the static rules' codes: functions over a Recording -> Findings.

Each finding carries `evidence` (what was measured) and, in `extra["estimate"]`, what
`savings.py` should time to estimate the fix's worth.
"""
from __future__ import annotations

import linecache
import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from matlint.diagnostics import Finding

from .capture import GEMM_OPS, LOSS_OPS, VIEW_OPS, Site, _column_major
from .savings import LoopEstimate, SdpaEstimate

LOOP_MIN_PER_STEP = 4        # same-shape GEMMs per step from one line
TINY_MIN_PER_STEP = 32       # launches per step from one line
TINY_KERNEL_US = 10.0
TINY_NUMEL = 1 << 16
SYNC_MIN_PER_STEP = 2
PRECISION_MIN_SHARE = 0.05   # MAT401: fp32 GEMMs outside autocast below this part of the step's GEMM work: quiet
PAD_MIN_SHARE = 0.01         # MAT403: a GEMM below this part of the step's GEMM work: quiet
NEGLIGIBLE_MS = 0.01         # MAT403: a measured saving below this per step, or below
NEGLIGIBLE_STEP_SHARE = 0.01  # this part of the step: not reported
ELEMENTWISE_BINARY = frozenset({"add", "sub", "mul", "div", "rsub", "pow", "maximum", "minimum", "eq", "ne", "lt", "gt", "le", "ge"})
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"})

TITLES = {
    "MAT101": ("python-loop-matmul", "GEMMs issued one per item from a Python loop"),
    "MAT201": ("trailing-one-broadcast", "(N, 1) against (N,) silently broadcasts to (N, N)"),
    "MAT202": ("loss-shape-mismatch", "loss input and target shapes differ and broadcast"),
    "MAT302": ("strided-gemm-input", "GEMM input copied because of its layout"),
    "MAT401": ("no-mixed-precision", "fp32 GEMMs on a tensor-core GPU without TF32 or autocast"),
    "MAT403": ("gemm-dim-not-multiple-of-8", "half-precision GEMM dims not multiples of 8"),
    "MAT502": ("host-sync-in-loop", "host syncs issued per step"),
    "MAT504": ("tiny-ops", "many tiny kernel launches from one line"),
    "MAT601": ("manual-attention", "hand-written attention instead of scaled_dot_product_attention"),
}
GPU_ONLY = ("MAT401", "MAT403", "MAT504")


def rule_title(code: str) -> tuple:
    """(name, summary) from the rule catalog when the rule module exists, else our own."""
    try:
        from matlint.registry import get_rule

        rule = get_rule(code)
        if rule is not None:
            return rule.name, rule.summary
    except Exception:
        pass
    return TITLES.get(code, (code.lower(), code))


@dataclass(frozen=True)
class DeviceContext:
    device_type: str                  # where the recorded ops ran: "cuda" or "cpu"
    capability: tuple = (0, 0)
    tf32: bool = False

    @classmethod
    def from_recording(cls, rec) -> "DeviceContext":
        if "cuda" in rec.device_types and torch.cuda.is_available():
            return cls("cuda", torch.cuda.get_device_capability(), torch.backends.cuda.matmul.allow_tf32)
        return cls("cpu")

    @property
    def tensor_cores(self) -> bool:
        return self.device_type == "cuda" and self.capability >= (8, 0)


def _finding(code: str, site: Site, message: str, evidence: dict, estimate=None) -> Finding:
    line = linecache.getline(site.filename, site.lineno) if site.lineno else ""
    stripped = line.rstrip("\n")
    column = len(stripped) - len(stripped.lstrip()) + 1 if stripped.strip() else 1
    f = Finding(
        code=code, message=message, filename=site.filename, row=site.lineno or 1, column=column,
        end_row=site.lineno or 1, end_column=max(len(stripped) + 1, column), noqa_row=site.lineno or 1,
        evidence=evidence,
    )
    if estimate is not None:
        f.extra["estimate"] = estimate
    return f


def _is_tensor(entry) -> bool:
    """A signature entry for one tensor (not for a list of tensors)."""
    return isinstance(entry[0], torch.Size)


def _shape(s) -> str:
    return "(" + ", ".join(str(d) for d in s) + ")"


def _dtype(d) -> str:
    return str(d).replace("torch.", "")


def _gemm_operands(key):
    """(a_sig, b_sig) of a GEMM key: the two matrix operands."""
    if key.op in ("addmm", "baddbmm", "addbmm"):
        return key.sig[1], key.sig[2]
    return key.sig[0], key.sig[1]


def _gemm_mnk(key):
    a, b = _gemm_operands(key)
    return a[0][-2], b[0][-1], a[0][-1]


def _gemm_flops(key) -> float:
    a, b = _gemm_operands(key)
    batch = math.prod(a[0][:-2]) if len(a[0]) > 2 else 1
    m, n, k = a[0][-2], b[0][-1], a[0][-1]
    return 2.0 * batch * m * n * k


def _share(stats, rec) -> float | None:
    if not rec.profiled or rec.kernel_us_total <= 0:
        return None
    return sum(s.kernel_us for s in stats) / rec.kernel_us_total


def _common_evidence(key, per_step, stats, rec) -> dict:
    ev = {
        "per_step": round(per_step, 2),
        "module": key.module,
        "phase": "backward" if key.backward else "forward",
        "device": key.device,
        "op": key.qualname,
        "shapes": [_shape(s[0]) for s in key.sig if s and _is_tensor(s)],
        "strides": [list(s[1]) for s in key.sig if s and _is_tensor(s) and s[1] is not None],
        "dtypes": [_dtype(s[2]) for s in key.sig if s and _is_tensor(s) and s[2] is not None],
    }
    share = _share(stats, rec)
    if share is not None:
        ev["share_of_kernel_time"] = round(share, 4)
    if rec.profiled:
        ev["kernel_launches_per_step"] = round(sum(s.launches for s in stats) / max(rec.steps, 1), 2)
    return ev


# -- MAT101 ------------------------------------------------------------------------------------
def check_loop_matmul(rec, steps, ctx):
    """Same-shape GEMMs from one line, many per step, that do not feed each other (a recurrence,
    a stack of layers or a decode loop feeds each call from the one before: left alone). What to
    batch them into depends on what they share: one weight → one call on the stacked inputs; one
    input → one GEMM on the concatenated weights; neither → bmm."""
    groups = defaultdict(list)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or key.backward or key.site in rec.chained_gemm_sites or stat.compiled:
            continue
        groups[(key.op, key.site, key.sig)].append((key, stat))
    for (op, site, sig), items in groups.items():
        per_step = sum(s.count for _, s in items) / steps
        if per_step < LOOP_MIN_PER_STEP:
            continue
        key = max(items, key=lambda e: e[1].count)[0]
        a, b = _gemm_operands(key)
        n = round(per_step)
        use = rec.gemm_operands.get((op, site, sig))
        shared = ("both" if use.first == 1 and use.second == 1 else "second" if use.second == 1
                  else "first" if use.first == 1 else None) if use is not None else None
        modules = sorted({k.module for k, _ in items})
        head = f"{per_step:g} same-shape GEMMs per step from this line ({key.qualname} {_shape(a[0])} @ {_shape(b[0])})"
        if shared == "both":
            fix = "the same GEMM on the same operands each time: compute it once and reuse the result"
        elif shared == "second":
            fix = (f"one weight {_shape(b[0])} on {n} independent inputs: stack the inputs (torch.cat along the "
                   f"batch dim) and make one call of the layer, then split its output")
        elif shared == "first" and len(b[0]) == 2 and _column_major(b):  # W.t() of (out, in) weights: nn.Linear
            fix = (f"one input on {n} different weights: concatenate the weights along their output dim "
                   f"(nn.Linear weights are (out, in): torch.cat(weights, dim=0), the biases likewise) and make "
                   f"one call (F.linear), then split its output")
        elif shared == "first":
            fix = (f"one input on {n} different weights: concatenate the weights along the output dim "
                   f"(torch.cat(weights, dim=-1)) and make one GEMM, then split its output")
        else:
            batched = f"({n}, {a[0][-2]}, {a[0][-1]}) @ ({n}, {b[0][-2]}, {b[0][-1]})"
            fix = (f"independent inputs and weights: issue one batched call instead, torch.bmm/torch.einsum on "
                   f"{batched}" + (" (per-module weights: torch.func.stack_module_state + torch.vmap, or a "
                                   "grouped GEMM)" if len(modules) > 1 else ""))
        grad = any(k.backward and k.site == site and k.op in GEMM_OPS for k in rec.ops)
        ev = _common_evidence(key, per_step, [s for _, s in items], rec)
        ev["module"] = modules[0] if len(modules) == 1 else modules
        ev["shared_operand"] = shared
        ev["independent"] = True
        if shared is None:
            ev["batched_shapes"] = f"({n}, {a[0][-2]}, {a[0][-1]}) @ ({n}, {b[0][-2]}, {b[0][-1]})"
        yield _finding("MAT101", site, f"{head}: {fix}", ev,
                       LoopEstimate("loop", key.op, a[0], b[0], _dtype(a[2]), key.device, n, per_step / n, grad, shared))


# -- MAT201 / MAT202 ----------------------------------------------------------------------------
def _trailing_one_pair(a, b) -> bool:
    return len(a) == len(b) + 1 and len(b) >= 1 and a[-1] == 1 and a[-2] > 1 and b[-1] == a[-2]


def check_broadcast(rec, steps, ctx):
    seen = set()
    for key, stat in rec.ops.items():
        if key.op not in ELEMENTWISE_BINARY or key.backward or len(key.sig) < 2 or not key.out:
            continue
        if not (key.sig[0] and key.sig[1] and _is_tensor(key.sig[0]) and _is_tensor(key.sig[1])):
            continue
        a, b = key.sig[0][0], key.sig[1][0]
        out_numel = math.prod(key.out[0])
        if out_numel <= max(math.prod(a), math.prod(b)):
            continue
        if not (_trailing_one_pair(a, b) or _trailing_one_pair(b, a)):
            continue
        if (key.site, a, b) in seen:
            continue
        seen.add((key.site, a, b))
        msg = (f"{key.qualname} of {_shape(a)} and {_shape(b)} broadcasts to {_shape(key.out[0])}: "
               f"make the shapes agree (squeeze(-1) / unsqueeze) or write the outer product explicitly")
        yield _finding("MAT201", key.site, msg, _common_evidence(key, stat.count / steps, [stat], rec))


def check_loss_shape(rec, steps, ctx):
    for key, stat in rec.ops.items():
        if key.op not in LOSS_OPS or key.backward or len(key.sig) < 2:
            continue
        expanded = [i for i, s in enumerate(key.sig[:2])
                    if any(st == 0 and sz > 1 for sz, st in zip(s[0], s[1]))]
        if not expanded:
            continue
        msg = (f"{key.qualname}: input and target had different shapes and were broadcast to "
               f"{_shape(key.sig[0][0])} (strides {list(key.sig[0][1])} and {list(key.sig[1][1])}): "
               f"reshape the target to the input's shape")
        yield _finding("MAT202", key.site, msg, _common_evidence(key, stat.count / steps, [stat], rec))


# -- MAT302 --------------------------------------------------------------------------------------
def cublas_copies(shape, stride) -> bool:
    """Whether cuBLAS copies this operand first (aten's prepare_matrix_for_cublas rules)."""
    if len(shape) < 2:
        return False
    rows, cols = shape[-2], shape[-1]
    s0, s1 = stride[-2], stride[-1]
    if rows <= 1 or cols <= 1:
        return False
    if len(shape) > 2 and (s0 == 0 or s1 == 0):
        return True
    return not ((s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)))


def check_strided_gemm(rec, steps, ctx):
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or stat.compiled:
            continue
        for which, operand in zip(("first", "second"), _gemm_operands(key)):
            shape, stride, dtype = operand
            if not cublas_copies(shape, stride):
                continue
            per_step = stat.count / steps
            msg = (f"{key.qualname}'s {which} operand {_shape(shape)} has strides {list(stride)}, no unit "
                   f"stride in its last two dims: it is copied before every GEMM ({per_step:g}x per step); "
                   f"keep the layout the GEMM wants (make it contiguous once, outside the loop)")
            ev = _common_evidence(key, per_step, [stat], rec)
            ev["copied_by"] = "cuBLAS (prepare_matrix_for_cublas)" if key.device == "cuda" else "the BLAS call"
            yield _finding("MAT302", key.site, msg, ev, ("copy", shape, stride, _dtype(dtype), key.device, per_step))
    for (site, module, shape, stride, dtype), count in rec.layout_copies.items():
        per_step = count / steps
        msg = (f"matmul copied a {_shape(shape)} operand with strides {list(stride)} (clone before bmm) "
               f"{per_step:g}x per step: produce it in the layout matmul wants, or permute the other operand")
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward", "shapes": [_shape(shape)],
              "strides": [list(stride)], "dtypes": [_dtype(dtype)], "copied_by": "matmul (aten::clone before bmm)"}
        device = "cuda" if ctx.device_type == "cuda" else "cpu"
        yield _finding("MAT302", site, msg, ev, ("copy", shape, stride, _dtype(dtype), device, per_step))


# -- MAT401 / MAT403 -----------------------------------------------------------------------------
def _gemm_weight(key, stat, steps, rec) -> float:
    """A GEMM key's part of the step: its kernel time when profiled, else its FLOPs."""
    return stat.kernel_us if rec.profiled and rec.kernel_us_total > 0 else _gemm_flops(key) * stat.count / steps


def _gemm_total(rec, steps) -> float:
    return sum(_gemm_weight(k, s, steps, rec) for k, s in rec.ops.items() if k.op in GEMM_OPS and k.device == "cuda")


def check_precision(rec, steps, ctx):
    """fp32 GEMMs run outside any autocast region, on a tensor-core GPU with TF32 off, when they are a
    real part of the step's GEMM work. fp32 GEMMs inside an autocast region (one turned off with
    enabled=False: kept in fp32 on purpose) are left alone."""
    if not ctx.tensor_cores or ctx.tf32:
        return
    fp32 = [(k, s) for k, s in rec.ops.items()
            if k.op in GEMM_OPS and k.device == "cuda" and _gemm_operands(k)[0][2] == torch.float32]
    plain = [(k, s) for k, s in fp32 if k.amp == ""]
    if not plain:
        return
    total = _gemm_total(rec, steps)
    share = sum(_gemm_weight(k, s, steps, rec) for k, s in plain) / total if total else 1.0
    if share < PRECISION_MIN_SHARE:
        return
    by_site = defaultdict(float)
    for k, s in plain:
        by_site[k.site] += _gemm_flops(k) * s.count / steps
    top_site = max(by_site, key=by_site.get)
    total_flops = sum(by_site.values())
    count = sum(s.count for _, s in plain) / steps
    autocast_elsewhere = any(k.amp and _gemm_operands(k)[0][2] in (torch.bfloat16, torch.float16)
                             for k in rec.ops if k.op in GEMM_OPS)
    where = "outside the step's autocast region" if autocast_elsewhere else "with no autocast"
    measure = "kernel time" if rec.profiled and rec.kernel_us_total > 0 else "FLOPs"
    msg = (f"{count:g} fp32 GEMMs per step ({total_flops / 1e9:.3g} GFLOP, {share:.0%} of the step's GEMM "
           f"{measure}) {where} on a tensor-core GPU (sm_{ctx.capability[0]}{ctx.capability[1]}) with TF32 off: "
           f"run them under torch.autocast('cuda', dtype=torch.bfloat16) or "
           f"torch.set_float32_matmul_precision('high')")
    ev = {"per_step": round(count, 2), "gflop_per_step": round(total_flops / 1e9, 3), "device": "cuda",
          "share_of_gemm_" + ("time" if measure == "kernel time" else "flops"): round(share, 4),
          "top_sites": [{"site": str(s), "gflop": round(f / 1e9, 3)}
                        for s, f in sorted(by_site.items(), key=lambda kv: -kv[1])[:5]],
          "phase": "forward+backward" if any(k.backward for k, _ in plain) else "forward"}
    kept = sum(s.count for k, s in fp32 if k.amp) / steps
    if kept:
        ev["fp32_on_purpose_per_step"] = round(kept, 2)  # in autocast(enabled=False) regions: not counted
    kshare = _share([s for _, s in plain], rec)
    if kshare is not None:
        ev["share_of_kernel_time"] = round(kshare, 4)
    gemms = [(k.op, k.sig, s.count / steps) for k, s in plain]
    yield _finding("MAT401", top_site, msg, ev, ("bf16", gemms))


def check_dims_multiple_of_8(rec, steps, ctx):
    if not ctx.tensor_cores:
        return
    total = _gemm_total(rec, steps)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or key.device != "cuda":
            continue
        a, _ = _gemm_operands(key)
        if a[2] not in (torch.bfloat16, torch.float16):
            continue
        m, n, k = _gemm_mnk(key)
        bad = {name: d for name, d in (("M", m), ("N", n), ("K", k)) if d % 8}
        if not bad or max(m, n, k) < 64:
            continue
        if total and _gemm_weight(key, stat, steps, rec) / total < PAD_MIN_SHARE:
            continue  # too small a part of the step's GEMM work for padding to matter
        dims = ", ".join(f"{name}={d}" for name, d in bad.items())
        msg = (f"{_dtype(a[2])} GEMM with {dims} (not multiples of 8): tensor cores run it slowly; pad "
               f"the dimension to a multiple of 8 (vocab, hidden or head size)")
        per_step = stat.count / steps
        yield _finding("MAT403", key.site, msg, _common_evidence(key, per_step, [stat], rec),
                       ("pad", key.op, key.sig, per_step))


def negligible(finding, step_ms: float | None) -> bool:
    """A MAT403 or MAT401 finding whose measured saving is too small to act on: under 0.01 ms per
    step, or under 1% of the step (MAT401's where the host, not the GPU, bounds the step)."""
    ms = finding.estimated_savings_ms
    if finding.code not in ("MAT403", "MAT401") or ms is None:
        return False
    return ms < NEGLIGIBLE_MS or (step_ms is not None and ms < NEGLIGIBLE_STEP_SHARE * step_ms)


# -- MAT502 / MAT504 -----------------------------------------------------------------------------
def _is_sync(key) -> bool:
    if key.op in SYNC_OPS:
        # On CPU nothing syncs; count what would on a GPU, issued by the user's own code.
        return key.device == "cuda" or key.direct
    return bool(key.out) and key.out[2] == "d2h"


def check_host_syncs(rec, steps, ctx):
    per_site = defaultdict(lambda: [0, []])
    for key, stat in rec.ops.items():
        if key.backward or not _is_sync(key):
            continue
        entry = per_site[(key.site, key.module)]
        entry[0] += stat.count
        entry[1].append(key)
    reported = set()
    for (site, module), (count, keys) in per_site.items():
        per_step = count / steps
        if per_step < SYNC_MIN_PER_STEP:
            continue
        ops = sorted({k.qualname for k in keys})
        where = "each one waits for the GPU" if ctx.device_type == "cuda" else "on a GPU each one would wait for the device"
        msg = (f"{per_step:g} host syncs per step from this line ({', '.join(ops)}): {where}; keep the values "
               f"on the device and read them once per step (or every N steps)")
        ev = {"per_step": round(per_step, 2), "module": module, "ops": ops, "device": ctx.device_type,
              "phase": "forward"}
        reported.add(site)
        yield _finding("MAT502", site, msg, ev)
    # The rest that torch's own sync detector saw (syncs.py): ops that wait inside C++, such as
    # boolean-mask indexing or a shape read off the data.
    for site, count in rec.syncs.items():
        per_step = count / steps
        if site in reported or per_step < SYNC_MIN_PER_STEP:
            continue
        msg = (f"{per_step:g} host syncs per step from this line, found by torch's sync detector (an op that "
               f"waits for the GPU inside: boolean-mask indexing, `nonzero`, a shape read off the data, a copy to "
               f"the host): keep the work on the device (`torch.where`, masks of fixed shape) or do it every N steps")
        yield _finding("MAT502", site, msg, {"per_step": round(per_step, 2), "device": "cuda", "phase": "forward",
                                             "found_by": "torch.cuda.set_sync_debug_mode"})


def check_tiny_ops(rec, steps, ctx):
    if ctx.device_type != "cuda":
        return
    # per line and module, forward only: the same line in every layer, or a layer's backward
    # kernels, are not a loop that one fused call could replace
    per_site = defaultdict(list)
    for key, stat in rec.ops.items():
        if key.device != "cuda" or key.backward or key.op in VIEW_OPS or stat.compiled or not key.out:
            continue
        per_site[(key.site, key.module)].append((key, stat))
    for (site, module), items in per_site.items():
        if rec.profiled:
            tiny = [(k, s) for k, s in items if s.launches and s.kernel_us / s.launches < TINY_KERNEL_US]
            launches = sum(s.launches for _, s in tiny) / steps
            kernel_us = sum(s.kernel_us for _, s in tiny) / max(sum(s.launches for _, s in tiny), 1)
        else:
            tiny = [(k, s) for k, s in items if math.prod(k.out[0]) <= TINY_NUMEL]
            launches = sum(s.count for _, s in tiny) / steps
            kernel_us = None
        if launches < TINY_MIN_PER_STEP:
            continue
        size = f"< {TINY_KERNEL_US:g} µs each (avg {kernel_us:.1f} µs)" if kernel_us is not None else f"on ≤ {TINY_NUMEL} elements each"
        msg = (f"{launches:g} kernel launches per step {size} from this line: fuse them with torch.compile, "
               f"capture the step in a CUDA graph, or use torch._foreach_* ops for per-tensor loops")
        ev = {"per_step": round(launches, 2), "module": module, "device": "cuda",
              "ops": sorted({k.qualname for k, _ in tiny})[:10], "phase": "forward"}
        if kernel_us is not None:
            ev["avg_kernel_us"] = round(kernel_us, 2)
        share = _share([s for _, s in tiny], rec)
        if share is not None:
            ev["share_of_kernel_time"] = round(share, 4)
        numel = max(1, int(sum(math.prod(k.out[0]) for k, _ in tiny) / len(tiny)))
        yield _finding("MAT504", site, msg, ev, ("tiny", numel, launches))


# -- MAT601 ----------------------------------------------------------------------------------------
_ATTN_MASK_ARG = {"masked_fill": "~mask", "where": "mask", "where_inv": "~mask"}
_ADDED = ("additive", "subtractive")  # a float mask added to the scores: attn_mask is it times MaskFact.factor
_MASK_SAYS = {
    "masked_fill": "attn_mask=~mask: SDPA's boolean mask marks the positions that take part, masked_fill's "
                   "the ones filled",
    "where": "attn_mask=mask: the where() condition, True where positions take part",
    "where_inv": "attn_mask=~mask: the where() condition inverted (it marked the positions filled)",
    "additive": "attn_mask=mask: the float mask added to the scores, as is",
    "subtractive": "attn_mask=-mask: the tensor subtracted from the scores, negated",
}


def _mask_times(factor: float) -> str:
    """attn_mask for an added mask: the user's `mask` times the factor it reached the scores with."""
    if factor == 1:
        return "mask"
    if factor == -1:
        return "-mask"
    return f"mask * {float(f'{factor:.8g}')!r}"


def _mask_arg(mask) -> str:
    return _mask_times(mask.factor) if mask.kind in _ADDED else _ATTN_MASK_ARG[mask.kind]


@dataclass(frozen=True)
class SdpaAdvice:
    """The SDPA call that computes what the hand-written attention computed, and what the guard
    could not establish (said as what to check)."""
    kwargs: dict          # SDPA keyword arguments; attn_mask as an expression of the user's `mask`
    checks: tuple         # what the user must check before switching
    exact: bool           # the call computes the same (up to rounding) when the checks hold
    gqa_rep: int = 1      # K/V heads repeated this many times (enable_gqa=True)

    def call(self) -> str:
        args = ["q", "k", "v"]
        for name, value in self.kwargs.items():
            if name == "attn_mask":
                args.append(f"attn_mask={value}")
            elif name == "dropout_p":
                args.append(f"dropout_p={value:g} if self.training else 0.0")
            elif name == "scale":
                args.append(f"scale={float(f'{value:.8g}')!r}")
            else:
                args.append(f"{name}={value}")
        return "F.scaled_dot_product_attention(" + ", ".join(args) + ")"


def sdpa_advice(keys, weights_used: bool) -> SdpaAdvice:
    """What to pass SDPA so that it computes what every observed call of one attention site did."""
    kwargs, checks, exact = {}, [], True
    mask_kinds = {tuple(m.kind for m in k.masks) for k in keys}
    kinds = sorted(mask_kinds, key=len)[-1]
    causal = len(mask_kinds) == 1 and len(kinds) == 1 and all(k.masks[0].causal for k in keys)
    factors = {m.factor for k in keys for m in k.masks if m.kind in _ADDED}
    if None in factors:
        checks.append("the float mask was added before the scores were scaled by a tensor, and SDPA adds attn_mask "
                      "after scaling: pass attn_mask=mask scaled by that tensor as the scores were")
        exact = False
    elif len(factors) > 1:
        checks.append(f"the float mask reached the scores with a different factor between calls "
                      f"({', '.join(f'{v:.6g}' for v in sorted(factors))}): pass each call's mask times its factor")
        exact = False
    if len(mask_kinds) > 1:
        checks.append(f"the scores were masked differently between calls ({', '.join('+'.join(m) or 'no mask' for m in sorted(mask_kinds))}): "
                      f"pass each call's mask as attn_mask")
    if "fill" in kinds:
        fills = sorted({m.fill for k in keys for m in k.masks if m.kind == "fill"})
        checks.append(f"check the masking: the scores were filled with {', '.join(f'{v:g}' for v in fills)} (not -inf "
                      f"or a large negative value), which SDPA has no equivalent for")
        exact = False
    elif causal:
        kwargs["is_causal"] = True
        checks.append("is_causal=True: the mask was exactly causal (lower-triangular) in every observed call; if it "
                      "can also hide padding, pass it as attn_mask= instead")
    elif None in factors:
        pass  # said above: the mask's factor is a tensor's value
    elif len(kinds) == 1:
        mask = keys[0].masks[0]
        kwargs["attn_mask"] = _mask_arg(mask)
        if mask.kind in _ADDED and mask.factor not in (1, -1):
            checks.append(f"attn_mask={kwargs['attn_mask']}: the float mask reached the scores times "
                          f"{mask.factor:.6g} (baddbmm's beta, or a scale applied after it), and SDPA adds "
                          f"attn_mask as it is")
        else:
            checks.append(_MASK_SAYS[kinds[0]])
    elif kinds:
        kwargs["attn_mask"] = "mask"
        checks.append(f"combine the {len(kinds)} masks ({', '.join(kinds)}) into one attn_mask (boolean: True where "
                      f"positions take part; or one additive float mask); is_causal cannot be combined with attn_mask")
    dropout = max(k.dropout_p for k in keys)
    if dropout:
        kwargs["dropout_p"] = dropout
    elif any(k.training is False or not k.grad for k in keys):  # a dropout would not have run: unseen
        checks.append("observed in eval mode or without grad: if this code applies dropout to the weights in "
                      "training, pass dropout_p=p if self.training else 0.0")
    scales = {k.scale for k in keys}
    tensors = {k.scale_tensors for k in keys}
    d = keys[0].qk_sig[0][0][-1]
    if len(tensors) > 1:
        checks.append("the scores were scaled by tensors differently between calls: scale q by each call's tensor "
                      "factors first")
        exact = False
    elif tensors != {()}:
        [ops] = tensors
        how = " then ".join("multiply q by" if op == "mul" else "divide q by" for op in ops)
        checks.append(f"the scores were {' then '.join({'mul': 'multiplied', 'div': 'divided'}[op] for op in ops)} by "
                      f"{'a tensor' if len(ops) == 1 else 'tensors'}: {how} {'it' if len(ops) == 1 else 'them'} first "
                      f"(shaped to broadcast over q); scale= is the numeric factor alone")
    if len(scales) > 1:
        checks.append(f"the scale differed between calls ({', '.join(f'{v:.6g}' for v in sorted(scales))}): pass "
                      f"each call's as scale=")
        exact = False
    else:
        [scale] = scales
        if abs(scale - 1.0 / math.sqrt(d)) > 1e-6 / math.sqrt(d):
            kwargs["scale"] = scale  # SDPA's default is 1/sqrt(head dim); this is not it
    reps = {(k.k_repeat, k.v_repeat) for k in keys}
    gqa_rep = 1
    if len(reps) == 1:
        [(k_rep, v_rep)] = reps
        if k_rep is not None and k_rep == v_rep and k_rep[1]:
            kwargs["enable_gqa"] = True
            gqa_rep = k_rep[0]
            checks.append(f"enable_gqa=True with k and v from before the head repeat ({gqa_rep}x fewer K/V heads "
                          f"than query heads): no repeated copy")
        elif k_rep is not None and k_rep == v_rep:
            checks.append(f"K/V heads were tiled with repeat (query head h reads K/V head h mod n_kv); enable_gqa "
                          f"pairs head h with K/V head h // {k_rep[0]}: keep passing the repeated k and v (or "
                          f"repeat_interleave them, then enable_gqa=True)")
    if weights_used:
        checks.append("SDPA does not return the attention weights, which this code returns or uses: switch only "
                      "where they are not needed")
    return SdpaAdvice(kwargs, tuple(checks), exact, gqa_rep)


def check_attention(rec, steps, ctx):
    groups = defaultdict(list)
    for key, stat in rec.attention.items():
        if key.in_sdpa:  # a real scaled_dot_product_attention call running its math backend
            continue
        groups[(key.qk_site, key.pv_site, key.module)].append((key, stat))
    for (qk_site, pv_site, module), entries in groups.items():
        keys = [k for k, _ in entries]
        key = max(entries, key=lambda e: e[1].count)[0]
        count = sum(st.count for _, st in entries)
        weights_used = any(st.weights_used for _, st in entries)
        advice = sdpa_advice(keys, weights_used)
        q, k = key.qk_sig
        bh, s_q, d = q[0]
        s_k = k[0][-1]
        per_step = count / steps
        scaled = key.scale != 1.0 or bool(key.scale_tensors)
        parts = (["matmul"] + (["scale"] if scaled else []) + [m.kind.split("_")[0] for m in key.masks]
                 + ["softmax"] + (["dropout"] if key.dropout_p else []) + ["matmul"])
        head = (f"hand-written attention ({' → '.join(parts)}) on {bh} heads × {s_q}×{s_k}, head dim {d}, "
                f"{_dtype(q[2])}")
        if key.module_type == "MultiheadAttention":
            msg = (f"{head}: nn.MultiheadAttention computes attention by hand when it is asked for the weights "
                   f"(need_weights=True, the default): pass need_weights=False where they are not used, and it "
                   f"runs scaled_dot_product_attention")
        else:
            msg = f"{head}: use {advice.call()} (torch.nn.functional; fused kernels)"
            if advice.checks:
                msg += "; " + "; ".join(advice.checks)
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward+backward" if key.grad else "forward",
              "shapes": [_shape(q[0]), _shape(k[0]), _shape(key.v_sig[0])], "dtypes": [_dtype(q[2])],
              "second_matmul": str(pv_site), "scaled": scaled, "scale_tensors": list(key.scale_tensors), "masks": [m.kind for m in key.masks],
              "masked": bool(key.masks), "device": ctx.device_type, "sdpa_kwargs": dict(advice.kwargs),
              "checks": list(advice.checks), "exact": advice.exact, "weights_used": weights_used}
        mask = "causal" if advice.kwargs.get("is_causal") else ("mask" if key.masks else None)
        yield _finding("MAT601", qk_site, msg, ev,
                       SdpaEstimate("sdpa", bh, s_q, s_k, d, key.v_sig[0][-1], _dtype(q[2]), ctx.device_type, mask,
                                    advice.kwargs.get("dropout_p", 0.0), key.grad, per_step,
                                    _dtype(key.softmax_dtype), advice.gqa_rep))


CHECKS = {
    "MAT101": check_loop_matmul,
    "MAT201": check_broadcast,
    "MAT202": check_loss_shape,
    "MAT302": check_strided_gemm,
    "MAT401": check_precision,
    "MAT403": check_dims_multiple_of_8,
    "MAT502": check_host_syncs,
    "MAT504": check_tiny_ops,
    "MAT601": check_attention,
}


def run_checks(rec, guard=None, ctx: DeviceContext | None = None) -> list:
    ctx = ctx or DeviceContext.from_recording(rec)
    steps = max(rec.steps, 1)
    findings = []
    for code, check in CHECKS.items():
        if guard is not None and not guard.selects(code):
            continue
        if code in GPU_ONLY and not ctx.tensor_cores and guard is not None:
            guard.notes.append(f"{code} ({rule_title(code)[0]}) needs a CUDA GPU with tensor cores; "
                               f"not evaluated on {ctx.device_type}")
        try:
            findings.extend(check(rec, steps, ctx))
        except Exception as exc:
            if guard is not None:
                guard.recorder.fail(exc, f"check {code}")
            else:
                raise
    findings.sort(key=lambda f: (f.code, f.filename, f.row))
    return findings
