"""MAT202 loss-shape-mismatch: a loss whose input and target broadcast to a bigger shape."""
from __future__ import annotations

import ast

from matlint.rule import Only, Rule
from matlint.semantic.kinds import identifier_text
from matlint.semantic.shapes import (LOSS_FUNCTIONS, LOSS_MODULES, broadcast, broadcast_is_valid, dim_eq,
                                   fmt_shape, loss_of, shape_of, trailing_one_mismatch)
from matlint.rules.mat201_trailing_one_broadcast import squeezed

# Losses that check the shapes (torch 2.x): the BCE pair raises ValueError on any difference;
# soft_margin_loss writes the broadcast into a tensor of the input's shape, so it raises
# RuntimeError where the input would have to grow and runs as meant where only the target
# broadcasts. The others (mse, l1, smooth_l1, huber) broadcast and only warn.
_RAISES_ON_ANY_MISMATCH = {"binary_cross_entropy": "ValueError", "binary_cross_entropy_with_logits": "ValueError"}
_RAISES_WHERE_INPUT_GROWS = {"soft_margin_loss": "RuntimeError"}


def _names_a_loss(ctx) -> bool:
    """The file can spell a loss function or module (an identifier names one). Without, no call
    is a loss: the shapes are never needed."""
    key = "mat202_file_names_a_loss"
    if key not in ctx.shared:
        text = identifier_text(ctx)
        # Every name holds one of these three: most files are settled in three searches, not fourteen.
        ctx.shared[key] = (("_loss" in text or "Loss" in text or "binary_cross_entropy" in text)
                           and any(name in text for name in (*LOSS_FUNCTIONS, *LOSS_MODULES)))
    return ctx.shared[key]

