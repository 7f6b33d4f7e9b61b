"""Generated programs for the property tests (tests/test_properties.py) and the long fuzz run
(benchmarks/fuzz.py): hypothesis strategies for PyTorch-flavoured code, mutations of real
files, and `check_program`, which states the properties every program must satisfy."""
from __future__ import annotations

import random
import warnings
from pathlib import Path

from hypothesis import strategies as st

from matlint.api import lint_text
from matlint.config import Settings
from matlint.fixes import apply_fixes, fix_until_stable, parses

REPO = Path(__file__).resolve().parent.parent
ALL_RULES = Settings(select=("ALL",))
TORCH_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


# -- a torch-flavoured program generator ------------------------------------------------

IMPORT_STYLES = (
    # (import lines, torch name, nn name, F name)
    ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n", "torch", "nn", "F"),
    ("import torch as T\nfrom torch import nn\nfrom torch.nn import functional as F\n", "T", "nn", "F"),
    ("import torch as th\nimport torch.nn as tnn\nimport torch.nn.functional as fn\n", "th", "tnn", "fn"),
    ("import torch\n", "torch", "torch.nn", "torch.nn.functional"),
    ("from torch import nn\nimport torch\n", "torch", "nn", "nn.functional"),
)
EXTRA_IMPORTS = (
    "import math\n", "from torch import matmul as mm\n", "from torch import einsum\n",
    "from torch.nn import Linear, Embedding as Emb\n", "from torch.optim import AdamW\n",
    "from torch.cuda.amp import autocast, GradScaler\n", "import numpy as np\n",
)
TENSORS = ("x", "w", "q", "k", "v", "h", "a", "b", "out", "scores", "att", "mask", "y", "logits", "self.weight", "p")
INDICES = ("i", "j", "t", "b", "k")
SIZES = ("B", "T", "C", "n", "d", "64", "768", "50257", "1", "3", "x.size(0)", "x.shape[-1]", "len(x)")
DIMS = ("-1", "-2", "0", "1", "2")
METHODS = ("t()", "T", "mT", "permute(0, 2, 1)", "contiguous()", "float()", "double()", "cpu()", "cuda()",
           "detach()", "squeeze(-1)", "unsqueeze(1)", "exp()", "sum()", "abs()")
SUBSCRIPTS = ("[{i}]", "[:, {i}]", "[{i}, {j}]", "[{i}][{j}]", "[..., 1::2]", "[:, ::2]", "[:, :, :T, :T]", "[None]")


class _Names:
    def __init__(self, torch: str, nn: str, fn: str):
        self.torch, self.nn, self.fn = torch, nn, fn


