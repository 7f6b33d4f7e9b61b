"""MAT601's layout helpers: the rank and strides of q, k and v against what SDPA's fused kernels
take (einsum terms, einops patterns, transposes), and the notes that say what to change."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from matlint.semantic.flow import FunctionFlow
from matlint.semantic.kinds import int_const
from matlint.semantic.layout import rank_of

from .scores import _CAST_METHODS, _Scores, _TRANSPOSE_METHODS
from .weights import _Probs


_TO_4D = {2: "add the batch and head axes (`q[None, None]`, ...)",
          3: "split the heads out of the batch axis, or add a leading one (`q.unsqueeze(0)`, ...)",
          5: "merge the leading axes into the batch (`q.flatten(0, 1)`, ...)"}


@dataclass
class _Layout:
    rank: Optional[int] = None
    strided_by: Optional[ast.AST] = None  # the view that moved another axis last: its stride is not 1


@dataclass
class _Operands:
    """q, k and v against what SDPA's fused kernels take."""
    rank: Optional[int]         # the one rank the code shows them to have
    ranked: list                # the names of those whose rank it shows
    pinned: bool                # it shows the rank of all three, and the same
    conflicting: bool           # it shows different ranks
    strided: list               # (name, view) for those whose last axis is not unit-stride
    rank_confirmed: bool        # something besides positive transpose axes says k's rank
    names: tuple = ("q", "k", "v")


_EINOPS_TOKEN = re.compile(r"\.\.\.|\w+|[()]")


def _einops_groups(side: str):
    """(groups, a bare `...` stands among them) for one side of an einops pattern: its axes grouped
    as parentheses group them; None for anonymous axes (`1`, `()`) or unbalanced text."""
    groups, current, bare_ellipsis = [], None, False
    for token in _EINOPS_TOKEN.findall(side):
        if token == "(":
            if current is not None:
                return None
            current = []
        elif token == ")":
            if not current:
                return None
            groups.append(current)
            current = None
        elif token.isdigit():
            return None
        elif current is not None:
            current.append(token)
        else:
            groups.append([token])
            bare_ellipsis |= token == "..."
    return (groups, bare_ellipsis) if current is None else None


def _rearranged(call: ast.Call) -> _Layout:
    """The layout `einops.rearrange(t, pattern)` makes of a contiguous `t`: its rank, and whether it
    is a view whose last axis is not t's last. einops reshapes, permutes, then reshapes again, which
    copies into a contiguous result unless each group it merges was adjacent, in order, in t."""
    pattern = call.args[1] if len(call.args) > 1 else None
    if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)) or pattern.value.count("->") != 1:
        return _Layout()
    sides = [_einops_groups(side) for side in pattern.value.split("->")]
    if None in sides:
        return _Layout()
    (lhs, _), (rhs, bare_ellipsis) = sides
    rank = None if bare_ellipsis else len(rhs)
    axes = [axis for group in lhs for axis in group]
    if not rhs or sorted(axes) != sorted(axis for group in rhs for axis in group) or len(set(axes)) != len(axes):
        return _Layout(rank)
    position = {axis: i for i, axis in enumerate(axes)}
    view = all(position[b] == position[a] + 1 for group in rhs for a, b in zip(group, group[1:]))
    return _Layout(rank, call if view and rhs[-1][-1] != axes[-1] else None)


