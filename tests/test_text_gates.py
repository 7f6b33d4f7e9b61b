"""The source-text gates (`_kinds.may_mention`; per function `_flow.function_may_mention` and
`_pointwise.may_take_root`) skip work in files and functions that cannot spell what a rule
looks for. A gate may only save time: every case below is linted with the gates and with every
gate forced open, and the findings must be the same. Each gate has a case where it lets the rule
through and the rule fires, and spellings that reach the rule without the plain word: aliases,
methods, modules, escapes and implicit concatenation in strings (the `getattr` cases stay quiet
with or without the gates: the rules do not read getattr strings; were they taught to, these
cases would catch a gate that hides them)."""
import textwrap

import pytest

import matlint.rules as rules_pkg
from matlint.engine import lint_source
from matlint.registry import all_rules, get_rule
from matlint.semantic import kinds as _kinds
from matlint.semantic.pointwise import holds_half

CASES = {
    # -- MAT601 needs "softmax" (any case) ------------------------------------------------------
    "softmax-alias": ("MAT601", """
        import math
        import torch
        from torch.nn.functional import softmax as sm
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            return sm(q @ k.mT / math.sqrt(q.size(-1)), dim=-1) @ v
        """, [(5, 15)]),
    "softmax-module-alias": ("MAT601", """
        import math
        import torch
        import torch.nn.functional as F
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            return F.softmax(q @ k.mT / math.sqrt(q.size(-1)), dim=-1) @ v
        """, [(5, 22)]),
    "softmax-method": ("MAT601", """
        import math
        import torch
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            return (q @ k.mT / math.sqrt(q.size(-1))).softmax(-1) @ v
        """, [(4, 13)]),
    "softmax-nn-module": ("MAT601", """
        import math
        import torch
        from torch import nn
        class Attention(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.Softmax(dim=-1)
            def forward(self, q, k, v):
                return self.act(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))) @ v
        """, [(9, 25)]),
    "softmax-fullwidth-identifier": ("MAT601", """
        import math
        import torch
        import torch.nn.functional as F
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            return F.ｓｏｆｔｍａｘ(q @ k.mT / math.sqrt(q.size(-1)), dim=-1) @ v
        """, [(5, 22)]),
    "softmax-getattr-escape": ("MAT601", r"""
        import math
        import torch
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            return getattr(torch, "soft\x6dax")(q @ k.mT / math.sqrt(q.size(-1)), dim=-1) @ v
        """, []),
    # -- MAT605 needs "tanh" --------------------------------------------------------------------
    "tanh-alias": ("MAT605", """
        import math
        import torch
        from torch import tanh as th
        def gelu(x):
            return 0.5 * x * (1.0 + th(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        """, [(5, 12)]),
    "tanh-method": ("MAT605", """
        import math
        import torch
        def gelu(x: torch.Tensor):
            return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))).tanh())
        """, [(4, 12)]),
    "tanh-functional": ("MAT605", """
        import math
        import torch
        import torch.nn.functional as F
        def gelu(x):
            return 0.5 * x * (1.0 + F.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        """, [(5, 12)]),
    "tanh-getattr-escape": ("MAT605", r"""
        import math
        import torch
        def gelu(x):
            return 0.5 * x * (1.0 + getattr(torch, "\x74anh")(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
        """, []),
    # -- MAT602 needs "exp" in the function, or a name for it other than a call ------------------
    "exp-alias": ("MAT602", """
        import torch
        from torch import exp as e
        def softmax(x):
            y = e(x - x.max(-1, keepdim=True).values)
            return y / y.sum(-1, keepdim=True)
        """, [(5, 12)]),
    "exp-fullwidth-identifier": ("MAT602", """
        import torch
        def softmax(x):
            y = torch.ｅｘｐ(x - x.max(-1, keepdim=True).values)
            return y / y.sum(-1, keepdim=True)
        """, [(4, 12)]),
    # -- MAT603/MAT604 need a root: sqrt/rsqrt/std in the function or named, or a literal 0.5 ------
    "rsqrt-alias": ("MAT604", """
        import torch
        from torch import rsqrt as r
        def rms_norm(x, eps: float):
            return x * r(x.pow(2).mean(-1, keepdim=True) + eps)
        """, [(4, 12)]),
    "rsqrt-assigned-alias": ("MAT604", """
        import torch
        inverse_root = torch.rsqrt
        def rms_norm(x, eps: float):
            return x * inverse_root(x.pow(2).mean(-1, keepdim=True) + eps)
        """, [(4, 12)]),
    "half-spelled-short": ("MAT604", """
        import torch
        def rms_norm(x, eps: float):
            return x * (x.pow(2).mean(-1, keepdim=True) + eps) ** -.5
        """, [(3, 12)]),
    "half-spelled-with-exponent": ("MAT603", """
        import torch
        def layer_norm(x, eps: float):
            return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=False) + eps) ** 5_0E-2
        """, [(3, 12)]),
    "mean-alias": ("MAT603", """
        import torch
        from torch import mean as average
        def layer_norm(x, eps: float):
            centered = x - average(x, -1, keepdim=True)
            return centered / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)
        """, [(5, 12)]),
    "mean-assigned-alias": ("MAT604", """
        import torch
        average = torch.mean
        def rms_norm(x, eps: float):
            return x * torch.rsqrt(average(x.pow(2), -1, keepdim=True) + eps)
        """, [(4, 12)]),
    "sqrt-fullwidth-identifier": ("MAT603", """
        import torch
        def layer_norm(x, eps: float):
            return (x - x.mean(-1, keepdim=True)) / torch.ｓｑｒｔ(x.var(-1, keepdim=True, unbiased=False) + eps)
        """, [(3, 12)]),
    "std-alias": ("MAT603", """
        import torch
        from torch import std as spread
        def layer_norm(x, eps: float):
            return (x - x.mean(-1, keepdim=True)) / (spread(x, -1, keepdim=True) + eps)
        """, [(4, 12)]),
    # -- MAT402 needs "float64" or "double" (any case), or a string argument of .to/.type ---------
    "float64-double-method": ("MAT402", """
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return x.double()
        """, [(5, 16)]),
    "float64-dtype-alias": ("MAT402", """
        import torch as T
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return T.zeros(3, dtype=T.double, device=x.device) + x
        """, [(5, 33)]),
    "float64-imported-alias": ("MAT402", """
        import torch
        from torch import nn
        from torch import float64 as f8
        class M(nn.Module):
            def forward(self, x):
                return x.to(f8)
        """, [(6, 16)]),
    "float64-tensor-type": ("MAT402", """
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return x.type(torch.DoubleTensor)
        """, [(5, 16)]),
    "float64-string-escape": ("MAT402", r"""
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return x.type("torch.\x44oubleTensor")
        """, [(5, 16)]),
    "float64-string-concatenation": ("MAT402", """
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return x.type("torch.Dou" "bleTensor")
        """, [(5, 16)]),
    "float64-getattr-escape": ("MAT402", r"""
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return x.to(getattr(torch, "\x66loat64"))
        """, []),
    # -- an nn.Linear applied to a tensor needs "Linear" -----------------------------------------
    "linear-alias": ("MAT302", """
        import torch
        from torch.nn import Linear as Dense, Module
        class M(Module):
            def __init__(self):
                super().__init__()
                self.fc = Dense(64, 64)
            def forward(self, h):
                return self.fc(h.permute(1, 0, 2))
        """, [(8, 24)]),
    "linear-alias-per-head": ("MAT104", """
        import torch
        from torch.nn import Linear as Dense, Module, ModuleList
        class Heads(Module):
            def __init__(self, n: int):
                super().__init__()
                self.heads = ModuleList([Dense(64, 16) for _ in range(n)])
            def forward(self, x):
                return torch.cat([h(x) for h in self.heads], dim=-1)
        """, [(8, 16)]),
    "linear-lazy-in-loop": ("MAT101", """
        import torch
        from torch import nn
        proj = nn.LazyLinear(8)
        xs = torch.randn(4, 16, 32)
        ys = [proj(xs[i]) for i in range(4)]
        """, [(5, 7)]),
    # -- the shape analysis needs a source of shapes in the function (`_shapes.may_hold_shapes`) --
    "shape-constructor-alias": ("MAT201", """
        import torch
        from torch import randn as r
        def f(n: int):
            pred = r(n, 1)
            target = r(n)
            return pred - target
        """, [(6, 12)]),
    "shape-layer-stored-in-init": ("MAT202", """
        import torch
        from torch import nn
        class Critic(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.value = nn.Linear(d, 1)
                self.crit = nn.MSELoss()
            def forward(self, obs, returns):
                n, d = obs.shape
                target = returns.view(n)
                return self.crit(self.value(obs), target)
        """, [(11, 16)]),
    # -- a data loader needs "loader" (any case) -------------------------------------------------
    "loader-alias": ("MAT502", """
        import torch
        from torch.utils.data import DataLoader as DL
        def train(model, data, opt, criterion):
            total = 0.0
            for x, y in DL(data, batch_size=8):
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                opt.step()
                total += loss.item()
            return total
        """, [(9, 18)]),
    "loader-camel-case-name": ("MAT502", """
        import torch
        def evaluate(model, valLoader):
            preds = []
            for x, y in valLoader:
                logits = model(x.to("cuda"))
                preds.append(logits.argmax(-1).cpu())
            return preds
        """, [(6, 22)]),
    # -- a training loop needs "backward" or "step" ----------------------------------------------
    "training-loop-step-only": ("MAT502", """
        import torch
        def train(model, batches, optimizer, criterion):
            total = 0.0
            for x, y in batches:
                loss = criterion(model(x), y)
                optimizer.step()
                total += loss.item()
            return total
        """, [(7, 18)]),
    "training-loop-fullwidth-step": ("MAT502", """
        import torch
        def train(model, batches, optimizer, criterion):
            total = 0.0
            for x, y in batches:
                loss = criterion(model(x), y)
                optimizer.\uff53\uff54\uff45\uff50()
                total += loss.item()
            return total
        """, [(7, 18)]),
    "training-loop-at-module-level": ("MAT502", """
        import torch
        total = 0.0
        for x, y in batches:
            loss = criterion(model(x.cuda()), y.cuda())
            loss.backward()
            total += loss.item()
        """, [(6, 14)]),
    # -- class attributes: without `register_buffer` or `setattr` only statements are read ------
    "class-attribute-set-in-a-block": ("MAT601", """
        import math
        import torch
        from torch import nn
        class Attention(nn.Module):
            def __init__(self, causal):
                super().__init__()
                if causal:
                    self.act = nn.Softmax(dim=-1)
                else:
                    raise ValueError(causal)
            def forward(self, q, k, v):
                return self.act(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))) @ v
        """, [(12, 25)]),
    "class-attribute-replaced-by-setattr": ("MAT601", """
        import math
        import torch
        from torch import nn
        class Attention(nn.Module):
            def __init__(self, act=None):
                super().__init__()
                self.act = nn.Softmax(dim=-1)
                if act is not None:
                    setattr(self, "act", act)  # self.act may not be a softmax: quiet
            def forward(self, q, k, v):
                return self.act(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))) @ v
        """, []),
    # -- MAT103 needs a `sum` the function can call --------------------------------------------
    "stacked-sum-method": ("MAT103", """
        import torch
        def f(x, w):
            return torch.stack([(x[i] * w).sum(-1) for i in range(x.shape[0])])
        """, [(3, 12)]),
    "stacked-sum-imported-alias": ("MAT103", """
        import torch
        from torch import sum as total
        def f(x, w):
            out = []
            for i in range(x.shape[0]):
                out.append(total(x[i] * w, dim=-1))
            return torch.stack(out)
        """, [(7, 12)]),
    "stacked-sum-module-alias": ("MAT103", """
        import torch
        add_up = torch.sum
        def f(x, w):
            rows = [add_up(x[i] * w, dim=-1) for i in range(x.shape[0])]
            return torch.stack(rows)
        """, [(5, 12)]),
    "training-loop-backward-only": ("MAT504", """
        import torch
        def train(model, loader, lr):
            for x, y in loader:
                model(x, y).backward()
                for p in model.parameters():
                    p.data = p.data - lr * p.grad
        """, [(6, 13)]),
}


