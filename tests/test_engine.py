"""The engine's own pieces: positions, source segments, noqa, newer-syntax detection, and the
import/alias resolver every rule relies on."""
import ast
import gc
import re
import sys
import textwrap

import pytest

from matlint.engine import FileContext, lint_source, noqa_map
from matlint.source import parse
from matlint.registry import get_rule

MAT101 = get_rule("MAT101")


def _context(source):
    return FileContext(source, "t.py", ast.parse(source))


def test_segment_matches_ast_get_source_segment_on_crlf_cr_and_non_ascii():
    source = "x = 'é' + f(ü)\r\ny = (1 +\r\n  2)\rz = {'ключ': [\n  3]}\n"
    ctx = _context(source)
    nodes = [n for n in ast.walk(ctx.tree) if hasattr(n, "end_lineno")]
    assert len(nodes) > 10
    for node in nodes:
        assert ctx.segment(node) == (ast.get_source_segment(source, node) or "")


@pytest.mark.parametrize("source", [
    "x = 'é' + f(ü)\ny = (1 +\n  2)\n\x0cz = {'ключ': [\n  3]}  # \u2028 \x0b\n",  # \n only
    "x = 'é' + f(ü)\ny = (1 +\r\n  2)\rz = {'ключ': [\n  3]}",                   # mixed ends
])
def test_segment_and_lines_on_newline_only_and_mixed_files(source):
    # A file with no \r takes a faster path: it must split where Python's tokenizer does
    # (not at form feeds or U+2028, as str.splitlines would).
    ctx = _context(source)
    assert ctx.lines == re.split(r"\r\n|\r|\n", source)
    for node in ast.walk(ctx.tree):
        if hasattr(node, "end_lineno"):
            assert ctx.segment(node) == (ast.get_source_segment(source, node) or "")


def test_columns_count_characters_not_bytes():
    source = "import torch\ns = 'ü' ; ys = [x[i] @ w for i in range(4)]\nx = torch.randn(4, 3, 3)\nw = torch.randn(3, 3)\n"
    (finding,) = lint_source(source, "t.py", [MAT101])
    assert (finding.row, finding.column) == (2, 17)  # bytes would say 18
    assert source.splitlines()[1][finding.column - 1:finding.end_column - 1] == "x[i] @ w"


LOOP = "import torch\nx = torch.randn(4, 3, 3)\nw = torch.randn(3, 3)\nys = [x[i] @ w for i in range(4)]"


@pytest.mark.parametrize("comment, suppressed", [
    ("  # noqa", True),
    ("  # noqa: MAT101", True),
    ("  # NOQA:MAT101,MAT502", True),
    ("  # noqa: MAT502", False),
    ("  # a comment mentioning noqa: MAT101 later", False),
])
def test_line_noqa(comment, suppressed):
    findings = lint_source(LOOP + comment + "\n", "t.py", [MAT101])
    assert (findings == []) is suppressed


# A multi-line statement whose first sync is on its second line (one MAT502 finding, there).
LOGGED = ("import torch\n"
          "def train(model, loader, opt, log):\n"
          "    for x, y in loader:\n"
          "        loss, acc = model(x.cuda(), y.cuda())\n"
          "        loss.backward()\n"
          "        opt.step()\n"
          "        log({{{first}\n"
          "            'loss': loss.item(),{sync}\n"
          "            'acc': acc.item(),{last}\n"
          "        }})\n")


@pytest.mark.parametrize("where, suppressed", [
    ("first", True),   # the statement's first line: its noqa_row
    ("sync", True),    # the line of the finding
    ("last", False),   # another line of the statement
])
def test_noqa_on_the_first_line_of_a_statement(where, suppressed):
    comments = {"first": "", "sync": "", "last": ""}
    comments[where] = "  # noqa: MAT502"
    findings = lint_source(LOGGED.format(**comments), "t.py", [get_rule("MAT502")])
    assert (findings == []) is suppressed
    if not suppressed:
        (finding,) = findings
        assert (finding.row, finding.noqa_row) == (8, 7) and "of `loss` and `acc`" in finding.message


def test_noqa_inside_a_string_is_not_a_comment():
    source = LOOP + "\nmsg = '# noqa'\n"
    assert len(lint_source(source, "t.py", [MAT101])) == 1


@pytest.mark.parametrize("header, suppressed", [
    ("# matlint: noqa\n", True),
    ("# matlint: noqa: MAT101\n", True),
    ("# matlint: noqa: MAT502\n", False),
])
def test_file_level_noqa(header, suppressed):
    assert (lint_source(header + LOOP + "\n", "t.py", [MAT101]) == []) is suppressed


