"""MAT302 strided-gemm-input: a GEMM operand whose layout forces a hidden copy on every call."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of, has_word
from matlint.semantic.kinds import FACTORIES, int_const
from matlint.semantic.layout import (STRIDE_KEEPING, Reorder, gemm_candidates, gemm_of_operand, mergeable, rank_of,
                                     reads_of_assigned, reorder)
from matlint.semantic.shapes import self_name_of
from matlint.semantic.torch_api import as_gemm
from matlint.semantic.tree import child_nodes, function_text

_FOLDING = ("nn.Linear", "linear")
# Tensor factories whose result does not require grad unless asked (`as_tensor`/`asarray` may return their argument).
_NO_GRAD_FACTORIES = FACTORIES - {"as_tensor", "asarray"}
_PRODUCE = "produce it in the layout the GEMM reads (weights: transpose or select once at init)"
_PARAMETER = ("torch.nn.Parameter", "torch.nn.parameter.Parameter")
# Iterating these gives a module's parameters (or modules holding them): freezing the items freezes the receiver.
_PARAMETER_ITERATORS = {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children"}
# Views of a tensor that keep the layout a layer gave it (chunks and slices of its features, split dims).
_LAYOUT_KEEPING = STRIDE_KEEPING | {"view", "view_as", "reshape", "reshape_as", "chunk", "split", "tensor_split",
                                    "unflatten", "unbind", "contiguous"}


@dataclass
class _Copy:
    """Why a GEMM copies an operand (and when), who makes the copy, and what avoids it."""
    why: str
    who: str
    advice: str
_REORDERS = ("permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis")


def _strided_last_dim(ctx, operand: ast.AST) -> bool:
    """`x[..., ::2]`, `x[:, 1::2]` of a tensor of known rank: the last dim has a step."""
    if not isinstance(operand, ast.Subscript) or not isinstance(operand.slice, ast.Tuple):
        return False
    elts = operand.slice.elts
    last = elts[-1]
    if not isinstance(last, ast.Slice) or last.step is None or int_const(last.step) in (1, -1):
        return False
    if any(isinstance(e, ast.Starred) for e in elts) or reorder(ctx, operand.value) is not None:
        return False
    first_is_ellipsis = isinstance(elts[0], ast.Constant) and elts[0].value is Ellipsis
    if first_is_ellipsis:
        return len(elts) >= 2
    if any(isinstance(e, ast.Constant) and e.value in (None, Ellipsis) for e in elts):
        return False
    return rank_of(ctx, operand.value) == len(elts) and len(elts) >= 2


def _spelled_as_operand(name: str, text: str) -> bool:
    """`text` may pass `name` to a GEMM as it is: an argument standing alone (`self.fc(h)`,
    `torch.matmul(h, w)`) or a side of `@`."""
    word = re.escape(name)
    return re.search(r"[(,]\s*%s\s*[,)]|@\s*%s\b|\b%s\s*@" % (word, word, word), text) is not None


def _stored_where(gemm, view: Reorder, base: str) -> str:
    """Where the advice's `base` is the tensor in its stored layout: said when the operand is a
    name assigned the view elsewhere, for there the name may hold the view by then."""
    node, inner = gemm.node, view.node
    if (node.lineno, node.col_offset) <= (inner.lineno, inner.col_offset) and \
            (inner.end_lineno, inner.end_col_offset) <= (node.end_lineno, node.end_col_offset):
        return ""
    return f"; here `{base}` is the tensor that line {inner.lineno} reorders, as it was before"


class StridedGemmInput(Rule):
    code = "MAT302"
    name = "strided-gemm-input"
    summary = "A GEMM operand cuBLAS cannot read in place (strided last dim, permuted batch dims): a hidden copy before the GEMM."
    runtime_docs = """
    The guard reports GEMM operands that cuBLAS copies before the GEMM (no unit stride in the
    last two dims) and the copies `matmul` makes to fold permuted batch dims, with shapes and
    strides. At attention's two GEMMs the copies are MAT601's (its SDPA call takes q, k and v as
    they are). The estimate times the copy.
    """
    docs = """
    ## What it does
    Flags GEMM operands whose memory layout forces a copy before the matrix units can read
    them, following the rule cuBLAS applies (`prepare_matrix_for_cublas`: a matrix is read in
    place when one of its last two dims has stride 1 and the other a stride at least the
    row length; `matmul` folds batch dims with `reshape`, which copies when they cannot merge):
    - a step slice of the last dim (`x[:, ::2] @ w`, `x[..., 1::2] @ w`, `F.linear(x[..., ::2], w)`):
      no dim has stride 1 any more;
    - a permute written inline as an operand whose leading dims `matmul` folds but cannot merge:
      `x.permute(1, 0, 2) @ w` (a 3-D left operand with a matrix on the right, or any input of a
      linear layer: matmul folds these only when the matrix requires grad, as every trainable
      parameter does, even under `torch.no_grad()`, an `nn.Parameter` (`self.W =
      nn.Parameter(torch.randn(d, k))`) included; otherwise it runs `bmm` on the view without a
      copy), and `torch.matmul(a.permute(0, 2, 1, 3), b.permute(0, 2, 3, 1))` (two batched
      operands: always folded);
    - a permute that leaves no unit-stride dim among the last two (`torch.bmm(x.permute(2, 0, 1), y)`);
    - the input of a trainable `nn.Linear` with its last two dims swapped (`self.fc(x.permute(0, 2,
      1))` of a 3-D `x`): the layer folds the leading dims, which now hold the old last dim, into
      rows; `torch.matmul(self.fc.weight.expand(*x.shape[:-2], -1, -1), x)` (plus the bias as a
      column) is the output already swapped back, read in place;
    - the input of a trainable linear layer with two dims swapped where the dims named show a
      rank of at least 3 (`self.fc(self.norm(x).transpose(1, 2))`), the rank itself unknown:
      whichever two dims of such a tensor are swapped, the rows the layer folds cannot merge.

    Each of these is found inline and through a name the function assigns it to (`h =
    x.permute(1, 0, 2)`, or an item of `a, h = ..., x.permute(1, 0, 2)`) and the GEMM reads,
    where that view is the only value the name can hold there.

    The message says when the GEMM runs inside a loop, where the copy repeats per iteration, and
    what avoids the copy: multiplying in the stored layout and permuting the product where the
    permute keeps the last dim in place (`(h @ w).permute(1, 0, 2)`); listing the batch dims in
    memory order in both operands and permuting the product back, where both store them together
    in the same order; otherwise only a tensor made in the layout the GEMM reads (for an operand
    of unknown origin, it adds that where a layer's output fixes the layout, the copy is the
    price of that product).

    ## Why is this bad?
    The copy is hidden inside the GEMM call (an `aten::clone` in matmul's `reshape`, or a copy
    inside the cuBLAS path that not even a dispatch mode sees): an extra kernel and a full read
    and write of the operand on every call, and usually again in backward.
    Laying the data out the way the GEMM reads it once (store the weight transposed at init,
    produce activations in `(..., rows, K)` order) removes it.

    ## Example
    ```python
    y = x[:, ::2] @ w                        # every other input feature
    z = h.permute(1, 0, 2) @ w               # (T, B, D) -> (B, T, D) then folded to rows
    ```

    ## Use instead
    ```python
    x_even = x[:, ::2].contiguous()          # once, where x is made or before the loop that reuses it
    y = x_even @ w
    z = (h @ w).permute(1, 0, 2)             # multiply in the stored layout, permute the result
    s = torch.matmul(q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0)).permute(1, 0, 2, 3)
                                             # not q.permute(2, 1, 0, 3) and k.permute(2, 1, 3, 0)
    ```

    ## Stays quiet on
    - Layouts cuBLAS reads for free: a plain transpose of the last two dims (`x @ w.T`, `.mT`,
      `transpose(-2, -1)`), row-strided slices (`x[::2] @ w`, `x[:, ::2]` of a 3-D tensor, which
      steps the rows), and permutes of the batch dims of `bmm` or of a batched matmul whose batch
      dims still merge.
    - Operands whose rank or layout it cannot see: names that may hold another value (a permute
      assigned on one path only) or that the GEMM reads through a slice, slices of tensors of
      unknown rank (`x[:, ::2]` could step a row dim), bases that are themselves transposed, and
      `self.fc(x.transpose(0, 1))` of unknown rank (a matrix is read transposed in place).
    - A permuted input times a matrix that never requires grad: a tensor factory such as
      `torch.randn(128, 8)`, inline or as the only value of a name, in a function that never
      mentions `requires_grad` (matmul does not fold then).
    - A layer or matrix the file may freeze: `self.fc.requires_grad_(False)`, `p.requires_grad =
      False` in a loop over `self.fc.parameters()`, `self.requires_grad_(False)`,
      `nn.Parameter(..., requires_grad=False)`, or a freeze of anything it cannot tell apart from
      the layer (a helper's parameter, `model.fc`). Freezing another attribute of the same class
      (`self.backbone.requires_grad_(False)`) leaves the layer trainable, and it is reported.
    - Copies that no layout can avoid: an operand whose batch dims cannot be brought together, or
      that has no unit-stride dim among its last two, when it is a view of a GEMM's output made in
      the same function (`q, k = self.qk(x).chunk(2, -1)`, `q = q.view(b, t, h, d)`, then
      `torch.matmul(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1))`): the layer fixes the layout,
      and no other spelling (einsum, an explicit `.contiguous()`) saves the copy.

    ## Fix safety
    No automatic fix: the better layout has to be produced where the data is created.
    """

    # The operand is visited: a step slice, or a call of `permute`/`transpose`/... (a method or a bare name).
    only = {"visit_Call": Only(attrs=frozenset(_REORDERS))}

    def visit_Call(self, node: ast.Call) -> None:
        self._visit_operand(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._visit_operand(node)

    def _visit_operand(self, node) -> None:
        if not self._maybe_strided(node):
            return
        gemm_node = gemm_of_operand(self.ctx, node, self._maybe_strided)
        if gemm_node is not None:
            self.check_gemm(gemm_node)
            return
        # `h = x.permute(1, 0, 2)` (or `a, h = ..., x.permute(1, 0, 2)`), then `self.fc(h)`: each
        # GEMM that reads the name directly, where the name holds this view and nothing else.
        operand = lambda load, parent: parent is not None and load in gemm_candidates(parent)
        for load in reads_of_assigned(self.ctx, node, operand, _spelled_as_operand):
            flow = flow_of(self.ctx, self.ctx.function)
            parent = flow.parent[load]
            self.check_gemm(parent, named=(load, node), in_loop=bool(flow.loops_around(parent)))

    def check_gemm(self, node: ast.AST, named=None, in_loop=None) -> None:
        """Report the operands of GEMM `node` that it copies; with `named` (a name operand and the
        view it holds), that operand alone."""
        gemm = as_gemm(self.ctx, node)
        if gemm is None or gemm.op not in ("@", "matmul", "mm", "bmm") + _FOLDING:
            return
        operands = gemm.operands[:1] if gemm.op in _FOLDING else gemm.operands
        if len(gemm.operands) != (1 if gemm.op == "nn.Linear" else 2):
            return
        for position, operand in enumerate(operands):
            if named is not None and operand is not named[0]:
                continue
            copy = self._copy(gemm, position, operand, named[1] if named is not None else operand)
            if copy is not None:
                looped = bool(self.ctx.loops) if in_loop is None else in_loop
                where = " on every iteration of the loop" if looped else " on every call"
                self.report(operand, f"`{self.ctx.segment(operand)}` {copy.why}, so {copy.who} copies it{where}; "
                                     f"{copy.advice}")

    @staticmethod
    def _maybe_strided(expr: ast.AST) -> bool:
        """Syntax alone: a step slice, or a permute/transpose call (`.t()`, `.T`, `.mT` are always free)."""
        if isinstance(expr, ast.Subscript):
            last = expr.slice.elts[-1] if isinstance(expr.slice, ast.Tuple) and expr.slice.elts else None
            return isinstance(last, ast.Slice) and last.step is not None
        if not isinstance(expr, ast.Call):
            return False
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", None)
        return name in _REORDERS

    def _copy(self, gemm, position: int, operand: ast.AST, viewed: ast.AST) -> Optional[_Copy]:
        """Why `gemm` copies `operand`, which holds the value of `viewed` (itself, or the view a
        name operand was assigned), or None."""
        if _strided_last_dim(self.ctx, viewed):
            return _Copy("steps through its last dim, leaving no dim with stride 1", "the GEMM", _PRODUCE)
        view = reorder(self.ctx, viewed, 3 if gemm.op == "bmm" else None)  # bmm takes 3-D batches only
        if (view is not None and view.last_two_only and view.perm and len(view.perm) >= 3
                and gemm.op == "nn.Linear" and isinstance(view.node, ast.Call)):
            # `self.fc(x.permute(0, 2, 1))`: the layer folds (B, C) into rows, which cannot merge
            return None if self._may_be_frozen(gemm.node.func) else self._fold_transposed(gemm, view)
        if (view is not None and view.perm is None and view.min_rank >= 3 and gemm.op in _FOLDING
                and isinstance(view.node, ast.Call) and self._trainable_weight(gemm)):
            # `self.fc(x.transpose(1, 2))`: a tensor of rank 3 or more with two dims swapped, whatever the rank
            return self._fold_swapped(gemm, view)
        if view is None or view.perm is None or view.last_two_only or not isinstance(view.node, ast.Call):
            return None
        perm, rank = view.perm, len(view.perm)
        if rank < 3:
            return None
        # Two batched operands, one held in a name, are most often heads split off a layer's output
        # (`q = q.view(b, t, h, d).transpose(1, 2)`), whose layout the layer fixed: only inline.
        named = viewed is not operand
        if gemm.op == "bmm":
            return None if named or rank - 1 in perm[-2:] or self._layer_output(view.base) else self._no_unit_stride()
        if gemm.op in ("@", "matmul"):
            other = gemm.operands[1 - position]
            other_view = reorder(self.ctx, other)
            other_rank = len(other_view.perm) if other_view and other_view.perm else rank_of(self.ctx, other)
            if other_rank is None:
                other_rank = self._parameter_rank(other)
            if other_rank is None:
                return None
            if position == 0 and other_rank == 2:
                if self._never_requires_grad(other) or self._may_be_frozen(other) or self._parameter_may_be_frozen(other):
                    return None
                return self._fold_rows(gemm, view, f"`{self.ctx.segment(other)}`")
            if other_rank != rank or named:
                return None
            if rank - 1 not in perm[-2:]:
                return None if self._layer_output(view.base) else self._no_unit_stride()
            return self._fold_batch(view, other_view)
        if gemm.op == "nn.Linear":
            if self._may_be_frozen(gemm.node.func) or self._layer_output(view.base):
                return None  # frozen, or a GEMM's output permuted for the next layer: its layout was fixed there
            return self._fold_rows(gemm, view, "the layer's weight")
        weight = gemm.operands[1]
        if gemm.op == "linear" and not self._never_requires_grad(weight) and not self._may_be_frozen(weight):
            return self._fold_rows(gemm, view, f"`{self.ctx.segment(weight)}`")
        return None

    def _trainable_weight(self, gemm) -> bool:
        """The weight of linear `gemm` requires grad: a layer or matrix the file never freezes."""
        if gemm.op == "nn.Linear":
            return not self._may_be_frozen(gemm.node.func)
        weight = gemm.operands[1]
        return not self._never_requires_grad(weight) and not self._may_be_frozen(weight)

    def _fold_swapped(self, gemm, view: Reorder) -> _Copy:
        """A linear layer's input with two dims swapped, of rank 3 or more though the rank is not
        known: whichever dims the swap moves, the rows the layer folds cannot merge (a swap of the
        last two dims of a 3-D tensor, or of two dims that are folded, or one that takes the
        last dim away). Applying the layer in the stored layout and swapping the result avoids it."""
        seg = self.ctx.segment
        weight = f"{seg(gemm.node.func)}.weight" if gemm.op == "nn.Linear" else seg(gemm.operands[1])
        base = seg(view.base)
        if not isinstance(view.base, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            base = f"({base})"
        why = (f"swaps two dims of a tensor of at least {view.min_rank} dims, so the rows that the layer folds with "
               "`reshape` (the dims before the last) cannot merge")
        advice = (f"multiply in the stored layout instead: where the swap takes the last dim, "
                  f"`torch.matmul({weight}.expand(*{base}.shape[:-2], -1, -1), {base})` (plus any bias as a "
                  f"column) is the output with its last two dims swapped; where it leaves the last dim in place, "
                  f"apply the layer to `{base}` and swap the result{_stored_where(gemm, view, base)}")
        return _Copy(why, "the layer" if gemm.op == "nn.Linear" else "matmul", advice)

    def _never_requires_grad(self, matrix: ast.AST) -> bool:
        """`torch.randn(128, 8)`, inline or as the only value of a name, with no `requires_grad`
        anywhere in the function: matmul never folds for it."""
        values = [matrix]
        if isinstance(matrix, ast.Name):
            function = self.ctx.function
            if function is None or has_word(function_text(self.ctx, function), "requires_grad"):
                return False
            stores = flow_of(self.ctx, function).stores.get(matrix.id, [])
            if not stores or not all(simple for _, simple in stores):
                return False
            values = [stmt.value for stmt, _ in stores]
        for value in values:
            qual = self.ctx.qualname(value.func) if isinstance(value, ast.Call) else None
            if (qual is None or qual.rpartition(".")[0] != "torch" or qual.rpartition(".")[2] not in _NO_GRAD_FACTORIES
                    or any(k.arg == "requires_grad" for k in value.keywords)):
                return False
        return True

    def _parameter_values(self, matrix: ast.AST) -> list:
        """The values the file gives `matrix` where it may be an `nn.Parameter` (`self.W`, or a
        name the function binds once)."""
        ctx = self.ctx
        if not _kinds.may_mention(ctx, "Parameter"):
            return []
        if (isinstance(matrix, ast.Attribute) and isinstance(matrix.value, ast.Name) and ctx.class_ is not None
                and ctx.functions and matrix.value.id == self_name_of(ctx.functions[0])):
            return [value for _, value in _kinds.class_attribute_values(ctx, ctx.class_, matrix.attr)]
        if isinstance(matrix, ast.Name) and ctx.function is not None:
            stores = flow_of(ctx, ctx.function).stores.get(matrix.id, [])
            return [stmt.value for stmt, simple in stores] if all(simple for _, simple in stores) else []
        return []

    def _parameter_rank(self, matrix: ast.AST) -> Optional[int]:
        """The rank of an `nn.Parameter` that requires grad, made of a sized factory
        (`self.W = nn.Parameter(torch.randn(d, k))`, or a name the function binds so), else None."""
        ranks = {self._sized_parameter_rank(value) for value in self._parameter_values(matrix)}
        return ranks.pop() if len(ranks) == 1 else None

    def _parameter_may_be_frozen(self, matrix: ast.AST) -> bool:
        """`matrix` is an `nn.Parameter` made with a `requires_grad` other than True."""
        return any(self._parameter_grad_flags(value) not in (None, True) for value in self._parameter_values(matrix))

    def _parameter_grad_flags(self, value: ast.AST):
        """None where `value` is no `nn.Parameter(...)`; True where it requires grad; False where it
        may not (`requires_grad=False`, or a flag this cannot read)."""
        if not isinstance(value, ast.Call) or self.ctx.qualname(value.func) not in _PARAMETER or not value.args:
            return None
        grad = [k.value for k in value.keywords if k.arg == "requires_grad"] + value.args[1:2]
        return all(isinstance(g, ast.Constant) and g.value is True for g in grad)

    def _sized_parameter_rank(self, value: ast.AST) -> Optional[int]:
        if self._parameter_grad_flags(value) is not True:
            return None  # no parameter, frozen, or maybe
        return _kinds.sized_factory_rank(value.args[0], self.ctx.qualname)

    def _may_be_frozen(self, holder: ast.AST) -> bool:
        """Whether the file may turn off grad for the layer or matrix `holder` (`self.fc`,
        `self.fc.weight`, `self.W`, `w`): a `requires_grad_(...)` or `.requires_grad = ...` other
        than True on it, on `self`, on a loop over its parameters, or on anything this cannot tell
        apart from it. Freezing another attribute of this class (`self.backbone`), or a Linear
        attribute of another class, leaves it trainable."""
        ctx = self.ctx
        freezes = _freezes(ctx)
        if not freezes:
            return False
        first = _first_self_attribute(holder, self_name_of(ctx.functions[0]) if ctx.functions else None)
        for cls, target in freezes:
            attr = _first_self_attribute(target, "self")
            if attr is None:
                return True  # `self`, `model.fc`, a parameter of a helper: may be this layer
            if cls is ctx.class_ and first is not None:
                if attr == first:
                    return True
                continue
            if cls is not ctx.class_ and cls is not None and _kinds.class_attribute_kind(ctx, cls, attr) == _kinds.LINEAR:
                continue  # a Linear of another class holds no other layer
            return True
        return False

    def _layer_output(self, expr: ast.AST, depth: int = 0) -> bool:
        """`expr` is a view of a GEMM's output made in this function (`q` after `q, k =
        self.qk(x).chunk(2, -1)` and `q = q.view(b, t, h, d)`): the layer fixed its layout."""
        if depth > 8 or self.ctx.function is None:
            return False
        while True:
            if isinstance(expr, ast.Subscript):
                expr = expr.value
            elif (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
                  and expr.func.attr in _LAYOUT_KEEPING and as_gemm(self.ctx, expr) is None):
                if any(k.arg == "memory_format" for k in expr.keywords):
                    return False
                expr = expr.func.value
            else:
                break
        if isinstance(expr, (ast.Call, ast.BinOp)):
            return as_gemm(self.ctx, expr) is not None  # `self.qk(x)`, `q @ k.transpose(-2, -1)`
        if not isinstance(expr, ast.Name):
            return False
        reaching = flow_of(self.ctx, self.ctx.function).reaching_all(expr)
        return bool(reaching) and all(isinstance(stmt, ast.Assign) and self._layer_output(stmt.value, depth + 1)
                                      for stmt, _ in reaching)

    @staticmethod
    def _no_unit_stride() -> _Copy:
        return _Copy("has no unit-stride dim among its last two", "the GEMM",
                     "only a tensor made with one of its last two dims innermost in memory avoids the copy; where "
                     "a layer's output fixes this layout, the copy is the price of this product")

    def _fold_rows(self, gemm, view: Reorder, weight: str) -> Optional[_Copy]:
        """A permuted input times a matrix: matmul reshapes its leading dims into rows, a copy
        unless they merge, and folds only when the matrix requires grad (else it runs `bmm` on
        the view with the matrix expanded, no copy)."""
        perm, rank = view.perm, len(view.perm)
        if all(mergeable(perm, i) for i in range(rank - 2)):
            return None
        why = (f"has permuted leading dims, which matmul folds into rows with `reshape` when {weight} requires "
               "grad (as a trainable parameter does, even under `torch.no_grad()`)")
        advice = _PRODUCE
        if perm[-1] == rank - 1:  # the product keeps the stored order of the leading dims: permute it instead
            product = self._product_in_stored_layout(gemm, view)
            if product is not None:
                advice = f"multiply in the stored layout and permute the product instead: `{product}`"
        return _Copy(why, "matmul", advice)

    def _fold_transposed(self, gemm, view: Reorder) -> _Copy:
        """A layer applied to its input with the last two dims swapped: the leading dims it folds
        into rows hold the old last dim, so they cannot merge; the weight times the stored tensor
        is the output with its last two dims swapped, with no copy."""
        layer = self.ctx.segment(gemm.node.func)
        base = self.ctx.segment(view.base)
        if not isinstance(view.base, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            base = f"({base})"
        why = "swaps the last dim into the rows that the layer folds with `reshape`, which cannot merge them"
        advice = (f"multiply in the stored layout instead: `torch.matmul({layer}.weight.expand(*{base}.shape[:-2], -1, "
                  f"-1), {base})` (plus `{layer}.bias[:, None]` where the layer has a bias) is the layer's output with "
                  f"its last two dims swapped, read in place (`{layer}.weight @ {base}` would fold and copy again)"
                  f"{_stored_where(gemm, view, base)}")
        return _Copy(why, "the layer", advice)

    def _product_in_stored_layout(self, gemm, view: Reorder) -> Optional[str]:
        seg = self.ctx.segment
        text, operand_text = seg(gemm.node), seg(view.node)
        if text.count(operand_text) != 1 or "\n" in text:
            return None
        base = seg(view.base)
        if not isinstance(view.base, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            base = f"({base})"
        product = text.replace(operand_text, base)
        if isinstance(gemm.node, ast.BinOp):
            product = f"({product})"
        suffix = operand_text[len(base):] if operand_text.startswith(base + ".") else None
        return product + (suffix or f".permute({', '.join(map(str, view.perm))})")

    def _fold_batch(self, view: Reorder, other_view: Optional[Reorder]) -> Optional[_Copy]:
        """Two batched operands: matmul reshapes the batch dims of each into one, a copy unless they merge."""
        perm, rank = view.perm, len(view.perm)
        batch = perm[:-2]
        if all(mergeable(perm, i) for i in range(rank - 3)):
            return None
        why = "has batch dims out of memory order, which matmul must fold into one with `reshape`"
        in_order = sorted(batch)
        if in_order != list(range(in_order[0], in_order[0] + len(in_order))):
            if self._layer_output(view.base):
                return None
            return _Copy(why, "matmul", "they are not next to each other in memory, so only a tensor made with "
                                        "them outermost avoids the copy; where a layer's output fixes this layout, "
                                        "the copy is the price of this product")
        # The batch dims lie together in memory, in another order: listing them in that order in
        # both operands (where the other one stores them the same way) and permuting the product
        # back removes the copy.
        order = [in_order.index(b) for b in batch]
        other_batch = other_view.perm[:-2] if other_view is not None and other_view.perm else tuple(range(rank - 2))
        if sorted(range(len(batch)), key=lambda i: batch[i]) != sorted(range(len(other_batch)), key=lambda i: other_batch[i]):
            return _Copy(why, "matmul", "the two operands store their batch dims in different orders: make them "
                                        "in one order where they are made")
        stored = ", ".join(map(str, in_order + list(perm[-2:])))
        back = ", ".join(map(str, order + [rank - 2, rank - 1]))
        return _Copy(why, "matmul", f"list them in memory order in both operands (here `.permute({stored})`) "
                                        f"and permute the product back with `.permute({back})`")



def _first_self_attribute(expr: ast.AST, self_name: Optional[str]) -> Optional[str]:
    """`fc` for `self.fc`, `self.fc.weight`, `self.fc[0]`; None for anything else."""
    first = None
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute):
            first = expr.attr
        expr = expr.value
    return first if isinstance(expr, ast.Name) and expr.id == self_name else None


def _freezes(ctx) -> list:
    """(class, target) of each statement of the file that may turn grad off: `target.requires_grad_(False)`,
    `target.requires_grad = flag`; a loop variable over `m.parameters()` stands for `m`."""
    found = ctx.shared.get("mat302_freezes")
    if found is not None:
        return found
    found = ctx.shared["mat302_freezes"] = []
    if "requires_grad" not in ctx.source:
        return found

    def turns_off(value: Optional[ast.AST]) -> bool:
        return not (isinstance(value, ast.Constant) and value.value is True)

    stack = [(ctx.tree, None, {})]
    while stack:
        node, cls, loops = stack.pop()
        if isinstance(node, ast.ClassDef):
            cls, loops = node, {}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            loops = {}
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            it = node.iter
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in _PARAMETER_ITERATORS:
                loops = dict(loops)
                for name in ast.walk(node.target):
                    if isinstance(name, ast.Name):
                        loops[name.id] = it.func.value
        target = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "requires_grad_" and (node.args or node.keywords)):
            flag = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "requires_grad"), None)
            if turns_off(flag):
                target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and turns_off(node.value):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and t.attr == "requires_grad":
                    target = t.value
        if target is not None:
            seen = set()
            while isinstance(target, ast.Name) and target.id in loops and target.id not in seen:
                seen.add(target.id)
                target = loops[target.id]
            found.append((cls, target))
        stack.extend((child, cls, loops) for child in child_nodes(node))
    return found
