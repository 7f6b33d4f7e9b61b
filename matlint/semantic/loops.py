"""Loop structure: what a loop iterates over, which names carry values from one iteration
to the next, and which depend on the loop variable. Computed lazily, once per loop."""
from __future__ import annotations

import ast
import builtins
import re
from functools import cached_property
from typing import Optional

from .flow import _end, _in_loop_body, _pos, flow_of
# walk_no_scopes and the scope tuples live in tree (a leaf); imported here for the modules that read them from loops
from .tree import (_COMPREHENSIONS, _SCOPE_TYPES, _SCOPES, block_fields, child_nodes, code_scope, dotted,
                   function_text, identifier_text, may_mention, walk, walk_no_scopes)

def bound_names(target: ast.AST) -> set:
    names = set()
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names

# Attributes that say where a tensor is, not what it holds.
_PLACEMENT_ATTRIBUTES = frozenset({"device", "dtype", "is_cuda"})


def loaded_names(expr: ast.AST) -> set:
    return {n.id for n in walk_no_scopes(expr) if n.__class__ is ast.Name and n.ctx.__class__ is ast.Load}


def _attribute_paths(expr: ast.AST) -> set:
    """`self.h` and `self.h.T` for `self.h.T @ W`: the dotted paths of the attributes `expr` reads."""
    return {dotted(n) for n in walk_no_scopes(expr) if n.__class__ is ast.Attribute} - {None}


def scope_statements(body):
    """The statements of a scope's `body` in source order, into blocks (`if`, `for`, `try`,
    `with`, `match`) but not into nested functions or classes: their `def` or `class` statement
    is yielded, their body is another scope's."""
    stack = list(reversed(body))
    while stack:
        stmt = stack.pop()
        yield stmt
        cls = stmt.__class__
        if cls not in _SCOPE_TYPES:
            for field in block_fields(cls):
                children = getattr(stmt, field)
                if children:
                    stack.extend(reversed(children))


def walk_direct(stmts):
    """Nodes of a loop body, not entering nested loops, comprehensions or scopes."""
    nested = _SCOPES + (ast.For, ast.AsyncFor, ast.While) + _COMPREHENSIONS
    stack = list(stmts)
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, nested):
            stack.extend(child_nodes(current))


class _Order(ast.NodeVisitor):
    """Reads and writes of plain names, and of attributes of them (`self.h`), in (approximate)
    evaluation order."""

    def __init__(self):
        self.events: list = []

    def visit_Name(self, node):
        self.events.append(("write" if isinstance(node.ctx, (ast.Store, ast.Del)) else "read", node.id))

    def visit_Attribute(self, node):
        path = dotted(node)
        if path is not None:
            self.events.append(("write" if isinstance(node.ctx, (ast.Store, ast.Del)) else "read", path))
        self.visit(node.value)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self.events.append(("read", node.target.id))
        else:
            self.visit(node.target)
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.events.append(("write", node.target.id))

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def _skip_scope(self, node):
        if not isinstance(node, ast.Lambda):
            self.events.append(("write", node.name))

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _skip_scope

    def visit_Lambda(self, node):
        pass

    def _comprehension(self, node):
        inner = set()
        for gen in node.generators:
            inner |= bound_names(gen.target)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in inner:
                self.events.append(("read", sub.id))

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension


# Module methods that rewrite the module's weights: `self.fc.reset_parameters()`, `model.load_state_dict(sd)`.
_REWRITE_WEIGHTS = frozenset({"reset_parameters", "_reset_parameters", "load_state_dict", "apply",
                              "init_weights", "_init_weights"})


# Methods that add items to a list and change none it holds.
_CONTAINER_GROWTH = frozenset({"append", "extend", "insert"})


def _changes_in_place(method: str) -> bool:
    """`x.add_(...)`, `x.copy_(...)`, `xs.append(...)`, `self.fc.reset_parameters()`: the method
    changes its receiver."""
    return ((method.endswith("_") and not method.startswith("_")) or method in _CONTAINER_GROWTH
            or method in _REWRITE_WEIGHTS)


# Methods whose result shares the receiver's memory: an in-place change of it changes the receiver.
_VIEWS = frozenset({"view", "view_as", "select", "narrow", "t", "transpose", "permute", "unsqueeze", "squeeze",
                    "flatten", "unflatten", "reshape", "expand", "diagonal", "movedim", "swapaxes"})
