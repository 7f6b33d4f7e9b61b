"""MAT101's advice: the message, and the one batched call (`bmm`, `einsum`, a broadcast `matmul`)
that replaces the loop's GEMMs."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic.loops import LoopInfo
from matlint.semantic.shapes import shape_of

from .items import _ATOMS, _Batched


_BATCH_LETTERS = "bnzyxwvutsrqpomlkhgfedca"


class _BatchedAdvice:
    """PythonLoopMatmul's message and batched-call suggestion."""

    # -- message ----------------------------------------------------------------
    def _message(self, gemm, loop: LoopInfo, batched) -> str:
        seg = self.ctx.segment
        if gemm.op == "@":
            what = "`@`"
        elif gemm.method:
            what = f"`{gemm.spelling}()`"
        else:
            what = f"`{gemm.spelling}`"
        where = loop.described
        if gemm.op == "nn.Linear" and isinstance(gemm.node.func, ast.Subscript) and loop.depends_on_iteration(
                gemm.node.func):
            layers = seg(gemm.node.func.value)
            return (f"{what} applies a different layer of one shape on every iteration of {where}: many small "
                    f"GEMMs instead of one; stack the layers' weights once (`W = torch.stack([m.weight for m in "
                    f"{layers}])`, the biases likewise) and apply them all in one `torch.einsum` (or `bmm`) with "
                    f"the layer index as a batch dim")
        suggestion = self._suggestion(gemm, batched)
        loops = self.ctx.loops
        inner = [each for each in loops[next(i for i, e in enumerate(loops) if e is loop) + 1:]
                 if any(each.depends_on_iteration(op) for op in gemm.operands)]
        kept = (f" ({' and '.join(each.described for each in inner)} inside it can stay: "
                f"one such call per item of {'them' if len(inner) > 1 else 'it'})") if inner else ""
        return (f"{what} runs once per iteration of {where}: many small GEMMs instead of one; "
                f"{suggestion}{kept}")

    def _suggestion(self, gemm, batched) -> str:
        seg = self.ctx.segment
        ops = gemm.operands
        items = [seg(b.base) if b else seg(op) for b, op in zip(batched, ops)]
        present = [b for b in batched if b is not None]
        # `x[i] @ x[j]` over two loop variables: all pairs, not one batch
        plain = all(b.plain for b in present) and len({b.index for b in present}) == 1
        dim0 = plain and all(b.dim == 0 for b in present)
        generic = ("do all iterations in one call: `torch.matmul`/`bmm` with the loop's items as a batch "
                   "dimension, or `torch.einsum` with a batch index")
        if any(b.keeps_dim for b in present) and not (
                gemm.op in ("nn.Linear", "linear")
                or gemm.op in ("@", "matmul", "mm") and batched[0] is not None and len(present) == 1):
            return generic  # `x[i:i + 1]` keeps its dim: only a left operand or a layer's input batches as is
        if gemm.op == "einsum":
            eq = self._batched_einsum(gemm.subscripts, batched) if plain else None
            return f'use one call: `torch.einsum("{eq}", {", ".join(items)})`' if eq else generic
        if gemm.op in ("nn.Linear", "linear") and plain and batched[0] is not None and len(present) == 1:
            call = gemm.spelling if gemm.op == "nn.Linear" else seg(gemm.node.func)
            args = [items[0]] + [seg(a) for a in gemm.node.args[1:]] + [
                f"{k.arg}={seg(k.value)}" if k.arg else f"**{seg(k.value)}" for k in gemm.node.keywords]
            then = "" if batched[0].dim == 0 else f" and index dim {batched[0].dim} of the result"
            return (f"apply it once to the whole tensor: `{call}({', '.join(args)})`{then} "
                    f"(a linear layer maps the last dim over any leading dims)")
        if gemm.op in ("nn.Linear", "linear") and batched[0] is not None and len(present) == 1:
            item = batched[0]
            if item.dim is not None and item.sources == (item.base,):
                return (f"apply it once to the whole `{items[0]}`, after the same steps that make its item here, "
                        f"and index dim {item.dim} of the result (a linear layer maps the last dim over any "
                        f"leading dims)")
            if len(item.sources) > 1:
                names = [f"`{seg(source)}`" for source in item.sources]
                whole = ", ".join(names[:-1]) + " and " + names[-1]
                return (f"build its input for every iteration at once, by the same steps on the whole {whole}, "
                        f"and apply it once (a linear layer maps the last dim over any leading dims)")
            return generic
        if len(ops) != 2 or not dim0:
            return generic
        a, b = [text if isinstance(op, _ATOMS) else f"({text})"
                for text, op in zip(items, [bt.base if bt else op for bt, op in zip(batched, ops)])]
        if gemm.op in ("@", "matmul", "mm", "bmm"):
            return self._matmul_suggestion(gemm.op, batched, ops, a, b) or generic
        if gemm.op in ("dot", "inner") and len(present) == 2:
            return f"use one call: `({a} * {b}).sum(-1)`"
        if gemm.op == "mv":
            if len(present) == 2:
                return f'use one call: `torch.einsum("bij,bj->bi", {a}, {b})`'
            if batched[0] is not None:
                return f'use one call: `torch.einsum("bij,j->bi", {a}, {b})`'
            return f"use one call: `{b} @ {a}.T`"
        return generic

    def _matmul_suggestion(self, op: str, batched, ops, a: str, b: str) -> Optional[str]:
        """The batched call for `a[i] @ b[i]`, `a[i] @ b` or `a @ b[i]`. `matmul` treats a 1-D
        operand as a vector, not as a batch of scalars: `A @ x[i]` over vectors `x[i]` is
        `x @ A.T`, not `A @ x`. `mm` and `bmm` take matrices only."""
        left, right = batched
        if left is not None and right is not None:
            if op in ("mm", "bmm"):
                return f"use one batched call: `{'torch.bmm' if op == 'mm' else 'torch.matmul'}({a}, {b})`"
            ranks = (self._item_rank(left), self._item_rank(right))
            if ranks == (1, 1):
                return f"use one call: `({a} * {b}).sum(-1)`"
            if ranks == (2, 1):
                return f'use one call: `torch.einsum("bij,bj->bi", {a}, {b})`'
            if ranks == (1, 2):
                return f'use one call: `torch.einsum("bj,bjk->bk", {a}, {b})`'
            if None in ranks:
                return (f"use one batched call: `torch.matmul({a}, {b})` if each item is a matrix "
                        f"(with vector items, `torch.einsum` with a batch index)")
            return f"use one batched call: `torch.matmul({a}, {b})`" if min(ranks) >= 2 else None
        broadcast = f"use one batched call: `{a} @ {b}` (matmul broadcasts over the batch dim)"
        fixed = shape_of(self.ctx, ops[1] if left is not None else ops[0])
        if fixed is not None and fixed.rank is not None and fixed.rank > 2:
            return None  # its own batch dims would meet the loop's
        if left is not None or op in ("mm", "bmm"):
            return broadcast
        rank = self._item_rank(right)
        if rank is not None and rank >= 2:
            return broadcast
        if fixed is not None and fixed.rank == 1:
            vector_form = f"`{b} @ {a}`"
        elif fixed is not None and fixed.rank == 2:
            vector_form = f"`{b} @ {a}.T`"
        else:
            vector_form = f"`{b} @ {a}.T` for a 2-D `{a}`"
        if rank == 1:
            return f"use one call: {vector_form}"
        return (f"use one batched call: `{a} @ {b}` if each item of `{b}` is a matrix "
                f"(with vector items, {vector_form})")

    def _item_rank(self, item: _Batched) -> Optional[int]:
        shape = shape_of(self.ctx, item.base)
        return shape.rank - 1 if shape is not None and shape.rank else None

    @staticmethod
    def _batched_einsum(subscripts: Optional[str], batched) -> Optional[str]:
        if not subscripts or "->" not in subscripts or "." in subscripts:
            return None
        lhs, rhs = subscripts.replace(" ", "").split("->")
        terms = lhs.split(",")
        if len(terms) != len(batched):
            return None
        letter = next((c for c in _BATCH_LETTERS if c not in subscripts), None)
        if letter is None:
            return None
        if any(b is not None and b.dim > len(t) for t, b in zip(terms, batched)):
            return None
        terms = [t[:b.dim] + letter + t[b.dim:] if b is not None else t for t, b in zip(terms, batched)]
        return ",".join(terms) + "->" + letter + rhs
