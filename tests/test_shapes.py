"""The symbolic shape analysis (`matlint/semantic/shapes.py`): shape in, shape out, for every op it handles.

Cases written with literal sizes are also run with torch, and the inferred shape must be the
shape torch produces. Symbolic cases check the dims by name; unknown cases check the analysis
says "unknown" instead of guessing."""
import ast
import textwrap

import pytest

from matlint.engine import lint_source
from matlint.registry import _handlers
from matlint.rule import Rule
from matlint.registry import all_rules
from matlint.semantic import shapes as _shapes
from matlint.semantic.shapes import FunctionShapes, Shape, function_shapes, never_shaped, shape_of, value_of

PRELUDE = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


class Probe(Rule):
    """A rule that only looks at values; tests subclass it with the visit methods they need."""
    code = "MAT999"
    name = "probe"
    summary = docs = ""


def probe(source: str, **handlers) -> None:
    """Lints `source` with a Probe whose visit methods are `handlers`."""
    cls = type("P", (Probe,), handlers)
    cls._handlers = _handlers(cls)
    findings = lint_source(source, "t.py", [cls], prefilter=False)
    assert not [f for f in findings if f.code == "MAT000"], findings


def revealed(source: str) -> list:
    """The analysis' value for the argument of every `reveal(expr)` call, in order."""
    out = []

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "reveal":
            out.append(value_of(self.ctx, node.args[0]))

    probe(PRELUDE + textwrap.dedent(source), visit_Call=visit_Call)
    return out


def inferred(setup: str, expr: str):
    return revealed(f"{textwrap.dedent(setup)}\nreveal({expr})\n")[-1]