@st.composite
def tensor_expr(draw, names: _Names, depth: int = 0):
    """A tensor-valued expression: GEMMs, pointwise chains, layout changes, reductions."""
    tt, fn = names.torch, names.fn
    if depth >= 2 or draw(st.integers(0, 2)) == 0:
        base = draw(st.sampled_from(TENSORS))
        if draw(st.booleans()):
            base += draw(st.sampled_from(SUBSCRIPTS)).format(i=draw(st.sampled_from(INDICES)),
                                                             j=draw(st.sampled_from(INDICES)))
        return base
    sub = lambda: draw(tensor_expr(names, depth + 1))  # noqa: E731
    size = lambda: draw(st.sampled_from(SIZES))  # noqa: E731
    dim = lambda: draw(st.sampled_from(DIMS))  # noqa: E731
    kind = draw(st.integers(0, 38))
    forms = [
        lambda: f"{sub()} @ {sub()}",
        lambda: f"{tt}.matmul({sub()}, {sub()})",
        lambda: f"{tt}.mm({sub()}, {sub()})",
        lambda: f"{tt}.bmm({sub()}, {sub()})",
        lambda: f"mm({sub()}, {sub()})",
        lambda: f"{tt}.einsum('bij,bjk->bik', {sub()}, {sub()})",
        lambda: f"{fn}.linear({sub()}, {sub()})",
        lambda: f"{sub()}.transpose({dim()}, -1)",
        lambda: f"{sub()}.transpose(1, 2).contiguous()",
        lambda: f"{sub()}.{draw(st.sampled_from(METHODS))}",
        lambda: f"{sub()}.view({size()}, {size()}, {size()})",
        lambda: f"{sub()}.reshape({size()}, -1)",
        lambda: f"{sub()}.softmax({dim()})",
        lambda: f"{fn}.softmax({sub()}, dim=-1)",
        lambda: f"{tt}.softmax({sub()}, {dim()})",
        lambda: f"{tt}.exp({sub()}) / {tt}.exp({sub()}).sum({dim()}, keepdim=True)",
        lambda: f"{sub()}.exp() / {tt}.sum({sub()}.exp(), 1, keepdim=True)",
        lambda: f"{sub()}.mean(-1, keepdim=True)",
        lambda: f"({sub()} - {sub()}).pow(2).mean(-1, keepdim=True)",
        lambda: f"{sub()} * {tt}.rsqrt({sub()}.pow(2).mean(-1, keepdim=True) + eps)",
        lambda: f"({sub()} - {sub()}) / {tt}.sqrt({sub()} + eps)",
        lambda: f"0.5 * {sub()} * (1.0 + {tt}.tanh(math.sqrt(2.0 / math.pi) * ({sub()} + 0.044715 * {tt}.pow({sub()}, 3.0))))",
        lambda: f"{sub()} {draw(st.sampled_from(['+', '-', '*', '/', '**']))} {sub()}",
        lambda: f"{sub()} * (1.0 / math.sqrt({sub()}.size(-1)))",
        lambda: f"{sub()}.masked_fill({sub()} == 0, float('-inf'))",
        lambda: f"{tt}.{draw(st.sampled_from(['randn', 'zeros', 'ones', 'empty', 'arange']))}({size()}, {size()})",
        lambda: f"{tt}.ones({size()}).to(device)",
        lambda: f"{tt}.zeros({size()}, {size()}).cuda()",
        lambda: f"{tt}.tensor([0.5, 2.0], device=x.device)",
        lambda: f"{tt}.randn({size()}, {size()}, dtype={tt}.float64)",
        lambda: f"{sub()}.to({tt}.float64)",
        lambda: f"{tt}.stack([{sub()} for {draw(st.sampled_from(INDICES))} in range({size()})])",
        lambda: f"{tt}.cat([h(x) for h in self.heads], dim=-1)",
        lambda: f"{fn}.mse_loss({sub()}, {sub()})",
        lambda: f"{fn}.scaled_dot_product_attention({sub()}, {sub()}, {sub()})",
        lambda: f"{tt}.tanh({sub()})",
        lambda: f"self.{draw(st.sampled_from(['proj', 'fc', 'key', 'query', 'value', 'W_hh']))}({sub()})",
        lambda: f"{tt}.where({sub()} > 0, {sub()}, {sub()})",
        lambda: f"({sub()})",
    ]
    return forms[kind % len(forms)]()


@st.composite
def statements(draw, names: _Names, depth: int, in_loop: bool, in_function: bool):
    """One to three statements as (indent level, text) pairs, relative to the enclosing block."""
    count = draw(st.integers(1, 3))
    lines = []
    for _ in range(count):
        lines.extend(draw(statement(names, depth, in_loop, in_function)))
    return lines


