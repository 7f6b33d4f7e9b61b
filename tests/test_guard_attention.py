"""MAT601 at run time: the SDPA call the guard suggests computes what the hand-written attention
computed. Per suggestion form, the module is run under the guard, the finding's SDPA arguments
are applied to a rewrite that shares the module's weights, and outputs and gradients are compared;
a real scaled_dot_product_attention call (whatever backend it runs) is never reported."""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402

# MATLINT_TEST_DEVICE=cuda runs the same tests on a GPU (fp32; its SDPA kernels differ from the
# math of the original by more rounding, and its dropout draws from another stream than F.dropout)
DEVICE = os.environ.get("MATLINT_TEST_DEVICE", "cpu")
TOL = dict(atol=1e-5, rtol=1e-4) if DEVICE == "cpu" else dict(atol=1e-4, rtol=1e-3)
B, S, HEADS, HEAD_DIM = 2, 12, 4, 8
PAD = torch.zeros(B, S, dtype=torch.bool, device=DEVICE)
PAD[0, -3:] = True   # the first sequence has 3 padding positions
PAD[1, -1:] = True


def padding_fill_mask(s):
    return PAD[:, None, None, :s]                       # True = filled (masked out)


def causal_fill_mask(s):
    return torch.ones(s, s, dtype=torch.bool, device=DEVICE).triu(1)   # True = filled


MASKS = {
    # name: (how the scores are masked, the `mask` tensor the user has)
    "none": (None, lambda s: None),
    "causal_fill": ("fill", causal_fill_mask),
    "padding_fill": ("fill", padding_fill_mask),
    "padding_fill_min": ("fill_min", padding_fill_mask),
    "causal_where": ("where", lambda s: ~causal_fill_mask(s)),         # True = takes part
    "padding_where": ("where", lambda s: ~padding_fill_mask(s)),
    "padding_where_inv": ("where_inv", padding_fill_mask),                   # True = filled
    "causal_additive": ("add", lambda s: torch.zeros(s, s, device=DEVICE).masked_fill(causal_fill_mask(s),
                                                                                     float("-inf"))),
    "padding_additive": ("add", lambda s: torch.zeros(B, 1, 1, s, device=DEVICE).masked_fill(padding_fill_mask(s),
                                                                                             -1e9)),
    "bias_additive": ("add", lambda s: torch.randn(HEADS, s, s, generator=torch.Generator().manual_seed(3)).to(DEVICE)),
}


class HandAttention(nn.Module):
    """Attention written out by hand, in the variants users write."""

    def __init__(self, mask="none", scale="sqrt", dropout=0.0, kv_heads=HEADS, repeat="interleave",
                 return_weights=False, dropout_module=False):
        super().__init__()
        torch.manual_seed(0)
        d = HEADS * HEAD_DIM
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, kv_heads * HEAD_DIM)
        self.v = nn.Linear(d, kv_heads * HEAD_DIM)
        self.out = nn.Linear(d, d)
        self.mask_how, self.mask_of = MASKS[mask]
        self.scale, self.dropout, self.kv_heads, self.repeat = scale, dropout, kv_heads, repeat
        self.return_weights = return_weights
        self.drop = nn.Dropout(dropout) if dropout_module else None  # a submodule that returns the weights
        self.temperature = nn.Parameter(torch.tensor(0.3))
        self.to(DEVICE)

    def heads(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, HEAD_DIM).transpose(1, 2)
        return q, k, v

    def repeat_kv(self, t):
        n = HEADS // self.kv_heads
        if n == 1:
            return t
        if self.repeat == "interleave":
            return t.repeat_interleave(n, dim=1)
        if self.repeat == "expand":  # Llama's repeat_kv
            b, h, s, d = t.shape
            return t[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)
        return t.repeat(1, n, 1, 1)  # tiled: head h reads K/V head h % kv_heads

    def attend(self, q, k, v):
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        scores = q @ k.transpose(-2, -1)  # <- here
        if self.scale == "sqrt":
            scores = scores / math.sqrt(HEAD_DIM)
        elif self.scale == "custom":
            scores = scores * 0.05
        elif self.scale == "tensor":
            scores = scores * self.temperature
        mask = self.mask_of(q.shape[-2])
        if self.mask_how == "fill":
            scores = scores.masked_fill(mask, float("-inf"))
        elif self.mask_how == "fill_min":
            scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        elif self.mask_how == "fill_zero":
            scores = scores.masked_fill(mask, 0.0)
        elif self.mask_how == "where":
            scores = torch.where(mask, scores, float("-inf"))
        elif self.mask_how == "where_inv":
            scores = torch.where(mask, float("-inf"), scores)
        elif self.mask_how == "add":
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        if self.drop is not None:
            weights = self.drop(weights)
        else:
            weights = F.dropout(weights, self.dropout, training=self.training)
        return weights @ v, weights

    def forward(self, x):
        b, s, _ = x.shape
        out, weights = self.attend(*self.heads(x))
        out = self.out(out.transpose(1, 2).reshape(b, s, -1))
        return (out, weights) if self.return_weights else out