def _lint(code: str, source: str) -> list:
    return [(f.row, f.column, f.end_row, f.end_column, f.message)
            for f in lint_source(textwrap.dedent(source).lstrip("\n"), "gate.py", [get_rule(code)], prefilter=False)]


GATES = ("may_mention", "function_may_mention", "may_take_root", "may_hold_shapes", "may_train")


def _open_gates(monkeypatch) -> None:
    """Every gate answers "may mention", wherever a rule module imported it."""
    all_rules()
    always = lambda *args, **kwargs: True  # noqa: E731
    for name in dir(rules_pkg):
        module = getattr(rules_pkg, name)
        for gate in GATES:
            if getattr(module, gate, None) is not None:
                monkeypatch.setattr(module, gate, always)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gate_loses_no_finding(case, monkeypatch):
    code, source, expect = CASES[case]
    gated = _lint(code, source)
    assert [(row, column) for row, column, *_ in gated] == expect, gated
    _open_gates(monkeypatch)
    assert _lint(code, source) == gated


def test_gates_answer_no_on_files_without_the_word():
    """The gates do skip work: a file that spells none of the words is settled by them."""
    from matlint.engine import FileContext
    from matlint.source import parse_quietly

    source = "import torch\nx = torch.ones(2)\n"
    ctx = FileContext(source, "f.py", parse_quietly(source))
    assert not _kinds.may_mention(ctx, "softmax", ignore_case=True)
    assert not _kinds.may_mention(ctx, "Linear")
    assert _kinds.may_mention(ctx, "ones")
    unicode = "import torch\nｓｏｆｔｍａｘ = torch.ones(2)\n"
    assert _kinds.may_mention(FileContext(unicode, "f.py", parse_quietly(unicode)), "softmax")
    other = '"""Shapes: B × T."""\nimport torch\nx = torch.ones(2)\n'  # not ASCII, and no softmax
    assert not _kinds.may_mention(FileContext(other, "f.py", parse_quietly(other)), "softmax", ignore_case=True)


@pytest.mark.parametrize("text", ["0.5", ".5", "x ** -0.5", "5e-1", "50e-2", "0.05e1", "5_0E-2", "0.000005e5",
                                  "5.0e-1", "5.E-1", "05.e-1", "0.5.real", "y=.50", "0.5j", "# half: 0.5"])
def test_holds_half_finds_every_spelling_of_one_half(text):
    assert holds_half(text)


@pytest.mark.parametrize("text", ["1e-5", "2.5", "0.25", "0.55", "0.5e1", "5.", "x5", "fc5.weight", "0x5", "1e5",
                                  "15e-2", "1_000.5", "layer5e-1", "eps=1e-12"])
def test_holds_half_is_quiet_on_other_numbers_and_names(text):
    assert not holds_half(text)


def test_the_loss_gate_prefilter_holds_every_loss_name():
    # MAT202's file gate first looks for "_loss", "Loss" or "binary_cross_entropy": a loss name
    # added without one of them would be skipped in every file.
    from matlint.semantic.shapes import LOSS_FUNCTIONS, LOSS_MODULES

    for name in (*LOSS_FUNCTIONS, *LOSS_MODULES):
        assert any(part in name for part in ("_loss", "Loss", "binary_cross_entropy")), name
