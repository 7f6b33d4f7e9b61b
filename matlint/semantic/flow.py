"""Straight-line def-use within one function: which assignment a name reads, and where the value
an assignment stores is read. Source order stands in for control flow (good enough for the
straight-line code of a `forward`), with two corrections: a store later in a loop around the read
reaches it on the next pass, and a store in the header of a statement around the read (a `for`
target, `with ... as`, a `:=` in a test) comes before it. A name stored any other way than
`name = value` breaks the chain, and callers stay quiet on a broken chain."""
from __future__ import annotations

import ast
from typing import Optional

from .lazy import BuiltOnFirstUse
from .tree import _SCOPE_TYPES, block_fields, child_nodes, function_text, identifier_text, walk_no_scopes

_LOOPS_AND_COMPREHENSIONS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)

_JUMPS = (ast.Break, ast.Continue, ast.Return, ast.Raise)  # statements that leave a block


def _pos(node: ast.AST) -> tuple:
    return (node.lineno, node.col_offset)


def _end(node: ast.AST) -> tuple:
    return (node.end_lineno, node.end_col_offset)


# Methods that change a list, dict or set in place (not `add` or `sort`: a tensor's make a new one).
CONTAINER_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
                                 "popitem", "discard", "reverse"})

class FunctionFlow(BuiltOnFirstUse):
    """Parents, stores and loads of plain names in one function, collected once, on first use."""

    _BUILT = frozenset({"parent", "block", "stores", "loads", "mutations", "branch_stores"})

    def __init__(self, function: ast.AST):
        self.function = function

    def _build(self) -> None:
        function = self.function
        self.parent: dict = {}
        self.block: dict = {}    # statement -> (id of its statement list, index in it)
        self.stores: dict = {}   # name -> [(storing statement, it is a plain `name = value`)]
        self.loads: dict = {}    # name -> [Name node]
        self.mutations: dict = {}  # name -> [statement changing it in place: `x.add_(1)`, `x[i] = 0`]
        self.branch_stores: dict = {}  # name -> [`if` storing it on both branches], filled on first ask
        body = function.body if isinstance(function.body, list) else [function.body]
        self._index_block(body)
        parent = self.parent
        for stmt in body:
            parent[stmt] = function
            stack = [stmt]  # `walk_no_scopes(stmt)`'s order, reading each node's children once
            while stack:
                node = stack.pop()
                children = child_nodes(node)
                for child in children:
                    parent[child] = node
                for field in block_fields(node.__class__):
                    block = getattr(node, field)
                    if isinstance(block, list):
                        self._index_block(block)
                stack.extend([child for child in children if child.__class__ not in _SCOPE_TYPES])
        args = getattr(function, "args", None)  # none for the module
        for arg in (args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]) if args else ():
            if arg is not None:
                self.stores.setdefault(arg.arg, []).append((None, False))
        for node in list(self.parent):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    self.loads.setdefault(node.id, []).append(node)
                    if self._mutated(node):
                        self.mutations.setdefault(node.id, []).append(self.statement(node))
                else:
                    stmt = self.statement(node)
                    simple = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is node
                    self.stores.setdefault(node.id, []).append((stmt, simple))

    def _mutated(self, load: ast.Name) -> bool:
        """`load` is changed in place where it stands: `x.masked_fill_(...)`, `x[i] = v`, `del x[i]`,
        `res.append(v)` (a list's, dict's or set's own mutators),
        also through an item (`x[i][j] = v`: basic indexing gives a view, or the nested list)."""
        up = self.parent.get(load)
        if isinstance(up, ast.Subscript):
            node = load
            while isinstance(up, ast.Subscript) and up.value is node and isinstance(up.ctx, ast.Load):
                node, up = up, self.parent.get(up)
            return isinstance(up, ast.Subscript) and up.value is node and not isinstance(up.ctx, ast.Load)
        if isinstance(up, ast.Attribute) and up.value is load:
            attr = up.attr
            call = self.parent.get(up)
            return ((attr.endswith("_") and not attr.startswith("_") or attr in CONTAINER_MUTATORS)
                    and isinstance(call, ast.Call) and call.func is up)
        return False

    def _index_block(self, block: list) -> None:
        for i, stmt in enumerate(block):
            if isinstance(stmt, ast.stmt):
                self.block[stmt] = (id(block), i)

    def statement(self, node: ast.AST) -> Optional[ast.stmt]:
        """The innermost statement holding `node`."""
        while node is not None and not isinstance(node, ast.stmt):
            node = self.parent.get(node)
        return node

    def enclosing(self, node: ast.AST):
        """Ancestors of `node`, innermost first."""
        node = self.parent.get(node)
        while node is not None:
            yield node
            node = self.parent.get(node)

    def loops_around(self, node: ast.AST) -> list:
        """The loops and comprehensions `node` is in, innermost first."""
        return [n for n in self.enclosing(node) if isinstance(n, _LOOPS_AND_COMPREHENSIONS)]

    def _dominates(self, stmt: ast.stmt, load: ast.Name) -> bool:
        """`stmt` runs on every path to `load` (it sits earlier in a block that holds the load)."""
        block, index = self.block.get(stmt, (None, -1))
        for ancestor in self.enclosing(load):
            place = self.block.get(ancestor)
            if place is not None and place[0] == block and place[1] > index:
                return True
        return False

    def _follows(self, store: Optional[ast.stmt], other: ast.stmt) -> bool:
        """`other` comes after `store` in the same block with no jump between them: every path
        from `store` runs it (`seq = np.linspace(...)`, then `seq = [int(s) for s in seq]` in one
        branch)."""
        if store is None:
            return False
        first, second = self.block.get(store), self.block.get(other)
        if first is None or second is None or first[0] != second[0] or second[1] <= first[1]:
            return False
        parent = self.parent.get(store)
        block = next((getattr(parent, field) for field in ("body", "orelse", "finalbody")
                      if id(getattr(parent, field, None)) == first[0]), None)
        return block is not None and not any(isinstance(node, _JUMPS) for stmt in block[first[1] + 1:second[1]]
                                             for node in ast.walk(stmt))

    def _reaches(self, store: Optional[ast.stmt], load: ast.AST, name: Optional[str] = None) -> bool:
        """`store` of `name` (the load's own name when None) may hold the value read at `load`."""
        name = name or load.id
        if store is not None and _end(store) > _pos(load):
            return self._encloses(store, load) or self._carried(store, load, name)
        if store is not None and self.in_exclusive_arms(store, load):
            return False
        for other, _ in self.stores.get(name, ()):
            if other is store or other is None:
                continue
            if self._encloses(other, load):
                if store is None or _end(store) <= _pos(other):
                    return False  # `for x in xs:` binds x before every pass reads it
                continue
            later = store is None or _stored_at(other) > _stored_at(store)
            if later and _end(other) <= _pos(load) and (self._dominates(other, load) or self._follows(store, other)):
                return False
        for branches in self._storing_branches(name):
            if (store is None or _pos(branches) > _end(store)) and _end(branches) <= _pos(load) \
                    and self._dominates(branches, load):
                return False
        return True

    def in_exclusive_arms(self, a: ast.AST, b: ast.AST) -> bool:
        """`a` and `b` sit in the two arms of one `if` that no loop of the function runs again:
        when one runs, the other does not, before or after."""
        for ancestor in self.enclosing(b):
            if isinstance(ancestor, _LOOPS_AND_COMPREHENSIONS):
                return False
            if isinstance(ancestor, ast.If) and ancestor.orelse:
                arms = (ancestor.body, ancestor.orelse)
                side_b = [i for i, arm in enumerate(arms) if _pos(arm[0]) <= _pos(b) and _end(b) <= _end(arm[-1])]
                side_a = [i for i, arm in enumerate(arms) if _pos(arm[0]) <= _pos(a) and _end(a) <= _end(arm[-1])]
                if side_a and side_b and side_a != side_b:
                    return not any(isinstance(n, _LOOPS_AND_COMPREHENSIONS) for n in self.enclosing(ancestor))
        return False

    def _storing_branches(self, name: str) -> list:
        """The `if` statements that store `name` on both branches (`if c: x = a` / `else: x =
        b`): like one store, they hide the stores before them from the reads after them."""
        found = self.branch_stores.get(name)
        if found is None:
            found = []
            parent = self.parent
            for stmt, _ in self.stores.get(name, ()):
                # only `if` statements straight around the store can store on every path
                ancestor = parent.get(stmt) if stmt is not None else None
                while isinstance(ancestor, ast.If):
                    if ancestor not in found and _stores_on_every_path(
                            ancestor.body, name) and _stores_on_every_path(ancestor.orelse, name):
                        found.append(ancestor)
                    ancestor = parent.get(ancestor)
            self.branch_stores[name] = found
        return found

    def _encloses(self, stmt: ast.stmt, load: ast.Name) -> bool:
        """`stmt` holds `load` in its body and stores the name in its header (a `for` target,
        `with ... as`, `:=` in a test), which runs first."""
        if not isinstance(stmt, _HEADER_STORES) or not any(a is stmt for a in self.enclosing(load)):
            return False
        # `for x in f(x):` reads the `x` from before the loop in its iterable
        return not (isinstance(stmt, (ast.For, ast.AsyncFor)) and _pos(stmt.iter) <= _pos(load) <= _end(stmt.iter))

    def _carried(self, store: ast.stmt, load: ast.AST, name: str) -> bool:
        """`store`, after `load` in the source, runs in a loop around `load`, so its value reaches
        `load` on the next pass, unless every pass stores the name again before the read."""
        for loop in self.enclosing(load):
            if not isinstance(loop, _LOOPS) or not _in_loop_body(load, loop):
                continue
            if not _in_loop_body(store, loop):
                continue  # an outer loop may still hold both
            if isinstance(loop, (ast.For, ast.AsyncFor)) and name in _stored_names_of(loop.target):
                return False
            return not any(
                other is not None and other is not store and _in_loop_body(other, loop)
                and _end(other) <= _pos(load) and self._dominates(other, load)
                for other, _ in self.stores.get(name, ())) and not any(
                _in_loop_body(branches, loop) and _end(branches) <= _pos(load) and self._dominates(branches, load)
                for branches in self._storing_branches(name))
        return False

    def reaching_all(self, load: ast.Name) -> list:
        """Every (statement, is a plain `name = value`) whose stored value `load` may read; the
        statement is None for a parameter."""
        return [(stmt, simple) for stmt, simple in self.stores.get(load.id, ()) if self._reaches(stmt, load)]

    def reaching_all_at(self, name: str, node: ast.AST) -> list:
        """`reaching_all` for a read of `name` where `node` stands (a comprehension of this
        function, whose body reads the function's names where the comprehension runs)."""
        return [(stmt, simple) for stmt, simple in self.stores.get(name, ()) if self._reaches(stmt, node, name)]

    def reaching(self, load: ast.Name) -> Optional[ast.Assign]:
        """The one `name = value` statement whose value `load` reads, or None when several may
        reach it or the name was stored some other way (a parameter, a loop target, unpacking)."""
        reaching = self.reaching_all(load)
        if len(reaching) == 1 and reaching[0][1]:
            return reaching[0][0]
        return None

    def optional_update(self, load: ast.Name, besides: tuple = ()):
        """(update, before) when `load` reads either `before` or `update`, a conditional
        `name = f(name)` that reads `before` (`if mask is not None: x = x + mask`); else None.
        `besides`: other loads of the name that the caller accounts for (`return out, x`)."""
        reaching = self.reaching_all(load)
        if len(reaching) != 2 or not all(simple for _, simple in reaching):
            return None
        for (update, _), (before, _) in (reaching, reaching[::-1]):
            inner = [n for n in walk_no_scopes(update.value) if isinstance(n, ast.Name) and n.id == load.id]
            if (len(inner) == 1 and self.reaching(inner[0]) is before
                    and [u for u in self.uses(update) if u not in besides] == [load]
                    and sorted(id(u) for u in self.uses(before) if u not in besides) == sorted([id(inner[0]), id(load)])):
                return update, before
        return None

    def uses(self, assign: ast.Assign) -> list:
        """Every load that may read the value `assign` stores."""
        return self.reads(assign, assign.targets[0].id)

    def reads(self, store: ast.stmt, name: str) -> list:
        """Every load of `name` that may read the value `store` binds to it."""
        return [load for load in self.loads.get(name, ()) if self._reaches(store, load)]

    def reaches(self, store: ast.stmt, load: ast.Name) -> bool:
        """Whether `load` may read the value `store` binds to its name."""
        return self._reaches(store, load)

    def stored_between(self, name: str, start: ast.AST, stop: ast.AST) -> bool:
        """Whether `name` is stored after `start` ends and before `stop` begins."""
        return any(stmt is not None and _end(start) < _end(stmt) <= _pos(stop)
                   for stmt, _ in self.stores.get(name, ()))

    def changed_between(self, name: str, start: ast.AST, stop: ast.AST) -> bool:
        """Whether `name` is stored, or changed in place, after `start` ends and before `stop` begins."""
        return self.stored_between(name, start, stop) or any(
            _end(start) < _end(stmt) <= _pos(stop) for stmt in self.mutations.get(name, ()))

    def same_block(self, a: ast.stmt, b: ast.stmt) -> bool:
        """Both statements are in the same statement list (so both run, in order)."""
        return a in self.block and b in self.block and self.block[a][0] == self.block[b][0]


