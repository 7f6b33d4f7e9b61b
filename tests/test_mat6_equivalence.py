"""The MAT6xx fixes compute what the code computed before: each example's source and its fixed
source are run on the same random tensors and compared. Safe fixes must agree unconditionally;
unsafe ones agree under the condition their docs state (a float mask, evaluation mode)."""
import types

import pytest

torch = pytest.importorskip("torch")

from matlint.engine import lint_source  # noqa: E402
from matlint.fixes import fix_until_stable  # noqa: E402
from matlint.registry import all_rules  # noqa: E402

RULES = {rule.code: rule for rule in all_rules()}
ManualAttention = RULES["MAT601"]


def _fixed(rule, example):
    source = example.code
    fixed, applied, _ = fix_until_stable(
        source, lambda s: [f for f in lint_source(s, "example.py", [rule], prefilter=False) if f.code == rule.code],
        unsafe=example.unsafe)
    assert applied > 0
    return source, fixed


def _modules(source, fixed, cls, ctor_args):
    ns_before, ns_after = {}, {}
    exec(compile(source, "before.py", "exec"), ns_before)
    exec(compile(fixed, "after.py", "exec"), ns_after)
    before, after = ns_before[cls](*ctor_args), ns_after[cls](*ctor_args)
    after.load_state_dict(before.state_dict())
    return before, after


def _functions(source, fixed, name):
    ns_before, ns_after = {}, {}
    exec(compile(source, "before.py", "exec"), ns_before)
    exec(compile(fixed, "after.py", "exec"), ns_after)
    return ns_before[name], ns_after[name]


def _qkv(*shape_q, s=7, ev=None):
    torch.manual_seed(0)
    *batch, lq, e = shape_q
    q = torch.randn(*batch, lq, e, dtype=torch.float64)
    k = torch.randn(*batch, s, e, dtype=torch.float64)
    v = torch.randn(*batch, s, ev or e, dtype=torch.float64)
    return q, k, v


# index -> a check that returns (before, after) outputs
def _check_nanogpt(source, fixed):
    before, after = _modules(source, fixed, "CausalSelfAttention", (32, 4, 16))
    x = torch.randn(2, 10, 32)
    return before(x), after(x)


def _check_one_expression(source, fixed):
    before, after = _functions(source, fixed, "attend")
    q, k, v = _qkv(2, 3, 5, 8, s=7, ev=6)
    return before(q, k, v), after(q, k, v)


def _check_prescaled_q(source, fixed):
    before, after = _functions(source, fixed, "forward")
    module = types.SimpleNamespace(scale=0.37)
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    return before(module, q, k, v), after(module, q, k, v)


def _check_dropout_in_eval(source, fixed):
    before, after = _modules(source, fixed, "Attention", (64, 4, 0.5))
    before.eval(), after.eval()
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    return before(q, k, v), after(q, k, v)


def _check_float_mask(source, fixed):
    before, after = _functions(source, fixed, "attention")
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    mask = torch.zeros(2, 1, 9, 11, dtype=torch.float64)
    mask[..., -3:] = float("-inf")
    return before(q, k, v, mask, 16), after(q, k, v, mask, 16)


def _check_bool_padding(source, fixed):
    before, after = _functions(source, fixed, "attend")
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    pad = torch.zeros(2, 1, 1, 11, dtype=torch.bool)
    pad[0, ..., -4:] = True
    return before(q, k, v, pad), after(q, k, v, pad)


def _check_bmm(source, fixed):
    before, after = _modules(source, fixed, "Attn", (16,))
    q, k, v = _qkv(6, 9, 16, s=11, ev=5)
    return before(q, k, v), after(q, k, v)


def _check_in_place_fill_and_methods(source, fixed):
    before, after = _functions(source, fixed, "attend")
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    mask = torch.ones(2, 1, 1, 11, dtype=torch.int64)
    mask[0, ..., -4:] = 0
    return before(q, k, v, mask), after(q, k, v, mask)


def _check_functions(calls):
    """A check of an example holding several attention functions: each is called as `calls` says
    (name -> arguments after q, k, v, and the shapes of q) and the outputs are compared stacked."""
    def check(source, fixed):
        outputs = [], []
        for name, (shape_q, extra) in calls.items():
            before, after = _functions(source, fixed, name)
            q, k, v = _qkv(*shape_q, s=11)
            args = [a() if callable(a) else a for a in extra]
            outputs[0].append(before(q, k, v, *args).flatten())
            outputs[1].append(after(q, k, v, *args).flatten())
        return torch.cat(outputs[0]), torch.cat(outputs[1])
    return check


def _float_bias(*shape):
    torch.manual_seed(1)
    return torch.randn(*shape, dtype=torch.float64)


