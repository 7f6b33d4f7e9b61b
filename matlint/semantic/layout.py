"""Memory layout of views: which expressions transpose or permute a tensor, into which dim
order, and whether a view's strides are ones cuBLAS accepts without a copy.

A permutation `perm` lists, for each dim of the view, the dim of the base it came from
(`x.permute(0, 2, 1, 3)` is `(0, 2, 1, 3)`; `x.transpose(-2, -1)` on a rank-3 `x` is `(0, 2, 1)`).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Optional

from . import kinds as _kinds
from .flow import flow_of
from .tree import function_text
from .kinds import int_const
from .shapes import shape_of

_TRANSPOSE_METHODS = {"transpose", "swapaxes", "swapdims"}
_TRANSPOSE_FUNCTIONS = {"torch.transpose", "torch.swapaxes", "torch.swapdims"}
_MOVE_METHODS = {"movedim", "moveaxis"}
_MOVE_FUNCTIONS = {"torch.movedim", "torch.moveaxis"}
# Casts keep a non-contiguous tensor's strides (memory_format=torch.preserve_format).
STRIDE_KEEPING = frozenset({"float", "half", "bfloat16", "double", "to", "type_as"})


def rank_of(ctx, expr: ast.AST) -> Optional[int]:
    shape = shape_of(ctx, expr)
    return shape.rank if shape is not None else None


@dataclass
class Reorder:
    """`node` is a view of `base` with its dims reordered."""
    node: ast.AST
    base: ast.AST
    perm: Optional[tuple]     # None when the rank is not known
    last_two_only: bool       # swaps exactly the last two dims, whatever the rank
    min_rank: int = 2         # the least rank the view can have (`x.transpose(1, 2)` needs 3)


def _swap(rank: int, a: int, b: int) -> Optional[tuple]:
    a, b = (a + rank if a < 0 else a), (b + rank if b < 0 else b)
    if not (0 <= a < rank and 0 <= b < rank):
        return None
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def _transpose(ctx, node, base, a_node, b_node, known_rank: Optional[int]) -> Optional[Reorder]:
    a, b = int_const(a_node), int_const(b_node)
    if a is None or b is None or a == b:
        return None
    rank = rank_of(ctx, base) or known_rank
    if {a, b} == {-1, -2}:
        return Reorder(node, base, _swap(rank, a, b) if rank else None, True)
    if rank is None:
        return Reorder(node, base, None, False, max(d + 1 if d >= 0 else -d for d in (a, b)))
    perm = _swap(rank, a, b)
    if perm is None:
        return None
    return Reorder(node, base, perm, rank >= 2 and perm[-2:] == (rank - 1, rank - 2) and perm[:-2] == tuple(range(rank - 2)))


def _matrix_t(ctx, node, base) -> Optional[Reorder]:
    """`.t()` swaps the dims of a matrix and returns a 0-D or 1-D tensor as it is."""
    if rank_of(ctx, base) in (0, 1):
        return None
    return Reorder(node, base, (1, 0), True)


def _move(ctx, node, base, source_node, destination_node, known_rank: Optional[int]) -> Optional[Reorder]:
    """`x.movedim(source, destination)` with ints or tuples of ints."""
    def ints(arg):
        elts = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
        values = [int_const(e) for e in elts]
        return None if None in values or not values else values
    sources, destinations = ints(source_node), ints(destination_node)
    if sources is None or destinations is None or len(sources) != len(destinations):
        return None
    rank = rank_of(ctx, base) or known_rank
    if len(sources) == 1 and {sources[0], destinations[0]} == {-1, -2}:  # moving one of the last two past the other
        return Reorder(node, base, _swap(rank, -2, -1) if rank else None, True)
    if rank is None:
        return Reorder(node, base, None, False)
    sources = [s + rank if s < 0 else s for s in sources]
    destinations = [d + rank if d < 0 else d for d in destinations]
    dims = sources + destinations
    if not all(0 <= d < rank for d in dims) or len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
        return None
    perm = [None] * rank
    for s, d in zip(sources, destinations):
        perm[d] = s
    rest = iter(d for d in range(rank) if d not in sources)
    perm = tuple(p if p is not None else next(rest) for p in perm)
    if perm == tuple(range(rank)):
        return None
    last_two = rank >= 2 and perm[:-2] == tuple(range(rank - 2)) and perm[-2:] == (rank - 1, rank - 2)
    return Reorder(node, base, perm, last_two)


def reorder(ctx, node: ast.AST, known_rank: Optional[int] = None) -> Optional[Reorder]:
    """The transpose/permute view `node` is, or None (also for numpy and unknown receivers of `.T`).
    `known_rank`: the rank the caller knows the view has (a `bmm` operand is 3-D), for when the
    shape analysis does not know it."""
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        if _kinds.kind_of(ctx, node.value) == _kinds.NUMPY:
            return None
        rank = rank_of(ctx, node.value)
        if node.attr == "T":
            # `.T` on anything but a matrix is deprecated (it reverses all dims): it means rank 2.
            if rank not in (None, 2):
                return None
            return Reorder(node, node.value, (1, 0), True)
        return Reorder(node, node.value, _swap(rank, -2, -1) if rank else None, True)
    if not isinstance(node, ast.Call) or node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    func, args = node.func, node.args
    qual = ctx.qualname(func)
    if qual in _TRANSPOSE_FUNCTIONS and len(args) == 3:
        return _transpose(ctx, node, args[0], args[1], args[2], known_rank)
    if qual == "torch.t" and len(args) == 1:
        return _matrix_t(ctx, node, args[0])
    if qual in _MOVE_FUNCTIONS and len(args) == 3:
        return _move(ctx, node, args[0], args[1], args[2], known_rank)
    if qual == "torch.permute" and len(args) == 2 and isinstance(args[1], (ast.Tuple, ast.List)):
        return _permute(node, args[0], args[1].elts)
    if not isinstance(func, ast.Attribute) or qual is not None:
        return None
    receiver = func.value
    if _kinds.kind_of(ctx, receiver) in _kinds.NON_TENSORS:
        return None
    if func.attr in _TRANSPOSE_METHODS and len(args) == 2:
        return _transpose(ctx, node, receiver, args[0], args[1], known_rank)
    if func.attr == "t" and not args:
        return _matrix_t(ctx, node, receiver)
    if func.attr in _MOVE_METHODS and len(args) == 2:
        return _move(ctx, node, receiver, args[0], args[1], known_rank)
    if func.attr == "permute" and args:
        elts = args[0].elts if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)) else args
        return _permute(node, receiver, elts)
    return None


def gemm_candidates(node: ast.AST) -> list:
    """Expressions that may be operands of GEMM `node`, found without resolving any name (a cheap
    filter before `as_gemm`)."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.Call):
        extra = [node.func.value] if isinstance(node.func, ast.Attribute) else []
        return list(node.args) + extra
    return []