# (setup with literal sizes, expression): the analysis must know the exact shape, and torch
# must agree with it.
CROSS_CHECKED = [
    # constructors
    ("", "torch.randn(2, 3)"),
    ("", "torch.zeros((4, 1))"),
    ("", "torch.ones([2, 3, 5])"),
    ("", "torch.empty(size=(3,))"),
    ("", "torch.rand(7)"),
    ("", "torch.full((2, 2), 0.5)"),
    ("", "torch.randint(0, 5, (6, 2))"),
    ("", "torch.randint(5, (3,))"),
    ("", "torch.arange(10)"),
    ("", "torch.arange(2, 11, 3)"),
    ("", "torch.linspace(0, 1, 5)"),
    ("", "torch.eye(3)"),
    ("", "torch.eye(2, 4)"),
    ("", "torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])"),
    ("", "torch.tensor(3.0)"),
    ("x = torch.randn(2, 3)", "torch.zeros_like(x)"),
    ("x = torch.randn(2, 3)", "torch.randn_like(x)"),
    ("x = torch.randn(2, 3)", "x.new_zeros(4, 5)"),
    ("x = torch.randn(2, 3)", "x.new_ones((6,))"),
    # view / reshape / -1
    ("x = torch.randn(2, 3, 4)", "x.view(6, 4)"),
    ("x = torch.randn(2, 3, 4)", "x.view(-1)"),
    ("x = torch.randn(2, 3, 4)", "x.view(2, -1)"),
    ("x = torch.randn(2, 3, 4)", "x.reshape(-1, 1)"),
    ("x = torch.randn(2, 3, 4)", "x.reshape((4, -1))"),
    ("x = torch.randn(2, 3, 4)", "torch.reshape(x, (3, 8))"),
    ("x = torch.randn(2, 3, 4)", "x.view(*x.shape[:-1], 2, 2)"),
    ("x = torch.randn(2, 3, 4)", "x.view(x.shape[:-1] + (2, -1))"),
    ("x = torch.randn(2, 3, 4); y = torch.randn(6, 4)", "x.view_as(y)"),
    # (un)squeeze, flatten
    ("x = torch.randn(2, 3)", "x.unsqueeze(0)"),
    ("x = torch.randn(2, 3)", "x.unsqueeze(-1)"),
    ("x = torch.randn(2, 3)", "x.unsqueeze(1)"),
    ("x = torch.randn(2, 3)", "torch.unsqueeze(x, -2)"),
    ("x = torch.randn(2, 1, 3, 1)", "x.squeeze()"),
    ("x = torch.randn(2, 1, 3, 1)", "x.squeeze(1)"),
    ("x = torch.randn(2, 1, 3, 1)", "x.squeeze(-1)"),
    ("x = torch.randn(2, 1, 3, 1)", "x.squeeze(0)"),
    ("x = torch.randn(2, 1, 3, 1)", "x.squeeze((1, 3))"),
    ("x = torch.randn(2, 3, 4, 5)", "x.flatten()"),
    ("x = torch.randn(2, 3, 4, 5)", "x.flatten(1)"),
    ("x = torch.randn(2, 3, 4, 5)", "x.flatten(1, 2)"),
    ("x = torch.randn(2, 3, 4, 5)", "torch.flatten(x, start_dim=-2)"),
    ("x = torch.randn(2, 3, 4, 5)", "nn.Flatten()(x)"),
    # permute / transpose / .T / .mT
    ("x = torch.randn(2, 3, 4)", "x.permute(2, 0, 1)"),
    ("x = torch.randn(2, 3, 4)", "x.permute((1, 2, 0))"),
    ("x = torch.randn(2, 3, 4)", "torch.permute(x, (0, 2, 1))"),
    ("x = torch.randn(2, 3, 4)", "x.transpose(0, 2)"),
    ("x = torch.randn(2, 3, 4)", "x.transpose(-2, -1)"),
    ("x = torch.randn(2, 3, 4)", "torch.transpose(x, 0, 1)"),
    ("x = torch.randn(2, 3, 4)", "x.swapaxes(0, 1)"),
    ("x = torch.randn(2, 3)", "x.T"),
    ("x = torch.randn(2, 3)", "x.t()"),
    ("x = torch.randn(2, 3, 4)", "x.mT"),
    # indexing
    ("x = torch.randn(2, 3, 4)", "x[0]"),
    ("x = torch.randn(2, 3, 4)", "x[:, 1]"),
    ("x = torch.randn(2, 3, 4)", "x[..., 0]"),
    ("x = torch.randn(2, 3, 4)", "x[:, None]"),
    ("x = torch.randn(2, 3, 4)", "x[None]"),
    ("x = torch.randn(2, 3, 4)", "x[..., None]"),
    ("x = torch.randn(2, 3, 4)", "x[:, None, :, None]"),
    ("x = torch.randn(2, 3, 4)", "x[1:, :2, ::2]"),
    ("x = torch.randn(2, 3, 4)", "x[:, -1:]"),
    ("x = torch.randn(2, 3, 4)", "x[0, ..., 1:3]"),
    ("x = torch.randn(2, 3, 4)", "x[-1]"),
    # reductions
    ("x = torch.randn(2, 3, 4)", "x.sum()"),
    ("x = torch.randn(2, 3, 4)", "x.sum(1)"),
    ("x = torch.randn(2, 3, 4)", "x.sum(-1, keepdim=True)"),
    ("x = torch.randn(2, 3, 4)", "x.mean(dim=(0, 2))"),
    ("x = torch.randn(2, 3, 4)", "x.mean((1, 2), True)"),
    ("x = torch.randn(2, 3, 4)", "torch.sum(x, dim=0)"),
    ("x = torch.randn(2, 3, 4)", "torch.mean(x, -1, keepdim=True)"),
    ("x = torch.randn(2, 3, 4)", "x.amax(dim=-1)"),
    ("x = torch.randn(2, 3, 4)", "x.logsumexp(1)"),
    ("x = torch.randn(2, 3, 4)", "x.argmax(-1)"),
    ("x = torch.randn(2, 3, 4)", "x.argmax()"),
    ("x = torch.randn(2, 3, 4)", "x.std(dim=0)"),
    ("x = torch.randn(2, 3, 4)", "x.max(dim=1)[0]"),
    ("x = torch.randn(2, 3, 4)", "x.max(-1).values"),
    ("x = torch.randn(2, 3, 4)", "x.min(dim=0, keepdim=True).indices"),
    ("x = torch.randn(2, 3, 4)", "x.max()"),
    ("x = torch.randn(2, 3, 4)", "x.norm(dim=-1)"),
    ("x = torch.randn(2, 3, 4)", "x.norm(dim=-1, keepdim=True)"),
    ("x = torch.randn(2, 3, 4)", "torch.linalg.norm(x, dim=1)"),
    ("x = torch.randn(2, 3, 4)", "torch.linalg.vector_norm(x, dim=-1, keepdim=True)"),
    ("x = torch.randn(2, 3, 4)", "x.topk(2, dim=1)[0]"),
    ("x = torch.randn(2, 3, 4)", "x.sort(dim=-1).values"),
    # matmul / @ / bmm / mm / einsum / linear
    ("a = torch.randn(2, 3); b = torch.randn(3, 5)", "a @ b"),
    ("a = torch.randn(2, 3); b = torch.randn(3, 5)", "torch.mm(a, b)"),
    ("a = torch.randn(4, 2, 3); b = torch.randn(4, 3, 5)", "torch.bmm(a, b)"),
    ("a = torch.randn(4, 2, 3); b = torch.randn(4, 3, 5)", "a.bmm(b)"),
    ("a = torch.randn(4, 1, 2, 3); b = torch.randn(6, 3, 5)", "torch.matmul(a, b)"),
    ("a = torch.randn(3); b = torch.randn(3)", "a @ b"),
    ("a = torch.randn(3); b = torch.randn(4, 3, 5)", "a @ b"),
    ("a = torch.randn(4, 2, 3); b = torch.randn(3)", "a @ b"),
    ("a = torch.randn(4, 2, 3); b = torch.randn(4, 3, 5)", "a.matmul(b)"),
    ("a = torch.randn(4, 2, 3); b = torch.randn(4, 5, 3)", "torch.einsum('bij,bkj->bik', a, b)"),
    ("a = torch.randn(2, 3); b = torch.randn(3, 5)", "torch.einsum('ij,jk', a, b)"),
    ("a = torch.randn(7, 4, 2, 3)", "torch.einsum('...ij->...ji', a)"),
    ("a = torch.randn(2, 3); b = torch.randn(3, 5)", "torch.einsum('ij,jk->ik', [a, b])"),
    ("a = torch.randn(5); b = torch.randn(3)", "torch.outer(a, b)"),
    ("x = torch.randn(2, 8, 3); w = torch.randn(5, 3)", "F.linear(x, w)"),
    ("a = torch.randn(4, 6, 3); b = torch.randn(4, 5, 3)", "torch.cdist(a, b)"),
    # cat / stack
    ("a = torch.randn(2, 3); b = torch.randn(2, 5)", "torch.cat([a, b], dim=1)"),
    ("a = torch.randn(2, 3); b = torch.randn(4, 3)", "torch.cat((a, b))"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 3)", "torch.stack([a, b])"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 3)", "torch.stack([a, b], dim=-1)"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 3)", "torch.concat([a, b], -1)"),
    # elementwise, activations, broadcasting
    ("a = torch.randn(4, 1); b = torch.randn(4)", "a - b"),
    ("a = torch.randn(4, 1); b = torch.randn(3)", "a * b"),
    ("a = torch.randn(2, 1, 3); b = torch.randn(5, 1)", "a + b"),
    ("a = torch.randn(2, 3)", "a * 2.0 + 1"),
    ("a = torch.randn(2, 3)", "-a"),
    ("a = torch.randn(2, 3)", "a ** 2"),
    ("a = torch.randn(2, 3); b = torch.randn(3)", "a > b"),
    ("a = torch.randn(2, 3); b = torch.randn(3)", "torch.sub(a, b)"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 1)", "a.mul(b)"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 1)", "torch.maximum(a, b)"),
    ("a = torch.randn(2, 3); b = torch.randn(2, 1)", "torch.where(a > 0, a, b)"),
    ("a = torch.randn(2, 3)", "a.masked_fill(a > 0, 0.0)"),
    ("a = torch.randn(3); m = torch.ones(2, 3, dtype=torch.bool)", "a.masked_fill(m, 0.0)"),
    ("a = torch.randn(3); b = torch.zeros(2, 3)", "a.clamp(min=b)"),
    ("a = torch.randn(2, 3)", "a.clamp(-1.0, 1.0)"),
    ("a = torch.randn(2, 3)", "torch.clamp(a, min=0)"),
    ("a = torch.randn(2, 3)", "a.type(torch.float64)"),
    ("a = torch.randn(2, 3)", "a.masked_fill(a > 0, float('-inf'))"),
    ("a = torch.randn(2, 3)", "a.masked_fill(a > 0, torch.finfo(a.dtype).min)"),
    ("import math; a = torch.randn(2, 3)", "a * math.pi + torch.inf"),
    ("a = torch.randn(2, 3)", "F.relu(a)"),
    ("a = torch.randn(2, 3)", "F.gelu(a).sigmoid().float()"),
    ("a = torch.randn(2, 3)", "torch.tanh(a)"),
    ("a = torch.randn(2, 3)", "F.softmax(a, dim=-1)"),
    ("a = torch.randn(2, 3)", "a.softmax(-1)"),
    ("a = torch.randn(2, 3)", "F.dropout(a, 0.1)"),
    ("a = torch.randn(2, 3)", "a.exp().clamp(min=0).detach().contiguous()"),
    ("a = torch.randn(2, 3)", "a.cumsum(1)"),
    ("a = torch.randn(2, 1)", "a.expand(2, 5)"),
    ("a = torch.randn(2, 1)", "a.expand(3, -1, 4)"),
    ("a = torch.randn(2, 1); b = torch.randn(2, 6)", "a.expand_as(b)"),
    ("a = torch.randn(2, 3)", "a.repeat(2, 2)"),
    ("a = torch.randn(2, 3)", "a.repeat(4, 1, 1)"),
    ("a = torch.randn(2, 3); i = torch.zeros(2, 1, dtype=torch.long)", "a.gather(1, i)"),
    ("a = torch.randn(2, 3); i = torch.zeros(2, dtype=torch.long)", "torch.gather(a, 1, i.unsqueeze(1))"),
    ("a = torch.randn(2, 3); i = torch.zeros(2, 1, dtype=torch.long)", "a.gather(1, i).expand(2, 1)"),
    ("import math; a = torch.randn(2, 3); D = a.size(-1)", "a * (1.0 / math.sqrt(D)) + a / D ** 0.5 - a * D ** -0.5"),
    ("i = torch.randint(0, 5, (2, 3))", "F.one_hot(i, 5)"),
    ("q = torch.randn(2, 4, 6, 8); v = torch.randn(2, 4, 6, 3)", "F.scaled_dot_product_attention(q, q[..., :8], v)"),
    # modules
    ("lin = nn.Linear(3, 5); x = torch.randn(2, 7, 3)", "lin(x)"),
    ("lin = nn.Linear(3, 1); x = torch.randn(4, 3)", "lin(x)"),
    ("lin = nn.Linear(in_features=3, out_features=6); x = torch.randn(3)", "lin(x)"),
    ("mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 1)); x = torch.randn(5, 3)", "mlp(x)"),
    ("emb = nn.Embedding(10, 4); i = torch.randint(0, 10, (2, 6))", "emb(i)"),
    ("norm = nn.LayerNorm(4); x = torch.randn(2, 4)", "norm(x)"),
    ("act = nn.GELU(); x = torch.randn(2, 4)", "act(x)"),
    # sizes read from tensors
    ("x = torch.randn(2, 3, 4); B, T, C = x.shape", "torch.zeros(B, C)"),
    ("x = torch.randn(2, 3, 4); n = x.size(1)", "torch.ones(n, n)"),
    ("x = torch.randn(2, 3, 4)", "torch.zeros(x.shape[0], len(x), x.size(-1))"),
    ("x = torch.randn(2, 3, 4)", "torch.zeros(x.shape)"),
    ("x = torch.randn(2, 3, 4)", "torch.zeros(x.size()[1:])"),
    ("x = torch.randn(2, 3, 4); B, T, C = x.shape", "x.view(B * T, C // 2, 2)"),
]