def _check_wrapped_call(source, fixed):
    config = types.SimpleNamespace(hidden_size=64, num_attention_heads=4, attention_probs_dropout_prob=0.5)
    before, after = _modules(source, fixed, "BertSelfAttention", (config,))
    before.eval(), after.eval()
    q, k, v = _qkv(2, 4, 9, 16, s=11)
    return before(q, k, v), after(q, k, v)


def _check_loop_over_layers(source, fixed):
    before, after = _functions(source, fixed, "encode")
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layers = [tuple(torch.randn(8, 8, dtype=torch.float64) for _ in range(3)) for _ in range(3)]
    return before(x, layers), after(x, layers)


def _check_top_level(source, fixed):
    """A script's top level: both programs run, with the same random inputs, and give the same `y`."""
    results = []
    for text in (source, fixed):
        torch.manual_seed(0)
        namespace = {}
        exec(compile(text, "program.py", "exec"), namespace)
        results.append(namespace["y"])
    return results


CHECKS = {
    0: _check_nanogpt,
    1: _check_one_expression,
    2: _check_prescaled_q,
    3: _check_dropout_in_eval,
    4: _check_float_mask,
    5: _check_bool_padding,
    6: _check_bmm,
    9: _check_in_place_fill_and_methods,
    # OpenCLIP's `attn += attn_mask` on 3-D bmm operands, `/=` and `*=`
    28: _check_functions({"clip": ((6, 9, 16), [lambda: _float_bias(6, 9, 11)]),
                          "divided": ((2, 4, 9, 16), []), "multiplied": ((2, 4, 9, 16), [0.37])}),
    # `.div()`, `.mul()`, `torch.div`, `.add(bias)`
    32: _check_functions({"div_method": ((2, 4, 9, 16), []), "mul_method": ((2, 4, 9, 16), [0.37]),
                          "torch_div": ((2, 4, 9, 16), []),
                          "add_method": ((2, 4, 9, 16), [lambda: _float_bias(2, 1, 9, 11)])}),
    # swapaxes, torch.transpose, einsum with a list, the stabilizer, `input=`, positive axes
    33: _check_functions({name: ((2, 4, 9, 16), []) for name in
                          ("swapped", "transposed", "listed", "stabilized", "keyword", "positive_axes")}),
    # `k.transpose(2, 3)` and `softmax(dim=3)`: positive axes of 4-D operands
    48: _check_functions({"attend": ((2, 4, 9, 16), [0.37])}),
    49: _check_wrapped_call,
    51: _check_loop_over_layers,
    52: _check_top_level,
    # `nn.Softmax(dim=-1)(scores)` built and called in one expression
    54: _check_functions({"attend": ((2, 4, 9, 16), [])}),
}


@pytest.mark.parametrize("index", sorted(CHECKS), ids=lambda i: f"MAT601-{i}")
def test_attention_fix_is_equivalent(index):
    example = ManualAttention.examples[index]
    source, fixed = _fixed(ManualAttention, example)
    assert "scaled_dot_product_attention" in fixed and "softmax(" not in fixed
    before, after = CHECKS[index](source, fixed)
    assert before.shape == after.shape
    assert torch.allclose(before, after, atol=1e-5, rtol=1e-5)


def test_every_attention_fix_is_checked():
    with_fix = {i for i, e in enumerate(ManualAttention.examples) if e.fixed is not None}
    assert with_fix == set(CHECKS)


def test_causal_fix_differs_without_the_mask():
    """The equivalence check can fail: dropping is_causal from the nanoGPT fix changes the output."""
    example = ManualAttention.examples[0]
    source, fixed = _fixed(ManualAttention, example)
    broken = fixed.replace(", is_causal=True", "")
    before, after = _check_nanogpt(source, broken)
    assert not torch.allclose(before, after, atol=1e-5, rtol=1e-5)


def _check_elementwise(rule, index, name, *shapes):
    source, fixed = _fixed(rule, rule.examples[index])
    before, after = _functions(source, fixed, name)
    torch.manual_seed(0)
    args = [torch.randn(*shape, dtype=torch.float64) for shape in shapes]
    return before(*args), after(*args)


@pytest.mark.parametrize("index, name, shapes", [
    (0, "probs", [(4, 7, 11)]),
    (1, "probs", [(5, 6), (6, 9)]),
])
def test_softmax_fix_is_equivalent(index, name, shapes):
    before, after = _check_elementwise(RULES["MAT602"], index, name, *shapes)
    assert torch.allclose(before, after, atol=1e-12)


def test_softmax_fix_repairs_overflow():
    """Why the MAT602 fix is unsafe: where exp() overflowed, the fix changes nan into the answer."""
    source, fixed = _fixed(RULES["MAT602"], RULES["MAT602"].examples[0])
    before, after = _functions(source, fixed, "probs")
    logits = torch.tensor([[100.0, 0.0]])
    assert torch.isnan(before(logits)).any()
    assert torch.allclose(after(logits), torch.tensor([[1.0, 0.0]]))