def rewrite(model, x, sdpa_kwargs):
    """The module with its attention replaced by the suggested SDPA call (same weights)."""
    b, s, _ = x.shape
    q, k, v = model.heads(x)
    kwargs = dict(sdpa_kwargs)
    if not kwargs.pop("enable_gqa", False):
        k, v = model.repeat_kv(k), model.repeat_kv(v)
    else:
        kwargs["enable_gqa"] = True
    if "attn_mask" in kwargs:  # an expression of the user's mask, as the message writes it
        kwargs["attn_mask"] = eval(kwargs["attn_mask"], {"mask": model.mask_of(s)})
    if "dropout_p" in kwargs and not model.training:
        kwargs["dropout_p"] = 0.0
    if model.scale == "tensor":
        q = q * model.temperature  # what the check says to do with a tensor scale
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return model.out(out.transpose(1, 2).reshape(b, s, -1))


def observe(model, x, steps=3):
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1)
    with g:
        for _ in range(steps):
            out = model(x)
            (out[0] if isinstance(out, tuple) else out).square().mean().backward()
            g.step()
    model.zero_grad()
    return g


def mat601(g):
    found = [f for f in g.findings if f.code == "MAT601"]
    assert len(found) <= 1, [f.message for f in found]
    return found[0] if found else None


def outputs_and_grads(fn, model, x, seed=7):
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = fn(x)
    out = out[0] if isinstance(out, tuple) else out
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.square().mean(), [x] + params, allow_unused=True)
    return out, grads


def assert_equivalent(model, x, kwargs):
    out0, grads0 = outputs_and_grads(model, model, x)
    out1, grads1 = outputs_and_grads(lambda t: rewrite(model, t, kwargs), model, x)
    # padded query rows are fine too: no row here is masked entirely
    torch.testing.assert_close(out1, out0, **TOL)
    for g0, g1 in zip(grads0, grads1):
        if g0 is None:  # only the unused temperature parameter
            continue
        torch.testing.assert_close(g1, g0, **TOL)


X = torch.randn(B, S, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(1)).to(DEVICE)

