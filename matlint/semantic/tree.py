"""`ast.iter_child_nodes` and `ast.walk` for the analyses, faster, and without the expression
contexts and operators (`Load`, `Store`, `Add`, `Eq`...): shared singletons that no analysis
looks for as nodes (a rule reads them through `.ctx` / `.op`), a third of a tree's nodes.

The stdlib versions stack two generators per node (iter_fields inside iter_child_nodes); the
shared analyses walk most of every file's tree, where that was a tenth of matlint's time. The
engine's walker reads its children from the same table.
"""
from __future__ import annotations

import ast
import unicodedata
from typing import Optional

_AST = ast.AST

# Fields that never hold a node an analysis visits: identifiers, numbers, flags and strings
# (`Name.id`, `Attribute.attr`, `Constant.value`...) and the context and operator singletons.
_NEVER_NODES = frozenset({
    "ctx", "op", "ops", "id", "attr", "arg", "name", "asname", "module", "level", "kind", "conversion",
    "is_async", "simple", "type_comment", "tag", "kwd_attrs",
})
_NAME_NODE_FIELD = ("TypeAlias",)  # Python 3.12+: `type X = ...` names X with a Name node
_NEVER_NODES_OF = {ast.Constant: {"value"}, ast.Global: {"names"}, ast.Nonlocal: {"names"}}
_NODE_FIELDS: dict = {}
# The only nodes with a list field that can hold something else than nodes: a Dict's `**` key
# and a keyword-only argument without a default are None.
_LISTS_WITH_NONE = frozenset({ast.Dict, ast.arguments})


def node_fields(node_type) -> tuple:
    """The fields of `node_type` that can hold child nodes, in `_fields` order."""
    fields = _NODE_FIELDS.get(node_type)
    if fields is None:
        skipped = _NEVER_NODES | _NEVER_NODES_OF.get(node_type, set())
        if node_type.__name__ in _NAME_NODE_FIELD:
            skipped = skipped - {"name"}
        fields = _NODE_FIELDS[node_type] = tuple(f for f in node_type._fields if f not in skipped)
    return fields


_BLOCK_FIELDS: dict = {}


def block_fields(node_type) -> tuple:
    """The fields of `node_type` that can hold a list of statements or of their parts (handlers,
    match cases): `body`, `orelse`, `finalbody`, `handlers`, `cases`. Most nodes have none; an
    `IfExp`'s `body` and `orelse` are expressions."""
    fields = _BLOCK_FIELDS.get(node_type)
    if fields is None:
        fields = _BLOCK_FIELDS[node_type] = tuple(
            f for f in ("body", "orelse", "finalbody", "handlers", "cases") if f in node_type._fields)
    return fields


def child_nodes(node: ast.AST) -> list:
    """The direct children of `node`, as `list(ast.iter_child_nodes(node))` less contexts and operators."""
    cls = node.__class__
    fields = _NODE_FIELDS.get(cls)
    if fields is None:
        fields = node_fields(cls)
    found = []
    for name in fields:
        value = getattr(node, name, None)
        if type(value) is list:
            found.extend(value)
        elif isinstance(value, _AST):
            found.append(value)
    if cls in _LISTS_WITH_NONE:
        return [item for item in found if item is not None]
    return found


def walk(node: ast.AST):
    """Every node under `node`, itself first, breadth first, as `ast.walk(node)` less contexts and operators."""
    queue = [node]
    index = 0
    while index < len(queue):
        current = queue[index]
        index += 1
        queue.extend(child_nodes(current))
        yield current