def test_noqa_map_reads_codes():
    per_line, _, file_noqa = noqa_map("a = 1  # noqa: MAT101, mat502\nb = 2  # noqa\n")
    assert per_line == {1: frozenset({"MAT101", "MAT502"}), 2: None} and not file_noqa


NEWER = [
    ("type Batch = torch.Tensor\n", (3, 12), "3.12"),
    ("def first[T](xs: list[T]) -> T:\n    return xs[0]\n", (3, 12), "3.12"),
    ("class Box[T]:\n    pass\n", (3, 12), "3.12"),
    ("try:\n    pass\nexcept ValueError, TypeError:\n    pass\n", (3, 14), "3.14"),
    ("name = 'x'\ns = t'hello {name}'\n", (3, 14), "3.14"),
]


@pytest.mark.parametrize("body, version, text", NEWER)
def test_newer_syntax_names_the_python_it_needs(body, version, text):
    source = "import torch\n" + body
    findings = lint_source(source, "t.py", [MAT101])
    if sys.version_info >= version:
        assert findings == []
        return
    (finding,) = findings
    assert finding.code == "MAT002" and f"Python {text}" in finding.message


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="Python 3.14 reads `except E, e:` as `except (E, e):`")
def test_python_2_except_binding_is_named_beside_the_newer_reading():
    source = "import torch\ntry:\n    torch.ones(1)\nexcept ValueError, e:\n    pass\n"
    (finding,) = lint_source(source, "t.py", [MAT101])
    assert finding.code == "MAT002" and finding.row == 4
    assert "Python 3.14" in finding.message and "`except E as e:`" in finding.message
    (finding,) = lint_source(source.replace("ValueError, e", "ValueError, (e)"), "t.py", [MAT101])
    assert "Python 2" not in finding.message


def test_plain_syntax_error_is_mat001_with_position():
    tree, finding = parse("import torch\ndef f(x)\n    return x\n", "t.py")
    assert tree is None and finding.code == "MAT001" and finding.row == 2


RESOLVE = [
    ("import torch as T", "T.matmul", "torch.matmul"),
    ("from torch import matmul as mm", "mm", "torch.matmul"),
    ("import torch.nn.functional as F", "F.linear", "torch.nn.functional.linear"),
    ("from torch.nn import functional as F", "F.linear", "torch.nn.functional.linear"),
    ("import torch\nmm = torch.mm", "mm", "torch.mm"),
    ("from torch import nn", "nn.Linear", "torch.nn.Linear"),
    ("import torch", "torch.functional.einsum", "torch.einsum"),
    ("import numpy as np", "np.dot", "numpy.dot"),
    ("from .local import matmul", "matmul", None),
]


@pytest.mark.parametrize("imports, expr, expected", RESOLVE)
def test_qualified_names_through_aliases(imports, expr, expected):
    ctx = _context(f"{imports}\n{expr}\n")
    node = ctx.tree.body[-1].value
    assert ctx.qualname(node) == expected


def test_a_parameter_shadows_an_import_inside_its_function():
    source = "import torch.nn.functional as F\ndef f(F):\n    return F.linear\n"
    ctx = _context(source)
    func = ctx.tree.body[1]
    ctx.names.enter_function(func)
    assert ctx.qualname(func.body[0].value) is None
    ctx.names.leave_scope()
    assert ctx.qualname(ast.parse("F.linear").body[0].value) == "torch.nn.functional.linear"


def test_an_attribute_the_file_sets_on_a_module_is_the_files_own():
    source = ("import torch.nn as nn\nclass MaskedLinear(nn.Module):\n    pass\n"
              "nn.MaskedLinear = MaskedLinear\nnn.MaskedLinear\nnn.MaskedLinear.forward\nnn.Linear\n")
    ctx = _context(source)
    masked, method, linear = (stmt.value for stmt in ctx.tree.body[-3:])
    assert ctx.qualname(masked) is None and ctx.qualname(method) is None
    assert ctx.names.set_on_module(masked) == "MaskedLinear"
    assert ctx.qualname(linear) == "torch.nn.Linear" and ctx.names.set_on_module(linear) is None