# Methods that may return their receiver itself (`x.float()` of a float tensor), or what it holds
# (`self.fc.parameters()`, `sd.values()`): their results alias it too.
_MAY_ALIAS = _VIEWS | frozenset({
    "contiguous", "to", "float", "half", "bfloat16", "double", "type", "cuda", "cpu", "detach", "as_strided",
    "expand_as", "reshape_as", "unfold", "view_as_real", "view_as_complex", "parameters", "named_parameters",
    "buffers", "named_buffers", "state_dict", "values", "items", "unbind", "split", "chunk", "tensor_split"})
_ALIAS_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
# Iterables whose items are the items of their arguments: `for p in zip(a.parameters(), ...)`.
_ITEM_WRAPPERS = frozenset({"zip", "enumerate", "reversed", "list", "tuple", "iter"})


def _alias_sources(value: ast.AST, qualname) -> list:
    """The names and attribute paths whose memory `value` may share: `x` for `x`, `x[1:]`,
    `x.T`, `x.view(-1)`, `x.unbind(0)`, `torch.narrow(x, ...)`; `self.fc` for
    `self.fc.parameters()` and `zip(self.fc.parameters(), ...)`."""
    while True:
        cls = value.__class__
        if cls is ast.Subscript:
            value = value.value
        elif cls is ast.Attribute and value.attr in _ALIAS_ATTRIBUTES:
            value = value.value
        elif cls is ast.Call and value.func.__class__ is ast.Attribute and value.func.attr in _MAY_ALIAS:
            function = qualname(value.func)
            if function is None:
                value = value.func.value  # a method: `x.view(-1)`
            elif function.startswith("torch.") and value.args:
                value = value.args[0]  # `torch.transpose(x, 0, 1)`
            else:
                return []
        elif cls is ast.Call and value.func.__class__ is ast.Name and value.func.id in _ITEM_WRAPPERS:
            return [source for arg in value.args for source in _alias_sources(arg, qualname)]
        else:
            path = dotted(value)
            return [path] if path is not None else []


def _bound_paths(target: ast.AST) -> list:
    """The names and attribute paths a store into `target` rebinds (`a, self.b = ...`)."""
    if target.__class__ in (ast.Tuple, ast.List):
        return [path for elt in target.elts for path in _bound_paths(elt)]
    if target.__class__ is ast.Starred:
        return _bound_paths(target.value)
    path = dotted(target)
    return [path] if path is not None else []


def _holds(outer: ast.AST, inner: ast.AST) -> bool:
    """The source span of `outer` contains that of `inner`."""
    return ((outer.lineno, outer.col_offset) <= (inner.lineno, inner.col_offset)
            and (inner.end_lineno, inner.end_col_offset) <= (outer.end_lineno, outer.end_col_offset))


def view_alias_roots(ctx, scope: ast.AST, loop: Optional[ast.AST] = None) -> dict:
    """For the names and attribute paths of `scope` that are bound to a view or alias of another
    (`out = x`, `prev, nxt = xs[:-1], xs[1:]`, `for p in self.fc.parameters()`), a representative
    shared by all names that may hold the same memory. Flow-insensitive: a name bound once to an
    alias is an alias everywhere, which errs on the side of "may share". With `loop`, the
    aliases `loop` may see: a binding after the loop that no loop around it repeats (`x = out`
    once the loop has filled `out`) runs too late to make one."""
    if loop is not None and getattr(loop, "end_lineno", None) is None:
        loop = None
    key = ("view_alias_roots", id(scope), id(loop) if loop is not None else None)
    roots = ctx.shared.get(key)
    if roots is None:
        roots = {}
        body = scope.body if isinstance(scope.body, list) else [scope.body]
        if loop is not None:
            end = (loop.end_lineno, loop.end_col_offset)
            repeating = [n for stmt in body for n in walk_no_scopes(stmt)
                         if n.__class__ in (ast.For, ast.AsyncFor, ast.While) and n is not loop and _holds(n, loop)]

        def root(path):
            while roots.get(path, path) != path:
                path = roots[path]
            return path

        def link(a, b):
            ra, rb = root(a), root(b)
            if ra != rb:
                roots[ra] = rb
                roots.setdefault(rb, rb)

        for stmt in body:
            for sub in walk_no_scopes(stmt):
                cls = sub.__class__
                if cls is ast.Assign:
                    pairs = [(target, sub.value) for target in sub.targets]
                elif cls in (ast.AnnAssign, ast.NamedExpr) and sub.value is not None:
                    pairs = [(sub.target, sub.value)]
                elif cls in (ast.For, ast.AsyncFor, ast.comprehension):
                    pairs = [(sub.target, sub.iter)]
                else:
                    continue
                if loop is not None:
                    at = sub.target if cls is ast.comprehension else sub
                    if (at.lineno, at.col_offset) >= end and not any(_holds(n, at) for n in repeating):
                        continue
                for target, value in pairs:
                    if (target.__class__ in (ast.Tuple, ast.List) and value.__class__ in (ast.Tuple, ast.List)
                            and len(target.elts) == len(value.elts)):
                        pairs.extend(zip(target.elts, value.elts))  # `prev, nxt = xs[:-1], xs[1:]`
                        continue
                    sources = _alias_sources(value, ctx.qualname)
                    for bound in _bound_paths(target) if sources else ():
                        for source in sources:
                            link(bound, source)
        roots = {path: root(path) for path in roots}
        ctx.shared[key] = roots
    return roots