def gemm_of_operand(ctx, node: ast.AST, is_operand: Callable) -> Optional[ast.AST]:
    """The `@` or call just above `node` (the node being walked) when `node` is the first of its
    `gemm_candidates` that `is_operand` accepts, else None. A rule about one kind of operand (a
    copy, a permuted view) visits those operands and judges each GEMM once, at its first such
    operand, instead of filtering the operands of every call in the file."""
    parents = ctx.parents
    if not parents:
        return None
    parent = parents[-1]
    cls = parent.__class__
    if cls is ast.Attribute:  # `x.t().contiguous().mm(w)`: the receiver of a method call
        owner = parents[-2] if len(parents) > 1 else None
        if parent.value is not node or owner.__class__ is not ast.Call or owner.func is not parent:
            return None
    elif cls is ast.BinOp:
        if parent.op.__class__ is not ast.MatMult:
            return None
        owner = parent
    elif cls is ast.Call:
        owner = parent
    else:
        return None
    for candidate in gemm_candidates(owner):
        if is_operand(candidate):
            return owner if candidate is node else None
    return None


def _permute(node, base, elts) -> Optional[Reorder]:
    order = [int_const(e) for e in elts]
    rank = len(order)
    if None in order or rank == 0:
        return None
    perm = tuple(o + rank if o < 0 else o for o in order)
    if sorted(perm) != list(range(rank)) or perm == tuple(range(rank)):
        return None
    last_two = rank >= 2 and perm[:-2] == tuple(range(rank - 2)) and perm[-2:] == (rank - 1, rank - 2)
    return Reorder(node, base, perm, last_two)


def mergeable(perm: tuple, i: int) -> bool:
    """Dims i and i+1 of a permuted view of a contiguous tensor can be merged without a copy."""
    return perm[i + 1] == perm[i] + 1