_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_HEADER_STORES = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith)


def _stored_at(stmt: ast.stmt) -> tuple:
    """Where `stmt` has stored its names: a statement that stores in its header (a `for` target,
    `with ... as`, a `:=` in a test) has stored them before its body runs, so a store in the body
    comes after."""
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return _end(stmt.iter)
    if isinstance(stmt, (ast.While, ast.If)):
        return _end(stmt.test)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return _end(stmt.items[-1].optional_vars or stmt.items[-1].context_expr)
    return _end(stmt)


def _stores_on_every_path(block: list, name: str) -> bool:
    """Every run of `block` stores `name`: an assignment to it (alone or unpacked) among its
    statements, or an `if` that does on both branches."""
    for stmt in block:
        if isinstance(stmt, ast.Assign) and any(name in _stored_names_of(t) for t in stmt.targets):
            return True
        if isinstance(stmt, ast.If) and _stores_on_every_path(stmt.body, name) and _stores_on_every_path(
                stmt.orelse, name):
            return True
    return False


def _in_loop_body(node: ast.AST, loop: ast.AST) -> bool:
    """`node` lies in what runs on every pass of `loop`: its body, and a `while` loop's test."""
    first = loop.test if isinstance(loop, ast.While) else loop.body[0]
    return _pos(first) <= _pos(node) and _end(node) <= _end(loop.body[-1])