def test_a_name_resolved_once_is_resolved_again_in_another_scope():
    # qualname remembers its answers, but only until the walker enters or leaves a scope.
    ctx = _context("import torch.nn.functional as F\ndef f(F):\n    pass\nF.linear\n")
    func, node = ctx.tree.body[1], ctx.tree.body[2].value
    assert ctx.qualname(node) == "torch.nn.functional.linear"
    ctx.names.enter_function(func)
    assert ctx.qualname(node) is None
    ctx.names.leave_scope()
    assert ctx.qualname(node) == "torch.nn.functional.linear"


def test_linting_leaves_no_tree_in_reference_cycles():
    # The CLI pauses the cyclic collector while it lints a file (see runner.py): that is only
    # cheap if the file's tree and analyses are freed by reference counting when it is done.
    # (ast.dump leaves a few closures in cycles; they hold no node.)
    from matlint.engine import FileContext, lint_bytes
    from matlint.registry import all_rules

    rules = [cls for cls in all_rules() if cls.default_enabled]
    sources = [example.code for cls in all_rules() for example in cls.examples]
    assert len(sources) > 100
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        findings = [f for source in sources for f in lint_bytes(source.encode(), "t.py", rules)]
        gc.collect()
        kept = [type(o).__name__ for o in gc.garbage if isinstance(o, (ast.AST, FileContext))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert len(findings) > 100
    assert kept == []


def test_walker_visits_every_node_but_operators_contexts_first_generators_and_annotations():
    # The walker skips fields that cannot hold a node it visits, and annotations; this checks the
    # list leaves out no other node, on real code using most of the grammar.
    import dataclasses
    import inspect
    import typing

    from matlint.engine import Walker

    node_classes = [c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.AST)]

    class Recorder:
        code = "MAT999"
        _handlers = {("visit", c.__name__): [f"visit_{c.__name__}"] for c in node_classes}

        def __init__(self):
            self.seen = []

        def __getattr__(self, name):
            return self.seen.append

    skipped_types = (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)
    annotated = (
        "import torch\n"
        "def f(x: torch.Tensor | None, *a: int, k: 'Tensor' = g(1), **kw: dict[str, int]) -> tuple[int, int]:\n"
        "    y: torch.Tensor = x @ x\n"
        "    z: list[int]\n"
        "    return lambda q=h(2): q\n"
        "class C:\n"
        "    w: Optional[torch.Tensor] = None\n"
        "    async def m(self, /, b: np.ndarray = np.zeros(3), *, c: int = 1) -> 'C': ...\n")
    sources = [inspect.getsource(module) for module in (ast, dataclasses, inspect, typing)] + [annotated]
    annotation_count = 0
    for source in sources:
        tree = ast.parse(source)
        recorder = Recorder()
        Walker(FileContext(source, "t.py", tree), [recorder]).walk(tree)
        first_generators = {id(n.generators[0]) for n in ast.walk(tree)
                            if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))}
        annotations = {id(sub) for n in ast.walk(tree)
                       for ann in (getattr(n, "annotation", None), getattr(n, "returns", None)) if ann is not None
                       for sub in ast.walk(ann)}
        annotation_count += len(annotations)
        expected = [n for n in ast.walk(tree) if not isinstance(n, skipped_types)
                    and id(n) not in first_generators and id(n) not in annotations]
        assert sorted(map(id, recorder.seen)) == sorted(map(id, expected))
        assert len(recorder.seen) == len({id(n) for n in recorder.seen})
    assert annotation_count > 20


