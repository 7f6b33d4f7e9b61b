"""The functions of a file and where the file calls them, so that what a caller passes can
flow into a function's parameters and what a function does can count where it is called.

A module-level `def f` is called as `f(...)` anywhere in the file; a method `def m(self, ...)`
of class `C` as `self.m(...)` from C's other methods, and a static method also as `C.m(...)`;
a class's `__init__` as `C(...)`. Built once per file, on first use.

Read for a project file that imports the linted one (`imported=`), the calls of what it imports
are kept too, by the name they have where they are defined: `accuracy(...)` after `from utils
import accuracy`, `at.tonumpy(...)` after `import array_tool as at`.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from typing import NamedTuple, Optional

from .tree import block_fields, child_nodes, dotted, identifier_text, is_main_guard, walk_no_scopes

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_BRANCHES = (ast.If, ast.IfExp, ast.ExceptHandler)
_NO_CALLS = (ast.Name, ast.Constant, ast.expr_context)


class CallSite(NamedTuple):
    call: ast.Call
    functions: tuple          # the functions around the call, outermost first
    cls: Optional[ast.ClassDef]  # the class whose method holds the call
    bound: bool               # `self.m(...)`: the first parameter is bound, not passed
    loops: tuple              # the loops around the call in its function, outermost first
    conditional: bool         # under an `if` or in a `try` handler of its function: not every call runs it


class FileCalls:
    def __init__(self, tree: ast.Module, text: str = "", imported: Optional[dict] = None):
        """`imported`: the names that stand for definitions of other project files, `{local name:
        (path, name)}` for a name imported from a module and `{alias: (path, None)}` for a module,
        and under `"*"` the paths of the modules imported with `*`; their calls are kept in
        `imported_sites`, by `(path, name)`."""
        self.imported = dict(imported or {})
        self._stars = self.imported.pop("*", ())
        self.module_functions: dict = {}   # name -> FunctionDef, for names bound once at module level
        self.methods: dict = {}            # id(ClassDef) -> {name: FunctionDef}
        self.class_of: dict = {}           # id(FunctionDef) -> its ClassDef, for methods
        self.classes: dict = {}            # name -> ClassDef, for classes defined once at module level
        rebound: set = set()
        for stmt in tree.body:
            if isinstance(stmt, _FUNCTIONS):
                if stmt.name in self.module_functions:
                    rebound.add(stmt.name)
                self.module_functions[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                if stmt.name in self.classes:
                    rebound.add(stmt.name)
                self.classes[stmt.name] = stmt
                table = self.methods[id(stmt)] = {}
                for item in stmt.body:
                    if isinstance(item, _FUNCTIONS):
                        table[item.name] = item
                        self.class_of[id(item)] = stmt
        for name in rebound:
            self.module_functions.pop(name, None)
            self.classes.pop(name, None)
        self._tree, self._text = tree, text
        self._walked = False               # the calls are found on first use (`_walk_once`)
        self._held: Optional[dict] = None  # while `_follow_held_instances` walks a function: its parameters' instances
        self._by_id: Optional[dict] = None  # id(FunctionDef) -> it, for `callee`
        self._functions: list = []
        self._sites: dict = {}
        self._imported_sites: dict = {}
        # Names the text calls somewhere besides their `def`: only statements that spell one of
        # them can call a function of the file (most statements are not read further).
        names = set(self.module_functions).union(*(table.keys() for table in self.methods.values()))
        # Functions defined inside a function (`def loss_fn(...)` in `main`), called in it by name.
        self._nested_names = frozenset(_NESTED_DEF.findall(text)) - names if text else frozenset()
        self._nested: dict = {}            # id(function) -> its `_nested_definitions`
        names |= self._nested_names
        called = [name for name in names if text.count(name + "(") >= 2] if text else sorted(names)
        called += [name for name in self.classes if name not in names and (not text or name + "(" in text)]
        # Instances of the file's classes and of what project modules define, by the name or
        # `self.` attribute bound once to one (`criterion = YoloLoss(...)`, `agent = Agent(...)`):
        # calling one runs its `forward`; a method called on one (`agent.act(s)`) is that method,
        # here or, as `Agent.act`, in the module that defines it.
        self.instance_classes, self.imported_instances, self.imported_choices = _bound_instances(
            text, self.classes, self.imported) if text and (self.classes or self.imported) else ({}, {}, {})
        self.instances: dict = {}
        for name, owner in self.instance_classes.items():
            table = self.methods[id(owner)]
            run = table.get("forward") or table.get("__call__")
            if run is not None:
                self.instances[name] = run
        called += [name.rpartition(".")[2] for name in self.instances]
        self._called = called

    # The calls of the file, found on first use: `callee` needs only the tables above.
    @property
    def functions(self) -> list:
        """Every function of the file."""
        self._walk_once()
        return self._functions

    @property
    def sites(self) -> dict:
        """id(FunctionDef) -> [CallSite]."""
        self._walk_once()
        return self._sites

    @property
    def imported_sites(self) -> dict:
        """(path, name) -> [CallSite], for the `imported` names."""
        self._walk_once()
        return self._imported_sites

    def _walk_once(self) -> None:
        if self._walked:
            return
        self._walked = True
        text, called = self._text, list(self._called)
        modules = list(self.instance_classes) + list(self.imported_instances) + list(self.imported_choices)
        if self.imported:  # the names imported from project modules, and `alias.` of the modules
            called += [name for name, (_, defined) in self.imported.items() if defined is not None]
            modules += [name for name, (_, defined) in self.imported.items() if defined is None]
        if text and not self._stars:
            self._call_lines = _lines_calling(text, called, modules) if called or modules else set()
        else:
            self._call_lines = None
        self._walk(self._tree, (), None, (), False)
        self._follow_held_instances()

    def _follow_held_instances(self) -> None:
        """`def train(gen, opt): ... gen.sample(n)`, where every call of the module-level function
        `train` in the file passes, for `gen`, one instance the file binds by name (`gen =
        Generator(...)`, `gen = generator.Generator(...)`) and the function never rebinds it: the
        calls of methods through the parameter are calls of that class's methods."""
        known = {name: ("own", cls) for name, cls in self.instance_classes.items()}
        known.update((name, ("imported", source)) for name, source in self.imported_instances.items())
        if not known:
            return
        for function in self.module_functions.values():
            sites = self._sites.get(id(function))
            if not sites:
                continue
            rebound = _stored_in(function)
            held = {}
            for param in function.args.posonlyargs + function.args.args:
                if param.arg in rebound:
                    continue
                passed = {known.get(dotted(arg) or "") if arg is not None else None
                          for arg in (argument_for(site, function, param.arg) for site in sites)}
                if len(passed) == 1 and None not in passed:
                    held[param.arg] = passed.pop()
            if held:
                self._held, lines = held, self._call_lines
                self._call_lines = None
                try:
                    self._walk(function, (function,), None, (), False)
                finally:
                    self._held, self._call_lines = None, lines

    def _may_call(self, stmt: ast.AST) -> bool:
        if self._call_lines is None:
            return True
        body = getattr(stmt, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body and hasattr(body[0], "lineno") else stmt.end_lineno
        return any(line in self._call_lines for line in range(stmt.lineno, max(last, stmt.lineno) + 1))

    def _walk(self, node: ast.AST, functions: tuple, cls: Optional[ast.ClassDef], loops: tuple,
              conditional: bool) -> None:
        """Statement by statement (cheap: most nodes are expressions), the calls of each one."""
        for field in block_fields(node.__class__):
            for child in getattr(node, field):
                if isinstance(child, _FUNCTIONS):
                    if self._held is None:
                        self._functions.append(child)
                    self._calls_in(child, functions, cls, loops, conditional, skip=("body",))
                    self._walk(child, functions + (child,), cls, (), False)
                elif isinstance(child, ast.ClassDef):
                    self._calls_in(child, functions, cls, loops, conditional, skip=("body",))
                    self._walk(child, functions, child, (), False)
                else:
                    self._calls_in(child, functions, cls, loops, conditional, skip=block_fields(child.__class__))
                    inner = loops + (child,) if isinstance(child, _LOOPS) else loops
                    branch = isinstance(child, _BRANCHES) and not (isinstance(child, ast.If)
                                                                  and is_main_guard(child.test))
                    self._walk(child, functions, cls, inner, conditional or branch)

    def _calls_in(self, stmt: ast.AST, functions: tuple, cls, loops: tuple, conditional: bool, skip) -> None:
        """Record the calls in `stmt`'s own expressions (not in its blocks, which `_walk` visits)."""
        if not self._may_call(stmt):
            return
        stack = [getattr(stmt, f) for f in stmt._fields if f not in skip]
        while stack:
            value = stack.pop()
            if isinstance(value, list):
                stack.extend(value)
                continue
            if not isinstance(value, ast.AST) or isinstance(value, _NO_CALLS):
                continue
            if value.__class__ is ast.Call:
                self._record(value, functions, cls, loops, conditional or isinstance(stmt, ast.If))
            stack.extend(child_nodes(value))

    def _record(self, call: ast.Call, functions: tuple, cls: Optional[ast.ClassDef], loops: tuple,
                conditional: bool) -> None:
        for key, bound, imported in self._targets(call, functions, cls, loops):
            site = CallSite(call, functions, cls, bound, loops, conditional)
            (self._imported_sites if imported else self._sites).setdefault(key, []).append(site)

    def _targets(self, call: ast.Call, functions: tuple, cls: Optional[ast.ClassDef], loops: tuple):
        """(key, bound, imported) for each definition `call` may run: `id(FunctionDef)` of the
        file's, or `(path, name)` of what a project module defines (`imported`)."""
        func = call.func
        if self._held is not None:  # `_follow_held_instances`: only the calls through its parameters
            if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and len(functions) == 1
                    and func.value.id in self._held):
                how, held = self._held[func.value.id]
                if how == "own":
                    target = self.methods[id(held)].get(func.attr)
                    if target is not None and not _is_static(target):
                        yield id(target), True, False
                else:
                    yield (held[0], f"{held[1]}.{func.attr}"), False, True
            return
        if isinstance(func, ast.Name):
            # a function defined in one around the call; its sites are recorded (what runs every
            # step), but `callee` leaves it out: it is read from inside its enclosing function
            target = self._nested_function(func.id, functions) if func.id in self._nested_names and functions \
                else None
            if target is None:
                target = self.module_functions.get(func.id)
            if target is not None:
                yield id(target), False, False
            elif func.id in self.instances:
                # `criterion(pred, y)` in a function: the instance's `forward` (calls at the top
                # level, a module's `__main__` smoke test on made-up CPU tensors, say nothing of
                # what the program passes it)
                if functions:
                    yield id(self.instances[func.id]), True, False
            elif func.id in self.classes:  # `ProbMask(b, h, ...)` runs its `__init__`
                target = self.methods[id(self.classes[func.id])].get("__init__")
                if target is not None:
                    yield id(target), True, False
            elif func.id in self.imported and self.imported[func.id][1] is not None:
                yield self.imported[func.id], False, True
            elif self._stars and func.id not in self.imported:
                for path in self._stars:  # `from utils import *`: any of them may define it
                    yield (path, func.id), False, True
        elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and cls is not None
              and functions and _first_parameter(functions[-1]) == func.value.id):
            target = self.methods.get(id(cls), {}).get(func.attr) or self.instances.get("self." + func.attr)
            if target is not None:
                yield id(target), not _is_static(target), False
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.classes:
            # `Block.attention(q, k, v)`: a static method called through its class
            target = self.methods.get(id(self.classes[func.value.id]), {}).get(func.attr)
            if target is not None and _is_static(target):
                yield id(target), False, False
        if isinstance(func, ast.Attribute) and self.instance_classes:  # `agent.act(s)`, an `Agent` of the file
            owner = self.instance_classes.get(dotted(func.value))
            target = self.methods[id(owner)].get(func.attr) if owner is not None else None
            if target is not None and (functions or loops) and not _is_static(target):
                yield id(target), True, False
        if isinstance(func, ast.Attribute) and self.imported_instances:  # `agent.learn()`, `self.agent.act(s)`
            made = self.imported_instances.get(dotted(func.value))
            if made is not None:
                yield (made[0], f"{made[1]}.{func.attr}"), False, True
        if isinstance(func, ast.Attribute) and self.imported_choices:  # `model.train_model(...)`, one of several
            for made in self.imported_choices.get(dotted(func.value), ()):
                yield (made[0], f"{made[1]}.{func.attr}"), False, True
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.imported
                and self.imported[func.value.id][1] is None):  # `at.tonumpy(x)`, `at` a project module
            yield (self.imported[func.value.id][0], func.attr), False, True

    def _nested_function(self, name: str, functions: tuple) -> Optional[ast.AST]:
        """The function that `name` calls inside `functions` (outermost first) where one of them
        defines it: the innermost that binds the name, if that binding is one `def` alone."""
        for function in reversed(functions):
            table = self._nested.get(id(function))
            if table is None:
                table = self._nested[id(function)] = _nested_definitions(function)
            if name in table:
                return table[name]
        return None

    def call_sites(self, function: ast.AST) -> list:
        return self.sites.get(id(function), [])

    def callee(self, call: ast.Call, functions: tuple, cls: Optional[ast.ClassDef]) -> Optional[tuple]:
        """(the function of the file that `call` runs, its CallSite) for a call made inside
        `functions` (outermost first) of `cls`, or None; read off the file's tables, without
        finding its other calls."""
        definitions = self._definitions
        for key, bound, imported in self._targets(call, functions, cls, ()):
            if not imported and key in definitions:
                return definitions[key], CallSite(call, functions, cls, bound, (), False)
        return None

    @property
    def _definitions(self) -> dict:
        if self._by_id is None:
            self._by_id = {id(f): f for f in self.module_functions.values()}
            for table in self.methods.values():
                self._by_id.update((id(f), f) for f in table.values())
        return self._by_id