class _OperandLayout:
    """ManualAttention's layout analysis of q, k and v."""

    # -- the operands' layout ------------------------------------------------------------
    def _operands(self, flow: FunctionFlow, scores: _Scores, probs: _Probs) -> _Operands:
        """What the code shows of q, k and v against what SDPA's fused kernels take: 4-D, the head
        dim last with stride 1. Worked out only once the whole attention has been found."""
        ranks = ([], [], [])  # what the code shows of the rank of q, k and v
        by_op = {"bmm": 3, "mm": 2}
        if scores.gemm.op in by_op:
            ranks[0].append(by_op[scores.gemm.op])
            ranks[1].append(by_op[scores.gemm.op])
        if probs.pv.op in by_op:
            ranks[2].append(by_op[probs.pv.op])
        if scores.terms:
            for i, term in enumerate(scores.terms[:2]):
                if "*" not in term:
                    ranks[i].append(len(term))
        if probs.terms and "*" not in probs.terms[0]:
            ranks[2].append(len(probs.terms[0]))
        if scores.k_rank is not None and not scores.rank_assumed:
            ranks[1].append(scores.k_rank)
        exprs = (scores.q, scores.k, probs.v)
        names = tuple(expr.id if isinstance(expr, ast.Name) else generic for expr, generic in zip(exprs, "qkv"))
        strided = []
        for i, expr in enumerate(exprs):
            layout = self._layout(flow, expr, 0, frozenset())
            rank = layout.rank if layout.rank is not None else rank_of(self.ctx, expr)
            if rank is not None:
                ranks[i].append(rank)
            if layout.strided_by is not None:
                strided.append((names[i], layout.strided_by))
        seen = {r for found in ranks for r in found}
        confirmed = scores.rank_assumed and seen == {scores.k_rank}
        if scores.rank_assumed and not seen:
            ranks[1].append(scores.k_rank)  # the only word on it: the message says what it implies
            seen = {scores.k_rank}
        rank = next(iter(seen)) if len(seen) == 1 else None
        return _Operands(rank, [names[i] for i in range(3) if ranks[i]], all(ranks) and rank is not None,
                         len(seen) > 1, strided, confirmed, names)

    def _layout(self, flow: FunctionFlow, node: ast.AST, depth: int, bound: frozenset) -> _Layout:
        """An operand's rank and the view, if any, that leaves its last axis with a stride other
        than 1, read off the expressions that compute it (`rearrange`, `view`/`reshape`,
        `transpose`/`permute`, `.contiguous()`), through names and unpacking. `bound`: names that
        stand for one element of an unpacked sequence (`t` in `map(lambda t: ..., qkv)`)."""
        if depth > 8:
            return _Layout()
        if isinstance(node, ast.Name):
            if node.id in bound:
                return _Layout()
            origin = self._origin(flow, node)
            if origin is None or origin[0] is None:
                return _Layout()
            return self._layout(flow, origin[0], depth + 1, bound | origin[1])
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)) and isinstance(
                node.right, (ast.Constant, ast.Name, ast.Attribute)):
            return self._layout(flow, node.left, depth + 1, bound)  # `q * self.scale` keeps q's strides
        if not isinstance(node, ast.Call):
            return _Layout()
        if self.ctx.qualname(node.func) == "einops.rearrange":
            return _rearranged(node)
        func = node.func
        if not isinstance(func, ast.Attribute) or self.ctx.qualname(func) is not None:
            return _Layout()
        method, args = func.attr, node.args
        if any(isinstance(a, ast.Starred) for a in args):
            return _Layout()
        if method in ("reshape", "view") and args and not node.keywords:
            if len(args) == 1:
                if isinstance(args[0], (ast.Tuple, ast.List)):
                    return _Layout(len(args[0].elts))
                return _Layout(1) if int_const(args[0]) is not None else _Layout()  # one name may be a shape
            return _Layout(len(args))
        inner = lambda: self._layout(flow, func.value, depth + 1, bound)  # noqa: E731
        if method in _TRANSPOSE_METHODS and len(args) == 2 and not node.keywords:
            axes = {int_const(a) for a in args}
            found = inner()
            if None in axes:
                return _Layout(found.rank)
            if axes & ({-1} | ({found.rank - 1} if found.rank else set())):
                # another axis comes last; unless this undoes an earlier transpose, its stride is not 1
                return _Layout(found.rank, node if found.strided_by is None else None)
            return found
        if method == "permute" and args and not node.keywords:
            order = [int_const(a) for a in (args[0].elts if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List))
                                             else args)]
            if None in order:
                return _Layout()
            rank, found = len(order), inner()
            if order[-1] % rank != rank - 1:
                return _Layout(rank, node if found.strided_by is None else None)
            return _Layout(rank, found.strided_by)
        if method == "contiguous" and not args:
            return _Layout(inner().rank)
        if method in _CAST_METHODS or method in ("detach", "clone"):
            return inner()  # they keep the strides (memory_format=torch.preserve_format)
        return _Layout()

    def _layout_notes(self, scores: _Scores, probs: _Probs, operands: _Operands) -> list:
        """What keeps q, k and v, as the code holds them, from SDPA's fused kernels."""
        notes = []
        wrong = []
        if scores.terms:
            a, b, want_a, want_b = scores.terms
            wrong += [(name, has, want) for name, has, want in ((operands.names[0], a, want_a),
                                                                 (operands.names[1], b, want_b)) if has != want]
        if probs.terms and probs.terms[0] != probs.terms[1]:
            wrong.append((operands.names[2], *probs.terms))
        if wrong:
            show = lambda term: term.replace("*", "...")  # noqa: E731
            note = (", ".join(f"`{name}` is `{show(has)}`" for name, has, _ in wrong) + " where SDPA needs "
                    + ", ".join(f"`{show(want)}`" for _, _, want in wrong)
                    + f": permute {'it' if len(wrong) == 1 else 'them'} first (as they are, SDPA would attend "
                      "over the wrong axes)")
            if any(has[-1] != want[-1] for _, has, want in wrong):
                note += (", and since that moves another axis last, make them `.contiguous()` (or produce that "
                         "layout in the first place)")
            notes.append(note)
        if operands.rank is not None and operands.rank != 4:
            names = [f"`{name}`" for name in operands.ranked]
            notes.append(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} {operands.rank}-D here: "
                         + _TO_4D.get(operands.rank, "reshape them to 4-D"))
        if operands.strided:
            names = [f"`{name}`" for name, _ in operands.strided]
            view = operands.strided[0][1]
            one = len(names) == 1
            notes.append(f"{', '.join(names)} {'is a view' if one else 'are views'} whose last axis has a stride "
                         f"other than 1 (`{self._describe(view)}`, line {view.lineno}): make "
                         f"{'it' if one else 'them'} `.contiguous()` first")
        return notes

    def _describe(self, view: ast.Call) -> str:
        if self.ctx.qualname(view.func) == "einops.rearrange":
            return f"rearrange(..., {self.ctx.segment(view.args[1])})"
        text = self.ctx.segment(view)
        return text if len(text) <= 60 and "\n" not in text else f".{view.func.attr}(...)"
