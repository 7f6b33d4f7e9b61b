"""Runtime checks on real models run on CPU: each check fires on its pattern and stays quiet
on the look-alikes it documents."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint_helpers import lines, this_line  # noqa: E402
from matlint.runtime_guard.checks import cublas_copies  # noqa: E402
from matlint.runtime_guard.checks import DeviceContext, run_checks  # noqa: E402


def observe(fn, steps=3, **options):
    options = {"json_path": None, "report": False, "estimate_savings": False, "warmup": 1,
               "window": steps - 1, **options}
    g = guard(**options)
    with g:
        for _ in range(steps):
            fn()
            g.step()
    return g


def codes(g):
    return sorted(f.code for f in g.findings)


# -- MAT101 ------------------------------------------------------------------------------------
def test_loop_matmul_fires_with_batched_shapes():
    w = torch.randn(8, 16, 16)
    x = torch.randn(8, 4, 16)

    def step():
        return torch.stack([x[h] @ w[h] for h in range(8)])  # <- here

    g = observe(step)
    [f] = [f for f in g.findings if f.code == "MAT101"]
    assert f.row == this_line(step)[0]
    assert f.evidence["per_step"] == 8
    assert "(8, 4, 16) @ (8, 16, 16)" in f.message


def test_loop_over_layers_is_quiet():
    layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
    x = torch.randn(4, 16)

    def step():
        h = x
        for layer in layers:
            h = layer(h)
        return h

    assert "MAT101" not in codes(observe(step))


def test_recurrence_is_quiet():
    w = torch.randn(16, 16)
    x = torch.randn(10, 4, 16)

    def step():
        h = torch.zeros(4, 16)
        for t in range(10):
            h = torch.tanh(x[t] + h @ w)
        return h

    assert "MAT101" not in codes(observe(step))


# -- MAT201 / MAT202 -----------------------------------------------------------------------------
def test_trailing_one_broadcast_fires_and_outer_product_is_quiet():
    pred = torch.randn(32, 1)
    target = torch.randn(32)
    a, b = torch.randn(32), torch.randn(32)

    def step():
        bad = (pred - target).abs().mean()  # <- here
        outer = a[:, None] * b[None, :]
        return bad + outer.sum()

    g = observe(step)
    assert lines(g, "MAT201") == this_line(step)
    [f] = [f for f in g.findings if f.code == "MAT201"]
    assert "(32, 1)" in f.message and "(32, 32)" in f.message


def test_loss_shape_mismatch():
    pred = torch.randn(16, 1, requires_grad=True)
    target = torch.randn(16)
    good_target = torch.randn(16, 1)

    def step():
        with pytest.warns(UserWarning):
            bad = F.mse_loss(pred, target)  # <- here
        good = F.mse_loss(pred, good_target)
        (bad + good).backward()

    g = observe(step)
    assert lines(g, "MAT202") == this_line(step)


# -- MAT302 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,stride,copied", [
    ((64, 32), (32, 1), False),      # dense
    ((64, 32), (1, 64), False),      # plain transpose: cuBLAS takes the flag
    ((64, 32), (64, 2), True),       # x[:, ::2]: no unit stride
    ((4, 64, 32), (0, 32, 1), False),  # batch broadcast by expand: a batch stride of 0 is fine
    ((4, 64, 32), (2048, 0, 1), True),  # batched, a last-two stride of 0
    ((64, 32), (32, 0), True),       # expanded columns
])
def test_cublas_copy_rule(shape, stride, copied):
    assert cublas_copies(shape, stride) is copied


def test_strided_gemm_input_fires_but_transpose_is_free():
    x = torch.randn(64, 64)
    w = torch.randn(32, 32)

    def step():
        strided = x[:, ::2] @ w  # <- here
        transposed = x[:, :32] @ w.T
        return strided, transposed

    g = observe(step)
    assert lines(g, "MAT302") == this_line(step)


def test_matmul_clone_before_bmm_is_reported():
    x = torch.randn(2, 16, 4, 8)  # (B, S, H, D)
    y = torch.randn(2, 4, 8, 16)

    def step():
        return x.permute(0, 2, 1, 3) @ y  # <- here: (B, H, S, D) is not viewable as 3-D

    g = observe(step)
    [f] = [f for f in g.findings if f.code == "MAT302"]
    assert f.row == this_line(step)[0]
    assert f.evidence["copied_by"].startswith("matmul")


# -- MAT502 --------------------------------------------------------------------------------------
def test_host_syncs_per_step():
    losses = [torch.tensor(float(i)) for i in range(4)]
    total = torch.tensor(3.0)

    def step():
        logged = [l.item() for l in losses]  # <- here
        once = total.item()  # <- here
        return logged, once

    g = observe(step)
    assert lines(g, "MAT502") == this_line(step)
    many, once = sorted((f for f in g.findings if f.code == "MAT502"), key=lambda f: f.row)
    assert (many.evidence["per_step"], once.evidence["per_step"]) == (4, 1)
    # the user's own read once a step is worth moving too: every N steps, or once after the loop
    assert "read them every N steps" in once.message and "read them once per step" in many.message


def test_optimizer_internal_scalar_reads_are_not_syncs():
    model = nn.Linear(8, 8)
    opt = torch.optim.Adam(model.parameters(), foreach=False)  # reads step tensors with .item()
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    assert "MAT502" not in codes(observe(step))


# -- MAT601 --------------------------------------------------------------------------------------
class ManualAttention(nn.Module):
    def __init__(self, d=32, heads=4, fused=False):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.heads = heads
        self.fused = fused

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # <- here
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return out.transpose(1, 2).reshape(b, s, d)


def test_manual_attention_fires_with_shapes_and_estimate():
    model = ManualAttention()
    x = torch.randn(2, 16, 32)

    def step():
        model(x).sum().backward()

    g = observe(step, estimate_savings=True)
    [f] = [f for f in g.findings if f.code == "MAT601"]
    assert [f.row] == this_line(ManualAttention.forward)
    assert f.evidence["module"] == "ManualAttention"
    assert f.evidence["phase"] == "forward+backward"
    assert f.evidence["masked"] and f.evidence["scaled"]
    assert "8 heads × 16×16, head dim 8" in f.message
    assert f.estimated_savings_ms is not None and "scaled_dot_product_attention" in f.evidence["estimate_method"]


class AttentionWeightsDropout(nn.Module):
    """Dropout on the attention weights: on CPU it is bernoulli_, div_ and a mul, not one op."""

    def __init__(self, gate=False):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.gate = gate

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, 8, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)  # <- here
        if self.gate:  # weights times a learned gate: not what SDPA computes
            weights = weights * torch.sigmoid(q.sum(-1, keepdim=True))
        else:
            weights = F.dropout(weights, 0.1, training=True)
        return (weights @ v).transpose(1, 2).reshape(b, s, d)


def test_manual_attention_with_dropout_on_the_weights_fires_on_cpu():
    model = AttentionWeightsDropout()
    x = torch.randn(2, 16, 32)
    g = observe(lambda: model(x).sum().backward())
    [f] = [f for f in g.findings if f.code == "MAT601"]
    assert [f.row] == this_line(AttentionWeightsDropout.forward)
    gated = AttentionWeightsDropout(gate=True)
    assert "MAT601" not in codes(observe(lambda: gated(x).sum().backward()))


def test_sdpa_is_quiet():
    model = ManualAttention(fused=True)
    x = torch.randn(2, 16, 32)
    assert "MAT601" not in codes(observe(lambda: model(x).sum().backward()))


# -- GPU-only checks, on recordings made here and read as if they ran on an sm_90 GPU ----------------
def as_cuda(rec):
    rec.ops = {k._replace(device="cuda"): v for k, v in rec.ops.items()}
    rec.device_types = {"cuda"}
    return rec


def recording(fn, steps=3):
    return observe(fn, steps, select=["MAT1"]).recorder.rec


def test_fp32_gemms_on_tensor_cores_without_tf32():
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
    x = torch.randn(1024, 512)
    rec = as_cuda(recording(lambda: model(x).sum().backward()))
    hopper = DeviceContext("cuda", (9, 0), tf32=False)
    [f] = [f for f in run_checks(rec, ctx=hopper) if f.code == "MAT401"]
    assert f.evidence["per_step"] == 5  # two forward; backward: dW twice, dX once (x needs no grad)
    assert f.evidence["phase"] == "forward+backward"
    assert f.extra["estimate"].added_launches == 4  # autocast casts each forward GEMM's input and weight
    assert not [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0), tf32=True)) if f.code == "MAT401"]
    assert not [f for f in run_checks(rec, ctx=DeviceContext("cuda", (7, 5))) if f.code == "MAT401"]
    # under autocast the GEMMs run in bf16 and the check stays quiet
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rec16 = as_cuda(recording(lambda: model(x).float().sum().backward()))
    assert not [f for f in run_checks(rec16, ctx=hopper) if f.code == "MAT401"]


def test_bf16_dims_not_multiple_of_8():
    odd = nn.Linear(64, 100).bfloat16()
    even = nn.Linear(64, 128).bfloat16()
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    rec = as_cuda(recording(lambda: (odd(x), even(x))))
    found = [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == "MAT403"]
    assert len(found) == 1 and "N=100" in found[0].message


def test_bf16_dims_not_multiple_of_8_one_finding_for_a_layers_forward_and_backward_gemms():
    odd = nn.Linear(64, 100).bfloat16()
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    rec = as_cuda(recording(lambda: odd(x).float().sum().backward()))
    [f] = [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == "MAT403"]
    assert "N=100 (not multiples of 8) (and 2 more GEMMs of this line: K=100, M=100)" in f.message
    assert f.evidence["gemms"] == 3 and len(f.extra["estimate"].gemms) == 3


def test_tiny_ops_from_one_line():
    params = [torch.randn(100) for _ in range(64)]
    grads = [torch.randn(100) for _ in range(64)]

    def step():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-0.1)  # <- here

    rec = as_cuda(recording(step))
    found = [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == "MAT504"]
    assert [f.row for f in found] == this_line(step)
    assert found[0].evidence["per_step"] == 64
    assert not [f for f in run_checks(rec, ctx=DeviceContext("cpu")) if f.code == "MAT504"]


class InputFeeding(nn.Module):
    """A decoder stepped in Python, one line per step that runs its own ops and a built-in Linear."""

    def __init__(self):
        super().__init__()
        self.combine = nn.Linear(16, 8)

    def forward(self, h, ctx):
        outs = []
        for _ in range(12):
            h = torch.tanh(self.combine(torch.cat([h, ctx], dim=1)))  # <- here
            outs.append(h)
        return torch.stack(outs)


def test_tiny_ops_of_a_line_count_the_builtin_module_it_calls():
    """12 steps of cat and tanh (the module's) and of the Linear's addmm (`combine`'s): 36 launches
    from the line, which MAT504 counts together; per module 24 and 12, under its bound."""
    model = InputFeeding()
    h, ctx = torch.randn(4, 8), torch.randn(4, 8)
    rec = as_cuda(recording(lambda: model(h, ctx)))
    found = [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == "MAT504"]
    assert [f.row for f in found] == this_line(InputFeeding.forward)
    assert found[0].evidence["per_step"] == 36 and found[0].evidence["module"] == "InputFeeding"


class EncoderClassifier(nn.Module):
    """One call of a built-in encoder: its layers' many small ops are its inside, not a loop of the line."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.encoder(x * 2.0).mean(1))


def test_tiny_ops_inside_a_builtin_model_the_line_calls_once_are_not_the_lines():
    model = EncoderClassifier()
    rec = as_cuda(recording(lambda: model(torch.randn(2, 8, 16)).sum().backward()))
    assert [f for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == "MAT504"] == []


def test_gpu_only_checks_say_so_on_cpu():
    model = nn.Linear(8, 8)
    g = observe(lambda: model(torch.randn(2, 8)))
    assert any("MAT401" in note and "not evaluated on cpu" in note for note in g.notes)
    assert "MAT401" not in codes(g)


# -- MAT605 ------------------------------------------------------------------------------------
class WrittenOutGelu(nn.Module):
    """An MLP whose activation is the tanh GELU written out, in one of its spellings."""

    def __init__(self, spelling):
        super().__init__()
        self.fc = nn.Linear(16, 64)
        self.spelling = spelling

    def forward(self, x):
        h = self.fc(x)
        if self.spelling == "pow":
            return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))  # <- here
        if self.spelling == "cube":  # x * x * x, named steps, the constant written as a number
            inner = h + 0.044715 * (h * h * h)
            return h * 0.5 * (1 + (0.7978845608 * inner).tanh())  # <- here
        if self.spelling == "power op":  # the constants multiplied out, the scale computed first
            return 0.5 * h * (1 + torch.tanh((2 / math.pi) ** 0.5 * (h ** 3 * 0.044715 + h)))  # <- here
        if self.spelling == "power in float32":  # as autocast on CUDA runs torch.pow: on a float32 copy of h
            return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h.float(), 3.0))))  # <- here
        if self.spelling == "F.gelu":
            return F.gelu(h, approximate="tanh")
        if self.spelling == "other constant":  # a cubic inside tanh that is not GELU's
            return torch.tanh(0.5 * (h + 0.1 * torch.pow(h, 3)))
        if self.spelling == "tanh of a square":
            return torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h))
        raise ValueError(self.spelling)