def _stored_in(function: ast.AST) -> set:
    """The names `function`'s body stores or deletes, its nested scopes aside."""
    return {node.id for stmt in function.body for node in walk_no_scopes(stmt)
            if node.__class__ is ast.Name and node.ctx.__class__ is not ast.Load}


_NESTED_DEF = re.compile(r"^[ \t]+(?:async[ \t]+)?def[ \t]+(\w+)", re.MULTILINE)


def _nested_definitions(function: ast.AST) -> dict:
    """{name: the function} for the names `function` binds in its own body (its nested scopes
    aside): a function defined there, where that one `def` is the name's only binding; None for
    a name bound otherwise too (it may hold anything)."""
    defined: dict = {}
    stored: set = set()
    stack = list(function.body)
    while stack:  # its statements and those of its blocks, not of nested scopes
        stmt = stack.pop()
        if isinstance(stmt, _FUNCTIONS):
            defined.setdefault(stmt.name, []).append(stmt)
        elif isinstance(stmt, ast.ClassDef):
            stored.add(stmt.name)
        else:
            for field in block_fields(stmt.__class__):
                stack.extend(getattr(stmt, field))
    stored |= _stored_in(function)
    args = function.args
    stored.update(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a)
    found = {name: None for name in stored}
    found.update((name, defs[0] if len(defs) == 1 and name not in stored else None) for name, defs in defined.items())
    return found