def _as_tuple(value):
    assert isinstance(value, Shape), value
    assert value.known, value
    assert all(isinstance(d, int) for d in value.dims), value
    return value.dims


@pytest.mark.parametrize("setup, expr", CROSS_CHECKED, ids=[e for _, e in CROSS_CHECKED])
def test_shape_matches_torch(setup, expr):
    torch = pytest.importorskip("torch")
    got = _as_tuple(inferred(setup.replace("; ", "\n"), expr))
    namespace: dict = {}
    torch.manual_seed(0)
    exec(PRELUDE + setup.replace("; ", "\n") + f"\n__result = {expr}\n", namespace)
    result = namespace["__result"]
    assert tuple(result.shape) == got


# Symbolic sizes: (source ending in reveal(...), expected shape as written by the analysis).
SYMBOLIC = [
    # a lone name passed as the size is a count where the function uses it as only an int can be
    ("def f(batch_size=32):\n    reveal(torch.zeros(batch_size))", "(batch_size,)"),
    ("def f(memory, n):\n    if len(memory) < n:\n        return\n    reveal(torch.zeros(n))", "(n,)"),
    ("def f(x, n):\n    for i in range(n):\n        pass\n    reveal(torch.ones(n))", "(n,)"),
    ("def f(x, k):\n    head = x[:k]\n    reveal(torch.randn(k))", "(k,)"),
    ("def f(x):\n    B, T, C = x.shape\n    reveal(x)", "(B, T, C)"),
    ("def f(x):\n    B, T, C = x.size()\n    reveal(x.view(B, T, 4, C // 4).transpose(1, 2))", "(B, 4, T, C // 4)"),
    ("def f(x, n_head):\n    B, T, C = x.shape\n    q = x.view(B, T, n_head, C // n_head).transpose(1, 2)\n"
     "    reveal(q @ q.transpose(-2, -1))", "(B, n_head, T, T)"),
    ("def f(x):\n    B, T, C = x.shape\n    reveal(x.reshape(-1, C))", "(B * T, C)"),
    ("def f(x):\n    B, T, C = x.shape\n    reveal(x.view(T * B, C).view(B, T, -1))", "(B, T, C)"),
    ("def f(x):\n    B, T, C = x.shape\n    reveal(x.flatten(0, 1))", "(B * T, C)"),
    ("def f(x):\n    *_, T, C = x.shape\n    reveal(x)", "(..., T, C)"),
    ("def f(x):\n    B, T = x.shape\n    reveal(torch.cat([x, x], dim=1))", "(B, T + T)"),
    ("def f(x):\n    B, T = x.shape\n    reveal(x.sum(-1, keepdim=True))", "(B, 1)"),
    ("def f(x):\n    B, T = x.shape\n    reveal(torch.einsum('bt,bs->bts', x, x))", "(B, T, T)"),
    ("def f(N: int):\n    reveal(torch.randn(N, 1) - torch.randn(N))", "(N, N)"),
    ("def f(x):\n    assert x.shape == (8, 16)\n    reveal(x)", "(8, 16)"),
    ("def f(x, B, T):\n    assert tuple(x.shape) == (B, T)\n    reveal(x.mT)", "(T, B)"),
    ("def f(x):\n    assert x.ndim == 3\n    reveal(x)", "(?, ?, ?)"),
    ("def f(x, n):\n    assert x.shape == torch.Size([n, 2])\n    reveal(x)", "(n, 2)"),
    ("def f(x):\n    assert x.dim() == 2\n    reveal(x.unsqueeze(-1))", "(?, ?, 1)"),
    ("def f(x, y):\n    B, T = y.shape\n    assert x.shape == y.shape\n    reveal(x)", "(B, T)"),
    ("def f(x):\n    n = x.size(0)\n    reveal(torch.zeros(n, 3))", "(n, 3)"),
    ("def f(x, k):\n    reveal(torch.randn(2, 3).view(-1, k))", "(?, k)"),
    ("def f(x, d):\n    reveal(torch.randn(2, 6).view(2, d * 2, 3 // d))", "(2, 2 * d, 3 // d)"),
    ("from jaxtyping import Float\nfrom torch import Tensor\n"
     "def f(x: Float[Tensor, 'batch seq 1']):\n    reveal(x)", "(batch, seq, 1)"),
    ("from jaxtyping import Float\nfrom torch import Tensor\n"
     "def f(x: Float[Tensor, '*batch dim']):\n    reveal(x)", "(..., dim)"),
    ("from jaxtyping import Float\nfrom torch import Tensor\n"
     "def f(x: Float[Tensor, 'b _ #c (h w)']):\n    reveal(x)", "(b, ?, ?, ?)"),
    ("from torchtyping import TensorType\n"
     "def f(x: TensorType['batch', 3, float]):\n    reveal(x)", "(batch, 3)"),
    ("from torchtyping import TensorType\n"
     "def f(x: TensorType[..., 'channels']):\n    reveal(x)", "(..., channels)"),
    ("def f(x):\n    y: 'unused' = x\n    reveal(torch.zeros(3) if x else torch.zeros(3))", "(3,)"),
    ("def f(x, d):\n    lin = nn.Linear(d, 1)\n    reveal(lin(x))", "(..., 1)"),
    ("def f(x, d):\n    h = nn.Linear(d, 8)(x)\n    B, T, C = h.shape\n    reveal(torch.zeros(B, C))", "(B, 8)"),
    ("def f(x, d):\n    conv = nn.Conv2d(3, d, 3)\n    reveal(conv(x))", "(..., d, ?, ?)"),
    ("import math\ndef f(x):\n    B, D = x.shape\n    s = 1.0 / math.sqrt(D)\n    reveal(x * s + x / D ** 0.5 + x * D ** -0.5)",
     "(B, D)"),
    ("def f(x, g: float, h=0.99, *, k=-1.5):\n    B, D = x.shape\n    reveal(g * x * h / k)", "(B, D)"),
    ("def f(q, a):\n    B, A = q.shape\n    assert a.shape == (B,)\n    reveal(q.gather(1, a.unsqueeze(1)))", "(B, 1)"),
    ("def f(net, s, a, B):\n    assert a.shape == (B, 1)\n    reveal(net(s).gather(1, a))", "(B, 1)"),
    ("def f(y, B):\n    assert y.ndim == 2 and y.shape[0] == B\n    reveal(y)", "(B, ?)"),
    ("def f(y, B, C):\n    assert y.ndim == 2\n    assert y.size(-1) == C\n    assert B == y.shape[0]\n    reveal(y)", "(B, C)"),
    ("def f(x, D):\n    assert x.shape[-1] == D\n    reveal(x)", "(..., D)"),
    ("class M(nn.Module):\n    def __init__(self, d, n_embd):\n        super().__init__()\n"
     "        self.n_embd = n_embd\n        self.fc = nn.Linear(d, n_embd)\n"
     "    def forward(self, x):\n        B, T, _ = x.shape\n        reveal(self.fc(x).view(B, T, self.n_embd))",
     "(B, T, self.n_embd)"),
    ("class M(nn.Module):\n    def __init__(self, cfg):\n        super().__init__()\n"
     "        self.head = nn.Sequential(nn.Linear(cfg.d, cfg.d), nn.Tanh(), nn.Linear(cfg.d, 1))\n"
     "    def forward(self, x):\n        reveal(self.head(x))", "(..., 1)"),
    ("class M(nn.Module):\n    def __init__(self, d, heads):\n        super().__init__()\n"
     "        self.num_heads = heads\n        self.heads = heads\n        self.gate = nn.Linear(d, heads)\n"
     "    def forward(self, x):\n        B, T, _ = x.shape\n"
     "        reveal(self.gate(x).view(B, T, self.heads) + self.gate(x))", "(B, T, self.num_heads)"),
    ("class M(nn.Module):\n    def __init__(self, cfg):\n        super().__init__()\n"
     "        self.cfg = cfg\n        self.proj = nn.Linear(cfg.d, cfg.hidden)\n"
     "    def forward(self, x):\n        reveal(self.proj(x))", "(..., self.cfg.hidden)"),
]


