"""MAT303 view-after-transpose: `.view()` that merges dims of a transposed or permuted tensor,
which raises at run time."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.kinds import int_const
from matlint.semantic.layout import (STRIDE_KEEPING, Reorder, assigned_value, may_be_laid_out_otherwise, mergeable,
                                    reorder)
from matlint.semantic.shapes import as_dim, dim_eq, shape_of, value_of


# How many steps (a cast, a comparison, a slice, a name) the rule follows back to a transpose.
_FOLLOWED = 8
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_COMPARE_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _keeps_every_dim(index: ast.AST) -> bool:
    """`[:k]`, `[1:, :n]`: plain slices, no step, no int, None or mask: the same dims, in the same order."""
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(item, ast.Slice) and item.step is None for item in items)


class ViewAfterTranspose(Rule):
    code = "MAT303"
    # The code raises at run time: an error, though its family is about speed.
    severity = "error"
    name = "view-after-transpose"
    summary = "`.view()` merging dims of a transposed/permuted tensor: it raises at run time; use `reshape` or `.contiguous()` first."
    docs = """
    ## What it does
    Flags `.view(...)` applied to a transpose or permute (`x.transpose(1, 2).view(B, T, C)`,
    `x.permute(0, 2, 1).view(-1)`, `x.movedim(1, 2).view(B, -1)`, also through a dtype/device
    cast, a comparison, a slice or a name bound once) when the view must merge two
    dims that the transpose took out of memory order. The rule knows the permutation (from
    `permute`'s arguments, or from `transpose` and the tensor's inferred rank) and the number of
    dims asked for; it reports only when the view asks for fewer dims than the permuted tensor
    has and *no* pair of neighbouring dims could be merged without a copy, so whichever dims the
    view merges, it fails.

    ## Why is this bad?
    `view` never copies: it needs strides that express the new shape, and a transposed tensor
    has none for merged dims. The call raises `RuntimeError: view size is not compatible with
    input tensor's size and stride` as soon as those dims are larger than 1 (often only with a
    real batch, after the tests with batch size 1 passed).

    ## Example
    ```python
    y = y.transpose(1, 2).view(B, T, C)      # y: (B, n_head, T, head_dim)
    ```

    ## Use instead
    ```python
    y = y.transpose(1, 2).reshape(B, T, C)   # or .contiguous().view(B, T, C)
    ```

    ## Stays quiet on
    - `.contiguous().view(...)`, `.reshape(...)`, `.flatten(...)`.
    - Views that only split dims, or merge dims the permute kept together:
      `x.permute(0, 2, 3, 1).view(1, -1, C)` merges dims 2 and 3, still adjacent in memory, and
      works; `x.transpose(1, 2).view(B, C, H, W)` splits a dim and works. Whenever some pair of
      neighbouring dims could be merged and the rule cannot tell which dims the view merges, it
      stays quiet. It can tell when the view's leading and trailing sizes are known to be the
      permuted tensor's own and one size is left between them, which takes all the other dims:
      `x.permute(0, 2, 3, 1).view(N, -1)` after `N, C, H, W = x.shape` merges H, W and C, and C
      is out of memory order, so it is reported.
    - Transposes of a tensor whose rank is unknown (other than `permute`, which states it),
      `view(dtype)`, `view(*shape)`, `view(shape)`.
    - A name the function may bind to more than one value where the view reads it. A name bound
      once is followed (`h = x.transpose(1, 2)` ... `h.view(B, -1)`), as are casts, comparisons
      (`pred.t().eq(target)` keeps the transposed layout) and slices that keep every dim
      (`correct[:k]`): `correct[:k].view(-1)` of the classic top-k accuracy helper raises for
      any `k > 1`.
    - Transposes of a tensor that is itself a transposed, permuted or moved view (`movedim`,
      `moveaxis`) or a `memory_format=` copy, inline or through a name (`h = x.transpose(1, 2)`
      ... `h.transpose(1, 2).view(B, -1)`): the second transpose may restore memory order.
    - `.t()` of a tensor known to have fewer than two dims: it returns the tensor as it is.
    - Dims known to have size 1 (they merge with anything).

    ## Fix safety
    Safe: `.view` → `.reshape`. Where `view` succeeds (dims of size 1), `reshape` returns the very
    same view; where it raises, `reshape` makes the copy the code needs.
    """

    only = {"visit_Call": Only(attrs=frozenset({"view"}))}

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "view"):
            return
        view_rank = self._view_rank(node)
        if view_rank is None:
            return
        source = self._reorder_through_casts(func.value)
        if source is None or source.perm is None:
            return
        perm = source.perm
        if view_rank >= len(perm) or may_be_laid_out_otherwise(self.ctx, source.base):
            return
        ones = self._size_one_dims(source)
        merged = self._surely_merged(node, source, view_rank)
        free = [mergeable(perm, i) or perm[i] in ones or perm[i + 1] in ones
                for i in (merged if merged is not None else range(len(perm) - 1))]
        # Which dims the view merges is known: one pair out of order fails. Unknown: it may merge any.
        if all(free) if merged is not None else any(free):
            return
        seg = self.ctx.segment
        receiver = f"`{seg(source.node)}`"
        if source.node is not func.value:
            receiver = f"`{seg(func.value)}`, which has the layout of {receiver},"
        self.report(func, f"`.view()` on {receiver} must merge dims the transpose took out of memory "
                          "order: it raises at run time for any dims larger than 1; use `.reshape(...)` (or "
                          "`.contiguous().view(...)`)",
                    fix=self._fix(func), end_node=node)

    def _fix(self, func: ast.Attribute):
        # Replace just the method name: `view` -> `reshape`.
        row, col = func.end_lineno, func.end_col_offset - len("view")
        anchor = ast.Name("view", lineno=row, col_offset=col, end_lineno=row, end_col_offset=func.end_col_offset)
        return self.replace(anchor, "reshape", "use `.reshape()`")

    def _view_rank(self, node: ast.Call) -> Optional[int]:
        args = node.args
        if node.keywords or not args or any(isinstance(a, ast.Starred) for a in args):
            return None
        if len(args) == 1:
            only = args[0]
            if isinstance(only, (ast.Tuple, ast.List)):
                return None if any(isinstance(e, ast.Starred) for e in only.elts) else len(only.elts)
            # A single argument may be a dtype or a shape variable: only a literal int is a rank-1 view.
            return 1 if int_const(only) is not None else None
        return len(args)

    def _reorder_through_casts(self, expr: ast.AST) -> Optional[Reorder]:
        """The transpose or permute whose layout `expr` has: `expr` itself, or what it is made of
        through casts, comparisons (an element-wise result takes its input's layout), slices
        that keep every dim (`[:k]`), and names the function binds once to such a value."""
        for _ in range(_FOLLOWED):
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and not expr.keywords and (
                    expr.func.attr in STRIDE_KEEPING or (expr.func.attr in _COMPARISONS and len(expr.args) == 1)):
                expr = expr.func.value
            elif isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _COMPARE_OPS:
                expr = expr.left
            elif isinstance(expr, ast.Subscript) and _keeps_every_dim(expr.slice):
                expr = expr.value
            elif isinstance(expr, ast.Name):
                value = assigned_value(self.ctx, expr)
                if value is None:
                    return None
                expr = value
            else:
                break
        return reorder(self.ctx, expr)

    def _surely_merged(self, node: ast.Call, source: Reorder, view_rank: int) -> Optional[range]:
        """The neighbouring pairs (i, i+1) of the permuted dims that the view certainly merges:
        its leading and trailing sizes are the permuted tensor's own (`view(N, -1)` of an
        (N, H, W, C) view), and the one size between them takes all the other dims. None when
        the sizes do not pin them."""
        shape = shape_of(self.ctx, source.base)
        perm = source.perm
        if shape is None or shape.rank != len(perm) or shape.leading:
            return None
        dims = [shape.dims[p] for p in perm]
        args = node.args[0].elts if len(node.args) == 1 and isinstance(node.args[0], (ast.Tuple, ast.List)) else node.args
        sizes = [as_dim(value_of(self.ctx, arg)) for arg in args]
        lead = 0
        while lead < view_rank - 1 and dim_eq(sizes[lead], dims[lead]):
            lead += 1
        trail = 0
        while trail < view_rank - 1 - lead and dim_eq(sizes[view_rank - 1 - trail], dims[len(dims) - 1 - trail]):
            trail += 1
        if view_rank - lead - trail != 1:
            return None
        return range(lead, len(dims) - trail - 1)

    def _size_one_dims(self, source: Reorder) -> set:
        shape = shape_of(self.ctx, source.base)
        if shape is None or shape.rank is None:
            return set()
        return {i for i, d in enumerate(shape.dims) if type(d) is int and d == 1}