# (module options, the SDPA keyword arguments the guard must suggest)
FORMS = {
    "unmasked": (dict(), {}),
    "causal masked_fill": (dict(mask="causal_fill"), {"is_causal": True}),
    "padding masked_fill": (dict(mask="padding_fill"), {"attn_mask": "~mask"}),
    "padding masked_fill finfo.min": (dict(mask="padding_fill_min"), {"attn_mask": "~mask"}),
    "causal where": (dict(mask="causal_where"), {"is_causal": True}),
    "padding where": (dict(mask="padding_where"), {"attn_mask": "mask"}),
    "padding where, filled first": (dict(mask="padding_where_inv"), {"attn_mask": "~mask"}),
    "causal additive": (dict(mask="causal_additive"), {"is_causal": True}),
    "padding additive": (dict(mask="padding_additive"), {"attn_mask": "mask"}),
    "relative-position bias": (dict(mask="bias_additive"), {"attn_mask": "mask"}),
    "no scale": (dict(scale="none"), {"scale": 1.0}),
    "custom scale": (dict(scale="custom"), {"scale": 0.05}),
    "tensor scale": (dict(scale="tensor"), {"scale": 1.0}),
    "dropout": (dict(dropout=0.2), {"dropout_p": 0.2}),
    "nn.Dropout": (dict(dropout=0.2, dropout_module=True), {"dropout_p": 0.2}),
    "GQA repeat_interleave": (dict(kv_heads=2, mask="causal_fill"), {"is_causal": True, "enable_gqa": True}),
    "GQA expand+reshape": (dict(kv_heads=1, repeat="expand"), {"enable_gqa": True}),
    "tiled repeat": (dict(kv_heads=2, repeat="tile"), {}),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_suggested_sdpa_call_computes_the_same(form):
    options, expected = FORMS[form]
    model = HandAttention(**options)
    f = mat601(observe(model, X))
    assert f is not None
    assert f.evidence["sdpa_kwargs"] == pytest.approx(expected)
    assert f.evidence["exact"]
    assert not f.evidence["weights_used"]  # none of these returns or reads its weights
    # the written call says the same as the structured arguments
    assert "F.scaled_dot_product_attention(q, k, v" in f.message
    for name, value in expected.items():
        assert f"{name}=" in f.message
    for mode in ("train", "eval") if DEVICE == "cpu" or not options.get("dropout") else ("eval",):
        getattr(model, mode)()
        assert_equivalent(model, X, f.evidence["sdpa_kwargs"])


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU SDPA draws its dropout mask from another stream")
def test_dropout_rewrite_draws_the_same_mask_on_cpu():
    """In training, SDPA's math backend on CPU draws its dropout mask as F.dropout does: with the
    same seed the rewrite matches exactly, so the suggested dropout_p is the module's."""
    model = HandAttention(dropout=0.2).train()
    f = mat601(observe(model, X))
    assert "dropout_p=0.2 if self.training else 0.0" in f.message
    out0, _ = outputs_and_grads(model, model, X)
    out1, _ = outputs_and_grads(lambda t: rewrite(model, t, f.evidence["sdpa_kwargs"]), model, X)
    out2, _ = outputs_and_grads(lambda t: rewrite(model, t, {}), model, X)
    torch.testing.assert_close(out1, out0, **TOL)
    assert not torch.allclose(out2, out0, atol=1e-3)  # without dropout_p it differs


def test_is_causal_only_for_an_exactly_causal_mask():
    # lower-triangular but shifted by one: not SDPA's causal mask
    model = HandAttention(mask="causal_fill")
    model.mask_of = lambda s: torch.ones(s, s, dtype=torch.bool, device=DEVICE).triu(2)
    f = mat601(observe(model, X))
    assert f.evidence["sdpa_kwargs"] == {"attn_mask": "~mask"}
    assert "is_causal" not in f.message
    assert_equivalent(model, X, f.evidence["sdpa_kwargs"])


def test_causal_advice_says_to_check_for_padding():
    f = mat601(observe(HandAttention(mask="causal_fill"), X))
    assert "is_causal=True" in f.message and "if it can also hide padding, pass it as attn_mask=" in f.message


def test_a_fill_that_is_not_a_mask_says_what_to_check():
    model = HandAttention(mask="padding_fill")
    model.mask_how = "fill_zero"  # filled with 0: not removed from the softmax
    f = mat601(observe(model, X))
    assert not f.evidence["exact"]
    assert "attn_mask" not in f.evidence["sdpa_kwargs"] and "is_causal" not in f.evidence["sdpa_kwargs"]
    assert "check the masking: the scores were filled with 0" in f.message


def test_tiled_heads_are_not_given_enable_gqa():
    f = mat601(observe(HandAttention(kv_heads=2, repeat="tile"), X))
    assert "enable_gqa" not in f.evidence["sdpa_kwargs"]
    assert "tiled with repeat" in f.message


def test_returned_weights_are_said_to_be_lost():
    model = HandAttention(mask="causal_fill", return_weights=True)
    f = mat601(observe(model, X))
    assert f.evidence["weights_used"]
    assert "SDPA does not return the attention weights" in f.message
    plain = mat601(observe(HandAttention(mask="causal_fill"), X))
    assert not plain.evidence["weights_used"] and "does not return" not in plain.message


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_weights_returned_by_a_dropout_submodule_are_not_weights_used(mode):
    """nn.Dropout (an nn.Identity, ...) inside the attention module returns the weights to it: that is
    not the module returning them."""
    model = getattr(HandAttention(dropout=0.2, dropout_module=True), mode)()
    f = mat601(observe(model, X))
    assert not f.evidence["weights_used"] and "does not return" not in f.message
    returned = getattr(HandAttention(dropout=0.2, dropout_module=True, return_weights=True), mode)()
    assert mat601(observe(returned, X)).evidence["weights_used"]


def test_weights_returned_from_before_their_dropout_are_used():
    class ReturnsUndropped(HandAttention):
        def attend(self, q, k, v):
            weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(HEAD_DIM), dim=-1)
            return self.drop(weights) @ v, weights  # the weights before dropout returned

    f = mat601(observe(ReturnsUndropped(dropout=0.2, dropout_module=True, return_weights=True).train(), X))
    assert f.evidence["weights_used"] and f.evidence["sdpa_kwargs"] == pytest.approx({"dropout_p": 0.2})


