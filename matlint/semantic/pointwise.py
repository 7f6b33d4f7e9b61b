"""Elementwise and reduction tensor ops in either spelling, for the rules that recognise
hand-written fused ops (softmax, norms, GELU): `torch.exp(x)` and `x.exp()` are both
`Op("exp", [x])`; `x ** 2`, `x.pow(2)`, `torch.pow(x, 2)`, `x.square()` and `x * x` are all
`Op("pow", [x, 2])`. numpy, math and other modules' functions are not tensor ops."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Optional

from .flow import function_may_mention
from .loops import name_tokens, walk_no_scopes
from .tree import dotted, function_text

_NAMESPACES = ("torch.", "torch.nn.functional.", "torch.special.")

# Identifiers (for `_names.mentions`) of a switch to fused kernels, the kernel hub's above all
# (`@use_kernel_forward_from_hub("RMSNorm")`, `use_kernelized_func`, `kernelize`,
# `is_kernels_available`, `disable_custom_kernels`); never `kernel` alone, which names conv and
# smoothing kernels (`kernel_size`).
KERNEL_SWITCH = r"use_kernel|kernelize|kernels?_hub|hub_kernels?|kernels_available|custom_kernels?"


# Words of a decorator's (or wrapper's) own name that say it compiles the function
# (`@torch.compile`, `@torch.jit.script`, deepspeed's `@jit_script_compat`, `@lazy_compile`), and
# words that say the opposite or something else (`@torch.jit.ignore`, `@torch.compiler.disable`,
# `@torch.jit.script_if_tracing`, which runs eagerly outside tracing, `@compile_compatible_lru_cache`).
_COMPILE_WORDS = frozenset({"compile", "compiled"})
_SCRIPT_WORDS = frozenset({"jit", "script", "scripted", "torchscript"})
_NOT_COMPILING_WORDS = frozenset({"disable", "disabled", "ignore", "unused", "no", "not", "skip", "eager", "if",
                                  "tracing", "export", "overload", "constant", "cache", "compatible", "allow",
                                  "setter", "getter"})


def _compiles(callee: ast.AST, reductions: bool) -> bool:
    """Whether the own name of a decorator or wrapper (the last part of `torch.jit.script`) says it
    compiles what it is given; with `reductions`, with torch.compile, which fuses reductions too
    (TorchScript's default fuser fuses elementwise ops only)."""
    if isinstance(callee, ast.Call):
        if isinstance(callee.func, (ast.Name, ast.Attribute)) and dotted(callee.func) in ("partial", "functools.partial"):
            return bool(callee.args) and _compiles(callee.args[0], reductions)  # `@partial(torch.compile, mode=...)`
        callee = callee.func
    name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
    words = set(name_tokens(name))
    return bool(words & _COMPILE_WORDS or not reductions and words & _SCRIPT_WORDS) and not words & _NOT_COMPILING_WORDS


def in_compiled_code(ctx, reductions: bool = False) -> bool:
    """Whether the code at the engine's position runs compiled: a function or class around it is
    decorated to be (`@torch.compile`, `@torch.jit.script`, a project's `@jit_script_compat`), or
    the module-level function holding it is handed to such a wrapper (`fast_gelu =
    torch.compile(gelu)`); the written-out elementwise steps then run fused, so the fused op
    would save nothing. With `reductions` (steps that include a sum or a mean), only
    torch.compile counts: TorchScript's default fuser leaves the reductions separate kernels.
    Asked only once a pattern has been found."""
    for scope in ctx.functions + ctx.classes:
        for decorator in getattr(scope, "decorator_list", ()):
            if _compiles(decorator, reductions):
                return True
    if ctx.classes or not ctx.functions or isinstance(ctx.functions[0], ast.Lambda):
        return False
    key = ("compiled_by_wrapper", reductions)
    wrapped = ctx.shared.get(key)
    if wrapped is None:
        wrapped = ctx.shared[key] = {
            stmt.value.args[0].id for stmt in ctx.tree.body
            if isinstance(stmt, (ast.Assign, ast.Expr)) and isinstance(stmt.value, ast.Call) and stmt.value.args
            and isinstance(stmt.value.args[0], ast.Name) and _compiles(stmt.value.func, reductions)}
    return ctx.functions[0].name in wrapped


@dataclass
class Op:
    name: str
    args: list                                   # the tensor first, then the positional arguments
    keywords: dict = field(default_factory=dict)

    def arg(self, index: int, keyword: str) -> Optional[ast.AST]:
        """Positional argument `index` (0 is the tensor) or the keyword of that name."""
        if index < len(self.args):
            return self.args[index]
        return self.keywords.get(keyword)


def same(a: Optional[ast.AST], b: Optional[ast.AST]) -> bool:
    return a is not None and b is not None and ast.dump(a) == ast.dump(b)


def number(node: Optional[ast.AST]) -> Optional[float]:
    """The value of a numeric literal, `-1` included."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = number(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    return None


_NUMBER_CHARS = frozenset("0123456789_.")
_REST_OF_NUMBER = re.compile(r"[\d_]*(?:[eE][+-]?\d[\d_]*)?")
_REST_OF_NUMBER_WITH_FRACTION = re.compile(r"[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d[\d_]*)?")


def holds_half(text: str) -> bool:
    """Whether `text` holds a number literal equal to 0.5 in any spelling (`0.5`, `.5`, `5e-1`,
    `0.05e1`, `5_0E-2`). Its mantissa has a 5, so each 5 is widened to the literal around it (a
    regex tried at every position of a function's text cost more than the analysis it saved)."""
    five = text.find("5")
    while five >= 0:
        start = five
        while start and text[start - 1] in _NUMBER_CHARS:
            start -= 1
        rest = _REST_OF_NUMBER if "." in text[start:five] else _REST_OF_NUMBER_WITH_FRACTION
        end = rest.match(text, five + 1).end()
        before = text[start - 1] if start else " "
        if not (before.isalnum() or before == "_"):  # `x5`, `1e5`, `0x5` hold no 0.5
            try:
                if float(text[start:end].replace("_", "")) == 0.5:
                    return True
            except ValueError:
                pass
        five = text.find("5", end)
    return False


def may_take_root(ctx, function: ast.AST, names: tuple) -> bool:
    """False only when `function` cannot take the square root `root_of` recognises: it can call
    none of `names` (`sqrt`, `rsqrt`, `std`; see `function_may_mention`) and holds no literal
    equal to 0.5 (the exponent of `** 0.5`, `** -0.5`, `.pow(0.5)`)."""
    if function_may_mention(ctx, function, names):
        return True
    key = ("holds_half", id(function))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = holds_half(function_text(ctx, function))
    return found


def is_eps(node: ast.AST) -> bool:
    """A small constant added for numerical safety: a number in (0, 1e-3], or a name or attribute
    called eps (`eps`, `self.variance_epsilon`)."""
    value = number(node)
    if value is not None:
        return 0 < value <= 1e-3
    return isinstance(node, ast.Name) and "eps" in node.id.lower() or (
        isinstance(node, ast.Attribute) and "eps" in node.attr.lower())


def is_true(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def torch_op(ctx, node: ast.AST) -> Optional[Op]:
    """The tensor op `node` applies, in a normalized form, or None."""
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            return Op("pow", [node.left, node.right])
        if isinstance(node.op, ast.Mult) and same(node.left, node.right):
            return Op("pow", [node.left, ast.Constant(2)])
        return None
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    keywords = {k.arg: k.value for k in node.keywords if k.arg}
    if len(keywords) != len(node.keywords):
        return None
    func = node.func
    qual = ctx.qualname(func)
    if qual is not None:
        for namespace in _NAMESPACES:
            if qual.startswith(namespace) and "." not in qual[len(namespace):]:
                name = qual[len(namespace):]
                args = list(node.args)
                if not args and "input" in keywords:
                    args = [keywords.pop("input")]
                return _normalized(name, args, keywords) if args else None
        return None
    if isinstance(func, ast.Attribute) and ctx.qualname(func.value) is None:
        return _normalized(func.attr, [func.value] + list(node.args), keywords)
    return None


_PRODUCTS = {"mul": ast.Mult, "multiply": ast.Mult, "div": ast.Div, "divide": ast.Div, "true_divide": ast.Div}
PRODUCT_METHODS = frozenset(_PRODUCTS)


def product(ctx, node: ast.AST) -> Optional[tuple]:
    """(ast.Mult or ast.Div, left, right) for `a * b`, `a / b` and their call spellings
    (`a.mul(b)`, `torch.div(a, b)`), or None."""
    if isinstance(node, ast.BinOp):
        return (node.op.__class__, node.left, node.right) if isinstance(node.op, (ast.Mult, ast.Div)) else None
    op = torch_op(ctx, node)
    if op is None or op.name not in _PRODUCTS or len(op.args) != 2 or op.keywords:
        return None  # `rounding_mode=`, `out=`: not a plain product
    return _PRODUCTS[op.name], op.args[0], op.args[1]


def difference(ctx, node: ast.AST) -> Optional[tuple]:
    """(a, b) for `a - b`, `a.sub(b)` and `torch.sub(a, b)` (not with `alpha=`), or None."""
    if isinstance(node, ast.BinOp):
        return (node.left, node.right) if isinstance(node.op, ast.Sub) else None
    op = torch_op(ctx, node)
    if op is None or op.name not in ("sub", "subtract") or len(op.args) != 2 or op.keywords:
        return None
    return op.args[0], op.args[1]


# Reads of what a tensor is, not of its values (a fused op leaves them answerable).
_METADATA_ATTRIBUTES = frozenset({"dtype", "shape", "device", "ndim", "is_cuda", "layout"})
_METADATA_METHODS = frozenset({"size", "dim", "ndimension", "numel", "nelement", "get_device",
                               "new_tensor", "new_zeros", "new_ones", "new_full", "new_empty"})


# Calls that read only the shape, dtype or device of their first argument: `torch.ones_like(x)`,
# and of the one argument of a method: `mask.expand_as(x)`, `t.type_as(x)`.
_LIKE_FACTORIES = frozenset({"ones_like", "zeros_like", "empty_like", "full_like", "rand_like", "randn_like",
                             "randint_like"})
_SHAPED_AS = frozenset({"expand_as", "view_as", "reshape_as", "type_as"})


def reads_metadata(flow, use: ast.Name) -> bool:
    """`use` reads what a tensor is, not its values: `x.dtype`, `x.shape`, `x.size(-1)`, `len(x)`,
    `torch.ones_like(x, dtype=torch.bool)`, `mask.expand_as(x)`."""
    up = flow.parent.get(use)
    if isinstance(up, ast.Attribute) and up.value is use:
        call = flow.parent.get(up)
        if isinstance(call, ast.Call) and call.func is up:
            return up.attr in _METADATA_METHODS
        return up.attr in _METADATA_ATTRIBUTES
    if not isinstance(up, ast.Call) or not up.args or up.args[0] is not use:
        return False
    func = up.func
    if isinstance(func, ast.Name):
        return func.id == "len" and len(up.args) == 1 or func.id in _LIKE_FACTORIES
    return isinstance(func, ast.Attribute) and (
        func.attr in _LIKE_FACTORIES or func.attr in _SHAPED_AS and len(up.args) == 1 and not up.keywords)


def _checked_only(ctx, flow, use: ast.Name) -> bool:
    """`use` sits in a check (`assert torch.isfinite(var).all()`, `torch._assert(...)`) or reads
    metadata: the value is not wanted on its own."""
    if reads_metadata(flow, use):
        return True
    for ancestor in flow.enclosing(use):
        if isinstance(ancestor, ast.Assert):
            return True
        if isinstance(ancestor, ast.Call) and ctx.qualname(ancestor.func) in ("torch._assert", "torch._assert_async"):
            return True
        if isinstance(ancestor, ast.stmt):
            return False
    return False


def feeds_only(ctx, flow, assign: ast.Assign, node: ast.AST, depth: int = 3) -> bool:
    """Whether every read of the value `assign` stores lies inside `node`, or in a plain
    `name = value` whose value in turn feeds only `node`: the steps of one computation. A read
    anywhere else (returned, stored on `self`, reused in other math) means the value is wanted on
    its own, which a fused op would not give; checks (`assert`, `torch._assert`) and metadata
    reads (`.shape`, `.dtype`) do not."""
    for use in flow.uses(assign):
        if any(ancestor is node for ancestor in flow.enclosing(use)) or _checked_only(ctx, flow, use):
            continue
        stmt = flow.statement(use)
        if not (depth and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and feeds_only(ctx, flow, stmt, node, depth - 1)):
            return False
    return True


def _normalized(name: str, args: list, keywords: dict) -> Op:
    if name == "square" and len(args) == 1:
        return Op("pow", [args[0], ast.Constant(2)], keywords)
    if name == "pow" and len(args) == 1 and "exponent" in keywords:
        return Op("pow", [args[0], keywords.pop("exponent")], keywords)
    return Op(name, args, keywords)


def resolve(flow, node: ast.AST, depth: int = 4) -> ast.AST:
    """`node`, or the value assigned to the name it is, followed through plain assignments. The
    value is compared as text with what stands at `node`, so it is not followed where a name it
    reads, or the name it is stored in, is stored again or changed in place before `node`
    (`v = x.pow(2).mean(-1)`, `x = proj(x)`, then `x * rsqrt(v)`)."""
    site = node
    while depth and isinstance(node, ast.Name):
        assign = flow.reaching(node)
        if assign is None or flow.changed_between(node.id, assign, site) or any(
                isinstance(n, ast.Name) and flow.changed_between(n.id, assign, site)
                for n in walk_no_scopes(assign.value)):
            break
        node = assign.value
        depth -= 1
    return node


def strip_casts(ctx, node: ast.AST) -> ast.AST:
    """`x.float()`, `x.to(torch.float32)`, `x.type_as(y)` -> `x` (dtype casts keep the values)."""
    while True:
        op = torch_op(ctx, node)
        if op is None or op.name not in ("float", "to", "double", "type_as", "half", "bfloat16"):
            return node
        node = op.args[0]


_CAST_METHODS = frozenset({"float", "to", "double", "type_as", "half", "bfloat16"})


def returned_affine(ctx, node: ast.AST) -> Optional[str]:
    """How the function returns `node`, the node being walked, in the expression around it:
    "none" as it is (through dtype casts: `(x * rms).to(dtype)`), "scale" times one factor
    (`w * normed`), "shift" times one factor plus one term; None when it is not returned there.
    A hand-written norm returned "none" has no weight and no bias to pass to the fused call,
    unless it is a method of a class that holds a parameter (Gemma's `_norm`, whose `forward`
    applies the weight): None then."""
    parents = ctx.parents
    current, state, i = node, "none", len(parents) - 1
    while i >= 0:
        up = parents[i]
        if (up.__class__ is ast.Attribute and up.value is current and up.attr in _CAST_METHODS and i
                and parents[i - 1].__class__ is ast.Call and parents[i - 1].func is up):
            current, i = parents[i - 1], i - 2
            continue
        if up.__class__ is ast.Return:
            if state == "none" and ctx.class_ is not None and "Parameter" in function_text(ctx, ctx.class_):
                return None
            return state
        if up.__class__ is ast.BinOp and (up.left is current or up.right is current) and (
                (state == "none" and up.op.__class__ is ast.Mult) or (state == "scale" and up.op.__class__ is ast.Add)):
            current, state, i = up, "scale" if state == "none" else "shift", i - 1
            continue
        return None
    return None


def last_dim_reduction(ctx, flow, node: ast.AST, names) -> Optional[ast.AST]:
    """The tensor a `<name>(t, -1, keepdim=True)` reduction (name in `names`) runs over, else None."""
    op = torch_op(ctx, strip_casts(ctx, resolve(flow, node)))
    if op is None or op.name not in names or number(op.arg(1, "dim")) != -1:
        return None
    if not is_true(op.keywords.get("keepdim", op.arg(2, ""))):
        return None
    return op.args[0]


def root_of(ctx, node: ast.AST, inverse: bool):
    """(x, eps) for `sqrt(x + eps)` / `(x + eps).sqrt()` / `(x + eps) ** 0.5`, or with
    `inverse` for `rsqrt(...)` / `(...) ** -0.5` / `1 / sqrt(...)`; eps may be absent."""
    if inverse and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and number(node.left) == 1:
        return root_of(ctx, node.right, False)
    op = torch_op(ctx, node)
    if op is None:
        return None
    if op.name == ("rsqrt" if inverse else "sqrt") and len(op.args) == 1 and not op.keywords:
        inner = op.args[0]
    elif op.name == "pow" and len(op.args) == 2 and number(op.args[1]) == (-0.5 if inverse else 0.5):
        inner = op.args[0]
    else:
        return None
    if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Add):
        return inner.left, inner.right
    added = torch_op(ctx, inner)
    if added is not None and added.name == "add" and len(added.args) == 2 and not added.keywords:
        return added.args[0], added.args[1]
    return inner, None