@pytest.mark.parametrize("source, expected", SYMBOLIC, ids=[e for _, e in SYMBOLIC])
def test_symbolic_shapes(source, expected):
    value = revealed(source)[-1]
    assert isinstance(value, Shape), value
    assert str(value) == expected


# Where the analysis must answer "unknown" (None) rather than guess.
UNKNOWN = [
    "def f(x):\n    reveal(x)",                                   # a parameter
    "def f(x, n):\n    if x.shape == (n, 2):\n        pass\n    reveal(x)",  # true only inside the if
    "def f(x):\n    reveal(x + 1)",
    "def f(x, shape):\n    reveal(x.view(shape))",               # `shape` may be a whole tuple
    "def f(shape):\n    reveal(torch.zeros(shape))",
    "def f(shape, other):\n    if shape > other:\n        pass\n    reveal(torch.zeros(shape))",  # tuples order too
    "def f(shape=(2, 3)):\n    reveal(torch.zeros(shape))",
    "def f(x, idx):\n    reveal(torch.randn(3, 4)[idx])",         # advanced indexing
    "def f(B: int):\n    reveal(torch.randn(B, 1).squeeze())",   # B may be 1
    "def f(n: int):\n    reveal(torch.randn(3, n).squeeze(1))",
    "def f(n):\n    y = torch.randn(3)\n    if n:\n        y = torch.randn(4)\n    reveal(y)",
    "def f(xs):\n    y = torch.randn(3)\n    for x in xs:\n        y = torch.cat([y, x])\n    reveal(y)",
    "def f(xs):\n    y = torch.randn(3)\n    while xs:\n        y = y[None]\n    reveal(y)",
    "def f(x):\n    y = torch.randn(3, 4)\n    reveal(y.permute(0, 2, 1))",  # wrong rank
    "def f(x):\n    reveal(torch.randn(2, 3) @ x)",
    "def f(x):\n    reveal(torch.randn(2, 3) * x)",             # x may be a tensor of any shape
    "def f(x):\n    h = x * 2\n    reveal(h + torch.zeros(3))",  # so may x * 2
    "def f(m):\n    reveal(torch.zeros(3).masked_fill(m, 0.0))",  # m may broadcast bigger
    "def f(lo):\n    reveal(torch.zeros(3).clamp(min=lo))",
    "def f(x):\n    reveal(torch.zeros(3).type())",                 # a string
    "def f(x):\n    reveal(torch.randn(2, 3).view(torch.float16))",  # rescales the last dim
    "def f(x):\n    reveal(torch.randn(2, 3)[x.bool()])",
    "def f(x):\n    reveal(F.interpolate(torch.randn(1, 3, 8, 8), scale_factor=2))",
    "def f(x):\n    reveal(torch.randn(2, 3).chunk(2)[0])",
    "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(3, 1)\n"
    "    def reset(self):\n        self.fc = nn.Identity()\n    def forward(self, x):\n        reveal(self.fc(x))",
    "def f(x):\n    t = torch.randn(2, 3)\n    t = t.unsqueeze(x)\n    reveal(t)",
    "def f(D):\n    reveal(torch.randn(3) * D ** 0.5)",          # D may be a tensor
    "def f(g: torch.Tensor = 0.5):\n    reveal(torch.randn(3) * g)",  # annotated as a tensor
    "def f(acc):\n    reveal(acc.gather(torch.randn(3)))",        # not gather(dim, index)
    "def f(x, B):\n    assert x.shape[0] == B\n    reveal(x)",    # rank unknown
]