# Each pattern starts at an assignment's `=` (a pattern that starts with a literal is scanned for
# quickly); the name bound is read back from the line before it (`_assignments`).
_INSTANCE = re.compile(r"=[ \t]*((?:[A-Za-z_]\w*\.)?[A-Za-z_]\w*)\(")
_ASSIGNED = re.compile(r"=(?!=)")
# `gen = gen.cuda()`: the same instance, moved; no other binding
_MOVED_AGAIN = re.compile(r"=[ \t]*((?:self\.)?[A-Za-z_]\w*)\.(?:cuda|to|cpu|float|double|half|train|eval)\(")
_TARGET = re.compile(r"(?<![\w.])((?:self\.)?[A-Za-z_]\w*)[ \t]*\Z")
_BEFORE_AUGMENTED_EQUALS = frozenset("=!<>+-*/%&|^@:")  # `==`, `<=`, `+=`, `:=`, ...


def _assignments(text: str, pattern) -> list:
    """(name or "self.attr", match) for each `name = ...` of `text` whose `=` and what follows
    it match `pattern`; not `name == ...`, `name += ...`, `x[i] = ...`, `obj.attr = ...`."""
    found = []
    for match in pattern.finditer(text):
        start = match.start()
        if start and text[start - 1] in _BEFORE_AUGMENTED_EQUALS:
            continue
        target = _TARGET.search(text, text.rfind("\n", 0, start) + 1, start)
        if target is not None:
            found.append((target.group(1), match))
    return found