class LossShapeMismatch(Rule):
    code = "MAT202"
    name = "loss-shape-mismatch"
    summary = "A loss's input and target have different shapes: the loss averages the wrong thing, or raises"
    runtime_docs = """
    The guard reports a loss whose input and target were broadcast to one shape (a stride-0 dim
    in the operands it observed), with the shapes.
    """
    docs = """
    ## What it does
    Finds element-wise losses (`F.mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`,
    `binary_cross_entropy`, `binary_cross_entropy_with_logits`, `soft_margin_loss`, and the
    modules `nn.MSELoss()`, `nn.L1Loss()`, `nn.SmoothL1Loss()`, `nn.HuberLoss()`, `nn.BCELoss()`,
    `nn.BCEWithLogitsLoss()`, `nn.SoftMarginLoss()`; called directly or through `.forward`, or
    held in a local or in an attribute created in `__init__`, module or function alike) whose
    input and target have known shapes (see MAT201 for where shapes come from, calls of the
    file's own classes included: `self.critic(s)`, `model.q(s)`) that differ and broadcast: `(N, 1)` against `(N,)` gives
    an `(N, N)` loss matrix, `(B, 1, H, W)` against `(B, H, W)` a `(B, B, H, W)` one, `(N, 1)`
    against `(N, 4)` repeats the one prediction four times, and `(N, 4)` against `(N, 1)`
    repeats each target.

    ## Why is this bad?
    It depends on the loss. `mse_loss`, `l1_loss`, `smooth_l1_loss` and `huber_loss` compute
    the loss over the broadcast shape and reduce it to a scalar, so training runs without an
    error toward a wrong objective (the mean over all pairs); PyTorch only warns, once, in a log
    nobody reads. `binary_cross_entropy` and `binary_cross_entropy_with_logits` raise
    `ValueError` on any shape difference, and `soft_margin_loss` raises `RuntimeError` where the
    input would have to grow: a crash waiting for the first run of that code path.

    ## Example
    ```python
    criterion = nn.MSELoss()
    pred = head(h)              # (N, 1)
    loss = criterion(pred, y)   # y: (N,)  -> (N, N) before the mean
    ```

    ## Use instead
    ```python
    loss = criterion(pred.squeeze(-1), y)
    ```

    ## Stays quiet on
    Input or target of unknown shape or rank (the BCE pair raises on any difference, so for it two
    known ranks that differ are enough, whatever the sizes) (a module held in an attribute of unknown class, an
    argument that another call passes as another class, a method whose `return`s disagree, a
    batch whose rows come from a Python list of unknown items); sizes that are different symbols (`N` against
    `M`, or a symbolic size against 1: the symbol may be 1); a singleton axis the author made
    on purpose (`y[:, None]`, `unsqueeze`, `keepdim=True`, `view(-1, 1)`); a lower-rank operand
    that only repeats over the other's leading axes (`(H, W)` against `(B, H, W)`), and other
    rank differences than one shape being the other with a 1 inserted; `soft_margin_loss` with a target that broadcasts to
    the input's shape (it computes the loss meant, without a warning); losses whose arguments
    are meant to differ in shape (`cross_entropy`, `nll_loss`, `gaussian_nll_loss`'s variance).

    ## Fix safety
    For the `(N, 1)` / `(N,)` case the fix squeezes the `(N, 1)` argument (`.squeeze(-1)`); it is
    unsafe because it changes the loss value (to the intended one). Other mismatches get no
    fix: which side is wrong is the author's call.
    """

    only = {"visit_Call": Only(if_file=_names_a_loss)}

    def visit_Call(self, node: ast.Call) -> None:
        named = self._loss_name(node)
        if named is None:
            return
        loss, function = named
        args = list(node.args)
        kwargs = {k.arg: k.value for k in node.keywords}
        input_node = args[0] if args else kwargs.get("input")
        target_node = args[1] if len(args) > 1 else kwargs.get("target")
        if input_node is None or target_node is None:
            return
        a, b = shape_of(self.ctx, input_node), shape_of(self.ctx, target_node)
        if a is None or b is None:
            return
        fix = None
        result = broadcast(a, b)
        input_grows = result is None or result.dims != a.dims
        if trailing_one_mismatch(a, b):
            fix = self.replace(input_node, squeezed(self.ctx, input_node), "Squeeze the input (`.squeeze(-1)`)", safe=False)
            advice = "write `.squeeze(-1)` on the input"
        elif trailing_one_mismatch(b, a):
            fix = self.replace(target_node, squeezed(self.ctx, target_node), "Squeeze the target (`.squeeze(-1)`)", safe=False)
            advice = "write `.squeeze(-1)` on the target"
        elif self._rank_mismatch(a, b):
            advice = "make the shapes agree (`target.view_as(input)` if they hold the same elements)"
        elif self._literal_mismatch(a, b):
            advice = ("make the shapes agree" if input_grows else
                      "give the target the input's shape (`target.expand_as(input)` if the repeat is meant)")
        elif function in _RAISES_ON_ANY_MISMATCH and a.rank is not None and b.rank is not None and a.rank != b.rank:
            # The BCE pair compares the sizes before anything else: any two ranks raise, whatever the
            # sizes are. A trailing 1 on the higher rank is the usual cause.
            if a.rank == b.rank + 1 and a.dims[-1] == 1:
                fix = self.replace(input_node, squeezed(self.ctx, input_node), "Squeeze the input (`.squeeze(-1)`)", safe=False)
                advice = "write `.squeeze(-1)` on the input"
            elif b.rank == a.rank + 1 and b.dims[-1] == 1:
                fix = self.replace(target_node, squeezed(self.ctx, target_node), "Squeeze the target (`.squeeze(-1)`)", safe=False)
                advice = "write `.squeeze(-1)` on the target"
            else:
                advice = "make the shapes agree"
        else:
            return
        shapes = f"{loss} input {fmt_shape(a)} and target {fmt_shape(b)}"
        error = _RAISES_ON_ANY_MISMATCH.get(function) or (_RAISES_WHERE_INPUT_GROWS.get(function) if input_grows else None)
        if error is not None:
            message = f"{shapes} differ in shape: `{function}` raises {error} at run time; {advice}"
        elif function in _RAISES_WHERE_INPUT_GROWS:
            return  # only the target broadcasts, to the input's shape: the loss is the one meant
        elif input_grows:
            message = (f"{shapes} broadcast to {fmt_shape(result)}: the loss averages over the broadcast "
                       f"(torch only warns); {advice}")
        else:
            message = (f"{loss} target {fmt_shape(b)} broadcasts to the input's {fmt_shape(a)}: each target value "
                       f"is reused along the broadcast axes (torch only warns); {advice}")
        self.report(node, message, fix=fix)

    def _loss_name(self, node: ast.Call):
        """The loss called, as the message names it (`mse_loss`, `MSELoss()`), and the function
        it computes (`mse_loss`); None when the call is no element-wise loss."""
        qual = self.ctx.qualname(node.func) or ""
        if qual.startswith("torch.nn.functional.") and qual.rsplit(".", 1)[1] in LOSS_FUNCTIONS:
            function = qual.rsplit(".", 1)[1]
            return function, function
        if not _names_a_loss(self.ctx):
            return None  # no loss is ever built or stored here: skip the shape analysis of every call
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "forward":
            func = func.value  # `criterion.forward(pred, y)`
        callee = loss_of(self.ctx, func)
        if callee is not None and callee.name in LOSS_MODULES:
            return f"{callee.name}()", LOSS_MODULES[callee.name]
        if callee is not None and callee.name in LOSS_FUNCTIONS:
            return callee.name, callee.name
        return None

    @staticmethod
    def _rank_mismatch(a, b) -> bool:
        """One shape is the other with a literal 1 inserted, and broadcasting them (which succeeds
        whatever the symbols are) gives a shape bigger than either: `(B, 1, H, W)` against
        `(B, H, W)` gives `(B, B, H, W)`. Every size known."""
        high, low = (a, b) if len(a.dims) > len(b.dims) else (b, a)
        if len(high.dims) != len(low.dims) + 1 or not (a.known and b.known) or a.explicit or b.explicit:
            return False
        if not any(d == 1 and all(dim_eq(x, y) for x, y in zip(high.dims[:i] + high.dims[i + 1:], low.dims))
                   for i, d in enumerate(high.dims)):
            return False
        if not broadcast_is_valid(a, b):
            return False
        result = broadcast(a, b)
        return result is not None and result.dims != a.dims and result.dims != b.dims

    @staticmethod
    def _literal_mismatch(a, b) -> bool:
        """Same rank, broadcast always succeeds, and some axis holds a literal 1 against a
        literal size > 1 (nothing the author expanded on purpose)."""
        if a.leading or b.leading or len(a.dims) != len(b.dims) or a.explicit or b.explicit:
            return False
        if not broadcast_is_valid(a, b):
            return False
        return any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a.dims, b.dims))