@pytest.mark.parametrize("source", UNKNOWN)
def test_unknown_is_not_guessed(source):
    assert shape_or_none(revealed(source)[-1]) is None


def shape_or_none(value):
    return value if isinstance(value, Shape) else None


def test_leading_unknown_dims_stay_unknown():
    x = revealed("def f(x, d):\n    lin = nn.Linear(d, 4)\n    reveal(lin(x).transpose(0, 1))\n"
                 "    reveal(lin(x).transpose(-1, -2))\n    reveal(lin(x).unsqueeze(-1))\n    reveal(lin(x)[0])\n"
                 "    reveal(lin(x).sum(-1))")
    assert x[0] is None                      # axis 0 of (..., 4) is not known
    assert x[1] is None                      # (..., 4) may have rank 1
    assert str(x[2]) == "(..., 4, 1)"
    assert x[3] is None
    assert x[4].leading and x[4].dims == ()


# Intent: which size-1 axes the author asked for on purpose.
EXPLICIT = [
    ("x = torch.randn(4)", "x[:, None]", {-1}),
    ("x = torch.randn(4)", "x.unsqueeze(1)", {-1}),
    ("x = torch.randn(4)", "x[None, :]", {-2}),
    ("x = torch.randn(4, 3)", "x.sum(-1, keepdim=True)", {-1}),
    ("x = torch.randn(4, 3)", "x.view(-1, 1)", {-1}),
    ("x = torch.randn(4, 3)", "x[:, -1:]", set()),          # keeps a dim, states no broadcast
    ("x = torch.randn(4)", "(x[:, None] * 2).float()", {-1}),
    ("x = torch.randn(4)", "x[:, None].transpose(0, 1)", {-2}),
    ("x = torch.randn(4)", "x[:, None] - x[None, :]", set()),
    ("x = torch.randn(4, 1)", "x", set()),
    ("lin = nn.Linear(3, 1); x = torch.randn(4, 3)", "lin(x)", set()),
    ("x = torch.randn(4, 1, 1)", "x.squeeze(1)", set()),
    ("x = torch.randn(4)", "x[:, None, None].squeeze(1)", {-1}),
    ("x = torch.randn(4)", "x[:, None][:, :]", {-1}),
    ("x = torch.randn(4)", "x[:, None][..., :]", {-1}),
    ("x = torch.randn(4, 3)", "x.sum(1, keepdim=True)[0]", {-1}),
    ("x = torch.randn(4, 3); i = torch.zeros(4, dtype=torch.long)", "x.gather(1, i.unsqueeze(1))", set()),
    ("x = torch.randn(4, 3); i = torch.zeros(4, dtype=torch.long)", "torch.gather(x, 1, i[:, None])", set()),
    ("x = torch.randn(4)", "nn.Sigmoid()(x[:, None])", {-1}),
    ("act = nn.Sequential(nn.ReLU(), nn.Dropout(0.1)); x = torch.randn(4)", "act(x[:, None])", {-1}),
    ("x = torch.randn(4)", "x[:, None].expand(4, 1)", {-1}),
    ("x = torch.randn(4)", "x[:, None].expand(-1, 1)", {-1}),
    ("x = torch.randn(4)", "x[:, None].expand(4, 3)", set()),
]


@pytest.mark.parametrize("setup, expr, axes", EXPLICIT, ids=[e for _, e, _ in EXPLICIT])
def test_explicit_singleton_axes(setup, expr, axes):
    value = inferred(setup.replace("; ", "\n"), expr)
    assert set(value.explicit) == axes


def test_every_expression_in_a_function_is_recorded_once():
    source = PRELUDE + "def f(N: int):\n    a = torch.randn(N, 1)\n    return (a - torch.randn(N)).mean()\n"
    seen = []

    def visit_BinOp(self, node):
        seen.append((shape_of(self.ctx, node.left), shape_of(self.ctx, node.right), shape_of(self.ctx, node)))
        seen.append(len([k for k in self.ctx.shared if k[0] == "shapes"]))

    probe(source, visit_BinOp=visit_BinOp)
    (a, b, result), analyses = seen
    assert (str(a), str(b), str(result)) == ("(N, 1)", "(N,)", "(N, N)")
    assert analyses == 1


def test_names_with_different_values_are_different_symbols():
    values = revealed("def f(x, y):\n    n = x.size(0)\n    m = y.size(0)\n    reveal(torch.zeros(n) - torch.zeros(m))\n"
                      "    reveal(torch.zeros(n) - torch.zeros(n))")
    assert str(values[0]) == "(?,)"      # n and m may differ: no claim
    assert str(values[1]) == "(n,)"


def test_names_assigned_twice_are_not_symbols():
    values = revealed("def f(x):\n    n = x.size(0)\n    a = torch.zeros(n)\n    n = x.size(1)\n"
                      "    reveal(a)\n    reveal(torch.zeros(n))")
    assert str(values[0]) == "(?,)" and str(values[1]) == "(?,)"


def test_a_name_assigned_once_in_a_loop_is_a_symbol_within_one_pass():
    values = revealed("def f(xs):\n    prev = None\n    for x in xs:\n        n = x.size(0)\n"
                      "        reveal(torch.zeros(n) - torch.zeros(n))\n        reveal(prev)\n"
                      "        prev = torch.zeros(n)\n    reveal(torch.zeros(n))\n")
    assert str(values[0]) == "(n,)"
    assert values[1] is None             # the step before's value: forgotten where the loop starts
    assert str(values[2]) != "(n,)"      # after the loop n is forgotten (the last pass's n, or none)


def test_a_name_reshaped_in_place_is_forgotten():
    values = revealed("def f(n):\n    a = torch.randn(n, 1)\n    a.squeeze_(1)\n    reveal(a)\n"
                      "    b = torch.randn(n, 1)\n    b. \\\n        unsqueeze_(0)\n    reveal(b)\n"
                      "    c = torch.randn(n, 1)\n    for _ in range(2):\n        reveal(c)\n        c.t_()\n")
    assert values == [None, None, None]  # in the loop, c may be the step before's transpose


