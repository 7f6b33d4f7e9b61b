"""MAT301 contiguous-before-gemm: a transposed view copied with `.contiguous()` only to be fed
to a GEMM, which takes the transpose for free."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of, nearby_comments
from matlint.semantic.kinds import int_const
from matlint.semantic.layout import Reorder, gemm_of_operand, may_be_laid_out_otherwise, may_have_stepped_dims, rank_of, reorder
from matlint.semantic.torch_api import as_gemm

_COPIES = ("contiguous", "clone")
# GEMMs whose operands go to cuBLAS as they are (no batch folding): which operand positions.
_DIRECT = {"mm": (0, 1), "bmm": (0, 1), "linear": (1,)}
_OPERAND_RANK = {"mm": 2, "bmm": 3}  # torch.mm takes matrices, torch.bmm 3-D batches: nothing else
# Words that give a reason for the copy (`needed: graph break under torch.compile`, `to break the
# view chain, which otherwise conflicts with backward hooks`), not a narration of it (`# make it
# contiguous for the matmul`).
_REASON = re.compile(r"\b(?:because|since|need|needs|needed|requires?|required|must|otherwise|workaround|"
                     r"work(?:s|ed)? around|bug|avoid\w*|break\w*|hooks?|compile\w*|jit|torchscript|onnx|export\w*|"
                     r"trac(?:e|ed|ing)|fail\w*|errors?|crash\w*|so that|in order to|alias\w*|in-place|inplace|"
                     r"deliberate\w*|on purpose|intentional\w*)\b", re.IGNORECASE)


def _swaps_first_two(view: ast.AST) -> bool:
    """`x.transpose(0, 1)` / `x.transpose(1, 0)` / `torch.transpose(x, 0, 1)`."""
    args = view.args[-2:] if isinstance(view, ast.Call) else []
    return len(args) == 2 and {int_const(a) for a in args} == {0, 1}


class ContiguousBeforeGemm(Rule):
    code = "MAT301"
    name = "contiguous-before-gemm"
    summary = "`.contiguous()` on a transposed view right before a GEMM: a needless copy, cuBLAS takes the transpose for free."
    runtime_docs = """
    The guard reports a copy the program made (`.contiguous()`, `.clone()`) of a tensor that a
    GEMM then reads, where the GEMM would have read the tensor as it was (a transpose of the last
    two dims); a layout the GEMM would copy itself is MAT302's, where the copy is the fix. The
    estimate times the copy.
    """
    docs = """
    ## What it does
    Flags `.contiguous()` (or `.clone()`) applied to a plain transpose of the last two dims
    (`.t()`, `.T`, `.mT`, `transpose(-2, -1)`, `permute(0, 2, 1)`, `transpose(0, 1)` of a
    matrix) when the copy is written directly as an operand of a matrix multiply: `@`,
    `torch.matmul`, `mm`, `bmm` or the weight of `F.linear`.

    ## Why is this bad?
    cuBLAS reads a matrix in either row- or column-major order: a transposed view is passed
    with a transpose flag and costs nothing (`prepare_matrix_for_cublas` accepts it as is).
    `.contiguous()` first writes a full transposed copy of the tensor to memory, then the GEMM
    reads it again: an extra kernel and a round trip through memory on every call, plus the
    copy's backward.

    ## Example
    ```python
    scores = torch.matmul(q, k.transpose(-2, -1).contiguous())
    y = x @ self.weight.t().contiguous()
    ```

    ## Use instead
    ```python
    scores = torch.matmul(q, k.transpose(-2, -1))
    y = x @ self.weight.t()
    ```

    ## Stays quiet on
    - The copy assigned to a name that is read more than once or inside a loop the copy is
      not in (`wt = w.t().contiguous()` before a loop that multiplies by `wt`): caching a
      transposed weight, or using the copy elsewhere, is the author's choice. A name read once,
      by a GEMM at the same loop depth (`kt = k.permute(0, 2, 1).contiguous()` then
      `torch.bmm(q, kt)`), only carries the copy to it and is reported.
    - Transposes of other dims (`transpose(1, 2)` of a 4-D tensor, `permute(0, 2, 1, 3)`): those
      are not free for a batched GEMM; MAT302 looks at them.
    - The left operand of `@`/`matmul` when its rank is not known to be 2, or the right one's not
      known to be 3 or more: whether matmul then folds batch dims into rows (which would copy the
      view anyway) depends on the ranks and the PyTorch version, so the rule does not promise a
      saving. (Measured with PyTorch 2.11 on an H100: `a.mT @ w` with a 3-D `a` launches no copy,
      so this quiet case errs on the side of silence.)
    - An operand of `@`/`matmul` with 4 or more dims (or an unknown number) whose transposed
      tensor is itself a permuted view, inline or through a name the function assigns so
      (`k = x.view(B, T, H, D).transpose(1, 2)` ... `q @ k.transpose(-2, -1).contiguous()`):
      matmul folds the batch dims with `reshape`, which cannot merge them and copies anyway, so
      dropping the copy saves nothing.
    - GEMMs written with `out=`: the output may alias the tensor that was copied.
    - A copy the author explains: a comment on its lines or in the run of comment lines just
      above its statement, or the docstring of a function around it, that names the copy
      (`contiguous`, `clone`) and gives a reason for it (`# contiguous() works around a jit bug`,
      `copied with .contiguous() to break the view chain, which otherwise conflicts with backward
      hooks`). Narration (`# make it contiguous for the matmul`) explains nothing.
    - A transpose of a slice with a step (`x[:, ::2].t()`) or of a broadcast view
      (`v.expand(8, -1).t()`), inline or through a name the function assigns so: cuBLAS cannot
      read it in place, so the GEMM copies it with or without `.contiguous()`.
    - `.contiguous(memory_format=...)`, `.clone(memory_format=...)`, and `.T` of something known
      to have other than two dims or to be a numpy array.

    ## Fix safety
    Unsafe, for `.contiguous()` and `.clone()` alike. The GEMM computes the same product from
    the view, but `.contiguous()` of a transposed view is a copy just as `.clone()` is, and
    autograd saves the GEMM's operand for backward: where code after the GEMM changes the
    original in place (`w.mul_(0.5)` under `no_grad`), backward accepts the copy but raises
    `one of the variables needed for gradient computation has been modified by an inplace
    operation` on the view. No fix where a comment lies inside the operand (the rewrite would
    drop it); a comment after it on its last line stays.
    """

    # The copy is visited: `x.t().contiguous()` is a call of `contiguous` or `clone`.
    only = {"visit_Call": Only(attrs=frozenset(_COPIES))}

    def visit_Call(self, node: ast.Call) -> None:
        if self._is_copy(node):
            gemm_node = gemm_of_operand(self.ctx, node, self._is_copy)
            if gemm_node is not None:
                self.check_gemm(gemm_node)
            else:
                self._check_named_copy(node)

    def _check_named_copy(self, copy: ast.Call) -> None:
        """`kt = k.permute(0, 2, 1).contiguous()` read once, by a GEMM at the same loop depth
        (`torch.bmm(q, kt)` on the next line): the name only carries the copy to the GEMM. A copy
        made before a loop and read in it is a cached transpose: the author's choice."""
        statement = self.ctx.statement()
        function = self.ctx.function
        if (function is None or not isinstance(statement, ast.Assign) or statement.value is not copy
                or len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name)):
            return
        flow = flow_of(self.ctx, function)
        uses = flow.uses(statement)
        if len(uses) != 1:
            return
        use = uses[0]
        owner = flow.parent.get(use)
        if isinstance(owner, ast.Attribute) and owner.value is use:
            owner = flow.parent.get(owner)  # `kt.mm(w)`
        gemm = as_gemm(self.ctx, owner) if isinstance(owner, (ast.BinOp, ast.Call)) else None
        if gemm is None or gemm.op not in ("@", "matmul", "mm", "bmm", "linear") or len(gemm.operands) != 2:
            return
        if flow.loops_around(use) != flow.loops_around(statement):
            return
        position = next((i for i, op in enumerate(gemm.operands) if op is use), None)
        if position is None or (isinstance(owner, ast.Call) and any(k.arg == "out" for k in owner.keywords)):
            return
        view = self._needless_copy(gemm, position, copy)
        if view is not None:
            copy_name = copy.func.attr
            fix = None
            if "#" not in self.ctx.segment(copy):
                fix = self.replace(copy, self.ctx.segment(view.node), f"drop `.{copy_name}()`", safe=False)
            self.report(copy, f"`.{copy_name}()` copies a transposed view only to feed it to the GEMM on line "
                              f"{use.lineno}; cuBLAS takes the transpose for free: assign "
                              f"`{self.ctx.segment(view.node)}` instead", fix=fix)

    def check_gemm(self, node: ast.AST) -> None:
        gemm = as_gemm(self.ctx, node)
        if gemm is None or gemm.op not in ("@", "matmul", "mm", "bmm", "linear"):
            return
        if isinstance(node, ast.Call) and any(k.arg == "out" for k in node.keywords):
            return  # `out=` may alias the copied tensor: the copy can matter
        operands = gemm.operands
        if len(operands) != 2:
            return
        for position, operand in enumerate(operands):
            view = self._needless_copy(gemm, position, operand)
            if view is None:
                continue
            copy = operand.func.attr
            fix = None
            if "#" not in self.ctx.segment(operand):  # the fix rewrites the operand: no comment inside it may go
                # The copy also gives autograd a private tensor to save: after it, changing the
                # original in place is allowed, without it backward raises.
                fix = self.replace(operand, self.ctx.segment(view.node), f"drop `.{copy}()`", safe=False)
            self.report(operand, f"`.{copy}()` copies a transposed view only to feed it to a GEMM; cuBLAS takes the "
                                 f"transpose for free: pass `{self.ctx.segment(view.node)}` directly", fix=fix)

    def _needless_copy(self, gemm, position: int, copy: ast.AST) -> Optional[Reorder]:
        """The transposed view that `copy` (operand `position` of `gemm`, or the value of a name
        that is) copies, when cuBLAS would take the view as it is."""
        if position not in _DIRECT.get(gemm.op, (0, 1)):
            return None
        view = self._copied_transpose(copy, _OPERAND_RANK.get(gemm.op))
        if view is None or not view.last_two_only or may_have_stepped_dims(self.ctx, view.base):
            return None
        if gemm.op in ("@", "matmul"):
            if position == 0 and not self._left_goes_direct(view, gemm.operands[1]):
                return None
            if self._batch_dims_may_not_fold(view):
                return None
        return None if self._explained(copy) else view

    def _explained(self, operand: ast.AST) -> bool:
        """A comment on a line of the operand or just above its statement, or the docstring of a
        function around it, names the copy and gives a reason for it."""
        statement = self.ctx.statement()
        texts = nearby_comments(self.ctx, operand, statement) if statement is not None else []
        texts += [ast.get_docstring(f) or "" for f in self.ctx.parents
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return any(_REASON.search(text) and any(word in text for word in _COPIES) for text in texts)

    def _batch_dims_may_not_fold(self, view: Reorder) -> bool:
        """matmul folds the batch dims of an operand of 4 or more dims with `reshape`: where the
        transposed tensor is itself a permuted view (`k = x.view(B, T, H, D).transpose(1, 2)`),
        they may not merge, and matmul copies it with or without `.contiguous()`."""
        rank = len(view.perm) if view.perm else None
        return (rank is None or rank >= 4) and may_be_laid_out_otherwise(self.ctx, view.base)

    @staticmethod
    def _is_copy(expr: ast.AST) -> bool:
        return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
                and expr.func.attr in _COPIES and not expr.args and not expr.keywords)

    def _copied_transpose(self, operand: ast.AST, known_rank: Optional[int]) -> Optional[Reorder]:
        if not self._is_copy(operand):
            return None
        view = reorder(self.ctx, operand.func.value, known_rank)
        if view is not None and view.perm is None and not view.last_two_only and _swaps_first_two(view.node):
            # `b.transpose(0, 1)` of a tensor of unknown rank fed to a GEMM: the matrix transpose
            view = reorder(self.ctx, operand.func.value, 2)
        return view

    def _left_goes_direct(self, view: Reorder, right: ast.AST) -> bool:
        """matmul hands a transposed left operand to cuBLAS as is: it is a matrix, or both sides are batched."""
        left_rank = len(view.perm) if view.perm else None
        if left_rank == 2:
            return True
        right_rank = rank_of(self.ctx, right)
        return left_rank is not None and left_rank >= 3 and right_rank is not None and right_rank >= 3
