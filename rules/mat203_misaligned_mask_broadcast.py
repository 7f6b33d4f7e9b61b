"""MAT203 misaligned-mask-broadcast: a (B, T) mask meets (B, H, T, T) scores aligned from the right."""
from __future__ import annotations

import ast

from matlint.rule import Only, Rule
from matlint.semantic.shapes import (Shape, broadcast_is_valid, dim_eq, fmt_dim, fmt_shape, make_shape, never_shaped,
                                   shape_of)
from matlint.rules.mat201_trailing_one_broadcast import operand_source

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# The same operations as methods and torch functions (`h.mul(mask)`, `torch.mul(h, mask)`, `h.mul_(mask)`).
_METHODS = {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide"}


def _matches(small, big) -> bool:
    return all(dim_eq(x, y) or (x == 1 and isinstance(x, int)) for x, y in zip(small, big))


def expansions(mask: Shape, target: Shape) -> list:
    """Each indexing (`[:, None, None, :]`, `[:, :, None]`) that lines `mask` up with `target`:
    leading mask axes against the target's leading axes, the rest against its trailing axes,
    all known sizes equal. Empty when plain right alignment is known to work, or any size or
    rank is unknown."""
    if mask.leading or target.leading or mask.explicit:
        return []
    rm, rt = len(mask.dims), len(target.dims)
    if rt < 3 or not 2 <= rm < rt or broadcast_is_valid(mask, target):
        return []
    if any(d is None for d in mask.dims) or all(d == 1 for d in mask.dims):
        return []
    found = []
    for k in range(1, rm + 1):
        head, tail = mask.dims[:k], mask.dims[k:]
        if _matches(head, target.dims[:k]) and _matches(tail, target.dims[rt - len(tail):]):
            parts = [":"] * k + ["None"] * (rt - rm) + [":"] * (rm - k)
            while parts[-1] == parts[-2] == ":":  # trailing full slices are implicit; keep one after the last None
                parts.pop()
            found.append("[" + ", ".join(parts) + "]")
    return found


class MisalignedMaskBroadcast(Rule):
    code = "MAT203"
    name = "misaligned-mask-broadcast"
    summary = "A mask or bias broadcast against attention scores lines up the wrong axes"
    docs = """
    ## What it does
    Finds a mask or bias of shape `(B, T)` (or `(B, T, T)`) combined with scores of shape
    `(B, H, T, T)`, or a `(B, T)` padding mask combined with hidden states `(B, T, C)`, by `+`,
    `-`, `*`, `/` (also in place, `scores += bias`, and as `torch.mul`, `h.mul(mask)`, ...),
    `scores.masked_fill(mask, ...)` (also `mask=` as a keyword) or `torch.where(mask, scores, ...)`
    (also bare `where` after `from torch import where`), or passed as the `attn_mask` of
    `F.scaled_dot_product_attention(q, k, v, ...)` (which broadcasts it against the scores,
    q's shape with k's length last: `(B, H, T, S)`), without expanding the mask first. Broadcasting aligns
    shapes from the right, so `(B, T)` is read as `(1, 1, B, T)`: the batch axis of the mask
    meets the query axis of the scores. The rule fires when both shapes are known, right
    alignment is not known to work, and a placement of the mask's axes (leading axes against
    the target's leading axes, the rest against its trailing axes) matches the known sizes.

    ## Why is this bad?
    When `B != T` it raises at run time, but only on the shapes that differ: with batch size 1,
    or when `B == T`, it runs and silently masks query rows by batch element. Either way the
    mask is not applied where the author meant.

    ## Example
    ```python
    scores = q @ k.transpose(-2, -1)          # (B, H, T, T)
    scores = scores.masked_fill(pad == 0, float("-inf"))   # pad: (B, T)
    ```

    ## Use instead
    ```python
    scores = scores.masked_fill(pad[:, None, None, :] == 0, float("-inf"))
    ```

    ## Stays quiet on
    Masks already expanded (`[:, None, None, :]`, `unsqueeze`, `view(B, 1, 1, T)`); masks whose
    right alignment works for every size (`(T, T)` causal masks, `(1, 1, T, T)` buffers);
    shapes with an unknown size or rank, also where the size the mask's axes meet is unknown
    (after a misaligned broadcast the scores' query axis is unknown: the first finding is the
    one to fix); masks that match no placement (they are not this pattern); one-dim masks.

    ## Fix safety
    The fix inserts the indexing that lines the mask up (`mask[:, None, None, :]`,
    `mask[:, :, None]`). It is unsafe: it changes which elements are masked (to the intended
    ones). When more than one placement matches (a `(B, T)` mask against `(B, T, T)` scores may
    mask keys or queries) the message lists them and no fix is offered.
    """

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) in _BINOPS:
            self._check(node, node.left, node.right) or self._check(node, node.right, node.left)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if type(node.op) in _BINOPS:
            self._check(node, node.value, node.target)

    only = {"visit_Call": Only(attrs=frozenset(
        {"masked_fill", "masked_fill_", "where", "scaled_dot_product_attention"} | _METHODS
        | {m + "_" for m in _METHODS}))}

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if not isinstance(func, (ast.Attribute, ast.Name)) or any(isinstance(a, ast.Starred) for a in args):
            return
        qual = self.ctx.qualname(func)
        if qual is not None:  # `torch.where(...)`, or `where(...)` after `from torch import where`
            name = qual[len("torch."):] if qual.startswith("torch.") else None
            if qual == "torch.nn.functional.scaled_dot_product_attention":
                self._check_sdpa(node)
            elif name == "masked_fill":
                scores, mask = _argument(node, 0, "input"), _argument(node, 1, "mask")
                if scores is not None and mask is not None:
                    self._check(node, mask, scores)
            elif name == "where":
                condition = _argument(node, 0, "condition")
                for other in (_argument(node, 1, "input"), _argument(node, 2, "other")):
                    if condition is not None and other is not None and self._check(node, condition, other):
                        return
            elif node.keywords:
                return  # `alpha=`, `rounding_mode=`, `out=`: leave them be
            elif name in _METHODS and len(args) == 2:
                self._check(node, args[0], args[1]) or self._check(node, args[1], args[0])
        elif isinstance(func, ast.Attribute):
            attr = func.attr
            if attr in ("masked_fill", "masked_fill_"):
                mask = _argument(node, 0, "mask")
                if mask is not None:
                    self._check(node, mask, func.value)
            elif node.keywords:
                return
            elif attr in _METHODS and len(args) == 1:
                self._check(node, func.value, args[0]) or self._check(node, args[0], func.value)
            elif attr[:-1] in _METHODS and len(args) == 1:
                self._check(node, args[0], func.value)  # in place: the receiver keeps its shape

    def _check_sdpa(self, node: ast.Call) -> None:
        """`F.scaled_dot_product_attention(q, k, v, attn_mask=mask)` broadcasts the mask against
        the scores, `(..., L, S)`: q's shape with k's sequence length last."""
        query, key, mask_node = _argument(node, 0, "query"), _argument(node, 1, "key"), _argument(node, 3, "attn_mask")
        if query is None or key is None or mask_node is None or never_shaped(mask_node, self.ctx):
            return
        q, k = shape_of(self.ctx, query), shape_of(self.ctx, key)
        if q is None or k is None or q.leading or k.leading or len(q.dims) < 3 or len(k.dims) != len(q.dims):
            return
        self._check(node, mask_node, None, make_shape(q.dims[:-1] + k.dims[-2:-1]))

    def _check(self, node, mask_node, target_node, target=None) -> bool:
        if never_shaped(mask_node, self.ctx) or (target is None and never_shaped(target_node, self.ctx)):
            return False
        mask = shape_of(self.ctx, mask_node)
        if target is None:
            target = shape_of(self.ctx, target_node)
        if mask is None or target is None:
            return False
        indexings = expansions(mask, target)
        if not indexings:
            return False
        fix_node = _mask_leaf(mask_node)
        index = " or ".join(f"`{i}`" for i in indexings)
        pad = len(target.dims) - len(mask.dims)
        aligned = make_shape((1,) * pad + mask.dims)
        # An axis where right alignment meets two different known sizes. Where the target's size
        # is unknown there, it is often the trace of an earlier misaligned broadcast (whose
        # finding is enough): stay quiet.
        clash = next((i for i, (m, t) in enumerate(zip(aligned.dims, target.dims))
                      if t is not None and not (dim_eq(m, t) or m == 1 or t == 1)), None)
        if clash is None:
            return False
        fix = None
        if len(indexings) == 1:
            fix = self.replace(fix_node, operand_source(self.ctx, fix_node) + indexings[0],
                               f"Expand the mask with `{indexings[0]}`", safe=False)
        self.report(node, (
            f"mask {fmt_shape(mask)} against {fmt_shape(target)} broadcasts as {fmt_shape(aligned)}: its "
            f"{fmt_dim(aligned.dims[clash])} meets axis {clash} ({fmt_dim(target.dims[clash])}) of {fmt_shape(target)}; "
            f"expand it with {index}{' (whichever axes it belongs to)' if fix is None else ''}"), fix=fix)
        return True


def _argument(node: ast.Call, position: int, keyword: str):
    """The argument passed at `position` or as `keyword=`, or None."""
    if len(node.args) > position:
        return node.args[position]
    return next((k.value for k in node.keywords if k.arg == keyword), None)


def _mask_leaf(node):
    """`pad == 0` is fixed as `pad[...] == 0`: index the tensor, not the comparison."""
    if isinstance(node, ast.Compare) and len(node.comparators) == 1 and isinstance(node.comparators[0], ast.Constant):
        return node.left
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return node.operand
    return node