def unpacked_item(stmt: ast.AST, name: str) -> Optional[ast.AST]:
    """The value `a, name = x, value` binds to `name`, item by item; None for any other statement."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], (ast.Tuple, ast.List))
            and isinstance(stmt.value, (ast.Tuple, ast.List)) and len(stmt.targets[0].elts) == len(stmt.value.elts)):
        return None
    hits = [value for target, value in zip(stmt.targets[0].elts, stmt.value.elts)
            if isinstance(target, ast.Name) and target.id == name]
    starred = any(isinstance(e, ast.Starred) for e in stmt.targets[0].elts + stmt.value.elts)
    return hits[0] if len(hits) == 1 and not starred else None


def assigned_value(ctx, load: ast.Name) -> Optional[ast.AST]:
    """The one expression whose value `load` reads in the function being walked: the value of its
    only reaching store, `name = value` or `a, name = x, value`; None for anything else."""
    reaching = flow_of(ctx, ctx.scope).reaching_all(load)
    if len(reaching) != 1 or reaching[0][0] is None:
        return None
    stmt, simple = reaching[0]
    return stmt.value if simple else unpacked_item(stmt, load.id)


def reads_of_assigned(ctx, value: ast.AST, where: Callable, spelled: Callable) -> list:
    """The loads that read what `value`, the node being walked, is stored to (`h = value`, or
    `a, h = x, value`), among those `where(load, its parent)` accepts, each of them only when it
    reads no other value: empty when `value` is not so stored, or when `spelled(name, the
    function's text)` says no such load is written there."""
    parents = ctx.parents
    if ctx.function is None or not parents:
        return []
    stmt = parents[-1]
    if isinstance(stmt, ast.Assign) and stmt.value is value:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            return []
        name = stmt.targets[0].id
    elif isinstance(stmt, (ast.Tuple, ast.List)) and len(parents) > 1 and getattr(parents[-2], "value", None) is stmt:
        stmt = parents[-2]
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        names = [t.id for t, v in zip(getattr(target, "elts", ()), stmt.value.elts) if v is value and isinstance(t, ast.Name)]
        if len(names) != 1 or unpacked_item(stmt, names[0]) is not value:
            return []
        name = names[0]
    else:
        return []
    if not spelled(name, function_text(ctx, ctx.function)):
        return []
    flow = flow_of(ctx, ctx.function)
    loads = [load for load in flow.loads.get(name, ()) if where(load, flow.parent.get(load))]
    return [load for load in loads if flow.reaches(stmt, load) and len(flow.reaching_all(load)) == 1]


def _inline_or_assigned(ctx, base: ast.AST) -> list:
    """`base` itself and, for a name, the values the function assigns to it in simple statements
    that may reach it."""
    values = [base]
    if isinstance(base, ast.Name) and ctx.function is not None:
        flow = flow_of(ctx, ctx.function)
        # The stores this load may read; all of the name's stores for a node the flow does not hold.
        stores = flow.reaching_all(base) if base in flow.parent else flow.stores.get(base.id, [])
        values += [stmt.value for stmt, simple in stores if stmt is not None and simple]
    return values


def may_be_laid_out_otherwise(ctx, base: ast.AST) -> bool:
    """`base` may not be contiguous: it is itself a transposed or permuted view or a
    `memory_format=` copy, inline or through a name the function assigns so (`h =
    x.transpose(1, 2)`, whose `h.transpose(1, 2)` is contiguous again; `k = x.view(B, T, H,
    D).transpose(1, 2)`, whose batch dims do not merge)."""
    for value in _inline_or_assigned(ctx, base):
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and value.func.attr in STRIDE_KEEPING | {"contiguous"}):
            if any(k.arg == "memory_format" for k in value.keywords):
                return True
            value = value.func.value
        if reorder(ctx, value) is not None:
            return True
    return False


# Views whose strides no GEMM reads in place, whatever is done to them after: a broadcast dim
# (stride 0) or overlapping windows.
_BROADCASTING = frozenset({"expand", "expand_as", "broadcast_to", "as_strided", "unfold", "diagonal"})


def may_have_stepped_dims(ctx, base: ast.AST) -> bool:
    """`base` is a slice with a step (`x[:, ::2]`) or a broadcast view (`v.expand(8, -1)`), inline
    or through a name the function assigns so: a transpose of it is no layout cuBLAS reads, and a
    GEMM copies it anyway."""
    for value in _inline_or_assigned(ctx, base):
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and value.func.attr in STRIDE_KEEPING):
            value = value.func.value
        if isinstance(value, ast.Subscript):
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            if any(isinstance(item, ast.Slice) and item.step is not None and int_const(item.step) != 1
                   for item in items):
                return True
        elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
              and value.func.attr in _BROADCASTING):
            return True
    return False