# Calls routed by attribute that a file can also spell as a bare name (or that a per-file gate
# routes), with the finding each gives.
ROUTED_BY_BARE_NAME = {
    "from torch import stack\nimport torch\ndef scores(q: torch.Tensor, k: torch.Tensor, n):\n"
    "    return stack([(q[i] * k[i]).sum(-1) for i in range(n)])\n": "MAT103",
    "import torch as T\ndef scores(q: T.Tensor, k: T.Tensor, n):\n"
    "    return T.concat([(q[i] * k[i]).sum(-1) for i in range(n)])\n": "MAT103",
    "import torch\njoin = torch.stack\ndef scores(q: torch.Tensor, k: torch.Tensor, n):\n"
    "    return join([(q[i] * k[i]).sum(-1) for i in range(n)])\n": "MAT103",
    "import torch\ndef scores(q: torch.Tensor, k: torch.Tensor, n):\n    from torch import cat as glue\n"
    "    return glue([(q[i] * k[i]).sum(-1) for i in range(n)])\n": "MAT103",
    "import torch\nfrom torch.nn import Linear as L\nlayer = L(1000, 1001)\n": "MAT403",
    "import torch\nfrom torch import nn\nfrom torch import cat\nclass Heads(nn.Module):\n"
    "    def __init__(self, d):\n        super().__init__()\n"
    "        self.heads = nn.ModuleList([nn.Linear(d, 64) for _ in range(8)])\n"
    "    def forward(self, x):\n        return cat([h(x) for h in self.heads], -1)\n": "MAT104",
    "import torch\nfrom torch import tensor as T\ndef train(model, loader, device):\n    for x in loader:\n"
    "        scale = T([0.5, 2.0], device=device)\n        model(x * scale).backward()\n": "MAT503",
    "import math\nimport torch\nfrom torch import tanh as th\ndef gelu(x):\n"
    "    return 0.5 * x * (1.0 + th(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))\n": "MAT605",
    "import torch\nfrom torch.optim import AdamW\ndef make(model):\n"
    "    return AdamW(model.parameters(), foreach=False)\n": "MAT504",
    # Routed to `.to`/`.type` only, in a file that names no float64 identifier: the string spells it.
    "import torch\nimport torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.w = nn.Parameter(torch.randn(4, 4))\n    def forward(self, x):\n"
    "        return x.to(\"torch.DoubleTensor\") @ self.w\n": "MAT402",
    # `p.data = ...` reached through a file gate that reads the source: parenthesized, continued.
    "import torch\ndef sgd_step(model, lr):\n    for p in model.parameters():\n        (p.data) = \\\n"
    "            p.data - lr * p.grad\n": "MAT504",
    # Routed to every call in a file that builds `nn.Softmax`: the softmax is `self.norm(...)`.
    "import torch\nimport torch.nn as nn\nclass A(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
    "        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)\n"
    "        self.norm = nn.Softmax(dim=-1)\n    def forward(self, x):\n        q, k, v = self.q(x), self.k(x), self.v(x)\n"
    "        return self.norm(q @ k.transpose(-2, -1) / 8.0) @ v\n": "MAT601",
}


def test_routing_by_only_changes_no_finding(monkeypatch):
    """`Rule.only` lets the walker skip handlers that would return at once; with every rule's
    routing removed, every rule example gives the same findings."""
    from matlint.engine import lint_source
    from matlint.registry import all_rules

    rules = [r for r in all_rules() if r._handlers]
    assert any(r.only for r in rules)
    sources = [example.code for rule in rules for example in rule.examples] + list(ROUTED_BY_BARE_NAME)

    def lint_all():
        return [[repr(f) for f in lint_source(s, "example.py", rules, prefilter=False)] for s in sources]

    routed = lint_all()
    found = [[line.split("'")[1] for line in findings] for findings in routed[-len(ROUTED_BY_BARE_NAME):]]
    assert found == [[code] for code in ROUTED_BY_BARE_NAME.values()]
    for rule in rules:
        monkeypatch.setattr(rule, "only", {})
    assert lint_all() == routed


def test_internal_error_names_the_rule_that_raised():
    from matlint.engine import lint_source
    from matlint.registry import _handlers
    from matlint.rule import Rule

    class Quiet(Rule):
        code, name, summary, docs = "MAT998", "quiet", "", ""

        def visit_Call(self, node):
            pass

    class Broken(Rule):
        code, name, summary, docs = "MAT999", "broken", "", ""

        def visit_Call(self, node):
            raise ValueError("boom")

    for cls in (Quiet, Broken):
        cls._handlers = _handlers(cls)
    findings = lint_source("import torch\ntorch.ones(1)\n", "t.py", [Quiet, Broken])
    assert [f.code for f in findings] == ["MAT000"]
    assert "internal error in MAT999 (ValueError: boom)" in findings[0].message


TREE_SOURCE = '''
import a.b as c
from . import d
def f(x, /, y=1, *args, k, m=2, **kw) -> int:
    global g
    d = {**x, "a": 1, None: 2}
    s = f"{x!r:>{y}}" + "{}".format(1)
    match x:
        case {"a": 1, **rest}: pass
        case [1, *others] | Point(x=0, y=None): pass
        case None | True: pass
        case Point(x=_) as p if p: pass
    with open(x) as h, g() as (i, j):
        del h[0], i.z
    try:
        yield from (lambda *q, r=3: q)(not x, -y, x if y else k)
    except (E, F) as e:
        raise E from e
    finally:
        assert x < y <= k, "msg"
    return [z async for z in w if z] or {z: z for z in x} or (await x)
'''