DROPOUT_CHECK = "if this code applies dropout to the weights in training, pass dropout_p=p if self.training else 0.0"


def observe_no_grad(model, x, steps=3):
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1)
    with g, torch.no_grad():
        for _ in range(steps):
            model(x)
            g.step()
    return g


def test_attention_observed_in_eval_or_without_grad_says_to_check_for_dropout():
    model = HandAttention(dropout=0.2, dropout_module=True).eval()  # its dropout does nothing in eval
    for g in (observe(model, X), observe_no_grad(model, X)):
        f = mat601(g)
        assert f.evidence["sdpa_kwargs"] == {} and DROPOUT_CHECK in f.message
        assert any(DROPOUT_CHECK in check for check in f.evidence["checks"])
    assert_equivalent(model, X, {})  # what was observed: eval
    # observed under no_grad in train mode without dropout: it may still be there in training
    assert DROPOUT_CHECK in mat601(observe_no_grad(HandAttention().train(), X)).message
    # observed training with grad: no dropout is no dropout; with it, it is passed
    assert DROPOUT_CHECK not in mat601(observe(HandAttention().train(), X)).message
    assert DROPOUT_CHECK not in mat601(observe_no_grad(HandAttention(dropout=0.2).train(), X)).message


def test_weights_read_after_the_product_are_used():
    class ReadsWeights(HandAttention):
        def forward(self, x):
            out, weights = self.attend(*self.heads(x))
            self.entropy = -(weights * weights.clamp_min(1e-9).log()).sum(-1).mean()  # read after @V
            return out.sum(1)

    f = mat601(observe(ReadsWeights(), X))
    assert f.evidence["weights_used"]