def _bound_instances(text: str, classes: dict, imported: dict) -> tuple:
    """({name or "self.attr": the class of the file}, {name or "self.attr": (path, name) of what a
    project module defines}, {name: [(path, name)] of the classes a name bound several times is
    bound to, each a project module's}) for the names the text binds once, and to nothing else but itself
    moved (`gen = gen.cuda()`), to a call of a class of the file or of an imported name (`agent =
    Agent(...)`, `self.memory = Replay(n)`, `gen = generator.Generator(...)`). One scan of the
    text for both."""
    own, other, choices = {}, {}, {}
    counts = None
    for name, match in _assignments(text, _INSTANCE):
        made = match.group(1)
        module, _, made = made.rpartition(".")
        if module:  # `gen = generator.Generator(...)` after `import generator`
            path = imported.get(module)
            cls, source = None, (path[0], made) if path is not None and path[1] is None and made[:1].isupper() else None
        else:
            cls = classes.get(made)
            source = imported.get(made) if cls is None else None
        if cls is None and (source is None or source[1] is None):
            continue
        if counts is None:  # how often each name is assigned anything, read once
            counts = Counter(name for name, _ in _assignments(text, _ASSIGNED))
            counts.subtract(name for name, match in _assignments(text, _MOVED_AGAIN) if match.group(1) == name)
        if counts[name] == 1:
            if cls is not None:
                own[name] = cls
            else:
                other[name] = source
        elif cls is None:
            choices.setdefault(name, []).append(source)
    # A name bound in several places, each to a class a project module defines (`model = DKT(...)`
    # in one branch, `model = SAKT(...)` in another): a method called on it is one of theirs.
    choices = {name: made for name, made in choices.items() if len(made) == counts[name] and len(set(made)) > 1}
    return own, other, choices