@pytest.mark.parametrize("index, name", [(0, "gelu"), (2, "gelu"), (4, "gelu")])
def test_tanh_gelu_fix_is_equivalent(index, name):
    before, after = _check_elementwise(RULES["MAT605"], index, name, (3, 64))
    assert torch.allclose(before, after, atol=1e-12, rtol=1e-12)


def test_tanh_gelu_module_fix_is_equivalent():
    source, fixed = _fixed(RULES["MAT605"], RULES["MAT605"].examples[1])
    before, after = _modules(source, fixed, "FastGELU", ())
    x = torch.randn(3, 64, dtype=torch.float64) * 4
    # the "fast" constants are rounded to 10 digits
    assert torch.allclose(before(x), after(x), atol=1e-9)


def test_tanh_gelu_fix_in_a_loop_is_equivalent():
    """The formula's input is rebound on every pass: the fix reads the loop's `h`, not the `x` it
    started from (with `x`, the second pass would differ)."""
    source, fixed = _fixed(RULES["MAT605"], RULES["MAT605"].examples[10])
    before, after = _functions(source, fixed, "run")
    torch.manual_seed(0)
    blocks = [torch.nn.Linear(8, 8).double() for _ in range(3)]
    x = torch.randn(2, 8, dtype=torch.float64)
    assert torch.allclose(before(x, blocks), after(x, blocks), atol=1e-12)


def test_every_elementwise_fix_is_checked():
    fixed = {(code, i) for code in ("MAT602", "MAT605") for i, e in enumerate(RULES[code].examples)
             if e.fixed is not None}
    assert fixed == {("MAT602", 0), ("MAT602", 1), ("MAT605", 0), ("MAT605", 1), ("MAT605", 2), ("MAT605", 4),
                     ("MAT605", 10)}


def test_advice_on_unscaled_flattened_attention_keeps_its_meaning():
    """MAT601 reports a softmax over scores flattened to rows of the key count, with no scale,
    without a fix; its message says to pass `scale=1.0`. Following that advice gives what the
    code computed (the 3-D operands taken as one head)."""
    example = next(e for e in ManualAttention.examples if e.expect and "view(-1, input_lengths)" in e.code)
    findings = [f for f in lint_source(example.code, "example.py", [ManualAttention], prefilter=False)
                if f.code == "MAT601"]
    assert len(findings) == 1 and "pass `scale=1.0`" in findings[0].message
    namespace = {}
    exec(compile(example.code, "before.py", "exec"), namespace)
    queries, values, _ = _qkv(2, 5, 8, s=7)
    before = namespace["attend"](queries, values)
    after = torch.nn.functional.scaled_dot_product_attention(queries, values, values, scale=1.0)
    assert torch.allclose(before, after, atol=1e-10)
    default = torch.nn.functional.scaled_dot_product_attention(queries, values, values)
    assert not torch.allclose(before, default, atol=1e-3)  # without `scale=1.0` the result changes


def test_advice_on_attention_with_the_values_on_the_left_keeps_its_meaning():
    """MAT601 reports SAGAN's self-attention (`bmm(v, attn.permute(0, 2, 1))`, keys laid out
    (B, E, N), no scale) without a fix; its message says to pass the keys and the values
    transposed, `scale=1.0`, and to transpose SDPA's result back. Doing so gives what the code
    computed."""
    example = next(e for e in ManualAttention.examples if e.expect and "bmm(v, attn.permute(0, 2, 1))" in e.code)
    findings = [f for f in lint_source(example.code, "example.py", [ManualAttention], prefilter=False)
                if f.code == "MAT601"]
    assert len(findings) == 1
    message = findings[0].message
    for advice in ("pass `scale=1.0`", "pass `k.transpose(-2, -1)` as SDPA's key",
                   "pass `v.transpose(-2, -1)` as SDPA's value and transpose its result back"):
        assert advice in message, message
    namespace = {}
    exec(compile(example.code, "before.py", "exec"), namespace)
    torch.manual_seed(0)
    module = namespace["SelfAttention"](4).double()
    x = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    before = module(x)
    b, c, h, w = x.shape
    q, k, v = torch.split(module.qkv(x), c, dim=1)
    q, k, v = q.view(b, c, h * w).permute(0, 2, 1), k.view(b, c, h * w), v.view(b, c, h * w)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = sdpa(q, k.transpose(-2, -1), v.transpose(-2, -1), scale=1.0).transpose(-2, -1)
    assert torch.allclose(before, out.reshape(b, c, h, w) + x, atol=1e-10)
    unscaled = sdpa(q, k.transpose(-2, -1), v.transpose(-2, -1)).transpose(-2, -1)
    assert not torch.allclose(before, unscaled.reshape(b, c, h, w) + x, atol=1e-3)
