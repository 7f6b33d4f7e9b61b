"""By default the backward pass runs without the capture mode and its GEMMs are derived from the
forward ones: the derived GEMMs are the ones autograd really runs, and nothing else changes."""
from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
from torch.autograd.variable import Variable  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint.runtime_guard.capture import derive_backward_gemms  # noqa: E402


def quiet(**options):
    return guard(**{"json_path": None, "report": False, "estimate_savings": False, "warmup": 0, **options})


class EveryGemmLayout(nn.Module):
    """addmm (Linear), bmm and baddbmm on transposed views, mm with row- and column-major operands
    on either side, an operand that needs no grad, and a 3-d matmul."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32, bias=False)
        self.w = nn.Parameter(torch.randn(32, 32))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 4, 8).transpose(1, 2).reshape(b * 4, t, 8) for z in self.qkv(x).split(32, dim=-1))
        a = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 8 ** 0.5, -1)
        y = torch.baddbmm(torch.zeros(b * 4, t, 8), a, v).view(b, 4, t, 8).transpose(1, 2).reshape(b, t, c)
        y = self.proj(y).reshape(-1, c)
        no_grad_column_major = torch.randn(c, b * t).t()
        outs = [y @ self.w, y @ self.w.t(), self.w.t() @ y.t(), no_grad_column_major @ self.w,
                torch.matmul(y.view(b, t, c), self.w)]
        # a product with a tensor, not a sum, so that every GEMM's incoming gradient is contiguous
        return sum((o * 0.5).sum() for o in outs)


def backward_gemms(g) -> collections.Counter:
    return collections.Counter({
        (k.op, k.qualname, k.site, k.module, k.sig, k.out): s.count
        for k, s in g.recorder.rec.ops.items() if k.backward and k.op in ("mm", "bmm")
    })


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_derived_backward_gemms_are_the_ones_autograd_runs(autocast):
    def run(**options):
        torch.manual_seed(0)
        model, x = EveryGemmLayout(), torch.randn(2, 16, 32)
        g = quiet(window=1, **options)
        with g:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            out.backward()
        assert g.errors == []
        return backward_gemms(g), [p.grad for p in model.parameters()]

    derived, derived_grads = run()
    observed, observed_grads = run(kernels=True)  # kernel attribution observes every backward op
    assert len(derived) == 13  # distinct keys (the five products on one line share a site)
    assert derived == observed  # op, site, module, shapes, strides, dtypes, output, count
    assert all(torch.equal(a, b) for a, b in zip(derived_grads, observed_grads))


def test_backward_runs_without_the_capture_mode_and_the_engine_comes_back():
    engine = Variable._execution_engine
    depths = []
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    with quiet(window=1) as g:
        h = x @ w
        h.register_hook(lambda grad: depths.append(torch._C._len_torch_dispatch_stack()))
        h.tanh().sum().backward()
        torch.autograd.grad((x @ w).sum(), w)  # torch.autograd.grad goes the same way
        after = torch._C._len_torch_dispatch_stack()
        x.add(1)  # recorded: the mode is back on after the backward
    assert depths == [0] and after == 1
    assert Variable._execution_engine is engine
    ops = g.recorder.rec.ops
    assert any(k.op == "add" and not k.backward for k in ops)
    assert not any(k.backward and k.op not in ("mm", "bmm") for k in ops)
    # the two forward mm of `x @ w` (x needs no grad): one backward mm each, x.T @ grad, on its line
    backward = {k.site.lineno: (k, s.count) for k, s in ops.items() if k.backward}
    forward = {k.site.lineno for k in ops if k.op == "mm" and not k.backward}
    assert set(backward) == forward and len(forward) == 2
    assert all(n == 1 and [tuple(s[0]) for s in k.sig] == [(8, 4), (4, 8)] for k, n in backward.values())


def test_forward_without_backward_derives_nothing():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    with quiet(window=2) as g:
        x @ w  # grad on, but no backward follows before the step ends
        g.step()
        with torch.no_grad():
            x @ w
        (x @ w).sum().backward()
        g.step()
    forward = sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "mm" and not k.backward)
    backward = sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "mm" and k.backward)
    assert (forward, backward) == (3, 1)


def test_a_mode_of_the_users_above_the_guard_keeps_the_backward_observed():
    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    with quiet(window=1) as g:
        with Counting() as user_mode:
            (x @ w).tanh().sum().backward()
    assert "tanh_backward" in user_mode.names  # the user's mode saw the whole backward
    backward = [k for k in g.recorder.rec.ops if k.backward]
    assert [k.op for k in backward] == ["mm"]  # observed (not derived): only its GEMM recorded


def test_nested_guards_both_derive():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    inner, outer = quiet(window=1), quiet(window=1)
    with outer:
        with inner:
            (x @ w).sum().backward()
    for g in (inner, outer):
        assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.backward) == 1
    assert Variable._execution_engine.__class__.__name__ != "_EngineRunningBackwardUnobserved"


@pytest.mark.parametrize("op, shapes, grads, expected", [
    # mm(a, b): grad_a = grad @ b^T, grad_b = a^T @ grad
    ("mm", [((4, 8), (8, 1)), ((8, 16), (16, 1))], (True, True),
     [("mm", [(4, 16), (16, 8)], (4, 8)), ("mm", [(8, 4), (4, 16)], (8, 16))]),
    # a column-major weight (Linear's weight.t()) gets its gradient as grad^T @ a, transposed after
    ("addmm", [((16,), (1,)), ((4, 8), (8, 1)), ((8, 16), (1, 8))], (False, True),
     [("mm", [(16, 4), (4, 8)], (16, 8))]),
    ("bmm", [((2, 4, 8), (32, 8, 1)), ((2, 8, 16), (128, 16, 1))], (True, False),
     [("bmm", [(2, 4, 16), (2, 16, 8)], (2, 4, 8))]),
    ("addbmm", [((4, 16), (16, 1)), ((2, 4, 8), (32, 8, 1)), ((2, 8, 16), (128, 16, 1))], (True, True), []),
])
def test_derive_backward_gemms_shapes(op, shapes, grads, expected):
    sig = tuple((torch.Size(shape), stride, torch.float32) for shape, stride in shapes)
    got = [(name, [tuple(s[0]) for s in gsig], tuple(out[0])) for name, _, gsig, out in derive_backward_gemms(op, sig, grads)]
    assert got == expected


def test_an_exception_in_the_backward_passes_through_and_the_mode_comes_back():
    class Boom(Exception):
        pass

    error = Boom("from a hook")
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)

    def hook(grad):
        raise error

    with quiet(window=1) as g:
        h = x @ w
        h.register_hook(hook)
        with pytest.raises(Boom) as caught:
            h.sum().backward()
        depth = torch._C._len_torch_dispatch_stack()
        x.add(1)
    assert caught.value is error
    assert depth == 1 and g.errors == []
    assert any(k.op == "add" for k in g.recorder.rec.ops)
    assert Variable._execution_engine.__class__.__name__ != "_EngineRunningBackwardUnobserved"
