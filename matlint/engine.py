"""Lints one file: decode, pre-filter, parse with the stdlib `ast`, run every enabled rule in
one traversal, apply `# noqa`. Never raises for a bad file: problems become MAT0xx findings."""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from typing import Iterable, Optional

from . import notebook
from .diagnostics import Edit, Finding
from .source import decode, parse
from .rule import Only
from matlint.semantic.loops import LoopInfo
from matlint.semantic.tree import node_fields
from matlint.semantic.file import SourceFile
from matlint.semantic import project

NOQA_RE = re.compile(
    r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE
)
FILE_NOQA_RE = re.compile(r"#\s*matlint\s*:\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
CODE_LIST_SPLIT = re.compile(r"[,\s]+")


def mentions_torch(data) -> bool:
    """The pre-filter: the file (bytes or text) may hold PyTorch code: it names `torch`, runs a
    backward pass (`loss.backward()` in a helper module that never imports torch), reads a value
    to the host (`loss.item()` in a logger module that its importers hand tensors), or takes names
    from another module with `import *` (`from module import *` where module.py imports torch as t)."""
    if isinstance(data, bytes):
        return b"torch" in data or b".backward(" in data or b".item()" in data or b"import *" in data
    return "torch" in data or ".backward(" in data or ".item()" in data or "import *" in data


class FileContext(SourceFile):
    """What a rule sees while the engine walks one file: the file, and where the walk stands."""

    def __init__(self, source: str, filename: str, tree: ast.Module):
        super().__init__(source, filename, tree)
        self.parents: list = []
        self.loops: list = []
        self.functions: list = []
        self.classes: list = []
        # The innermost function (not across a class body) and class around the node being
        # walked, kept by the walker: read by most handlers, they are attributes, not properties.
        self.function = None
        self.class_ = None
        self.findings: list = []
        self._current_code = "MAT000"

    def edit(self, node: ast.AST, content: str, end_node: Optional[ast.AST] = None) -> Edit:
        row, col, end_row, end_col = self.span(node, end_node)
        return Edit(content, row, col, end_row, end_col)

    # -- structure ---------------------------------------------------------
    @property
    def parent(self) -> Optional[ast.AST]:
        return self.parents[-1] if self.parents else None

    def statement(self) -> Optional[ast.stmt]:
        """The innermost statement around the node being walked (None outside every statement)."""
        for node in reversed(self.parents):
            if isinstance(node, ast.stmt):
                return node
        return None

    def report(self, code: str, node: ast.AST, message: str, fix=None, end_node=None,
               noqa_row: Optional[int] = None) -> None:
        """`noqa_row`: a second line whose `# noqa` silences the finding (the first line of the
        statement that the finding stands for), besides the finding's own first line."""
        row, col, end_row, end_col = self.span(node, end_node)
        self.findings.append(Finding(code, message, self.filename, row, col, end_row, end_col, fix, noqa_row or row))


_AST = ast.AST


def _node_classes(base=ast.AST) -> list:
    found = []
    for sub in base.__subclasses__():
        found.append(sub)
        found.extend(_node_classes(sub))
    return found


_NODE_CLASSES = frozenset(_node_classes())
# Annotations are types, not computation: the walker does not enter them (a parameter's, a
# return's, an annotated assignment's), nor does it call handlers on anything inside them.
_ANNOTATION_FIELDS = {ast.arg: "annotation", ast.AnnAssign: "annotation"}


def walked_fields(node_type) -> tuple:
    """The fields of `node_type` the walker enters: `node_fields` less annotations."""
    fields = node_fields(node_type)
    annotation = _ANNOTATION_FIELDS.get(node_type)
    return fields if annotation is None else tuple(f for f in fields if f != annotation)


# Nodes with no child the walker visits (Name, Constant, Pass, alias, arg...): entering one only
# calls its handlers, so a walk with none for it does not enter it.
_LEAF_CLASSES = frozenset(c for c in _NODE_CLASSES if not walked_fields(c))
# Statements whose children are all leaves (`alias`): entered only for their own handlers.
_LEAF_PARENTS = {ast.Import: ast.alias, ast.ImportFrom: ast.alias}
# Node classes whose only child field holds one node or None (not a list).
_ONE_CHILD = {ast.Attribute: "value", ast.keyword: "value", ast.Expr: "value",
              ast.Starred: "value", ast.UnaryOp: "operand", ast.Await: "value", ast.Return: "value"}
assert all(walked_fields(c) == (f,) for c, f in _ONE_CHILD.items())
# Values of child fields that are not nodes (a missing `returns`, a Dict's `**` key).
_NOT_NODES = frozenset({type(None), str, int, float, bytes, bool})


_UNNAMED_ATTRIBUTE = object()
_ATTRIBUTE = object()  # the route key's second name, for a call of an attribute


class _Routes:
    """The handlers of one node class, some with an `Only`: the ones to call, by whether the
    node is inside a loop and (for a call) the attribute or bare name it calls, in registration
    order."""

    __slots__ = ("entries", "by_key", "attrs")

    def __init__(self, entries: list):
        self.entries = entries
        self.by_key: dict = {}
        # Any attribute or name no entry names routes alike: one key for all of them.
        self.attrs = frozenset().union(*(only.attrs for _, only in entries if only and only.attrs))

    def pick(self, ctx, node) -> list:
        func = getattr(node, "func", None)
        cls = func.__class__
        attrs = self.attrs
        if cls is ast.Attribute:
            name, alias = func.attr, _ATTRIBUTE
            if name not in attrs:
                name = _UNNAMED_ATTRIBUTE
        elif cls is ast.Name:  # `cat(...)`: by the name, and by what it stands for (`torch.cat`)
            name = func.id if func.id in attrs else None
            alias = (ctx.qualname(func) or "").rpartition(".")[2] if attrs else ""
            if alias not in attrs:
                alias = None
        else:
            name = alias = None
        key = (bool(ctx.loops), name, alias)
        handlers = self.by_key.get(key)
        if handlers is None:
            handlers = self.by_key[key] = [handler for handler, only in self.entries
                                           if only is None or _admits(only, key, cls)]
        return handlers


def _admits(only, key: tuple, func_class) -> bool:
    in_loop, name, alias = key
    if only.in_loops and not in_loop:
        return False
    if only.attrs is None:
        return True
    if func_class is ast.Attribute:
        return name in only.attrs
    return None in only.attrs or name in only.attrs or alias in only.attrs


def _walk_layout(handled: frozenset) -> tuple:
    """What the walker enters, given the node classes with handlers or a special walk."""
    unhandled = _NODE_CLASSES - handled
    skipped = unhandled & _LEAF_CLASSES
    skipped |= {c for c, child in _LEAF_PARENTS.items() if c in unhandled and child in skipped}
    # A function's parameters are entered only for their defaults, or for a handler of `arg`.
    walk_all_parameters = ast.arg not in skipped
    # Handler-less nodes with one child (`self.fc`, `dim=1`), entered only when that child is
    # not skipped: a fifth of the nodes the walk would otherwise enter to do nothing.
    hollow = {c: field for c, field in _ONE_CHILD.items() if c in unhandled}
    # Classes of child values to enter, and to step over without a look (handler-less leaves, non-nodes).
    enter = _NODE_CLASSES - skipped - hollow.keys()
    skip = frozenset(skipped | _NOT_NODES)
    return walk_all_parameters, hollow, enter, skip


_LAYOUTS: dict = {}  # handled classes -> _walk_layout(...)
_EVERY_CALL, _EVERY_CALL_IN_LOOPS = Only(), Only(in_loops=True)


class Walker:
    """One traversal of the tree, calling each enabled rule's visit_/leave_ handlers."""

    def __init__(self, ctx: FileContext, rules: Iterable):
        self.ctx = ctx
        self.visit: dict = {}
        self.leave: dict = {}
        routed = set()
        for rule in rules:
            only_table = getattr(type(rule), "only", None) or {}
            for (kind, node_type), attrs in rule._handlers.items():
                table = self.visit if kind == "visit" else self.leave
                node_class = getattr(ast, node_type, None)
                if node_class is None:
                    continue
                for attr in attrs:
                    only = only_table.get(attr)
                    if only is not None:
                        if only.if_file is not None and not only.if_file(ctx):
                            continue  # the handler does nothing anywhere in this file
                        if only.every_call_if is not None and only.attrs is not None and only.every_call_if(ctx):
                            only = _EVERY_CALL_IN_LOOPS if only.in_loops else _EVERY_CALL
                        if only.in_loops or only.attrs is not None:
                            routed.add((table is self.visit, node_class))
                        else:
                            only = None
                    table.setdefault(node_class, []).append((getattr(rule, attr), only))
        # Handlers are bound methods of the rules: `handler.__self__.code` names the rule.
        for table in (self.visit, self.leave):
            for node_class, entries in table.items():
                if (table is self.visit, node_class) in routed:
                    table[node_class] = _Routes(entries)
                else:
                    table[node_class] = [handler for handler, _ in entries]
        handled = frozenset(self.visit).union(self.leave)
        layout = _LAYOUTS.get(handled)
        if layout is None:  # the same few sets of handled classes recur file after file
            layout = _LAYOUTS[handled] = _walk_layout(handled | self.special.keys())
        self.walk_all_parameters, self.hollow, self.enter, self.skip = layout
        # node class -> (visit handlers, leave handlers, special walk, child fields), built on first sight
        self.plans: dict = {}

    def _plan(self, node_type) -> tuple:
        plan = self.plans[node_type] = (self.visit.get(node_type), self.leave.get(node_type),
                                        self.special.get(node_type), walked_fields(node_type))
        return plan

    def walk(self, tree: ast.AST) -> None:
        """Walk `tree` (a file's module, or any node), calling the rules' handlers."""
        ctx = self.ctx
        plans, make_plan = self.plans, self._plan
        parents = ctx.parents
        enter, skip, hollow = self.enter, self.skip, self.hollow

        # A closure, not a method: its names are cells, not attributes looked up on every node.
        def walk(node: ast.AST) -> None:
            plan = plans.get(node.__class__)
            visit, leave, special, fields = plan if plan is not None else make_plan(node.__class__)
            if visit:
                if visit.__class__ is _Routes:
                    visit = visit.pick(ctx, node)
                try:
                    for handler in visit:  # inline, not a helper: this runs for most nodes
                        handler(node)
                except BaseException:
                    ctx._current_code = handler.__self__.code  # for the MAT000 finding that names the rule
                    raise
            parents.append(node)
            if special is not None:
                special(self, node)
            else:
                # The same test for a list's items and for a single child, written out twice: a
                # helper called per child would cost a call for every child of every node.
                for field in fields:
                    value = getattr(node, field, None)
                    if value.__class__ is list:
                        for item in value:
                            cls = item.__class__
                            if cls in enter:
                                walk(item)
                            elif cls in hollow:
                                if getattr(item, hollow[cls]).__class__ not in skip:
                                    walk(item)
                            elif cls not in skip and isinstance(item, _AST):
                                walk(item)
                    else:
                        cls = value.__class__
                        if cls in enter:
                            walk(value)
                        elif cls in hollow:
                            if getattr(value, hollow[cls]).__class__ not in skip:
                                walk(value)
                        elif cls not in skip and isinstance(value, _AST):
                            walk(value)
            parents.pop()
            if leave:
                if leave.__class__ is _Routes:
                    leave = leave.pick(ctx, node)
                try:
                    for handler in leave:
                        handler(node)
                except BaseException:
                    ctx._current_code = handler.__self__.code
                    raise

        self._walk_node = walk
        try:
            walk(tree)
        finally:
            # `walk` holds itself and this walker: cycles that would keep the tree alive until
            # the garbage collector found them. Emptying the cell and the attribute breaks both.
            self._walk_node = walk = None

    def _walk_all(self, nodes) -> None:
        walk = self._walk_node
        for child in nodes:
            if child is not None:
                walk(child)

    def _in_loop(self, loop: LoopInfo, nodes) -> None:
        self.ctx.loops.append(loop)
        self._walk_all(nodes)
        self.ctx.loops.pop()

    def _walk_for(self, node) -> None:
        self._walk_all((node.target, node.iter))
        self._in_loop(LoopInfo(node, self.ctx), node.body)
        self._walk_all(node.orelse)

    def _walk_while(self, node) -> None:
        self._in_loop(LoopInfo(node, self.ctx), [node.test] + node.body)
        self._walk_all(node.orelse)

    def _walk_comprehension(self, node) -> None:
        first = node.generators[0]
        self._walk_node(first.iter)
        inner = [first.target, *first.ifs, *node.generators[1:]]
        inner += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._in_loop(LoopInfo(node, self.ctx), inner)

    def _walk_function(self, node) -> None:
        ctx = self.ctx
        if not isinstance(node, ast.Lambda):
            self._walk_all(node.decorator_list)  # not `returns`: an annotation
        args = node.args
        if self.walk_all_parameters or args.defaults or any(args.kw_defaults):
            self._walk_node(args)
        saved_loops, ctx.loops = ctx.loops, []
        saved_function, ctx.function = ctx.function, node
        ctx.functions.append(node)
        ctx.names.enter_function(node)
        if isinstance(node, ast.Lambda):
            self._walk_node(node.body)
        else:
            self._walk_all(node.body)
        ctx.names.leave_scope()
        ctx.functions.pop()
        ctx.function = saved_function
        ctx.loops = saved_loops

    def _walk_class(self, node: ast.ClassDef) -> None:
        ctx = self.ctx
        self._walk_all(node.decorator_list)
        self._walk_all(node.bases)
        self._walk_all(node.keywords)
        saved = ctx.loops, ctx.functions, ctx.function, ctx.class_
        ctx.loops, ctx.functions, ctx.function, ctx.class_ = [], [], None, node
        ctx.classes.append(node)
        ctx.names.enter_class(node)
        self._walk_all(node.body)
        ctx.names.leave_scope()
        ctx.classes.pop()
        ctx.loops, ctx.functions, ctx.function, ctx.class_ = saved


# Plain functions, not bound methods: a walker holding its own bound methods would be a reference
# cycle, keeping every file's tree alive until the garbage collector finds it.
Walker.special = {
    ast.FunctionDef: Walker._walk_function, ast.AsyncFunctionDef: Walker._walk_function,
    ast.Lambda: Walker._walk_function, ast.ClassDef: Walker._walk_class,
    ast.For: Walker._walk_for, ast.AsyncFor: Walker._walk_for, ast.While: Walker._walk_while,
    ast.ListComp: Walker._walk_comprehension, ast.SetComp: Walker._walk_comprehension,
    ast.GeneratorExp: Walker._walk_comprehension, ast.DictComp: Walker._walk_comprehension,
}


# -- decoding and parsing ---------------------------------------------------

# -- noqa ---------------------------------------------------------------------

def _codes(text: Optional[str]):
    if not text:
        return None
    return frozenset(c.upper() for c in CODE_LIST_SPLIT.split(text.strip()) if c)


def noqa_map(source: str):
    """({row: codes or None for all}, file_codes or None for all, file_noqa_present)."""
    if "noqa" not in source and "NOQA" not in source:
        return {}, None, False
    per_line: dict = {}
    file_codes, file_noqa = None, False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return {}, None, False
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        match = FILE_NOQA_RE.search(tok.string)
        if match:
            file_noqa = True
            codes = _codes(match.group("codes"))
            if codes is None:
                file_codes = None
            else:
                file_codes = (file_codes or frozenset()) | codes
            continue
        match = NOQA_RE.search(tok.string)
        if match:
            per_line[tok.start[0]] = _codes(match.group("codes"))
    return per_line, file_codes, file_noqa


def apply_noqa(findings: list, source: str) -> list:
    if not findings:
        return findings  # most files: no need to tokenize them for comments
    per_line, file_codes, file_noqa = noqa_map(source)
    if not per_line and not file_noqa:
        return findings
    kept = []
    for f in findings:
        if file_noqa and (file_codes is None or f.code in file_codes):
            continue
        if any(row in per_line and (per_line[row] is None or f.code in per_line[row])
               for row in {f.row, f.noqa_row or f.row}):
            continue
        kept.append(f)
    return kept


# -- entry points ---------------------------------------------------------------

def _run_rules(tree: ast.Module, source: str, filename: str, rule_classes, rule_options) -> list:
    ctx = FileContext(source, filename, tree)
    rules = [cls(ctx, rule_options.get(cls.code)) for cls in rule_classes if cls._handlers]
    walker = Walker(ctx, rules)
    try:
        walker.walk(tree)
    except RecursionError:
        raise
    except Exception as exc:  # a rule bug must not take the run down
        row = ctx.parents[-1].lineno if ctx.parents and hasattr(ctx.parents[-1], "lineno") else 1
        return ctx.findings + [Finding(
            "MAT000",
            f"internal error in {ctx._current_code} ({type(exc).__name__}: {exc}); the rest of this file was not checked",
            filename, row, 1, row, 1)]
    finally:
        # The shared analyses point back at ctx; without this cycle the whole tree is freed by
        # reference counting as soon as the caller lets go of it, not by the garbage collector.
        ctx.shared.clear()
    return ctx.findings


# The parser accepts trees about 3x deeper than the recursion limit (a chain of 2,000 `a + a`),
# and the walker and the rules' recursive analyses take a few frames per level.
DEEP_TREE_RECURSION_FACTOR = 12


def lint_tree(tree: ast.Module, source: str, filename: str, rule_classes, rule_options=None) -> list:
    """Run the rules over an already parsed tree (the flake8 plugin hands us its own)."""
    rule_options = rule_options or {}
    with project.files_unchanged():  # the project's files, looked up once for this file
        return _lint_tree(tree, source, filename, rule_classes, rule_options)


def _lint_tree(tree: ast.Module, source: str, filename: str, rule_classes, rule_options: dict) -> list:
    try:
        return _run_rules(tree, source, filename, rule_classes, rule_options)
    except RecursionError:
        pass
    # Only deeply nested files get here: walk them again with room for their depth.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit * DEEP_TREE_RECURSION_FACTOR)
    try:
        return _run_rules(tree, source, filename, rule_classes, rule_options)
    except RecursionError:
        return [Finding("MAT000", "expressions nest too deeply to analyse; split the longest expression",
                        filename, 1, 1, 1, 1)]
    finally:
        sys.setrecursionlimit(limit)


def lint_source(source: str, filename: str, rule_classes, rule_options=None, prefilter: bool = True,
                tree: Optional[ast.Module] = None) -> list:
    """Lint `source`; `tree`: the source already parsed."""
    if prefilter and not mentions_torch(source):
        return []
    if tree is None:
        tree, error = parse(source, filename)
        if error:
            return [error]
    findings = lint_tree(tree, source, filename, rule_classes, rule_options)
    findings = apply_noqa(findings, source)
    findings.sort(key=Finding.sort_key)
    return findings


def lint_bytes(data: bytes, filename: str, rule_classes, rule_options=None) -> list:
    source, error = decode(data, filename)
    if error:
        return [error]
    if filename.endswith(notebook.NOTEBOOK_SUFFIX):
        return lint_notebook(source, filename, rule_classes, rule_options)
    # a project module that the analysis of a file linted before has parsed already
    return lint_source(source, filename, rule_classes, rule_options, tree=project.parsed_from(filename, data))


def read_notebook(text: str, filename: str):
    """(Notebook, None), or (None, the MAT001 finding for a file that is not a notebook)."""
    try:
        return notebook.read(text), None
    except notebook.NotebookError as exc:
        return None, Finding("MAT001", f"cannot read this notebook: {exc}", filename,
                             exc.row, exc.column, exc.row, exc.column)


def lint_notebook(text: str, filename: str, rule_classes, rule_options=None) -> list:
    """Findings for a notebook's code cells, located in their cells; a cell that does not parse
    gets MAT001 and the others are linted without it."""
    if not mentions_torch(text):
        return []
    book, error = read_notebook(text, filename)
    if error:
        return [error]
    program, problems = notebook.program(book, filename)
    return sorted(problems + lint_program(program, filename, rule_classes, rule_options), key=Finding.sort_key)


def lint_program(program, filename: str, rule_classes, rule_options=None) -> list:
    """Findings for a notebook's `Program`, located in its cells (`# noqa` as in a file)."""
    if not mentions_torch(program.source):
        return []
    try:
        tree = program.tree if program.tree is not None else notebook.parse(program.source, filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        # Every cell parses alone; together they may not (a cell that ends inside a bracket).
        row = getattr(exc, "lineno", None) or 1
        return [program.to_cell(Finding("MAT001", f"the cells do not parse as one program: {exc}",
                                         filename, row, 1, row, 1))]
    findings = apply_noqa(lint_tree(tree, program.source, filename, rule_classes, rule_options), program.source)
    return sorted((program.to_cell(f) for f in findings), key=Finding.sort_key)