def is_main_guard(test: ast.AST) -> bool:
    """`__name__ == "__main__"` (either way round): the test of a program's main block."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {getattr(test.left, "id", None), getattr(test.comparators[0], "id", None),
             getattr(test.left, "value", None), getattr(test.comparators[0], "value", None)}
    return "__name__" in sides and "__main__" in sides


def dotted(expr: ast.AST) -> Optional[str]:
    """`a.b.c` for a chain of Name/Attribute nodes, else None."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def product_factors(expr: ast.AST) -> list:
    """The factors of a product `a * b * c`, in order (`[expr]` for anything else)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return product_factors(expr.left) + product_factors(expr.right)
    return [expr]


# The structure and text helpers below are leaves: every analysis reads them (loops, flow, kinds,
# calls), so they import no other module of the semantic model.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SCOPE_TYPES = frozenset(_SCOPES)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def walk_no_scopes(node: ast.AST):
    """ast.walk that does not enter nested functions, lambdas or classes."""
    stack = [node]
    scopes = _SCOPE_TYPES
    while stack:
        current = stack.pop()
        yield current
        stack.extend([child for child in child_nodes(current) if child.__class__ not in scopes])


def identifier_text(ctx) -> str:
    """The source with every identifier spelled as the tree holds it: the source itself, or for a
    file that is not ASCII its NFKC normal form (the parser normalizes identifiers so: `ｓｏｆｔｍａｘ`
    is `softmax`). An identifier of the tree is a substring of this text."""
    text = ctx.shared.get("identifier_text")
    if text is None:
        source = ctx.source
        text = ctx.shared["identifier_text"] = source if source.isascii() else unicodedata.normalize("NFKC", source)
    return text


def code_scope(ctx) -> Optional[ast.AST]:
    """The function the walker is in, or the module at module level: the scope whose flow the
    rules read. None inside a lambda or a class body."""
    function = ctx.function
    if function is None:
        return ctx.tree if ctx.class_ is None else None
    return None if isinstance(function, ast.Lambda) else function


def function_text(ctx, function: ast.AST) -> str:
    """The source lines of `function`, identifiers spelled as the tree holds them (NFKC, as in
    `identifier_text`): a cheap filter before building its flow."""
    key = ("function_text", id(function))
    text = ctx.shared.get(key)
    if text is None:
        if not hasattr(function, "lineno"):  # the module
            return identifier_text(ctx)
        text = "\n".join(ctx.lines[function.lineno - 1:function.end_lineno])
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text)
        ctx.shared[key] = text
    return text


def may_mention(ctx, word: str, ignore_case: bool = False) -> bool:
    """False only when no identifier of the file (a name, an attribute, a keyword, an imported
    name or alias) can contain `word`, so a question whose answer needs it is settled without the
    analyses: identifiers are spelled out in `identifier_text` as they are in the tree.

    Identifiers only: a string literal can hold `word` without the source spelling it
    (`"\\x44ouble"`, implicit concatenation `"Dou" "ble"`), so a rule that matches the contents
    of strings must not let this gate skip those matches."""
    key = ("mentions", word, ignore_case)
    found = ctx.shared.get(key)
    if found is None:
        if ignore_case:
            text = ctx.shared.get("identifier_text_lower")
            if text is None:
                text = ctx.shared["identifier_text_lower"] = identifier_text(ctx).lower()
        else:
            text = identifier_text(ctx)
        found = ctx.shared[key] = word in text
    return found


def fills_own_cache(branch: ast.If, receiver: str) -> bool:
    """`branch` fills a cache of the object `receiver` names (a method's `self`): its test reads
    an attribute of it (`if self.key is None or ...:`, `if not hasattr(self, "key"):`) that its
    statements store (`self.key = ...`), so what it runs runs when the cache misses."""
    read = _attributes_read(branch.test, receiver)
    return bool(read) and bool(read & _attributes_stored(branch, receiver))


def _attributes_read(node: ast.AST, receiver: str) -> set:
    """The attributes of `receiver` that `node` reads, also by name through `hasattr(self, "name")`."""
    return {sub.attr if isinstance(sub, ast.Attribute) else sub.args[1].value for sub in ast.walk(node)
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == receiver
            or isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "hasattr"
            and len(sub.args) == 2 and isinstance(sub.args[0], ast.Name) and sub.args[0].id == receiver
            and isinstance(sub.args[1], ast.Constant) and isinstance(sub.args[1].value, str)}


def _attributes_stored(block: ast.AST, receiver: str) -> set:
    """The attributes of `receiver` that the statements in `block` assign."""
    return {target.attr for target in stored_targets(block) if isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name) and target.value.id == receiver}


def stored_targets(block: ast.AST):
    """The targets the statements in `block` assign, items taken to what holds them
    (`self._cache[key] = ...` stores `self._cache`)."""
    for stmt in ast.walk(block):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) else ()
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            yield target