def _stored_names_of(target: ast.AST) -> set:
    return {n.id for n in walk_no_scopes(target) if isinstance(n, ast.Name)}


def flow_of(ctx, function: ast.AST) -> FunctionFlow:
    key = ("flow", id(function))
    flow = ctx.shared.get(key)
    if flow is None:
        flow = ctx.shared[key] = FunctionFlow(function)
    return flow


def nearby_comments(ctx, node: ast.AST, statement: ast.stmt, continues=None) -> list:
    """The comments that can explain `node`: those on its own lines, and the run of comment lines
    just above its `statement` (a blank line, or code that `continues` does not accept, ends the
    run). A comment on another line of a multi-line statement belongs to that line."""
    lines = ctx.lines
    comments = [line[line.find("#"):] for line in lines[node.lineno - 1:node.end_lineno] if "#" in line]
    row = statement.lineno - 2
    while row >= 0:
        text = lines[row].strip()
        if text.startswith("#"):
            comments.append(text)
        elif not text or continues is None or not continues(text):
            break
        row -= 1
    return comments


def _whole_word_ends(text: str, word: str):
    """The end offsets of `word` where it stands in `text` as a whole identifier (a maximal run of word characters)."""
    size = len(text)
    at = text.find(word)
    while at >= 0:
        end = at + len(word)
        if not (at and (text[at - 1].isalnum() or text[at - 1] == "_")) and not (
                end < size and (text[end].isalnum() or text[end] == "_")):
            yield end
        at = text.find(word, at + 1)


