"""MAT601 at runtime: attention computed by hand (matmul, scale, mask, softmax, dropout, matmul)
as the guard's capture recognized it (`Recording.attention`), the SDPA call that computes the
same, and the timing of that call against the hand-written chain. Imported only by the guard
(needs torch)."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from matlint.runtime_guard import savings
from matlint.runtime_guard.checks import dtype_str, finding, shape_str
from matlint.runtime_guard.registry import estimator, runtime_check

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
    if any(k.keys_in_rows for k in keys):
        checks.append("the scores were computed as keys @ query (the keys in the rows, one query): SDPA's q is "
                      "that query as one row, (..., 1, d) (`h.unsqueeze(1)` where the code has `h.unsqueeze(2)`), "
                      "k the keys as they are, and its output has that one query row")
    if weights_used:
        checks.append("SDPA does not return the attention weights, which this code returns or uses: switch only "
                      "where they are not needed")
    return SdpaAdvice(kwargs, tuple(checks), exact, gqa_rep)


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


@runtime_check("MAT601")
def check_attention(rec, steps, ctx):
    groups = defaultdict(list)
    for key, stat in rec.attention.items():
        if key.in_sdpa:  # a real scaled_dot_product_attention call running its math backend
            continue
        groups[(key.qk_site, key.pv_site, key.module)].append((key, stat))
    yield from _math_backend_findings(rec, steps, ctx)
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
                f"{dtype_str(q[2])}")
        if key.module_type == "MultiheadAttention":
            msg = (f"{head}: nn.MultiheadAttention computes attention by hand when it is asked for the weights "
                   f"(need_weights=True, the default): pass need_weights=False where they are not used, and it "
                   f"runs scaled_dot_product_attention")
        else:
            msg = f"{head}: use {advice.call()} (torch.nn.functional; fused kernels)"
            if advice.checks:
                msg += "; " + "; ".join(advice.checks)
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward+backward" if key.grad else "forward",
              "shapes": [shape_str(q[0]), shape_str(k[0]), shape_str(key.v_sig[0])], "dtypes": [dtype_str(q[2])],
              "second_matmul": str(pv_site), "scaled": scaled, "scale_tensors": list(key.scale_tensors), "masks": [m.kind for m in key.masks],
              "masked": bool(key.masks), "device": ctx.device_type, "sdpa_kwargs": dict(advice.kwargs),
              "checks": list(advice.checks), "exact": advice.exact, "weights_used": weights_used}
        mask = "causal" if advice.kwargs.get("is_causal") else ("mask" if key.masks else None)
        yield finding("MAT601", qk_site, msg, ev,
                      SdpaEstimate("sdpa", bh, s_q, s_k, d, key.v_sig[0][-1], dtype_str(q[2]), ctx.device_type, mask,
                                   advice.kwargs.get("dropout_p", 0.0), key.grad, per_step,
                                   dtype_str(key.softmax_dtype), advice.gqa_rep))


@estimator("sdpa")
def estimate_sdpa(spec: SdpaEstimate, budget):
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    upcast = spec.softmax_dtype == "float32" and dt != torch.float32  # autocast runs softmax in fp32
    inputs = savings.Inputs(spec.device)
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

        return savings.time_pair(manual, fused, device, budget=budget)

    t = savings.cached(key, compute)
    t_manual, t_fused = t.slow_ms, t.fast_ms
    mask = {"causal": "; causal mask as is_causal=True", "mask": "; the mask as an explicit attn_mask"}.get(spec.mask, "")
    method = (f"timed matmul-scale-{'mask-' if spec.mask else ''}softmax-matmul ({t_manual:.3f} ms) against "
              f"scaled_dot_product_attention ({t_fused:.3f} ms){' fwd+bwd' if grad else ''} at the observed "
              f"shapes on {device}{mask}")
    return t.scaled(spec.per_step), method



# -- a real SDPA call that ran its math backend -------------------------------------------------

class SdpaBackendEstimate(NamedTuple):
    kind: str            # "sdpa_backend"
    cause: str           # "strided" (an operand's last dim is not unit-stride) or "gqa" (enable_gqa)
    bh: int              # batch × query heads
    s_q: int
    s_k: int
    d: int
    d_v: int
    dtype: str
    device: str
    rep: int             # query heads per K/V head ("gqa")
    masked: bool
    causal: bool         # the mask was exactly causal (is_causal=True)
    dropout_p: float
    grad: bool
    per_step: float


def _math_backend_cause(key) -> str | None:
    """What kept SDPA's fused kernels from this call, where the recording shows it and a change that
    keeps the call's meaning lets them run: a query or value whose last dim is not unit-stride
    (`.contiguous()` them), or K/V heads that SDPA repeated itself for `enable_gqa=True` (repeat
    them before the call). Other causes (dropout on the CPU, 3-D operands) are not told apart here."""
    q, v = key.qk_sig[0], key.v_sig
    if q[1][-1] != 1 or v[1][-1] != 1:
        return "strided"
    if key.k_repeat is not None and key.k_repeat == key.v_repeat and key.k_repeat[0] > 1:
        return "gqa"
    return None


def _math_backend_findings(rec, steps, ctx):
    sites = defaultdict(list)
    for key, stat in rec.attention.items():
        if key.in_sdpa:
            sites[key.qk_site].append((key, stat))
    for site, entries in sites.items():
        key = max(entries, key=lambda e: e[1].count)[0]
        cause = _math_backend_cause(key)
        if cause is None:
            continue
        per_step = sum(st.count for _, st in entries) / steps
        q, k = key.qk_sig
        bh, s_q, d = q[0]
        s_k = k[0][-1]
        rep = key.k_repeat[0] if cause == "gqa" else 1
        spec = SdpaBackendEstimate("sdpa_backend", cause, bh, s_q, s_k, d, key.v_sig[0][-1], dtype_str(q[2]),
                                   ctx.device_type, rep, bool(key.masks),
                                   len(key.masks) == 1 and key.masks[0].causal, key.dropout_p, key.grad, per_step)
        if not _fused_once_changed(spec):
            continue  # something else kept the fused kernels away (dropout on the CPU...): nothing to say
        head = (f"scaled_dot_product_attention ran its math backend here ({bh} heads × {s_q}×{s_k}, head dim {d}, "
                f"{dtype_str(q[2])}), which writes the whole score matrix like hand-written attention")
        if cause == "strided":
            which = "query" if q[1][-1] != 1 else "value"
            operand = q if which == "query" else key.v_sig
            msg = (f"{head}: its fused kernels need q, k and v with a unit-stride last dim, and the {which}'s has "
                   f"stride {operand[1][-1]} (strides {list(operand[1])} with batch and heads folded): pass "
                   f"`.contiguous()` operands, or produce them as (B, H, L, E) with E last")
        else:
            msg = (f"{head}: with enable_gqa=True ({rep} query heads per K/V head) no fused kernel took this "
                   f"{dtype_str(q[2])} call on {ctx.device_type}; repeat the K/V heads yourself "
                   f"(`k.repeat_interleave({rep}, dim=-3)`, v likewise) and drop enable_gqa, or run it in bf16 "
                   f"under autocast")
        ev = {"per_step": round(per_step, 2), "module": key.module, "backend": "math", "cause": cause,
              "shapes": [shape_str(q[0]), shape_str(k[0]), shape_str(key.v_sig[0])],
              "strides": [list(q[1]), list(key.v_sig[1])], "dtypes": [dtype_str(q[2])], "device": ctx.device_type}
        yield finding("MAT601", site, msg, ev, spec)


class _Softmaxes(TorchDispatchMode):
    """Whether SDPA's math backend ran: its own softmax (`_safe_softmax`) is dispatched."""

    def __init__(self):
        super().__init__()
        self.math = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_safe_softmax":
            self.math = True
        return func(*args, **(kwargs or {}))