@st.composite
def statement(draw, names: _Names, depth: int, in_loop: bool, in_function: bool):
    tt, nn = names.torch, names.nn
    expr = lambda: draw(tensor_expr(names))  # noqa: E731
    target = lambda: draw(st.sampled_from(TENSORS[:-2]))  # noqa: E731  (not self.weight, p)
    index = lambda: draw(st.sampled_from(INDICES))  # noqa: E731
    size = lambda: draw(st.sampled_from(SIZES))  # noqa: E731
    nested = depth < 2
    kind = draw(st.integers(0, 23 if nested else 13))
    if kind == 0:
        return [(0, f"{target()} = {expr()}")]
    if kind == 1:
        return [(0, f"{target()} {draw(st.sampled_from(['+=', '-=', '*=']))} {expr()}")]
    if kind == 2:
        return [(0, f"{target()}[{index()}] = {expr()}")]
    if kind == 3:
        i, j, k = index(), index(), index()
        return [(0, f"{target()}[{i}][{j}] += {target()}[{i}][{k}] * {target()}[{k}][{j}]")]
    if kind == 4:
        return [(0, f"assert {target()}.shape == ({size()}, {size()})")]
    if kind == 5:
        return [(0, f"B, T, C = {target()}.{draw(st.sampled_from(['shape', 'size()']))}")]
    if kind == 6:
        return [(0, f"total += {expr()}.item()")]
    if kind == 7:
        return [(0, f"outs.append({expr()})")]
    if kind == 8:
        return [(0, draw(st.sampled_from(["loss.backward()", "opt.step()", "opt.zero_grad()", "print(loss)",
                                          "pass", "scaler.scale(loss).backward()", "x = x.to(device)"])))]
    if kind == 9:
        return [(0, f"{target()} = [{expr()} for {index()} in range({size()})]")]
    if kind == 10:
        return [(0, f"opt = {tt}.optim.{draw(st.sampled_from(['SGD', 'AdamW', 'Adam']))}(params, lr=0.1, foreach=False)")]
    if kind == 11:
        layer = draw(st.sampled_from([f"{nn}.Linear({size()}, {size()})", f"{nn}.Embedding({size()}, {size()})",
                                      f"Linear(in_features={size()}, out_features={size()})",
                                      f"{nn}.Parameter({tt}.randn({size()}, {size()}))"]))
        return [(0, f"{draw(st.sampled_from(['layer', 'head', 'self.proj', 'self.fc']))} = {layer}")]
    if kind == 12:
        return [(0, f"{target()} = {target()}.{draw(st.sampled_from(['view', 'reshape']))}({size()}, {size()}, -1)"
                    f".transpose(1, 2)")]
    if kind == 13:
        if in_loop and draw(st.booleans()):
            return [(0, draw(st.sampled_from(["break", "continue"])))]
        return [(0, f"{target()} = {target()}.{draw(st.sampled_from(['item()', 'cpu()', 'tolist()', 'numpy()']))}")]

    def body(loop: bool) -> list:
        inner = draw(statements(names, depth + 1, loop or in_loop, in_function))
        return [(indent + 1, text) for indent, text in inner]

    if kind in (14, 15):
        header = draw(st.sampled_from([f"for {index()} in range({size()}):", "for x, y in loader:",
                                       "for p in model.parameters():", f"for {index()}, xi in enumerate(x):",
                                       "for e, p in zip(ema.parameters(), model.parameters()):"]))
        return [(0, header)] + body(True)
    if kind == 16:
        return [(0, draw(st.sampled_from(["while step < n:", "while True:"])))] + body(True)
    if kind == 17:
        lines = [(0, f"if {expr()} > 0:")] + body(False)
        if draw(st.booleans()):
            lines += [(0, "else:")] + body(False)
        return lines
    if kind == 18:
        ctx = draw(st.sampled_from([f"{tt}.no_grad()", f"{tt}.autocast('cuda')", "autocast()",
                                    f"{tt}.autocast('cuda', enabled=False)"]))
        return [(0, f"with {ctx}:")] + body(False)
    if kind == 19 and in_function:
        return [(0, f"return {expr()}")]
    if kind == 20:
        return [(0, "try:")] + body(False) + [(0, "except RuntimeError:"), (1, "pass")]
    if kind in (21, 22):
        return draw(idiom(names))
    return [(0, f"{target()} = {expr()}  # noqa: {draw(st.sampled_from(['MAT101', 'MAT301', 'E501']))}")]