def _changed_tensor(target: ast.AST, spine: list):
    """The name or attribute path (`buf`, `self.traj`) whose tensor a store into `target` or an
    in-place call on it changes: through indexing (`buf[t + 1]`), views (`buf.view(-1)`) and
    `.data` (`self.W.data`). Collects the nodes walked into `spine` (they are the change, not a read)."""
    node = target
    while True:
        spine.append(node)
        cls = node.__class__
        if cls is ast.Subscript:
            node = node.value
        elif cls is ast.Call and node.func.__class__ is ast.Attribute and node.func.attr in _VIEWS:
            node = node.func.value
        elif cls is ast.Attribute and node.attr == "data":
            node = node.value
        else:
            break
    path = dotted(node)
    if path is not None:
        spine.extend(n for n in walk_no_scopes(node) if n.__class__ in (ast.Attribute, ast.Name))
    return path


def _path_prefixes(path: str) -> list:
    """`self.a.b` -> `self.a`, `self.a.b`: the attributes that hold (or are) the changed tensor;
    a plain name is its own."""
    parts = path.split(".")
    if len(parts) == 1:
        return parts
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


class LoopInfo:
    """A `for`, `while` or comprehension, as seen from inside its body."""

    def __init__(self, node: ast.AST, ctx):
        self.node = node
        self.ctx = ctx

    @property
    def is_comprehension(self) -> bool:
        return isinstance(self.node, _COMPREHENSIONS)

    @property
    def described(self) -> str:
        """The loop as a message names it: "the `for t` loop on line 9", "the comprehension on
        line 3", "the `while` loop on line 5"."""
        node = self.node
        if self.is_comprehension:
            return f"the comprehension on line {node.lineno}"
        if isinstance(node, ast.While):
            return f"the `while` loop on line {node.lineno}"
        return f"the `for {self.ctx.segment(node.target)}` loop on line {node.lineno}"

    @property
    def body(self) -> list:
        node = self.node
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return node.body
        if isinstance(node, ast.While):
            return [node.test] + node.body
        inner = [g for g in node.generators[1:]] + [i for g in node.generators for i in g.ifs]
        return inner + ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])

    @property
    def iter(self):
        """The iterable (None for `while`)."""
        if isinstance(self.node, (ast.For, ast.AsyncFor)):
            return self.node.iter
        if self.is_comprehension:
            return self.node.generators[0].iter
        return None

    @cached_property
    def targets(self) -> set:
        """Names that take a new value each iteration by the loop itself."""
        node = self.node
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return bound_names(node.target)
        if self.is_comprehension:
            names = set()
            for gen in node.generators:
                names |= bound_names(gen.target)
            return names
        assigned = self.assigned
        return {n for n in loaded_names(node.test) if n in assigned}

    @cached_property
    def assigned(self) -> set:
        names = set()
        for stmt in self.body:
            for sub in walk_no_scopes(stmt):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(sub.name)
        return names

    @cached_property
    def carried(self) -> set:
        """Names whose value from the previous iteration is read (recurrences, accumulators),
        also through a tensor or list the body changes in place and reads (`hs[t + 1] =
        f(hs[t] @ W)`, `h.copy_(f(h @ W))`, `outs.append(outs[-1] @ W)`, `W.data += ...`)."""
        if self.is_comprehension:
            return set()
        order = _Order()
        for stmt in self.node.body:
            order.visit(stmt)
        written, carried = set(), set()
        # `self.h = f(x[t] @ W + self.h @ U)`: an attribute rebound in the body, read before
        assigned = self.assigned | {name for kind, name in order.events if kind == "write" and "." in name}
        for kind, name in order.events:
            if kind == "write":
                written.add(name)
            elif name in assigned and name not in written and name not in self.targets:
                carried.add(name)
        return carried | self._read_after_change_in_place()

    @cached_property
    def _changes_in_place(self):
        """(names and attribute paths the body changes in place, ids of the nodes that spell
        those changes): a store into `buf[t + 1]` or `self.traj[t + 1]`, `self.w += ...`,
        `W.data = ...`, `buf[t + 1].copy_(...)`, `out=buf[t + 1]`, `self.W.data.add_(...)`. A
        changed attribute path comes with the attributes holding it (`self.proj` for
        `self.proj.weight`): calling `self.proj(x)` reads it."""
        changed, spine, grown, rewritten = set(), [], set(), set()
        qualname = self.ctx.qualname
        for sub in self._body_nodes:
            cls = sub.__class__
            if cls is ast.Subscript and sub.ctx.__class__ is ast.Store:
                target = sub
            elif cls is ast.AugAssign and sub.target.__class__ is ast.Attribute:
                target = sub.target  # `self.w += ...`
            elif cls is ast.Attribute and sub.ctx.__class__ is ast.Store and sub.attr == "data":
                target = sub  # `W.data = ...`
            elif cls is ast.Call:
                for keyword in sub.keywords:
                    if keyword.arg == "out":  # `torch.matmul(a, b, out=buf[t + 1])`
                        path = _changed_tensor(keyword.value, spine)
                        if path is not None:
                            changed.update(_path_prefixes(path))
                func = sub.func
                if func.__class__ is not ast.Attribute or not _changes_in_place(func.attr):
                    continue
                if qualname(func) is not None:  # `torch.relu_(x)`, `nn.init.zeros_(w)`: changes its argument
                    if not sub.args:
                        continue
                    target = sub.args[0]
                else:
                    target = func.value
            else:
                continue
            path = _changed_tensor(target, spine)
            if path is not None:
                changed.update(_path_prefixes(path))
                growth = cls is ast.Call and qualname(sub.func) is None and sub.func.attr in _CONTAINER_GROWTH
                (grown if growth else rewritten).add(path)
        return changed, {id(n) for n in spine}, grown - rewritten

    @cached_property
    def _body_nodes(self) -> list:
        return [sub for stmt in self.body for sub in walk_no_scopes(stmt)]

    def _read_after_change_in_place(self) -> set:
        """The names and attribute paths of `_changes_in_place` that the body also reads: the
        read sees what an earlier iteration wrote."""
        changed, not_reads, _ = self._changes_in_place
        if not changed:
            return set()
        found = set()
        for sub in self._body_nodes:
            cls = sub.__class__
            if cls is ast.Name:
                if sub.id in changed and sub.ctx.__class__ is ast.Load and id(sub) not in not_reads:
                    found.add(sub.id)
            elif cls is ast.Attribute and sub.ctx.__class__ is ast.Load and id(sub) not in not_reads:
                path = dotted(sub)
                if path in changed:
                    found.add(path)
        return found

    @cached_property
    def _changed_paths(self) -> set:
        """Names and attribute paths whose value the body changes: in place, or attributes it
        rebinds (`self.W = ...`, with the attributes holding them)."""
        paths = set(self._changes_in_place[0])
        for sub in self._body_nodes:
            if sub.__class__ is ast.Attribute and sub.ctx.__class__ is not ast.Load:
                path = dotted(sub)
                if path is not None:
                    paths.update(_path_prefixes(path))
        return paths

    def changes(self, expr: ast.AST) -> bool:
        """`expr` reads something the body assigns, rebinds or changes in place: its value may
        differ from one iteration to the next (`W` after `W = next(ws)`, `self.W` after
        `self.W = ...` or `self.W.data.mul_(...)`), also through another name for the same memory
        (`x` after `out = x` when the body writes `out[t + 1]`, `self.fc` when it runs
        `p.mul_(...)` for `p` in `self.fc.parameters()`)."""
        names = loaded_names(expr)
        if names & self.assigned:
            return True
        changed = self._changed_paths
        if not changed:
            return False
        read = names | _attribute_paths(expr)
        if read & changed:
            return True
        changed_roots = self._changed_alias_roots
        if not changed_roots:
            return False
        roots = self._alias_roots
        return any(roots.get(path) in changed_roots for path in read)

    @cached_property
    def _alias_roots(self) -> dict:
        scope = code_scope(self.ctx)
        return view_alias_roots(self.ctx, scope, self.node) if scope is not None else {}

    @cached_property
    def _changed_alias_roots(self) -> set:
        """The alias representatives of the names and paths the body changes in place. A list
        the body only grows (`preds.append(p)`) changes none of the items it held: a name bound
        to one of them (`ins = preds[t - 1]`) shares nothing the growth changes."""
        roots = self._alias_roots
        changed, _, grown = self._changes_in_place
        return {roots[path] for path in changed - grown if path in roots}

    @cached_property
    def _assignments(self) -> list:
        """(names bound, names read, value) for each binding in the body."""
        assignments = []
        for stmt in self.body:
            for sub in walk_no_scopes(stmt):
                if isinstance(sub, ast.Assign):
                    targets = set().union(*(bound_names(t) for t in sub.targets))
                    assignments.append((targets, loaded_names(sub.value), sub.value))
                elif isinstance(sub, (ast.AugAssign, ast.AnnAssign)) and sub.value is not None:
                    assignments.append((bound_names(sub.target), loaded_names(sub.value), sub.value))
                elif isinstance(sub, (ast.For, ast.AsyncFor)):
                    assignments.append((bound_names(sub.target), loaded_names(sub.iter), sub.iter))
                elif isinstance(sub, ast.NamedExpr):
                    assignments.append((bound_names(sub.target), loaded_names(sub.value), sub.value))
        return assignments

    def assigned_from(self, seeds: set) -> set:
        """`seeds`, and every name the body assigns from one of them (or from an attribute path
        among them, `cur = self.traj[t]`), transitively."""
        deps = set(seeds)
        paths = {name for name in seeds if "." in name}
        changed = True
        while changed:
            changed = False
            for targets, reads, value in self._assignments:
                if targets <= deps:
                    continue
                if reads & deps or (paths and _attribute_paths(value) & paths):
                    deps |= targets
                    changed = True
        return deps

    @cached_property
    def derived(self) -> set:
        """Names assigned in the body from values that depend on the loop variable."""
        return self.assigned_from(self.targets) - set(self.targets)

    @cached_property
    def carried_all(self) -> set:
        """`carried`, and the names the body assigns from them: `cur` in `cur = buf[t]` when the
        body also writes `buf[t + 1]` reads the previous step as surely as `buf[t]` does."""
        carried = self.carried
        return self.assigned_from(carried) if carried else carried

    def depends_on_iteration(self, expr: ast.AST) -> bool:
        names = loaded_names(expr)
        return bool(names & (self.targets | self.derived))

    def reads_carried(self, expr: ast.AST) -> bool:
        carried = self.carried_all
        if not carried:
            return False
        if loaded_names(expr) & carried and self._reads_previous_pass(expr, carried, set()):
            return True
        return self._carries_attributes and bool(_attribute_paths(expr) & carried)

    def _reads_previous_pass(self, expr: ast.AST, carried: set, seen: set) -> bool:
        """Some name of `carried` that `expr` reads may hold a value of an earlier pass. A read
        that only assignments earlier in the same pass reach reads that pass's value, and holds
        the previous pass only if such an assignment's value does (`ynext = y[:, t]` before
        `embed(ynext)` in a loop that ends with `ynext = sample(mu)`). Where a value is placed
        (`x.device`, `x.dtype`) is no value of the pass that made it: `t = torch.ones(n).to(x.device)`
        before `x = xs[-1]` reads nothing of the previous pass."""
        placement = {id(node.value) for node in walk_no_scopes(expr)
                     if node.__class__ is ast.Attribute and node.attr in _PLACEMENT_ATTRIBUTES}
        for load in walk_no_scopes(expr):
            if load.__class__ is not ast.Name or load.id not in carried or load.ctx.__class__ is not ast.Load \
                    or id(load) in placement:
                continue
            stores = self.assigned_this_pass(load)
            if stores is None or any(store in seen for store in stores):
                return True
            seen.update(stores)
            if any(self._reads_previous_pass(store.value, carried, seen) for store in stores):
                return True
        return False

    def assigned_this_pass(self, load: ast.Name) -> Optional[list]:
        """The `name = value` statements that `load`, a read in this loop's body, may read, when
        all of them are in the body before it: the value read is this pass's. None when a value
        from before the loop or from an earlier pass may reach it."""
        function = self.ctx.function if self.ctx.function is not None else self.ctx.tree
        flow = flow_of(self.ctx, function)
        if self.node not in flow.loops_around(load):
            return None  # not a read this function's flow sees inside the loop
        stores = []
        for store, simple in flow.reaching_all(load):
            if not simple or not _in_loop_body(store, self.node) or _end(store) > _pos(load):
                return None
            stores.append(store)
        return stores or None

    @cached_property
    def _carries_attributes(self) -> bool:
        return any("." in name for name in self.carried)

    def direct_nodes(self):
        """Nodes of the body that run once per iteration of this loop (not of a nested loop)."""
        return walk_direct(self.body)


