"""MAT203 misaligned-mask-broadcast: a (B, T) mask meets (B, H, T, T) scores aligned from the right."""
from __future__ import annotations

import ast

from matlint.rule import Only, Rule, bad, good
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
    examples = [
        bad("""
            import torch

            def attend(x, pad, n_head: int):
                B, T, C = x.shape
                q = x.view(B, T, n_head, C // n_head).transpose(1, 2)
                k = x.view(B, T, n_head, C // n_head).transpose(1, 2)
                scores = q @ k.transpose(-2, -1)
                assert pad.shape == (B, T)
                scores = scores.masked_fill(pad == 0, float("-inf"))
                return scores.softmax(-1)
            """, (9, 14), fixed="""
            import torch

            def attend(x, pad, n_head: int):
                B, T, C = x.shape
                q = x.view(B, T, n_head, C // n_head).transpose(1, 2)
                k = x.view(B, T, n_head, C // n_head).transpose(1, 2)
                scores = q @ k.transpose(-2, -1)
                assert pad.shape == (B, T)
                scores = scores.masked_fill(pad[:, None, None, :] == 0, float("-inf"))
                return scores.softmax(-1)
            """, unsafe=True, message_contains="mask (B, T) against (B, n_head, T, T) broadcasts as (1, 1, B, T): its B meets axis 2 (T)"),
        bad("""
            import torch
            from jaxtyping import Float
            from torch import Tensor

            def pool(h: Float[Tensor, "B T C"], m: Float[Tensor, "B T"], s: Float[Tensor, "B H T T"]):
                a = h.mul(m).sum(1)
                b = torch.mul(m, h).sum(1)
                h.mul_(m)
                c = torch.masked_fill(s, m == 0, float("-inf"))
                return a, b, c
            """, (6, 9), (7, 9), (8, 5), (9, 9), fixed="""
            import torch
            from jaxtyping import Float
            from torch import Tensor

            def pool(h: Float[Tensor, "B T C"], m: Float[Tensor, "B T"], s: Float[Tensor, "B H T T"]):
                a = h.mul(m[:, :, None]).sum(1)
                b = torch.mul(m[:, :, None], h).sum(1)
                h.mul_(m[:, :, None])
                c = torch.masked_fill(s, m[:, None, None, :] == 0, float("-inf"))
                return a, b, c
            """, unsafe=True),
        good("""
            import torch
            from jaxtyping import Float
            from torch import Tensor

            def pool(h: Float[Tensor, "B T C"], m: Float[Tensor, "B T"], s: Float[Tensor, "B H T T"]):
                a = h.mul(m[:, :, None]).sum(1)
                b = torch.add(h, m[..., None], alpha=2)
                c = torch.masked_fill(s, m[:, None, None, :] == 0, float("-inf"))
                d = s.masked_fill(m[:, None, None, :] == 0, 0.0)
                return a, b, c, d
            """),
        bad("""
            import torch
            from jaxtyping import Float
            from torch import Tensor

            def add_bias(scores: Float[Tensor, "b h q k"], bias: Float[Tensor, "b k"]):
                return scores + bias
            """, (6, 12), fixed="""
            import torch
            from jaxtyping import Float
            from torch import Tensor

            def add_bias(scores: Float[Tensor, "b h q k"], bias: Float[Tensor, "b k"]):
                return scores + bias[:, None, None, :]
            """, unsafe=True),
        bad("""
            import torch

            def f(B: int, H: int, T: int):
                scores = torch.randn(B, H, T, T)
                mask = torch.ones(B, T, T, dtype=torch.bool)
                out = torch.where(mask, scores, torch.zeros_like(scores))
                return scores * mask, out
            """, (6, 11), (7, 12), message_contains="expand it with `[:, None, :]`"),
        bad("""
            import torch

            class Attention(torch.nn.Module):
                def forward(self, q, k, key_padding_bias):
                    B, H, T, D = q.shape
                    assert k.shape == q.shape
                    attn = q @ k.transpose(-2, -1)
                    assert key_padding_bias.shape == (B, T)
                    attn += key_padding_bias
                    return attn.softmax(dim=-1)
            """, (9, 9), fixed="""
            import torch

            class Attention(torch.nn.Module):
                def forward(self, q, k, key_padding_bias):
                    B, H, T, D = q.shape
                    assert k.shape == q.shape
                    attn = q @ k.transpose(-2, -1)
                    assert key_padding_bias.shape == (B, T)
                    attn += key_padding_bias[:, None, None, :]
                    return attn.softmax(dim=-1)
            """, unsafe=True),
        bad("""
            import torch

            def masked_mean(hidden, mask):
                B, T, C = hidden.shape
                assert mask.shape == (B, T)
                return (hidden * mask).sum(1) / mask.sum(1, keepdim=True)
            """, (6, 13), fixed="""
            import torch

            def masked_mean(hidden, mask):
                B, T, C = hidden.shape
                assert mask.shape == (B, T)
                return (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
            """, unsafe=True, message_contains="broadcasts as (1, B, T): its B meets axis 1 (T)"),
        bad("""
            import torch

            def f(B: int, T: int):
                scores = torch.randn(B, T, T)
                pad = torch.ones(B, T)
                return scores * pad
            """, (6, 12), message_contains="`[:, None, :]` or `[:, :, None]` (whichever axes it belongs to)"),
        bad("""
            import torch
            def run(loader):
                for hidden, mask in loader:
                    B, T, C = hidden.shape
                    assert mask.shape == (B, T)
                    pooled = (hidden * mask).sum(1)
            """, (6, 19)),
        bad("""
            import math
            import torch

            def attend(q, k, pad, temperature: float):
                B, H, T, D = q.shape
                assert k.shape == (B, H, T, D) and pad.shape == (B, T)
                s1 = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
                s1 = s1.masked_fill(pad == 0, float("-inf"))
                s2 = q @ k.transpose(-2, -1) / D ** 0.5
                s2 = s2.masked_fill(pad == 0, float("-inf"))
                scale = D ** -0.5 / temperature
                s3 = (q @ k.transpose(-2, -1) * scale).masked_fill(pad == 0, 0.0)
                return s1, s2, s3
            """, (8, 10), (10, 10), (12, 10)),
        bad("""
            import torch
            from torch import where

            def f(B: int, H: int, T: int):
                scores = torch.randn(B, H, T, T)
                pad = torch.ones(B, T, dtype=torch.bool)
                return where(pad, scores, 0.0), scores.masked_fill(mask=pad, value=0.0)
            """, (7, 12), (7, 37), fixed="""
            import torch
            from torch import where

            def f(B: int, H: int, T: int):
                scores = torch.randn(B, H, T, T)
                pad = torch.ones(B, T, dtype=torch.bool)
                return where(pad[:, None, None, :], scores, 0.0), scores.masked_fill(mask=pad[:, None, None, :], value=0.0)
            """, unsafe=True),
        bad("""
            import torch

            def f(x, n_head: int):
                B, T, C = x.shape
                mask = torch.ones(B, T)
                att = torch.randn(B, n_head, T, T)
                att = att.masked_fill(mask == 0, -1e9)  # att is (B, n_head, ?, T) from here on
                att = att.masked_fill_(mask.bool(), 0.0)
                return att
            """, (7, 11)),
        good("""
            import torch
            from jaxtyping import Bool, Float
            from torch import Tensor
            def masked_mean(h: Float[Tensor, "B T C"], mask: Bool[Tensor, "B T"]):
                mask = mask.float()
                mask.unsqueeze_(-1)
                return (h * mask).sum(1) / mask.sum(1)
            """),
        good("""
            import torch

            def f(B: int, H: int, T: int, pad):
                scores = torch.randn(B, H, T, T)
                mask = torch.ones(B, T, dtype=torch.bool)
                a = scores.masked_fill(mask[:, None, None, :], 0.0)
                b = scores + mask.unsqueeze(1).unsqueeze(2)
                causal = torch.ones(T, T).tril()
                c = scores * causal
                d = scores.masked_fill(mask.view(B, 1, 1, T), 0.0)
                e = scores + pad
                return a, b, c, d, e
            """),
        bad("""
            import torch.nn.functional as F
            from jaxtyping import Bool, Float
            from torch import Tensor

            def attend(q: Float[Tensor, "B H T D"], k: Float[Tensor, "B H S D"], v: Float[Tensor, "B H S D"],
                       pad: Bool[Tensor, "B S"], causal: Bool[Tensor, "T S"]):
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=pad)
                b = F.scaled_dot_product_attention(q, k, v, pad)
                c = F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :])
                d = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
                return a, b, c, d
            """, (7, 9), (8, 9), fixed="""
            import torch.nn.functional as F
            from jaxtyping import Bool, Float
            from torch import Tensor

            def attend(q: Float[Tensor, "B H T D"], k: Float[Tensor, "B H S D"], v: Float[Tensor, "B H S D"],
                       pad: Bool[Tensor, "B S"], causal: Bool[Tensor, "T S"]):
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :])
                b = F.scaled_dot_product_attention(q, k, v, pad[:, None, None, :])
                c = F.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :])
                d = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
                return a, b, c, d
            """, unsafe=True, message_contains="mask (B, S) against (B, H, T, S) broadcasts as (1, 1, B, S)"),
    ]

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
        if query is None or key is None or mask_node is None or never_shaped(mask_node):
            return
        q, k = shape_of(self.ctx, query), shape_of(self.ctx, key)
        if q is None or k is None or q.leading or k.leading or len(q.dims) < 3 or len(k.dims) != len(q.dims):
            return
        self._check(node, mask_node, None, make_shape(q.dims[:-1] + k.dims[-2:-1]))

    def _check(self, node, mask_node, target_node, target=None) -> bool:
        if never_shaped(mask_node) or (target is None and never_shaped(target_node)):
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