def test_module_level_layers_bound_twice_or_made_global_are_not_known():
    twice = revealed("crit = nn.MSELoss()\ncrit = nn.L1Loss()\ndef f(a, b):\n    reveal(crit(a, b))\n")
    made_global = revealed("crit = nn.MSELoss()\ndef g():\n    global crit\n    crit = None\n"
                           "def f(a, b):\n    reveal(crit(a, b))\n")
    assert twice == [None] and made_global == [None]


def test_module_level_layers_are_read_with_the_module_names_not_the_function_locals():
    layer = "d = 8\nhead = nn.Linear(4, d)\ndef f(x: torch.Tensor, n):\n"
    plain = revealed(layer + "    reveal(head(x.view(n, 4)))\n    reveal(head(x.view(n, 4)))\n")
    assert [str(v) for v in plain] == ["(n, 8)", "(n, 8)"]  # the module binds d once, to 8
    shadowed = revealed(layer + "    d = 3\n    reveal(head(x.view(n, 4)))\n")
    assert [str(v) for v in shadowed] == ["(n, ?)"]  # not (n, 3): the module's d is not the function's


def test_module_level_layers_built_from_each_other_end():
    # `a` is read while `b` is read while `a` is read...: this recursed until the walk gave up (MAT000).
    values = revealed("a = nn.Sequential(b)\nb = nn.Sequential(a)\ndef f(x: torch.Tensor, n):\n"
                      "    reveal(a(x.view(n, 4)))\n")
    assert len(values) == 1


def test_init_symbols_do_not_meet_forward_symbols():
    values = revealed("class M(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                      "        self.fc = nn.Linear(3, n)\n    def forward(self, x, n: int):\n"
                      "        reveal(self.fc(x))\n        reveal(torch.zeros(n))")
    assert values[0].dims[-1] != values[1].dims[0]


def test_statements_of_every_kind_are_walked_without_errors():
    values = revealed('''
        import math
        def f(x, items, cfg):
            global G
            keep = torch.zeros(7)
            a = torch.zeros(4, 1)
            if (n := len(items)) > 2:
                b = torch.zeros(n)
            try:
                c = torch.zeros(3)
            except (ValueError, TypeError) as err:
                c = torch.zeros(5)
            finally:
                d = torch.zeros(2)
            with torch.no_grad() as ctx:
                e = [torch.zeros(k) for k in range(3)]
            match cfg:
                case {"size": size}:
                    a = torch.zeros(size)
                case [first, *rest]:
                    pass
                case _:
                    pass
            g = (lambda t: t * 2)(a)
            async def inner():
                await something(a)
            del d
            reveal(a)
            reveal(c)
            reveal(d)
            reveal(keep)
            return a
    ''')
    assert values[0] is None            # `a` differs between match cases
    assert values[1] is None            # (3,) or (5,)
    assert values[2] is None            # deleted
    assert str(values[3]) == "(7,)"     # untouched by any of it


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def _sources_with_shapes() -> list:
    """Every program of this file and every rule example that parses: code that reaches many shapes."""
    from matlint.registry import all_rules

    programs = [PRELUDE + setup.replace("; ", "\n") + f"\nreveal({expr})\n" for setup, expr in CROSS_CHECKED]
    programs += [PRELUDE + source for source, _ in SYMBOLIC]
    programs += [example.code for rule in all_rules() for example in rule.examples]
    return [program for program in programs if _parses(program)]


def test_never_shaped_expressions_have_no_shape(monkeypatch):
    """`never_shaped` lets rules skip the analysis; it must only say so where the analysis would
    find no shape. Every expression of every analysed function is checked against the analysis."""
    monkeypatch.setattr(_shapes, "may_hold_shapes", lambda *args: True)  # the whole analysis, everywhere
    checked = []

    def visit_FunctionDef(self, node):
        analysis = function_shapes(self.ctx, node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.expr) and never_shaped(sub, self.ctx):
                checked.append(sub)
                assert not isinstance(analysis.value(sub), Shape), ast.unparse(sub)

    def visit_Module(self, node):
        visit_FunctionDef(self, node)

    for source in _sources_with_shapes():
        probe(source, visit_FunctionDef=visit_FunctionDef, visit_Module=visit_Module)
    assert len(checked) > 1000


def _same_value(a, b) -> bool:
    """Equal values; modules (compared by identity) built by two analyses of one function are
    the same when their names and layers agree."""
    return a == b or ("Module(" in repr(a) and repr(a) == repr(b))


def test_lazy_analysis_gives_the_values_of_the_whole_analysis(monkeypatch):
    """A lazy analysis (the one rules get) reads a function's statements only as far as it is
    asked; asked about every expression, in reverse order of position and then in order, it must
    give exactly the values the whole analysis gives."""
    monkeypatch.setattr(_shapes, "may_hold_shapes", lambda *args: True)
    compared = []

    def visit_FunctionDef(self, node):
        cls = self.ctx.class_ if node in getattr(self.ctx.class_, "body", ()) else None
        args = (_shapes._class_attrs(self.ctx, cls), _shapes.self_name_of(node)) if cls is not None else ()
        whole = FunctionShapes(self.ctx, node, *args)
        exprs = [sub for sub in ast.walk(node) if isinstance(sub, ast.expr)]
        for order in (exprs[::-1], exprs):
            lazy = FunctionShapes(self.ctx, node, *args, lazy=True)
            for sub in order:
                assert _same_value(lazy.value(sub), whole.values.get(sub)), ast.unparse(sub)
                compared.append(sub)
        assert lazy.values.keys() == whole.values.keys()

    for source in _sources_with_shapes():
        probe(source, visit_FunctionDef=visit_FunctionDef, visit_Module=visit_FunctionDef)
    assert len(compared) > 10000


def test_never_shaped_covers_sizes_attributes_and_displays():
    from matlint.engine import FileContext

    source = "self.labels = torch.ones(n, 1)\nself.a, self.b = x, y\nself.total += 1\nfc(self.arg, 2)\n"
    ctx = FileContext(source, "t.py", ast.parse(source))
    for text in ("1", "-1", "not x", "'s'", "f'{x}'", "(a, b)", "[a]", "{a: b}", "[t for t in x]",
                 "lambda: x", "a or b", "x.shape", "x.shape[0]", "x.dtype", "self.fc", "-x.ndim", "f(x).labels"):
        assert never_shaped(ast.parse(text, mode="eval").body, ctx), text
    for text in ("x", "x.T", "x.mT", "x.data", "out.values", "x[0]", "x + y", "-x", "f(x)", "x.view(2, 3)",
                 "a if c else b", "x == y", "self.labels", "self.a", "self.b", "self.total", "self.arg"):
        assert not never_shaped(ast.parse(text, mode="eval").body, ctx), text


# -- the gate: a function with no source of shapes is not analysed ---------------------------------