# -- training and evaluation step loops ------------------------------------------------

def identifier(expr: ast.AST):
    """The last name in `a.b.c` (or `a`), else None."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def is_backward(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"


def is_optimizer_step(node: ast.AST, optimizers: frozenset = frozenset()) -> bool:
    """`opt.step()`, `optimizer.step()`, `self.optim.step()`, `optD.step()`, `scaler.step(opt)`,
    `self.critic_optimizer[agent].step()` (one optimizer of a list); not `optimal_x.step()` or
    `self.options.step()`. `optimizers`: names the file binds to an optimizer whatever they say
    (`optimizer_names`: `self.trainer.step()` after `self.trainer = T.optim.Adam(...)`)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"):
        return False
    owner = node.func.value
    while isinstance(owner, ast.Subscript):
        owner = owner.value
    return any(token in _OPTIMIZER_TOKENS or token.endswith(_OPTIMIZER_SUFFIXES)
               for token in name_tokens(identifier(owner))) or bool(optimizers) and dotted(owner) in optimizers


def optimizer_names(ctx) -> frozenset:
    """The names and `self.<attr>`s that the file binds to a `torch.optim` optimizer it makes
    (`self.trainer = T.optim.Adam(params, lr=lr)`, `G_solver = optim.Adam(...)`), read once per file."""
    found = ctx.shared.get("optimizer_names")
    if found is None:
        names = set()
        if may_mention(ctx, "optim"):
            for node in walk(ctx.tree):
                if node.__class__ is ast.Assign and node.value.__class__ is ast.Call and len(node.targets) == 1:
                    qual = ctx.qualname(node.value.func) or ""
                    module, _, name = qual.rpartition(".")
                    if module in ("torch.optim", "torch.optim.sgd", "torch.optim.adam", "torch.optim.adamw") \
                            and name[:1].isupper():
                        target = dotted(node.targets[0])
                        if target:
                            names.add(target)
        found = ctx.shared["optimizer_names"] = frozenset(names)
    return found