def _is_static(function: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)


def _first_parameter(function: ast.AST) -> Optional[str]:
    args = function.args
    params = args.posonlyargs + args.args
    return params[0].arg if params else None


def _lines_calling(text: str, names: list, modules: list = ()) -> set:
    """The 1-based lines of `text` that spell a call of one of `names` (`name(`) or of an
    attribute of one of `modules` (`module.name(`)."""
    spelled = [re.escape(n) + r"\(" for n in names] + [re.escape(m) + r"\.\w+\(" for m in modules]
    pattern = re.compile(r"\b(?:" + "|".join(spelled) + ")")
    starts = [m.start() for m in pattern.finditer(text)]
    if not starts:
        return set()
    lines, line, offset = set(), 1, 0
    for start in starts:
        line += text.count("\n", offset, start)
        offset = start
        lines.add(line)
    return lines


def file_calls(ctx) -> FileCalls:
    found = ctx.shared.get("file_calls")
    if found is None:
        found = ctx.shared["file_calls"] = FileCalls(ctx.tree, identifier_text(ctx))
    return found


def argument_for(site: CallSite, function: ast.AST, name: str):
    """The expression `site` passes for parameter `name` of `function`; the parameter's
    default where the call leaves it out; None where it cannot be told (`*args`, `**kwargs`)."""
    args = function.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if site.bound:
        positional = positional[1:]
    call = site.call
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if name in positional:
        index = positional.index(name)
        if index < len(call.args):
            return call.args[index]
        defaults = args.defaults
        first_default = len(positional) - len(defaults)
        return defaults[index - first_default] if index >= first_default else None
    kwonly = [a.arg for a in args.kwonlyargs]
    if name in kwonly:
        return args.kw_defaults[kwonly.index(name)]
    return None