# Each function's only source of a shape, in the spellings that reach the analysis without the
# plain `.name`: the gate (`may_hold_shapes`) must let every one through.
SHAPE_SOURCES = {
    "constructor": "def f(n):\n    reveal(torch.randn(n, 1))\n",
    "constructor-imported-alias": "from torch import randn as r\ndef f(n):\n    reveal(r(n, 1))\n",
    "constructor-assigned-alias": "r = torch.randn\ndef f(n):\n    reveal(r(n, 1))\n",
    "constructor-local-import": "def f(n):\n    from torch import randn as r\n    reveal(r(n, 1))\n",
    "constructor-enclosing-alias": "def g():\n    r = torch.randn\n    def f(n):\n        reveal(r(n, 1))\n    return f\n",
    "comment-between-dot-and-name": "def f(n):\n    reveal((torch.  # a comment\n            randn(n, 1)))\n",
    "continuation-between-dot-and-name": "def f(n):\n    reveal(torch. \\\n        randn(n, 1))\n",
    "fullwidth-name": "def f(n):\n    reveal(torch.\uff52\uff41\uff4e\uff44\uff4e(n, 1))\n",
    "view-of-unknown": "def f(x, n):\n    reveal(x.view(n, 1))\n",
    "layer-called-inline": "def f(x):\n    reveal(nn.Linear(4, 1)(x))\n",
    "loss-held-as-value": "def f(a, b):\n    crit = F.mse_loss\n    reveal(crit(a, b))\n",
    "loss-imported-alias": "from torch.nn.functional import mse_loss as l2\ndef f(a, b):\n    reveal(l2(a, b))\n",
    "assert-shape": "def f(x, n):\n    assert x.shape == (n, 1)\n    reveal(x)\n",
    "assert-rank": "def f(x):\n    assert x.ndim == 2\n    reveal(x)\n",
    "unpacked-shape": "def f(x):\n    B, T = x.shape\n    reveal(x)\n",
    "unpacked-size-in-a-block": "def f(x):\n    with torch.no_grad():\n        B, T = x.size()\n        reveal(x)\n",
    "layer-stored-in-init": """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        reveal(self.head(x))
""",
    "loss-stored-in-init": """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.crit = nn.MSELoss()

    def forward(self, a, b):
        reveal(self.crit(a, b))
""",
    "jaxtyping-annotation": "from jaxtyping import Float\nfrom torch import Tensor\ndef f(x: Float[Tensor, 'b 1']):\n    reveal(x)\n",
    "loss-built-at-module-level": "criterion = nn.MSELoss()\ndef f(a, b):\n    reveal(criterion(a, b))\n",
    "layer-built-at-module-level": "head = nn.Linear(8, 1)\ndef f(x: torch.Tensor, n):\n    reveal(head(x.view(n, 8)))\n",
    "module-level-code": "reveal(torch.randn(3, 1))\n",
    "lambda": "f = lambda n: reveal(torch.randn(n, 1))\n",
}


# The analysis reads `__init__` with the names in scope where it is asked (a method), so it does
# not know this layer; the gate lets it through all the same (an `import` in `__init__`), and
# the sweep below would catch a gate that stopped doing so once the analysis learns it.
LAYER_IMPORTED_IN_INIT = """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        from torch.nn import Linear as L
        self.head = L(8, 1)

    def forward(self, x):
        reveal(self.head(x))
"""


@pytest.mark.parametrize("case", sorted(SHAPE_SOURCES))
def test_gate_lets_every_source_of_shapes_through(case):
    assert isinstance(revealed(SHAPE_SOURCES[case])[-1], Shape)


def test_functions_without_a_source_of_shapes_are_not_analysed():
    """The gate does save work: these functions get the empty stand-in, not an analysis."""
    source = PRELUDE + textwrap.dedent("""
        def f(x, y):
            z = x + y * 2
            return reveal(z @ y.T)

        class M(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.act = nn.GELU()

            def forward(self, x):
                n = x.shape[0]
                return reveal(self.act(x))
        """)
    stand_ins = []

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "reveal":
            stand_ins.append(function_shapes(self.ctx) is _shapes._NO_SHAPES)

    probe(source, visit_Call=visit_Call)
    assert stand_ins == [True, True]


def test_gate_skips_only_functions_the_analysis_knows_no_shape_in(monkeypatch):
    """Every function of every rule example and every program of this file that the gate skips
    is analysed anyway, and must hold no shape."""
    real = _shapes.may_hold_shapes
    answers = []

    def checked(ctx, owner, cls=None):
        answer = real(ctx, owner, cls)
        if not answer:
            analysis = (FunctionShapes(ctx, owner, _shapes._class_attrs(ctx, cls), _shapes.self_name_of(owner))
                        if cls is not None else FunctionShapes(ctx, owner))
            shaped = [v for v in analysis.values.values() if isinstance(v, Shape)]
            assert not shaped, (ctx.source, getattr(owner, "lineno", None), shaped)
        answers.append(answer)
        return answer

    monkeypatch.setattr(_shapes, "may_hold_shapes", checked)
    sources = _sources_with_shapes() + [PRELUDE + s for s in [*SHAPE_SOURCES.values(), LAYER_IMPORTED_IN_INIT]]
    for source in sources:
        lint_source(source, "t.py", all_rules(), prefilter=False)
    assert answers.count(False) >= 50 and answers.count(True) >= 50, (answers.count(False), answers.count(True))


def test_gate_reads_rows_of_hashes_in_linear_time():
    """A dot before a long comment of `#`s (a banner) must not send the gate's regex into
    exponential backtracking: each comment has one way to match."""
    import signal

    source = PRELUDE + "def f(x):\n    y = (x.  # " + "#" * 5000 + "\n         mean())\n    return reveal(y + 1)\n"
    signal.signal(signal.SIGALRM, lambda *args: pytest.fail("the gate took more than 5 s"))
    signal.alarm(5)
    try:
        assert revealed(source) == [None]
    finally:
        signal.alarm(0)


def test_what_an_unknown_operand_must_be():
    values = revealed("def f(h, e, n: int):\n"
                      "    reveal(h.repeat(n, 1, 1))\n"          # one size per axis of the result
                      "    reveal(h.repeat(n, 1))\n"             # numpy's repeat(repeats, axis) too: no claim
                      "    reveal(torch.cat([h.repeat(n, 1, 1), e], 2))\n"  # cat's operands share one rank
                      "    reveal(torch.cat([h, e], 2))\n")
    assert [str(v) if v is not None else None for v in values] == ["(?, ?, ?)", None, "(?, ?, ?)", None]


def test_wrappers_that_give_their_argument_back():
    values = revealed("from torch.autograd import Variable\n"
                      "def f(n: int):\n"
                      "    reveal(Variable(torch.ones(n)).cuda())\n"
                      "    reveal(nn.Parameter(torch.randn(n, 4)))\n"
                      "    reveal(nn.Parameter(torch.randn(n, 4), requires_grad=False))\n")
    assert [str(v) for v in values] == ["(n,)", "(n, 4)", "(n, 4)"]