def is_training_loop(ctx, loop: LoopInfo) -> bool:
    """The loop body itself (not a nested loop) calls `.backward()` or an optimizer's `.step()`."""
    key = ("training_loop", id(loop.node))
    if key not in ctx.shared:
        optimizers = optimizer_names(ctx)
        ctx.shared[key] = may_train(ctx) and any(is_backward(n) or is_optimizer_step(n, optimizers)
                                                 for n in loop.direct_nodes())
    return ctx.shared[key]


def updates_weights(ctx, loop: LoopInfo) -> bool:
    """`is_training_loop`, or the body calls a helper that may run the backward pass and the
    step (`train_step(loss, opt)`, `self.update(loss=...)`, `self.optimize_model()`): the weights
    may change between iterations."""
    if is_training_loop(ctx, loop):
        return True
    key = ("updates_weights", id(loop.node))
    found = ctx.shared.get(key)
    if found is None:
        found = False
        discarded = set()  # calls made for their effect: `self.fit(x, y)`, not `model = fit(sample)`
        for node in loop.direct_nodes():
            cls = node.__class__
            if cls is ast.Expr and node.value.__class__ is ast.Call:
                discarded.add(id(node.value))
            elif cls is ast.Call and may_run_training_step(node, id(node) in discarded):
                found = True
                break
        ctx.shared[key] = found
    return found


