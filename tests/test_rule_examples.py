"""Every rule's examples are its tests: exact positions for bad code, silence for good code,
and the exact source after fixing for bad->fixed pairs."""
import pytest

from matlint.engine import lint_source
from matlint.fixes import fix_until_stable
from matlint.registry import all_rules

CASES = [
    pytest.param(rule, i, example, id=f"{rule.code}-{i}")
    for rule in all_rules()
    for i, example in enumerate(rule.examples)
]


def _lint_one(rule, source):
    findings = lint_source(source, "example.py", [rule], prefilter=False)
    assert not [f for f in findings if f.code == "MAT000"], findings  # the rule crashed
    return [f for f in findings if f.code == rule.code]


@pytest.mark.parametrize("rule, index, example", CASES)
def test_example(rule, index, example):
    findings = _lint_one(rule, example.code)
    got = sorted((f.row, f.column) for f in findings)
    assert got == sorted(example.expect), "\n".join(f"{f.row}:{f.column} {f.message}" for f in findings)
    if example.message_contains:
        assert any(example.message_contains in f.message for f in findings)
    if example.fixed_code is not None:
        fixed, applied, _ = fix_until_stable(example.code, lambda s: _lint_one(rule, s), unsafe=example.unsafe)
        assert applied > 0
        assert fixed == example.fixed_code
        # a second --fix changes nothing
        again, applied_again, _ = fix_until_stable(fixed, lambda s: _lint_one(rule, s), unsafe=example.unsafe)
        assert applied_again == 0 and again == fixed


@pytest.mark.parametrize("rule", [r for r in all_rules() if not r.code.startswith("MAT0")], ids=lambda r: r.code)
def test_rule_has_bad_and_good_examples(rule):
    assert any(e.expect for e in rule.examples), f"{rule.code} has no bad example"
    assert any(not e.expect for e in rule.examples), f"{rule.code} has no good example"


def test_mat601_sees_a_softmax_upcast_passed_positionally():
    """`torch.softmax(x, -1, torch.float32)` upcasts (dtype is its third argument): dropping the
    upcast changes the result in half precision, so the fix to SDPA must not be safe."""
    rule = next(r for r in all_rules() if r.code == "MAT601")
    source = ("import torch\n"
              "def upcast(q, k, v):\n"
              "    attn = (q @ k.transpose(-2, -1)) * 0.125\n"
              "    attn = {softmax}\n"
              "    return attn @ v\n")
    for softmax, safe in (("torch.softmax(attn, -1, torch.float32)", False),
                          ("torch.nn.functional.softmax(attn, -1, 3, torch.float32)", False),
                          ("torch.softmax(attn, -1)", True)):
        (finding,) = _lint_one(rule, source.format(softmax=softmax))
        assert finding.fix is not None and finding.fix.safe is safe, softmax


def test_mat605_fix_is_unsafe_where_the_formula_reads_x_through_a_cast():
    """`x.float()` inside the formula upcasts only part of it: on a bf16 `x` the original returns
    float32 and `F.gelu(x, approximate="tanh")` returns bf16, so the fix must not be safe; the
    same formula without casts keeps its safe fix."""
    rule = next(r for r in all_rules() if r.code == "MAT605")
    source = ("import math\n"
              "import torch\n"
              "def gelu(x):\n"
              "    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * ({inner})))\n")
    for inner, safe in (("x.float() + 0.044715 * x.float() ** 3", False),
                        ("x.to(torch.float32) + 0.044715 * torch.pow(x.to(torch.float32), 3)", False),
                        ("x + 0.044715 * x ** 3", True)):
        (finding,) = _lint_one(rule, source.format(inner=inner))
        assert finding.fix is not None and finding.fix.safe is safe, inner


# A module's forward that creates `{factory}` on the host and moves it to the input's device.
_MAT503_FORWARD = ("import torch\n"
                   "from torch import nn\n"
                   "class M(nn.Module):\n"
                   "    def forward(self, x):\n"
                   "        return x + {factory}.to(x.device)\n")


def test_mat503_device_fix_is_safe_only_where_the_values_are_bit_identical():
    """`linspace`, `logspace` and a fractional-step `arange` round differently on the GPU than on
    the host (measured on an H100), so creating them there is an unsafe fix; fills are exact."""
    rule = next(r for r in all_rules() if r.code == "MAT503")
    for factory, safe in (("torch.logspace(-4, 0, 333)", False), ("torch.linspace(0, 1, 7)", False),
                          ("torch.arange(0, 1, 0.001)", False), ("torch.arange(0, 10, step=0.5)", False),
                          ("torch.arange(8)", True), ("torch.arange(0, 16, 2)", True), ("torch.ones(3)", True)):
        (finding,) = _lint_one(rule, _MAT503_FORWARD.format(factory=factory))
        assert finding.fix is not None and finding.fix.safe is safe, factory


def test_mat503_offers_device_only_to_factories_that_take_it():
    """`torch.bernoulli(p)` and `torch.normal(mean_tensor, std)` sample from a tensor and take no
    `device=`: their finding says to make that tensor on the device, and has no fix; the sized
    `torch.normal(0.0, 1.0, size)` takes `device=` and gets the fix."""
    rule = next(r for r in all_rules() if r.code == "MAT503")
    for factory, fixed in (("torch.bernoulli(0.1 * torch.ones(x.shape))", False),
                           ("torch.normal(torch.zeros(x.shape), 0.1)", False),
                           ("torch.normal(0.0, 0.1, x.shape)", True), ("torch.normal(0.0, 0.1, size=(3,))", True)):
        (finding,) = _lint_one(rule, _MAT503_FORWARD.format(factory=factory))
        assert (finding.fix is not None) is fixed, factory
        assert ("no `device=`" in finding.message) is not fixed, finding.message


def test_mat301_drops_contiguous_and_clone_unsafely():
    """`.contiguous()` of a transposed view is a copy just as `.clone()` is: it gives autograd a
    private tensor to save; without it, an in-place change of the original after the GEMM makes
    backward raise, so dropping either is not a safe fix."""
    rule = next(r for r in all_rules() if r.code == "MAT301")
    source = "import torch\ndef f(x, w):\n    return x @ w.t().{copy}()\n"
    for copy in ("contiguous", "clone"):
        (finding,) = _lint_one(rule, source.format(copy=copy))
        assert finding.fix is not None and finding.fix.safe is False, copy
    multiline = "import torch\ndef f(x, w):\n    return x @ (w.t()  # a note\n            .contiguous())\n"
    (finding,) = _lint_one(rule, multiline)
    assert finding.fix is None  # the rewrite would drop the comment