class RealSdpa(nn.Module):
    def __init__(self, dropout=0.0, gqa=False, mask=None):
        super().__init__()
        torch.manual_seed(0)
        self.inner = HandAttention(kv_heads=2 if gqa else HEADS)
        self.dropout, self.gqa, self.mask = dropout, gqa, mask
        self.to(DEVICE)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.inner.heads(x)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=self.dropout,
                                             enable_gqa=self.gqa)
        return self.inner.out(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("options", [dict(), dict(dropout=0.2), dict(gqa=True), dict(mask=~padding_fill_mask(S)),
                                     dict(dropout=0.1, gqa=True, mask=~padding_fill_mask(S))])
def test_a_real_sdpa_call_is_never_told_to_use_sdpa(options):
    """With dropout on CPU (and in other cases on a GPU: fp32 with GQA, ...) SDPA runs its math
    backend, whose matmul → softmax → matmul the guard sees; it is SDPA all the same."""
    g = observe(RealSdpa(**options).train(), X)
    f = mat601(g)
    # At most what kept the fused kernels from the call (fp32 with GQA on a GPU): never "use SDPA"
    assert f is None or (f.evidence["backend"] == "math" and "F.scaled_dot_product_attention(" not in f.message)
    if DEVICE == "cpu":  # on CPU only dropout makes SDPA take its math backend, and nothing is said of it
        assert f is None
        assert any(k.in_sdpa for k in g.recorder.rec.attention) == bool(options.get("dropout"))
    elif options.get("gqa"):
        assert f is not None and f.evidence["cause"] == "gqa" and "repeat_interleave" in f.message


class StridedSdpa(nn.Module):
    """SDPA called on a query whose last dim is not unit-stride: every backend but math refuses it."""

    def __init__(self, strided=True):
        super().__init__()
        torch.manual_seed(0)
        self.inner = HandAttention(kv_heads=HEADS)
        self.strided = strided
        self.to(DEVICE)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.inner.heads(x)
        if self.strided:
            q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.inner.out(out.transpose(1, 2).reshape(b, s, -1))


def test_sdpa_on_a_strided_query_is_told_what_lets_a_fused_kernel_run():
    g = observe(StridedSdpa(), X)
    f = mat601(g)
    assert f is not None and f.evidence["backend"] == "math" and f.evidence["cause"] == "strided"
    assert "`.contiguous()`" in f.message and "F.scaled_dot_product_attention(" not in f.message
    assert f.row == StridedSdpa.forward.__code__.co_firstlineno + 5  # the SDPA call's line
    # the math backend's own GEMM copies are SDPA's, not the user's: no MAT302 at that line
    assert not [x for x in g.findings if x.code == "MAT302" and x.row == f.row]
    assert mat601(observe(StridedSdpa(strided=False), X)) is None


class SelfAttention(nn.Module):
    def __init__(self, **call):
        super().__init__()
        self.mha = nn.MultiheadAttention(HEADS * HEAD_DIM, HEADS, batch_first=True)
        self.call = call
        self.to(DEVICE)

    def forward(self, x):
        return self.mha(x, x, x, **self.call)[0]


def test_multihead_attention_asked_for_weights_is_told_need_weights_false():
    f = mat601(observe(SelfAttention(), X))
    assert f is not None and "need_weights=False" in f.message
    assert "F.scaled_dot_product_attention(" not in f.message
    assert mat601(observe(SelfAttention(need_weights=False), X)) is None


def test_estimate_times_the_suggested_call():
    model = HandAttention(mask="padding_fill", kv_heads=2)
    g = guard(json_path=None, report=False, warmup=1, window=2)
    with g:
        for _ in range(3):
            model(X).sum().backward()
            g.step()
    f = mat601(g)
    assert f.estimated_savings_ms is not None
    assert "explicit attn_mask" in f.evidence["estimate_method"]


# -- attention written as a function of q, k, v: the suggestion applied as the finding says ---------
QKV = [torch.randn(B, HEADS, S, HEAD_DIM, generator=torch.Generator().manual_seed(10 + i)).to(DEVICE)
       for i in range(3)]
TEMP = torch.tensor(0.3, device=DEVICE)
BIAS = torch.randn(HEADS, S, S, generator=torch.Generator().manual_seed(4)).to(DEVICE)
CAUSAL_ADD = torch.zeros(S, S, device=DEVICE).masked_fill(causal_fill_mask(S), float("-inf"))


def leaves():
    return [t.clone().requires_grad_(True) for t in QKV + [TEMP]]


def observe_fn(fn, steps=3):
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1)
    with g:
        for _ in range(steps):
            fn(*leaves()).square().mean().backward()
            g.step()
    return g