_NAME_TOKEN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_tokens(name: Optional[str]) -> list:
    """The lower-case words of an identifier, split at `_`, case changes and digits:
    `optimizerG` -> optimizer, g; `train_step` -> train, step; `optimal_k` -> optimal, k."""
    return [token.lower() for token in _NAME_TOKEN.findall(name or "")]


# Whole tokens: `opt`, `optim`, `g_optimizer`, `optD`, not `optimal_k`, `opts` (options) or a
# `scaler` (sklearn's as often as a GradScaler, and a GradScaler comes with its optimizer).
_OPTIMIZER_TOKENS = frozenset({"opt", "optim", "optims", "optimizer", "optimizers", "optimiser", "optimisers"})
# One-word names of an optimizer or of the GradScaler that steps it: `doptimizer`, `gradscaler`, `scaler`.
_OPTIMIZER_SUFFIXES = ("optim", "optimizer", "optimiser", "scaler")
# What a loss is held in, not the loss: `loss_fn`, `loss_weight`, `val_loss`, `loss_history`.
_NOT_A_LOSS = frozenset({"fn", "fns", "func", "function", "functions", "criterion", "module", "weight", "weights",
                         "scale", "coef", "coeff", "type", "name", "names", "cfg", "config", "args", "kwargs", "dict",
                         "list", "history", "hist", "log", "logs", "meter", "value", "values", "val", "valid", "eval",
                         "test", "str"})