REPORTED_SPELLINGS = ["pow", "cube", "power op", "power in float32"]


@pytest.mark.parametrize("spelling", REPORTED_SPELLINGS)
def test_written_out_tanh_gelu_is_reported_at_the_tanh(spelling):
    model = WrittenOutGelu(spelling)
    x = torch.randn(4, 16)
    g = observe(lambda: model(x).sum().backward())
    [f] = [f for f in g.findings if f.code == "MAT605"]
    assert f.row == this_line(WrittenOutGelu.forward)[REPORTED_SPELLINGS.index(spelling)]
    assert f.evidence["per_step"] == 1 and f.evidence["shapes"] == ["(4, 64)"] and f.evidence["backward"]
    assert 'F.gelu(x, approximate="tanh")' in f.message


@pytest.mark.parametrize("spelling", REPORTED_SPELLINGS)
def test_the_suggested_f_gelu_computes_what_each_reported_spelling_does(spelling):
    """The fix MAT605 suggests, applied: outputs and gradients agree with the written-out formula."""
    torch.manual_seed(0)
    model, fixed = WrittenOutGelu(spelling), WrittenOutGelu("F.gelu")
    fixed.load_state_dict(model.state_dict())
    x = torch.randn(8, 16)
    out, out_fixed = model(x), fixed(x)
    assert torch.allclose(out.float(), out_fixed.float(), atol=1e-5, rtol=1e-4)
    out.square().sum().backward()
    out_fixed.square().sum().backward()
    for p, q in zip(model.parameters(), fixed.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spelling", ["F.gelu", "other constant", "tanh of a square"])
def test_tanh_gelu_look_alikes_are_quiet(spelling):
    model = WrittenOutGelu(spelling)
    x = torch.randn(4, 16)
    assert "MAT605" not in codes(observe(lambda: model(x).sum().backward()))


def test_written_out_tanh_gelu_in_bfloat16_with_its_power_in_float32():
    model = WrittenOutGelu("power in float32").to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    g = observe(lambda: model(x).sum().backward())
    [f] = [f for f in g.findings if f.code == "MAT605"]
    assert f.evidence["dtypes"] == ["bfloat16"]  # the dtype of h, which F.gelu would take


def test_the_same_line_in_every_layer_is_one_finding_that_names_the_layers():
    layers = nn.Sequential(*[WrittenOutGelu("pow") for _ in range(3)])
    for layer in layers:
        layer.fc = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    g = observe(lambda: layers(x).sum().backward(), estimate_savings=True)
    [f] = [f for f in g.findings if f.code == "MAT605"]
    assert f.evidence["module"] == ["Sequential.0", "Sequential.1", "Sequential.2"]
    assert f.evidence["per_step"] == 3 and ", in 3 modules: " in f.message
    assert f.estimated_savings_ms is not None and len(f.evidence["estimate_interval_ms"]) == 2


def test_written_out_tanh_gelu_estimate_times_f_gelu():
    model = WrittenOutGelu("pow")
    x = torch.randn(64, 16)
    g = observe(lambda: model(x).sum().backward(), estimate_savings=True)
    [f] = [f for f in g.findings if f.code == "MAT605"]
    assert f.estimated_savings_ms is not None
    assert "F.gelu(approximate='tanh')" in f.evidence["estimate_method"]
    assert "forward and backward" in f.evidence["estimate_method"]


# -- MAT501 ------------------------------------------------------------------------------------
def test_a_loop_over_elements_is_reported_at_its_line():
    h = torch.randn(64, 8)

    def step():
        out = torch.empty(64)
        for i in range(64):
            out[i] = h[i, 0] * 2 + 1  # <- here
        return out

    g = observe(step)
    [f] = [f for f in g.findings if f.code == "MAT501"]
    assert f.row == this_line(step)[0]
    assert f.evidence["per_step"] == 192  # mul, add and the copy into out[i], 64 times
    assert "loop over a tensor's elements" in f.message


def test_single_elements_of_their_own_are_no_loop_over_elements():
    """Per-layer losses summed one by one, and the same loop vectorized: no MAT501."""
    layers = [torch.randn(8) for _ in range(48)]
    h = torch.randn(64, 8)

    def per_layer():
        total = torch.zeros(())
        for w in layers:
            total = total + w.square().sum() * 0.5  # 0-d values, each its own tensor
        return total

    def vectorized():
        return h[:, 0] * 2 + 1

    assert [f for f in observe(per_layer).findings if f.code == "MAT501"] == []
    assert [f for f in observe(vectorized).findings if f.code == "MAT501"] == []
