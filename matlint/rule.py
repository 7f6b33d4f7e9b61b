"""The anatomy of a rule. A rule is one module under `rules/` holding one `Rule` subclass, or a
package there whose `__init__.py` holds it.

Top to bottom a rule module holds: metadata (`code`, `name`, `summary`, `default_enabled`),
`docs` (markdown with the sections in DOC_SECTIONS) and the static check (`visit_<AstNode>` /
`leave_<AstNode>` methods, called by the engine's single traversal). A rule with a runtime check
is a package: its `runtime` submodule registers the check and the estimators of its fixes with
the guard (`matlint.runtime_guard.registry`); it needs torch, and only the guard imports it.
A package may also split a big static check by concern into further submodules.

Its examples, which are its tests, live in its fixture file `rules/fixtures/<code>.py`: one case
after another, each opened by a header line that starts with `# %%` (the cell marker editors
know):

    # %% bad 5:33 6:39, message contains: pad to 50304
    <code with a finding at row 5, column 33 and one at 6:39 (1-based, in the case's own lines,
    columns in characters); ", message contains: <text>" is optional>
    # %% fixed
    <the bad case above after `--fix`; `# %% fixed, unsafe` with unsafe fixes>
    # %% OK: what this negative tests
    <code that must stay clean>

Further `# %%` lines right after a header continue its description. A case's code runs to the
next header; blank lines around it are not part of it. Text before the first header is free.
`Rule.examples` reads the file on first use: only the tests and the docs need it, never a lint.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, ClassVar, Optional

from .diagnostics import Fix
from .semantic.names import QUIET_SCOPES, quiet_at

FAMILIES = {
    "0": "engine",
    "1": "loops",
    "2": "broadcasting",
    "3": "layout",
    "4": "precision",
    "5": "launches",
    "6": "fused",
}

# What a finding is called everywhere (text summary, SARIF, GitHub annotations, the editor):
# an "error" where the program computes something other than it means, raises, or could not be
# checked; a "warning" where it is correct but slow. A rule may declare its own `severity`.
ERROR_FAMILIES = frozenset({"engine", "broadcasting"})
SEVERITIES = ("error", "warning")

DOC_SECTIONS = (
    "What it does",
    "Why is this bad?",
    "Example",
    "Use instead",
    "Stays quiet on",
    "Fix safety",
)

CODE_RE = re.compile(r"^MAT\d{3}$")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Example:
    """Code a rule is tested on.

    `expect` lists the exact findings as (row, column) pairs, 1-based, columns in characters;
    an empty `expect` means the code must stay clean. `fixed`, when given, is the source
    after applying this rule's fixes (`unsafe=True` to include unsafe fixes).
    """

    source: str
    expect: tuple = ()
    fixed: Optional[str] = None
    unsafe: bool = False
    message_contains: str = ""

    @property
    def code(self) -> str:
        return textwrap.dedent(self.source).lstrip("\n")

    @property
    def fixed_code(self) -> Optional[str]:
        if self.fixed is None:
            return None
        return textwrap.dedent(self.fixed).lstrip("\n")


_BAD = re.compile(r"bad((?: \d+:\d+)+)(?:, message contains: (.+))?")
_FIXED = re.compile(r"fixed(, unsafe)?")
_OK = re.compile(r"OK: \S.*")


def parse_fixture(text: str, name: str) -> tuple:
    """The examples in a fixture file's text (format: this module's docstring)."""
    cases = []  # [header, row, code lines]
    for row, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            if not cases or cases[-1][2]:
                cases.append([line[4:].strip(), row, []])
            # else a header's continuation line: its description
        elif cases:
            cases[-1][2].append(line)
    examples = []
    for header, row, lines in cases:
        source = "\n".join(lines).strip("\n") + "\n"
        if not source.strip():
            raise ValueError(f"{name}:{row}: a case without code")
        bad_case, fixed_case = _BAD.fullmatch(header), _FIXED.fullmatch(header)
        if bad_case:
            expect = tuple(tuple(int(n) for n in at.split(":")) for at in bad_case[1].split())
            examples.append(Example(source, expect, message_contains=bad_case[2] or ""))
        elif fixed_case:
            if not examples or not examples[-1].expect or examples[-1].fixed is not None:
                raise ValueError(f"{name}:{row}: `fixed` must follow a `bad` case")
            examples[-1] = replace(examples[-1], fixed=source, unsafe=fixed_case[1] is not None)
        elif _OK.fullmatch(header):
            examples.append(Example(source))
        else:
            raise ValueError(f"{name}:{row}: a case header is `# %% bad ROW:COL ...`, `# %% fixed` or "
                             f"`# %% OK: <what it tests>`, not {header!r}")
    return tuple(examples)


@lru_cache(maxsize=None)
def load_examples(code: str) -> tuple:
    """The examples in `rules/fixtures/<code>.py` (installed as package data of `matlint.rules`);
    none for a code without a fixture file (the engine's own MAT0xx)."""
    path = resources.files("matlint.rules") / "fixtures" / f"{code}.py"
    if not CODE_RE.match(code) or not path.is_file():
        return ()
    return parse_fixture(path.read_text(encoding="utf-8"), f"{code}.py")


class _Examples:
    """`Rule.examples`: read from the rule's fixture file when first asked for."""

    def __get__(self, instance, owner) -> tuple:
        return load_examples(getattr(owner, "code", ""))


@dataclass(frozen=True)
class Only:
    """When a handler can do anything, so the engine calls it only then (a rule's `only` maps
    handler names to these): `in_loops`, only inside a loop or comprehension; `attrs` (for
    `visit_Call`), only for calls `x.<attr>(...)` with one of these names, and calls `f(...)` of a
    bare name that is one of them or is bound to a qualified name ending in one (`cat(...)` after
    `from torch import cat as join`); with None among them, also for calls of anything else that
    is not an attribute (`self.heads[i](x)`, `f()(x)`); `every_call_if`, a predicate of the
    file's context under which `attrs` does not apply and every call is routed (a file that
    names `float64` anywhere); `if_file`, only in files for which this predicate holds (both asked
    once per file). The handler must return at once in every case left out, as if the engine
    did not route."""

    in_loops: bool = False
    attrs: Optional[frozenset] = None
    if_file: Optional[Callable] = None
    every_call_if: Optional[Callable] = None


@dataclass(frozen=True)
class Option:
    type: type
    default: Any
    help: str


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    docs: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    # "" means the family's: "error" for ERROR_FAMILIES, else "warning".
    severity: ClassVar[str] = ""
    # The rule's tests, from `rules/fixtures/<code>.py` (see the module's docstring).
    examples = _Examples()
    options: ClassVar[dict] = {}
    # Set by the registry: {"Call": ("visit_Call",), ...}
    _handlers: ClassVar[dict] = {}
    # Handler name -> Only: the nodes and files where the handler can do anything.
    only: ClassVar[dict] = {}
    # What the rule's runtime check (its package's `runtime` module) reports under `matlint.guard`,
    # and where it stays quiet: the docs' "At run time" section. Every rule with a runtime check has it.
    runtime_docs: ClassVar[str] = ""
    # Code the rule never reports in (names.TESTS, names.REFERENCE): findings there are dropped,
    # and the docs' "Stays quiet on" says so from names.QUIET_SCOPES.
    quiet_in: ClassVar[tuple] = ()

    def __init__(self, ctx, options: Optional[dict] = None):
        self.ctx = ctx
        self.opts = {k: o.default for k, o in self.options.items()}
        if options:
            self.opts.update(options)

    @classmethod
    def family(cls) -> str:
        return FAMILIES[cls.code[3]]

    @classmethod
    def level(cls) -> str:
        return cls.severity or ("error" if cls.family() in ERROR_FAMILIES else "warning")

    @classmethod
    def fix_kind(cls) -> str:
        """The fixes its examples show: "safe", "unsafe", "safe / unsafe" (which, depends on the
        case) or "" (no fix)."""
        kinds = {"unsafe" if e.unsafe else "safe" for e in cls.examples if e.fixed is not None}
        return " / ".join(sorted(kinds))

    @classmethod
    def rendered_docs(cls) -> str:
        state = "on" if cls.default_enabled else "off (enable with `select`)"
        docs = textwrap.dedent(cls.docs).strip()
        if cls.quiet_in:
            bullets = "".join(f"- {textwrap.fill(QUIET_SCOPES[kind], 92, subsequent_indent='  ', break_on_hyphens=False)}.\n"
                              for kind in cls.quiet_in)
            heading = "## Stays quiet on\n"
            if heading in docs:
                docs = docs.replace(heading, heading + bullets, 1)
            else:
                docs += "\n\n" + heading + bullets.rstrip("\n")
        if cls.runtime_docs:
            section = "## At run time (`matlint.guard`)\n" + textwrap.dedent(cls.runtime_docs).strip() + "\n\n"
            safety = "## Fix safety\n"
            docs = docs.replace(safety, section + safety, 1) if safety in docs else docs + "\n\n" + section.rstrip("\n")
        return f"# {cls.name} ({cls.code})\n\n{cls.summary}\n\nFamily: {cls.family()}. Severity: {cls.level()}. Default: {state}.\n\n{docs}\n"

    def report(self, node: ast.AST, message: str, fix: Optional[Fix] = None,
               end_node: Optional[ast.AST] = None, noqa_row: Optional[int] = None) -> None:
        if self.quiet_in and quiet_at(self.ctx, self.quiet_in, node.lineno):
            return
        self.ctx.report(self.code, node, message, fix=fix, end_node=end_node, noqa_row=noqa_row)

    # Helpers for building fixes from ast positions.
    def replace(self, node: ast.AST, content: str, message: str, safe: bool = True,
                end_node: Optional[ast.AST] = None) -> Fix:
        return Fix(message, (self.ctx.edit(node, content, end_node=end_node),), safe)


class GemmVisitor:
    """Mixin for the rules about GEMMs: `check_gemm(node)` runs on every `a @ b` and every call,
    the nodes `as_gemm` sorts out (with `gemms_in_loops_only`, only on those inside a loop or
    comprehension). Put it before `Rule` in the bases and define `check_gemm`."""

    gemms_in_loops_only = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.gemms_in_loops_only:  # the engine calls the handlers only inside loops
            cls.only = {**cls.only, "visit_BinOp": Only(in_loops=True), "visit_Call": Only(in_loops=True)}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if node.op.__class__ is ast.MatMult and (self.ctx.loops or not self.gemms_in_loops_only):
            self.check_gemm(node)

    def visit_Call(self, node: ast.Call) -> None:
        if self.ctx.loops or not self.gemms_in_loops_only:
            self.check_gemm(node)