# What a step changes, handed with a loss: `backprop(loss, model)`, `apply_grads(loss, net.parameters())`.
_STEPPABLE = _OPTIMIZER_TOKENS | frozenset({
    "model", "models", "net", "nets", "network", "networks", "module", "policy", "agent", "actor", "critic",
    "learner", "params", "parameters", "weights", "generator", "discriminator"})
# What `step`, `update` and `optimize` act on when they name a training step: `sgd_step`,
# `optimizer_step`, `update_params`, `update_target_network`, `optimize_parameters`; not
# `time_step`, `decode_step`, `update_state`, `update_step_size`, `optimize_acqf`.
_STEP_VERBS = frozenset({"step", "update", "optimize", "optimise"})
_STEP_OBJECTS = _OPTIMIZER_TOKENS | frozenset({
    "model", "models", "net", "network", "networks", "policy", "actor", "critic", "params", "parameters", "param",
    "parameter", "weights", "weight", "sgd", "adam", "grad", "grads", "gradient", "gradients", "update"})
_TRAINERS = frozenset({"trainer", "learner", "engine", "agent", "solver", "updater"})
# A bool handed to `.train(...)`: `model.train(mode)`, `module.train(self.training)`.
_MODE_FLAGS = frozenset({"mode", "training", "train", "flag", "enabled", "enable", "eval"})
# Callees and receivers that step nothing: builtins (`float(loss)`, `print(loss)`), logging,
# metrics, bookkeeping (`losses.append(loss)`), evaluation, inference, callbacks, getters.
_BUILTINS = frozenset(dir(builtins))
_STEPS_NOTHING = frozenset({
    "log", "logs", "logger", "logging", "metric", "metrics", "meter", "meters", "tracker", "track", "record",
    "history", "stats", "stat", "summary", "writer", "wandb", "tb", "tensorboard", "pbar", "tqdm", "progress",
    "print", "info", "debug", "warn", "warning", "write", "report", "plot", "show", "display", "save", "dump",
    "append", "extend", "insert", "add", "item", "items", "tolist", "numpy", "cpu", "detach", "format", "to",
    "eval", "evaluate", "val", "valid", "validate", "validation", "test", "predict", "inference", "infer",
    "decode", "generate", "generation", "compile", "export", "mode", "register", "on", "callback", "callbacks",
    "is", "get", "has", "should", "can", "num"})


def _argument_names(call: ast.Call) -> list:
    """The identifiers a call is handed: `opt`, `self.optimizer`, keyword names (`loss=...`), and
    `model` for `model.parameters()`."""
    names = [k.arg for k in call.keywords if k.arg]
    for arg in call.args + [k.value for k in call.keywords]:
        if arg.__class__ is ast.Starred:
            arg = arg.value
        name = identifier(arg)
        if (name is None and arg.__class__ is ast.Call and arg.func.__class__ is ast.Attribute
                and arg.func.attr in ("parameters", "named_parameters")):
            name = identifier(arg.func.value)
        if name:
            names.append(name)
    return names


def _is_loss(tokens: list) -> bool:
    return any(token in ("loss", "losses") for token in tokens) and not _NOT_A_LOSS.intersection(tokens)