def has_word(text: str, word: str) -> bool:
    """Whether identifier `word` stands in `text` (str.find per word: listing every word of the
    text with a regex cost more)."""
    return next(_whole_word_ends(text, word), None) is not None


def _named_other_than_by_call(text: str, name: str) -> bool:
    """Whether identifier `name` stands somewhere in `text` without a call right after it (str.find:
    a regex searched over every file's whole text cost more than the analyses it saved)."""
    size = len(text)
    for end in _whole_word_ends(text, name):
        while end < size and text[end].isspace():
            end += 1
        if end == size or text[end] != "(":
            return True
    return False


def function_may_mention(ctx, function: ast.AST, names: tuple) -> bool:
    """False only when no code of `function` can call a function named one of `names` (`exp`,
    `sqrt`): none is in its text (a substring will do: `rsqrt` holds `sqrt`), and the file never
    names one other than by calling it; `from torch import exp as e` or `e = torch.exp` lets the
    function call it without spelling it. Rules ask once per binary operation: the answer is kept
    per function."""
    key = ("function_may_mention", id(function), names)
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _function_may_mention(ctx, function, names)
    return found


def _function_may_mention(ctx, function: ast.AST, names: tuple) -> bool:
    text = function_text(ctx, function)
    if any(name in text for name in names):
        return True
    for name in names:  # per name: MAT603 and MAT604 ask about overlapping sets (sqrt, rsqrt)
        key = ("named_other_than_by_call", name)
        named = ctx.shared.get(key)
        if named is None:
            named = ctx.shared[key] = _named_other_than_by_call(identifier_text(ctx), name)
        if named:
            return True
    return False