def test_child_nodes_and_walk_match_the_stdlib_less_contexts_and_operators():
    from matlint.semantic.tree import child_nodes, walk
    singletons = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
    tree = ast.parse(TREE_SOURCE)
    nodes = list(ast.walk(tree))
    assert len(nodes) > 150
    for node in nodes:
        expected = [c for c in ast.iter_child_nodes(node) if not isinstance(c, singletons)]
        assert child_nodes(node) == expected, type(node).__name__
    assert list(walk(tree)) == [n for n in nodes if not isinstance(n, singletons)]


def test_walker_enters_parameter_defaults_but_not_annotations():
    """Without a handler for `arg` the walker enters a function's parameters only for their
    defaults; calls inside annotations are never seen."""
    from matlint.engine import Walker

    class Calls:
        code = "MAT999"
        _handlers = {("visit", "Call"): ["visit_Call"]}

        def __init__(self):
            self.seen = []

        def visit_Call(self, node):
            self.seen.append(ast.unparse(node))

    source = ("def f(x: T[g0()], k=g1(), *, j: T[g2()] = g3(), m=None) -> T[g4()]:\n"
              "    y: T[g5()] = g6()\n"
              "    return lambda q=g7(): q\n"
              "def plain(a: T[g8()], b) -> None:\n"
              "    pass\n")
    tree = ast.parse(source)
    calls = Calls()
    Walker(FileContext(source, "t.py", tree), [calls]).walk(tree)
    assert calls.seen == ["g3()", "g1()", "g6()", "g7()"]  # `arguments` field order: kw_defaults first


QUIET_SCOPES_SOURCE = '''import pytest
f()                                # 2: module level
def test_loss():
    f()                            # 4: a module-level test
    def inner():
        f()                        # 6: inside a test
def test(model, loader):
    f()                            # 8: a script's evaluation loop
class TestModel:
    def check(self):
        f()                        # 11: a test class
class Solver:
    def test_multi(self):
        f()                        # 14: a method of another class
@pytest.fixture
def data():
    f()                            # 17: a fixture
def attention_ref(q, k):
    f()                            # 19: a reference implementation
if __name__ == "__main__":
    def test_main():
        f()                        # 22: a module-level test under the main guard
'''


def _call_reporter(quiet):
    from matlint.registry import _handlers
    from matlint.rule import Rule

    class EveryCall(Rule):
        code, name, summary, docs = "MAT998", "every-call", "", ""
        quiet_in = quiet

        def visit_Call(self, node):
            if isinstance(node.func, ast.Name) and node.func.id == "f":
                self.report(node, "a call")

    EveryCall._handlers = _handlers(EveryCall)
    return EveryCall


@pytest.mark.parametrize("quiet, rows", [
    ((), [2, 4, 6, 8, 11, 14, 17, 19, 22]),
    (("tests",), [2, 8, 14, 19]),
    (("reference",), [2, 4, 6, 8, 11, 14, 17, 22]),
    (("tests", "reference"), [2, 8, 14]),
])
def test_a_rule_reports_nothing_in_the_code_it_declares_itself_quiet_in(quiet, rows):
    findings = lint_source(QUIET_SCOPES_SOURCE, "train.py", [_call_reporter(quiet)], prefilter=False)
    assert [f.row for f in findings] == rows


@pytest.mark.parametrize("filename", ["test_train.py", "train_test.py", "conftest.py", "tests/train.py",
                                      "pkg/test/train.py", "testing/train.py"])
def test_every_line_of_a_test_file_is_test_code(filename):
    assert lint_source(QUIET_SCOPES_SOURCE, filename, [_call_reporter(("tests",))], prefilter=False) == []
    assert len(lint_source(QUIET_SCOPES_SOURCE, filename, [_call_reporter(())], prefilter=False)) == 9


def test_the_docs_state_each_declared_quiet_scope_once_from_its_declaration():
    from matlint.registry import all_rules
    from matlint.semantic.names import QUIET_SCOPES

    declared = [cls for cls in all_rules() if cls.quiet_in]
    assert len(declared) >= 10
    for cls in all_rules():
        docs = cls.rendered_docs()
        quiet = docs[docs.index("## Stays quiet on"):] if "## Stays quiet on" in docs else ""
        for kind, text in QUIET_SCOPES.items():
            first_words = " ".join(text.split()[:3])
            assert (first_words in " ".join(quiet.split())) == (kind in cls.quiet_in), (cls.code, kind)
            assert first_words not in " ".join(textwrap.dedent(cls.docs).split()), cls.code  # not copied by hand