def _mode_switch(call: ast.Call) -> bool:
    """`model.train()`, `self.train(False)`, `module.train(mode)`: not a training run."""
    if call.func.__class__ is not ast.Attribute or call.keywords or len(call.args) > 1:
        return False
    if not call.args:
        return True
    arg = call.args[0]
    if arg.__class__ in (ast.Constant, ast.UnaryOp, ast.BoolOp, ast.Compare):
        return True
    return bool(_MODE_FLAGS.intersection(name_tokens(identifier(arg) or "")))


def may_run_training_step(call: ast.Call, discarded: bool) -> bool:
    """A call that can plausibly run a training step: it is handed an optimizer (`train_step(loss,
    opt)`, `trainer.run(batch, optimizer)`), or a loss together with what a step changes
    (`backprop(loss, model)`), or its name says it trains (`self.training_step(batch)`,
    `sgd_step(...)`, `update(loss=...)`, `self.fit(x, y)` for its effect). Builtins, logging,
    metrics and bookkeeping never count. `discarded`: the call is a statement of its own."""
    func = call.func
    callee = identifier(func)
    if callee is None or (func.__class__ is ast.Name and callee in _BUILTINS):
        return False
    tokens = name_tokens(callee)
    if not tokens or _STEPS_NOTHING.intersection(tokens):
        return False
    receiver = name_tokens(identifier(func.value) or "") if func.__class__ is ast.Attribute else []
    if _STEPS_NOTHING.intersection(receiver):
        return False  # `loss_meter.update(loss)`, `self.logger.step(loss)`
    handed = [name_tokens(name) for name in _argument_names(call)]
    if any(_OPTIMIZER_TOKENS.intersection(names) for names in handed):
        return True
    has_loss = any(_is_loss(names) for names in handed)
    steppable = any(_STEPPABLE.intersection(names) for names in handed if not _is_loss(names))  # not `policy_loss`
    if has_loss and (steppable or _OPTIMIZER_TOKENS.intersection(tokens + receiver)):
        return True  # `backprop(loss, model)`, `self._optimizer_hook(losses)`, `optim_wrapper.run(loss)`
    own = func.__class__ is ast.Name or receiver == ["self"]
    trainer = bool(_TRAINERS.intersection(receiver))
    first, last = tokens[0], tokens[-1]
    if first in ("train", "training", "learn"):  # `train_step`, `self._training_step`; not `_transpose_if_training`
        return not (tokens == ["train"] and _mode_switch(call))
    if "backward" in tokens or "backprop" in tokens:
        # `self.manual_backward(loss)`, `backward_chunk(1)`; not `grad = _linear_backward(g, w)`
        return discarded or has_loss or steppable
    if first == "fit" and tokens[1:2] != ["to"]:
        # `self.fit(x, y)`, `trainer.fit(model)`, `self.fit_batch(b)`; not `scaler.fit(x)` or
        # `model = fit(sample)` (a RANSAC fit)
        return ((own or trainer or bool(_STEPPABLE.intersection(receiver)))
                and (discarded or len(tokens) > 1 or has_loss or steppable))
    if len(tokens) == 1:
        # `update(loss=...)`, `self.update(loss)`, `trainer.step(batch)`; not `self.step(x, h)`,
        # `results.update(loss=...)` or `env.step(action)`
        return first in _STEP_VERBS and (has_loss and own or trainer)
    if last in _STEP_VERBS and tokens[-2] in _STEP_OBJECTS:
        return True  # `sgd_step`, `optimizer_step`, `polyak_parameter_update`
    return last in _STEP_OBJECTS and bool(_STEP_VERBS.intersection(tokens[:-1]))  # `update_params`


def may_train(ctx) -> bool:
    """False only when the function the walker is in (or the module, outside functions) cannot
    call `.backward()` or `.step()`: attribute names, so its text (NFKC) would spell them."""
    text = function_text(ctx, ctx.function) if ctx.function is not None else identifier_text(ctx)
    return "backward" in text or "step" in text


def file_trains(ctx) -> bool:
    """The file calls both `.backward()` and an optimizer's `.step()`: a training script, not a
    library of models or an inference pipeline."""
    found = ctx.shared.get("file_trains")
    if found is None:
        found = False
        if may_mention(ctx, "backward") and may_mention(ctx, "step"):
            nodes = [n for n in walk(ctx.tree) if n.__class__ is ast.Call]
            optimizers = optimizer_names(ctx)
            found = any(is_backward(n) for n in nodes) and any(is_optimizer_step(n, optimizers) for n in nodes)
        ctx.shared["file_trains"] = found
    return found