def follow(f, q, k, v, t, mask):
    """The suggested call, applied as the finding says: q multiplied or divided by the tensor factors
    in evidence["scale_tensors"], attn_mask the written expression of the user's mask."""
    kwargs = dict(f.evidence["sdpa_kwargs"])
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = eval(kwargs["attn_mask"], {"mask": mask})
    for how in f.evidence.get("scale_tensors", ()):
        q = q * t if how == "mul" else q / t
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def assert_fn_equivalent(fn, f, mask=None):
    x0, x1 = leaves(), leaves()
    out0, out1 = fn(*x0), follow(f, *x1, mask)
    torch.testing.assert_close(out1, out0, **TOL)
    grads0 = torch.autograd.grad(out0.square().mean(), x0, allow_unused=True)
    grads1 = torch.autograd.grad(out1.square().mean(), x1, allow_unused=True)
    for g0, g1 in zip(grads0, grads1):
        if g0 is None:  # the temperature, where fn does not use it
            assert g1 is None or not g1.abs().any()
            continue
        torch.testing.assert_close(g1, g0, **TOL)


def flat(t):
    return t.reshape(B * HEADS, S, HEAD_DIM)


def baddbmm_attention(make_input, beta, alpha):
    def fn(q, k, v, t):
        scores = torch.baddbmm(make_input(), flat(q), flat(k).transpose(1, 2), beta=beta, alpha=alpha)
        return (scores.softmax(-1) @ flat(v)).view(B, HEADS, S, HEAD_DIM)
    return fn


SQRT_D = math.sqrt(HEAD_DIM)
# name: (fn(q, k, v, t), the user's mask tensor, the SDPA keyword arguments the guard must suggest)
FUNCTION_FORMS = {
    # GPT-NeoX: baddbmm on zeros with beta=1, the scale as alpha
    "baddbmm zeros, alpha=1/sqrt(d)": (
        baddbmm_attention(lambda: torch.zeros(B * HEADS, S, S, device=DEVICE), 1.0, 1 / SQRT_D), None, {}),
    # GPT-2's _upcast_and_reordered_attn: beta=0 on an uninitialised tensor (not a mask)
    "baddbmm empty, beta=0": (
        baddbmm_attention(lambda: torch.empty(B * HEADS, S, S, device=DEVICE), 0, 1 / SQRT_D), None, {}),
    "baddbmm empty, beta=0, alpha=0.05": (
        baddbmm_attention(lambda: torch.empty(B * HEADS, S, S, device=DEVICE), 0, 0.05), None, {"scale": 0.05}),
    "baddbmm causal mask, beta=1": (
        baddbmm_attention(lambda: CAUSAL_ADD, 1, 1 / SQRT_D), CAUSAL_ADD, {"is_causal": True}),
    "baddbmm bias, beta=0.5, alpha=0.05": (
        baddbmm_attention(lambda: BIAS.repeat(B, 1, 1), 0.5, 0.05), BIAS, {"attn_mask": "mask * 0.5", "scale": 0.05}),
    # an additive mask added before the scale: SDPA adds attn_mask after scaling
    "(qk + bias) / sqrt(d)": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1) + BIAS) / SQRT_D).softmax(-1) @ v, BIAS,
        {"attn_mask": f"mask * {float(f'{1 / SQRT_D:.8g}')!r}"}),
    "(qk - bias) * 0.05": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1) - BIAS) * 0.05).softmax(-1) @ v, BIAS,
        {"attn_mask": "mask * -0.05", "scale": 0.05}),
    "(qk + causal) / sqrt(d)": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1) + CAUSAL_ADD) / SQRT_D).softmax(-1) @ v, CAUSAL_ADD,
        {"is_causal": True}),
    "masked_fill then / sqrt(d)": (
        lambda q, k, v, t: (q @ k.transpose(-2, -1)).masked_fill(causal_fill_mask(S), float("-inf")).div(SQRT_D)
        .softmax(-1) @ v, None, {"is_causal": True}),
    # tensor factors: divided or multiplied, next to a number
    "scores * t": (lambda q, k, v, t: ((q @ k.transpose(-2, -1)) * t).softmax(-1) @ v, None, {"scale": 1.0}),
    "scores / t": (lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / t).softmax(-1) @ v, None, {"scale": 1.0}),
    "scores / sqrt(d) * t": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / SQRT_D * t).softmax(-1) @ v, None, {}),
    "scores * 0.05 / t": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1)) * 0.05 / t).softmax(-1) @ v, None, {"scale": 0.05}),
    # transposed twice: softmax over the keys all the same
    "scores.mT.softmax(-2).mT": (
        lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / SQRT_D).mT.softmax(-2).mT @ v, None, {}),
}