def test_module_level_instances_and_their_moves():
    values = revealed("class Head(nn.Module):\n"
                      "    def __init__(self):\n"
                      "        super().__init__()\n"
                      "        self.fc = nn.Linear(8, 1)\n"
                      "    def forward(self, x):\n"
                      "        return self.fc(x)\n"
                      "class Plain:\n"
                      "    def cuda(self):\n"
                      "        return None\n"
                      "head = Head()\n"
                      "head = head.cuda().train()\n"
                      "plain = Plain().cuda()\n"
                      "reveal(head(torch.randn(5, 8)))\n"
                      "reveal(plain)\n")
    assert str(values[0]) == "(5, 1)"
    assert not isinstance(values[1], _shapes.Instance)  # a class's own `cuda` returns what it returns


_NET = """\
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, d, out=1):
        super().__init__()
        self.fc = nn.Linear(d, 16)
        self.head = nn.Linear(16, out)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))
"""


def test_a_class_of_another_project_module_gives_its_forward_shape(tmp_path):
    """`from model import Net` (or `import pkg.model as models`, `models.Net(...)`): calling the
    instance gives what `forward` returns, read where the class is defined, with the sizes the
    constructor call gives; as a module-level name, or passed to the function that trains it."""
    from matlint.registry import get_rule

    (tmp_path / "model.py").write_text(_NET)
    script = tmp_path / "train.py"
    source = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        from model import Net

        net = Net(8)
        wide = Net(8, out=4)
        for step in range(100):
            x, y = torch.randn(32, 8), torch.randn(32)
            loss = F.mse_loss(net(x), y) + F.mse_loss(wide(x), y)
            loss.backward()
        """)
    script.write_text(source)
    rules = [get_rule("MAT202")]
    found = lint_source(source, str(script), rules)
    assert [(f.row, f.column) for f in found] == [(9, 12)]
    assert "input (32, 1) and target (32,)" in found[0].message

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(_NET)
    script = tmp_path / "main.py"
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        import pkg.model as models

        def train(model, opt, n: int):
            x, y = torch.randn(n, 8), torch.randn(n)
            loss = nn.MSELoss()(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()

        if __name__ == "__main__":
            net = models.Net(8)
            train(net, torch.optim.SGD(net.parameters(), 0.1), 64)
        """)
    script.write_text(source)
    found = lint_source(source, str(script), rules)
    assert [(f.row, f.column) for f in found] == [(7, 12)]
    assert "MSELoss() input (n, 1) and target (n,)" in found[0].message
    # The module's head made 4 wide: the shapes differ without broadcasting into a matrix.
    (package / "model.py").write_text(_NET.replace("out=1", "out=4"))
    assert lint_source(source, str(script), rules) == []


def test_a_module_whose_class_another_project_module_defines_runs_its_gemm_per_item(tmp_path):
    """MAT101: `self.score(c * q.select(1, i))` in a loop over `i`, where `self.score` is a
    `Linear` wrapper of a project module whose `forward` applies `nn.Linear` to its input: one
    small GEMM per item. The message quotes that GEMM from the module that defines it."""
    from matlint.registry import get_rule

    (tmp_path / "layers.py").write_text(textwrap.dedent("""\
        import torch.nn as nn

        class Linear(nn.Module):
            def __init__(self, d_in, d_out, dropout=0.0):
                super().__init__()
                self.linear = nn.Linear(d_in, d_out)
                self.dropout = nn.Dropout(dropout)

            def forward(self, x):
                x = self.dropout(x)
                return self.linear(x)

        class Running(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.linear = nn.Linear(d, d)

            def forward(self, x):
                self.last = x
                return self.linear(x)
        """))
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from layers import Linear, Running

        class Attention(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.score = Linear(d, 1)
                self.keep = Running(d)

            def forward(self, c, q):
                cols = []
                for i in range(q.size(1)):
                    cols.append(self.score(c * q.select(1, i).unsqueeze(1)))
                    cols.append(self.keep(q.select(1, i)))
                return torch.stack(cols, dim=-1)
        """)
    script = tmp_path / "model.py"
    script.write_text(source)
    found = lint_source(source, str(script), [get_rule("MAT101")])
    assert [(f.row, f.column) for f in found] == [(14, 25)]  # `Running` stores state: each call may depend on the last
    assert "(`self.linear(x)` on line 11 of `forward` in layers.py)" in found[0].message


def test_a_size_the_analysis_cannot_read_still_counts_as_a_dim():
    """`view` with a size it cannot read, and an `nn.Linear` whose width it cannot read: the rank
    is known, the dim is not. A lone name may hold a whole size tuple, and stays unknown."""
    values = revealed("""\
        def f(x, s, n, k, sizes):
            fc = nn.Linear(8, max(n, k))
            flat = x.view(-1, 64 * (s // 2) * (s // 2))
            reveal(flat)
            reveal(fc(torch.randn(4, 8)))
            reveal(fc(flat)[:, 0])
            reveal(x.view(sizes))
        """)
    assert [str(v) for v in values[:3]] == ["(?, ?)", "(4, ?)", "(?,)"]
    assert not isinstance(values[3], Shape)


def test_a_loss_module_moved_to_the_gpu_is_the_same_loss():
    value = inferred("crit = nn.BCELoss().cuda()\nother = nn.MSELoss().to('cuda')", "crit")
    assert isinstance(value, _shapes.Loss) and value.name == "BCELoss"
    assert inferred("crit = nn.BCELoss().cuda()\nother = nn.MSELoss().to('cuda')", "other").name == "MSELoss"


def test_what_a_method_stores_in_self_it_reads_back_unless_another_method_stores_it():
    values = revealed("""\
        class Agent:
            def reset(self, n: int):
                self.h = torch.zeros(n)

            def fit(self, n: int):
                self.labels = torch.ones(n, 1)
                self.h = torch.zeros(n, 1)
                reveal(self.labels)
                reveal(self.h)
                for _ in range(3):
                    reveal(self.labels)
                    self.labels = torch.ones(n)
        """)
    assert [str(v) if v is not None else None for v in values[:1]] == ["(n, 1)"]
    assert not isinstance(values[1], Shape)  # `reset` stores `self.h` too
    assert values[2] is None  # the loop stores it: another pass reads another value


def test_a_function_nested_in_a_method_reads_the_methods_self():
    values = revealed("""\
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(8, 1)

            def forward(self, x):
                def inner(c):
                    return reveal(self.head(c))
                def shadow(self, c):
                    return reveal(self.head(c))
                return inner(x) + shadow(x, x)
        """)
    assert str(values[0]) == "(..., 1)"
    assert values[1] is None