def _lines(text: str) -> list:
    """(indent level, text) pairs from a 4-space indented snippet."""
    out = []
    for line in text.strip("\n").splitlines():
        stripped = line.lstrip(" ")
        out.append(((len(line) - len(stripped)) // 4, stripped))
    return out


@st.composite
def idiom(draw, names: _Names):
    """A coherent snippet of the kind each rule looks for, with its names, aliases and
    spellings drawn at random, so that the rules' visit code runs on many variants."""
    tt, nn, fn = names.torch, names.nn, names.fn
    pick = lambda *options: draw(st.sampled_from(options))  # noqa: E731
    i, j, kk = draw(st.permutations(["i", "j", "k", "t", "b"]))[:3]
    gemm = pick(f"{tt}.mm({{a}}, {{b}})", "{a} @ {b}", f"{tt}.matmul({{a}}, {{b}})", "mm({a}, {b})",
                f"{fn}.linear({{a}}, {{b}}.t())", f"{tt}.einsum('ij,jk->ik', {{a}}, {{b}})")
    softmax = pick(f"{fn}.softmax({{s}}, dim=-1)", "{s}.softmax(-1)", f"{tt}.softmax({{s}}, dim=-1)")
    transpose = pick("{x}.transpose(-2, -1)", "{x}.mT", "{x}.transpose(1, 2)", "{x}.t()", "{x}.permute(0, 2, 1)", "{x}.T")
    size = pick("64", "50257", "768", "n", "1000", "30522")
    kind = draw(st.sampled_from(range(18)))
    if kind == 0:  # a loop of GEMMs (MAT101)
        return _lines(f"""
x = {tt}.randn(8, 16, 32)
w = {tt}.randn(8, 32, 64)
out = {tt}.empty(8, 16, 64)
for {i} in range({pick("8", "x.size(0)", "len(x)")}):
    out[{i}] = {gemm.format(a=f"x[{i}]", b=f"w[{i}]")}
ys = [{gemm.format(a=f"x[{i}]", b="w[0]")} for {i} in range(8)]
""")
    if kind == 1:  # a scalar triple loop (MAT102)
        return _lines(f"""
A = {tt}.randn(4, 3)
B = {tt}.randn(3, 5)
C = {tt}.zeros(4, 5)
for {i} in range(4):
    for {j} in range(5):
        for {kk} in range(3):
            C[{i}][{j}] += A[{i}][{kk}] * B[{kk}][{j}]
""")
    if kind == 2:  # stacked per-row products (MAT103)
        return _lines(f"""
q = {tt}.randn(16, 8, 32)
k = {tt}.randn(16, 8, 32)
scores = {tt}.stack([{pick(f"(q[{i}] * k[{i}]).sum(-1)", f"{tt}.sum(q[{i}] * k[{i}], dim=-1)")} for {i} in range(16)])
""")
    if kind == 3:  # per-head modules (MAT104)
        return _lines(f"""
class MultiHead({nn}.Module):
    def __init__(self, num_heads, d):
        super().__init__()
        self.heads = {nn}.ModuleList([{nn}.Linear(d, d // num_heads) for _ in range(num_heads)])
    def forward(self, x):
        return {tt}.cat([h(x) for h in self.heads], dim=-1)
""")
    if kind == 4:  # loop-invariant projection (MAT105)
        return _lines(f"""
for t in range(x.size(0)):
    h = {tt}.tanh({gemm.format(a="x[t]", b="W_xh")} + {gemm.format(a="h", b="W_hh")} + b)
    outputs.append(h)
""")
    if kind == 5:  # trailing-one broadcast and loss shape (MAT201, MAT202)
        return _lines(f"""
N = {pick("64", "128")}
pred = {tt}.randn(N, 1)
target = {tt}.randn(N)
loss = {pick("((pred - target) ** 2).mean()", f"{fn}.mse_loss(pred, target)", "(target - pred).pow(2).mean()")}
""")
    if kind == 6:  # a mask broadcast (MAT203)
        return _lines("""
B, T, C = x.shape
q = x.view(B, T, n_head, C // n_head).transpose(1, 2)
k = x.view(B, T, n_head, C // n_head).transpose(1, 2)
scores = q @ k.transpose(-2, -1)
assert pad.shape == (B, T)
scores = scores.masked_fill(pad == 0, float("-inf"))
""")
    if kind == 7:  # layout copies before a GEMM (MAT301, MAT302, MAT303, MAT304)
        x = pick("x", "k", "self.weight")
        return _lines(f"""
y = {gemm.format(a="q", b=transpose.format(x=x) + pick(".contiguous()", "", "[:, ::2]"))}
z = {transpose.format(x="y")}.view({pick("-1", "B, T, C", "y.size(0), -1")})
for c in chunks:
    w = {transpose.format(x=x)}.contiguous()
""")
    if kind == 8:  # a training loop (MAT401, MAT502, MAT503)
        return _lines(f"""
for x, y in loader:
    weights = {tt}.ones(10).to(device)
    loss = {fn}.cross_entropy(model(x.cuda()), y.cuda())
    loss.backward()
    opt.step()
    total += loss.{pick("item()", "cpu()", "tolist()")}
""")
    if kind == 9:  # float64 (MAT402)
        return _lines(f"""
class Head({nn}.Module):
    def __init__(self, d):
        super().__init__()
        self.w = {nn}.Parameter({tt}.randn(d, d, dtype={tt}.{pick("float64", "double")}))
    def forward(self, x):
        return x.{pick("double()", f"to({tt}.float64)", "float()")} @ self.w
""")
    if kind == 10:  # GEMM sizes (MAT403)
        return _lines(f"""
self.lm_head = {nn}.Linear({pick("768", "300", "d")}, {size}, bias=False)
emb = {nn}.Embedding({size}, {pick("1024", "768", "999")})
""")
    if kind == 11:  # per-element loops (MAT501)
        return _lines(f"""
x = {tt}.randn(n)
out = {tt}.empty_like(x)
for {i} in range({pick("len(x)", "x.shape[0]", "x.size(0)")}):
    out[{i}] = x[{i}] * {pick(f"w[{i}] + b[{i}]", "2.0", f"x[{i}]")}
""")
    if kind == 12:  # tiny ops (MAT504)
        return _lines(f"""
opt = {tt}.optim.{pick("SGD", "AdamW")}(params, lr=0.1, foreach=False)
for p in model.parameters():
    p.data = p.data - lr * p.grad
""")
    if kind == 13:  # manual attention (MAT601)
        return _lines(f"""
att = ({pick("q @ k.transpose(-2, -1)", "q @ k.mT", f"{tt}.matmul(q, k.transpose(-1, -2))")}) * (1.0 / math.sqrt(k.size(-1)))
att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
att = {softmax.format(s="att")}
y = att @ v
""")
    if kind == 14:  # manual softmax (MAT602)
        return _lines(f"""
probs = {pick(f"{tt}.exp(logits) / {tt}.exp(logits).sum(dim=-1, keepdim=True)",
              f"logits.exp() / {tt}.sum(logits.exp(), 1, keepdim=True)")}
""")
    if kind == 15:  # manual layer norm (MAT603)
        return _lines(f"""
mean = x.mean(-1, keepdim=True)
var = (x - mean).pow(2).mean(-1, keepdim=True)
x = (x - mean) / {tt}.sqrt(var + eps)
""")
    if kind == 16:  # manual RMS norm (MAT604)
        return _lines(f"""
variance = x.pow(2).mean(-1, keepdim=True)
x = x * {tt}.rsqrt(variance + eps)
""")
    # manual tanh GELU (MAT605)
    return _lines(f"""
y = 0.5 * x * (1.0 + {tt}.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * {pick(f"{tt}.pow(x, 3.0)", "x * x * x", "x ** 3")})))
""")


def _render(lines, base_indent: int, unit: str) -> list:
    return [unit * (base_indent + indent) + text for indent, text in lines]


@st.composite
def function_def(draw, names: _Names, method: bool = False):
    name = draw(st.sampled_from(["forward", "step", "attend", "train", "f", "layer_norm"])) if method else \
        draw(st.sampled_from(["f", "train", "attend", "matmul", "scale", "evaluate", "rms_norm"]))
    params = draw(st.lists(st.sampled_from(["x", "w", "q", "k", "v", "h", "n", "B", "loader", "model", "opt"]),
                           unique=True, max_size=4))
    annotated = [f"{p}: {names.torch}.Tensor" if p in "xwqkvh" and draw(st.booleans()) else p for p in params]
    args = ", ".join((["self"] if method else []) + annotated + (["eps=1e-5"] if draw(st.booleans()) else []))
    decorator = [(0, f"@{names.torch}.no_grad()")] if draw(st.integers(0, 5)) == 0 else []
    body = draw(statements(names, 0, False, True))
    if draw(st.booleans()):
        body.append((0, f"return {draw(tensor_expr(names))}"))
    return decorator + [(0, f"def {name}({args}):")] + [(i + 1, t) for i, t in body]


@st.composite
def module_class(draw, names: _Names):
    nn, tt = names.nn, names.torch
    init = [(1, "super().__init__()")]
    for _ in range(draw(st.integers(0, 4))):
        attr = draw(st.sampled_from(["proj", "fc", "key", "query", "value", "W_hh", "weight", "heads", "lm_head"]))
        value = draw(st.sampled_from([
            f"{nn}.Linear(d, {draw(st.sampled_from(SIZES))}, bias=False)",
            f"{nn}.ModuleList([{nn}.Linear(d, h) for _ in range(n)])",
            f"{nn}.Parameter({tt}.randn(d, d, dtype={tt}.float64))",
            f"{nn}.Embedding({draw(st.sampled_from(SIZES))}, d)",
            f"{nn}.Linear(d, d, dtype={tt}.double)",
        ]))
        init.append((1, f"self.{attr} = {value}"))
    if draw(st.booleans()):
        init.append((1, f"self.register_buffer('bias', {tt}.tril({tt}.ones(n, n)).view(1, 1, n, n))"))
    if draw(st.booleans()):
        init.append((1, "for _ in range(n):"))
        init.append((2, f"self.heads.append({nn}.Linear(d, 1))"))
    lines = [(0, f"class {draw(st.sampled_from(['Block', 'Head', 'Attention', 'RNN', 'Model']))}({nn}.Module):"),
             (1, "def __init__(self, d, h=8, n=4):")] + [(i + 1, t) for i, t in init]
    for _ in range(draw(st.integers(1, 2))):
        lines += [(i + 1, t) for i, t in draw(function_def(names, method=True))]
    return lines


@st.composite
def torch_programs(draw) -> str:
    """A syntactically valid module mixing imports, functions, nn.Module classes and top-level code."""
    imports, tt, nn, fn = draw(st.sampled_from(IMPORT_STYLES))
    names = _Names(tt, nn, fn)
    header = imports + "".join(draw(st.lists(st.sampled_from(EXTRA_IMPORTS), unique=True, max_size=4)))
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(range(5)))
        if part == 0:
            blocks.append(draw(function_def(names)))
        elif part == 1:
            blocks.append(draw(module_class(names)))
        elif part == 2:
            blocks.append(draw(statements(names, 0, False, False)))
        elif part == 3:
            # an idiom inside a function, where the rules see parameters and locals
            blocks.append(draw(function_def(names)) + [(1 + i, text) for i, text in draw(idiom(names))])
        else:
            blocks.append(draw(idiom(names)))
    rendered = [line for block in blocks for line in _render(block, 0, unit)]
    if draw(st.booleans()):
        rendered = [draw(restyled_line(line)) for line in rendered]
    return header + "\n".join(rendered) + "\n"


@st.composite
def restyled_line(draw, line: str) -> str:
    """The same statement written less tidily: non-ASCII text before it on the line (fix
    columns are characters, ast's are bytes), a comment after it, or a line break inside
    its brackets (fixes spanning lines)."""
    style = draw(st.sampled_from(range(6)))
    stripped = line.lstrip(" \t")
    indent = line[:len(line) - len(stripped)]
    simple = not stripped.endswith(":") and not stripped.startswith(("@", "else", "except", "#"))
    if style == 0 and simple:
        return f'{indent}_s = "{draw(st.sampled_from(["é", "日本語", "∑x²", "ü"]))}"; {stripped}'
    if style == 1 and "#" not in line:
        return f"{line}  # {draw(st.sampled_from(['ü', 'note', 'type: ignore', 'noqa']))}"
    if style == 2 and ", " in line and "'" not in line and '"' not in line:
        cut = draw(st.sampled_from([i for i in range(len(line)) if line.startswith(", ", i)]))
        if line[:cut].count("(") + line[:cut].count("[") > line[:cut].count(")") + line[:cut].count("]"):
            return line[:cut + 1] + "\n" + draw(st.sampled_from(["", "        ", "\t"])) + line[cut + 2:]
    return line


# -- programs from hypothesmith, made to reach the rules --------------------------------

def with_torch_header(source: str) -> str:
    """hypothesmith's programs rarely mention torch, so the engine's pre-filter would skip them."""
    if "__future__" in source:  # future imports must stay first
        return source + ("" if source.endswith("\n") or not source else "\n") + TORCH_HEADER
    return TORCH_HEADER + source


# -- mutations of real files ---------------------------------------------------------------

TORCH_NAMES = ("torch.matmul", "torch.bmm", "F.softmax", "x.contiguous", "torch.einsum", "nn.Linear",
               "torch.float64", "x.item", "torch.randn", "torch.tanh", "F.linear", "x.transpose", "x.view",
               "torch.ones", "x.mT", "torch.stack", "torch.cat", "F.scaled_dot_product_attention")


def mutate(source: str, rng: random.Random, rounds: int = 3) -> str:
    """Random line- and token-level edits of a real file; the result may or may not parse."""
    lines = source.splitlines(keepends=True)
    for _ in range(rounds):
        if not lines:
            break
        op = rng.randrange(8)
        i = rng.randrange(len(lines))
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            # replace an identifier with a torch API name
            words = [w for w in _identifiers(lines[i])]
            if words:
                lines[i] = lines[i].replace(rng.choice(words), rng.choice(TORCH_NAMES), 1)
        elif op == 4:
            # truncate at a random character
            cut = rng.randrange(len(lines[i]) + 1)
            lines = lines[:i] + [lines[i][:cut]]
        elif op == 5:
            # keep a window of the file
            j = rng.randrange(i, len(lines)) + 1
            lines = lines[i:j]
        elif op == 6:
            # re-indent one line
            stripped = lines[i].lstrip(" \t")
            lines[i] = rng.choice(["", "    ", "        ", "\t"]) + stripped
        else:
            # duplicate a block into a loop body
            j = min(len(lines), i + rng.randint(1, 6))
            block = ["    " + line if line.strip() else line for line in lines[i:j]]
            lines[i:j] = ["for i in range(n):\n"] + block
    return "".join(lines)


def mutate_until_parses(source: str, rng: random.Random, rounds: int = 3, tries: int = 5) -> str:
    """A mutation that still parses, when one of a few tries gives one (most edits break the
    syntax, and the rules only run on what parses)."""
    for _ in range(tries):
        mutated = mutate(source, rng, rounds)
        if parses(mutated):
            return mutated
    return mutated


def _identifiers(line: str) -> list:
    out, word = [], []
    for ch in line + " ":
        if ch.isalnum() or ch == "_":
            word.append(ch)
        else:
            if word and not word[0].isdigit():
                out.append("".join(word))
            word = []
    return out


def seed_files(limit_bytes: int = 60_000) -> list:
    """Real files to mutate that every checkout has: examples/, the rules' own examples."""
    from matlint.registry import all_rules

    sources = [p.read_text(encoding="utf-8") for p in sorted((REPO / "examples").glob("*.py"))]
    for rule in all_rules():
        for example in rule.examples:
            sources.append(example.code)
            if example.fixed_code:
                sources.append(example.fixed_code)
    return [s for s in sources if len(s) <= limit_bytes]


# -- the properties -------------------------------------------------------------------

def _lint(source: str) -> list:
    return lint_text(source, "generated.py", ALL_RULES)


def _key(finding) -> tuple:
    return finding.code, finding.row, finding.column, finding.end_row, finding.end_column


def check_program(source: str, line_endings: bool = True, per_fix: bool = True) -> list:
    return check_program_findings(source, line_endings, per_fix)[0]


def check_program_findings(source: str, line_endings: bool = True, per_fix: bool = True):
    """`check_program`, also returning the findings; any warning raised while linting or
    fixing (it would print on the user's terminal) is a violation too."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems, findings = _check(source, line_endings, per_fix)
    problems += [f"linting warned: {w.category.__name__}: {w.message}" for w in caught]
    return problems, findings


def _check(source: str, line_endings: bool, per_fix: bool):
    """The properties that must hold for any program; returns the violations (empty when fine).

    (a) linting never raises and never reports MAT000 (internal error); a file that mentions
        torch and does not parse gets exactly one MAT001/MAT002;
    (b) fixes (safe, then safe+unsafe) give source that parses, and fixing again changes nothing;
    (c) every fix offered applies on its own (its result parses); a safe fix removes a finding
        of its code and adds no finding of another code;
    (d) CRLF line endings give the same findings as LF.
    Returns (violations, findings); the violations are empty when all hold.
    """
    problems = []
    try:
        findings = _lint(source)
    except Exception as exc:  # the property is "never raises"; report it rather than stop
        return [f"lint raised {type(exc).__name__}: {exc}"], []
    internal = [f for f in findings if f.code == "MAT000"]
    if internal:
        return [f"MAT000 at {f.row}:{f.column}: {f.message}" for f in internal], findings
    if not parses(source):
        if "torch" in source and [f.code for f in findings] not in (["MAT001"], ["MAT002"]):
            problems.append(f"unparsable file gave {[f.code for f in findings]}, not one MAT001/MAT002")
        return problems, findings
    for unsafe in (False, True):
        if not any(f.fix and (f.fix.safe or unsafe) for f in findings):
            continue
        label = "unsafe" if unsafe else "safe"
        try:
            fixed, _, remaining = fix_until_stable(source, _lint, unsafe=unsafe)
            again, applied_again, _ = fix_until_stable(fixed, _lint, unsafe=unsafe)
        except Exception as exc:
            problems.append(f"{label} fixing raised {type(exc).__name__}: {exc}")
            continue
        if not parses(fixed):
            problems.append(f"{label} fixes gave source that does not parse")
        if any(f.code == "MAT000" for f in remaining):
            problems.append(f"{label} fixes gave source with an internal error")
        if applied_again or again != fixed:
            problems.append(f"{label} fixes are not idempotent: a second pass applied {applied_again}")
    if per_fix:
        problems += _check_each_fix(source, findings)
    if line_endings and "\r" not in source:
        crlf = _lint(source.replace("\n", "\r\n"))
        if sorted(map(_key, crlf)) != sorted(map(_key, findings)):
            problems.append("CRLF line endings change the findings")
    return problems, findings


def _check_each_fix(source: str, findings: list) -> list:
    problems = []
    before = _code_counts(findings)
    for finding in findings:
        if not finding.fix:
            continue
        where = f"{finding.code} fix at {finding.row}:{finding.column}"
        fixed, applied = apply_fixes(source, [finding], unsafe=True)
        if not applied:
            # --fix would skip it, yet the finding is reported as fixable
            problems.append(f"{where} does not parse when applied alone")
            continue
        if not finding.fix.safe:
            continue
        after = _code_counts(_lint(fixed))
        if after.get(finding.code, 0) >= before[finding.code]:
            problems.append(f"{where} did not remove its finding")
        added = {code: n for code, n in after.items() if code != finding.code and n > before.get(code, 0)}
        if added:
            problems.append(f"{where} added findings {added}")
    return problems


def _code_counts(findings) -> dict:
    counts: dict = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    return counts


def minimize(source: str, still_fails) -> str:
    """Line-level delta debugging: the smallest set of lines (greedy) for which `still_fails`."""
    lines = source.splitlines(keepends=True)
    chunk = max(1, len(lines) // 2)
    while chunk >= 1:
        i, removed = 0, False
        while i < len(lines):
            trial = lines[:i] + lines[i + chunk:]
            if trial and still_fails("".join(trial)):
                lines, removed = trial, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return "".join(lines)