@pytest.mark.parametrize("form", list(FUNCTION_FORMS))
def test_suggested_call_for_attention_functions_computes_the_same(form):
    fn, mask, expected = FUNCTION_FORMS[form]
    f = mat601(observe_fn(fn))
    assert f is not None
    assert f.evidence["sdpa_kwargs"] == pytest.approx(expected)
    assert f.evidence["exact"]
    assert_fn_equivalent(fn, f, mask)


def test_an_additive_mask_scaled_by_a_tensor_says_what_to_check():
    f = mat601(observe_fn(lambda q, k, v, t: ((q @ k.transpose(-2, -1) + BIAS) * t).softmax(-1) @ v))
    assert not f.evidence["exact"]
    assert "added before the scores were scaled by a tensor" in f.message


@pytest.mark.parametrize("fn", [
    lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / SQRT_D).softmax(-2) @ v,        # over the queries
    lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / SQRT_D).softmax(-1).mT @ v,     # P transposed before @v
    lambda q, k, v, t: ((q @ k.transpose(-2, -1)) / SQRT_D).mT.softmax(-1) @ v,     # S transposed
], ids=["softmax(-2)", "softmax(-1).mT @ v", "S.mT.softmax(-1)"])
def test_softmax_not_over_the_keys_is_not_attention(fn):
    assert mat601(observe_fn(fn)) is None


def repeat_along_keys(t):
    """Each key (value) position twice in a row: a repeat along the sequence, not of heads."""
    b, h, s, d = t.shape
    return t[:, :, :, None, :].expand(b, h, s, 2, d).reshape(b, h, 2 * s, d)


def test_keys_repeated_along_the_sequence_are_not_grouped_heads():
    def fn(q, k, v, t):
        k, v = repeat_along_keys(k), repeat_along_keys(v)
        return ((q @ k.transpose(-2, -1)) / SQRT_D).softmax(-1) @ v

    f = mat601(observe_fn(fn))
    assert f.evidence["sdpa_kwargs"] == {} and "enable_gqa" not in f.message
    q, k, v, t = leaves()
    expected = fn(q, k, v, t)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, repeat_along_keys(k), repeat_along_keys(v)),
                               expected, **TOL)


def test_sdpa_math_backend_estimate_times_the_call_as_made_against_the_changed_one():
    model = StridedSdpa()
    g = guard(json_path=None, report=False, estimate_savings=True, savings_budget_s=3.0, warmup=1, window=2)
    with g:
        for _ in range(3):
            model(X).square().mean().backward()
            g.step()
    f = mat601(g)
    assert f is not None and f.evidence["estimate_method"].startswith("timed scaled_dot_product_attention as called")
    assert "contiguous q, k, v" in f.evidence["estimate_method"]