def _explicit_mask(spec: SdpaBackendEstimate):
    """The attn_mask to time the call with: a boolean one where the observed mask was not exactly
    causal (that one goes as is_causal=True), else None."""
    if not spec.masked or spec.causal:
        return None
    return torch.ones(spec.s_q, spec.s_k, dtype=torch.bool, device=spec.device).tril()


def _fused_once_changed(spec: SdpaBackendEstimate) -> bool:
    """Whether SDPA, called once with the change the finding suggests (contiguous operands, K/V heads
    repeated) and everything else as observed (dtype, mask, dropout, grad), runs a fused backend on
    this device: only then is the change worth saying."""
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    device = spec.device
    q, k, v = (torch.randn(1, spec.bh, s, d, dtype=dt, device=device, requires_grad=spec.grad)
               for s, d in ((spec.s_q, spec.d), (spec.s_k, spec.d), (spec.s_k, spec.d_v)))
    mask = _explicit_mask(spec)
    watch = _Softmaxes()
    with watch:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=spec.dropout_p, is_causal=spec.causal)
    return not watch.math


@estimator("sdpa_backend")
def estimate_sdpa_backend(spec: SdpaBackendEstimate, budget):
    """The SDPA call as it was (math backend) against the changed one (a fused backend), fwd(+bwd)."""
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    inputs = savings.Inputs(spec.device)
    key = spec._replace(per_step=0.0)
    device, grad, rep = spec.device, spec.grad, spec.rep

    def compute():
        q = inputs.tensor((1, spec.bh, spec.s_q, spec.d), dt, requires_grad=grad)
        k = inputs.tensor((1, spec.bh // rep, spec.s_k, spec.d), dt, requires_grad=grad)
        v = inputs.tensor((1, spec.bh // rep, spec.s_k, spec.d_v), dt, requires_grad=grad)
        mask = _explicit_mask(spec)

        def call(qq, kk, vv, gqa):
            out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, dropout_p=spec.dropout_p,
                                                 is_causal=spec.causal, enable_gqa=gqa)
            if grad:
                out.sum().backward()

        if spec.cause == "strided":
            strided = [t.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(grad)
                       for t in (q, k, v)]
            return savings.time_pair(lambda: call(*strided, False), lambda: call(q, k, v, False), device,
                                     budget=budget)
        return savings.time_pair(lambda: call(q, k, v, True),
                                 lambda: call(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), False),
                                 device, budget=budget)

    t = savings.cached(key, compute)
    change = ("contiguous q, k, v" if spec.cause == "strided" else f"K/V heads repeated {rep}x, enable_gqa off")
    method = (f"timed scaled_dot_product_attention as called ({t.slow_ms:.3f} ms) against the call with "
              f"{change} ({t.fast_ms:.3f} ms){' fwd+bwd' if grad else ''} at the observed shapes on {device}")
    return t.scaled(spec.per_step), method
