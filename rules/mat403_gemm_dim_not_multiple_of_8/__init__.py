"""MAT403 gemm-dim-not-multiple-of-8: a layer whose literal size makes its GEMMs miss the
tensor-core alignment (`nn.Linear(768, 50257)`)."""
from __future__ import annotations

import ast
import re

from matlint.rule import Only, Option, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.names import TESTS

# Layer -> its size parameters, in positional order, and which of them are GEMM dims.
_LAYERS = {
    "torch.nn.Linear": ("in_features", "out_features"),
    "torch.nn.LazyLinear": ("out_features",),
    "torch.nn.Bilinear": ("in1_features", "in2_features", "out_features"),
    "torch.nn.Embedding": ("num_embeddings",),
}
_GEMM_USE = re.compile(r"@|\blinear\(|\bmatmul\(|\bmm\(|\beinsum\(")
_HOW_TO_PAD = {
    "in_features": " (zero-padding the inputs' last dim to match)",
    "in1_features": " (zero-padding the first input's last dim to match)",
    "in2_features": " (zero-padding the second input's last dim to match)",
    "out_features": " (and ignore or slice off the extra outputs)",
    "num_embeddings": " (its extra rows are extra output logits: slice or mask them off)",
}
_SHORT = {"torch.nn.Linear": "nn.Linear", "torch.nn.LazyLinear": "nn.LazyLinear",
          "torch.nn.Bilinear": "nn.Bilinear", "torch.nn.Embedding": "nn.Embedding"}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded(dim: int) -> int:
    """What to pad to: a multiple of 64 for large dims (nanoGPT's 50257 -> 50304), else of 8."""
    return _round_up(dim, 64) if dim >= 1024 else _round_up(dim, 8)


class GemmDimNotMultipleOf8(Rule):
    code = "MAT403"
    name = "gemm-dim-not-multiple-of-8"
    quiet_in = (TESTS,)
    summary = "A layer size given as a literal that is not a multiple of 8, so its bf16/fp16 GEMMs miss the tensor-core fast path."
    options = {
        "min_dim": Option(int, 128, "sizes below this are ignored: the GEMMs of small heads cost little either way"),
    }
    runtime_docs = """
    On a GPU with tensor cores, the guard reports bf16/fp16 GEMMs with M, N or K not a multiple of
    8 (the largest at least 64) that are at least 1 % of the step's GEMM work; the estimate times
    the GEMM at the observed and padded dims, and a finding whose saving is negligible is dropped.
    """
    docs = """
    ## What it does
    Flags the sizes of `nn.Linear`, `nn.LazyLinear` and `nn.Bilinear`, and the vocabulary of
    an `nn.Embedding` whose weight is tied to an output layer or multiplied directly
    (`lm_head.weight = wte.weight`, `h @ wte.weight.T`), that are written as integer literals
    (or as a name bound to one literal, `vocab_size = 50257`), are at least `min_dim`
    (default 128), and are not multiples of 8. Keyword and positional spellings and every
    import alias of `torch.nn` count.

    ## Why is this bad?
    In bf16/fp16, cuBLAS uses tensor cores at full speed only when the GEMM's dimensions (and
    so its leading dimensions) are multiples of 8; otherwise it falls back to slower kernels.
    On an H100 a bf16 GEMM with K=8191 ran 5.3× slower than with K=8192. A layer's
    `in_features` is K of the forward GEMM and `out_features` is N; an embedding's vocabulary is
    N of the output projection when the weights are tied (as in GPT-2).

    ## Example
    ```python
    self.wte = nn.Embedding(50257, 768)
    self.lm_head = nn.Linear(768, 50257, bias=False)
    self.wte.weight = self.lm_head.weight
    ```

    ## Use instead
    ```python
    self.wte = nn.Embedding(50304, 768)          # padded vocabulary, as nanoGPT does
    self.lm_head = nn.Linear(768, 50304, bias=False)
    self.wte.weight = self.lm_head.weight
    ```
    The extra logits are never targets, but they are outputs: they enter the softmax's
    normalizer and the logits' shape, so slice them off (`logits[..., :50257]`) or mask them
    where the exact distribution or shape matters (sampling, `logits.view(-1, 50257)`).

    ## Stays quiet on
    - Small sizes (below `min_dim`): output heads such as `nn.Linear(768, 1)` or
      `nn.Linear(512, 10)`, and tiny inputs such as 3 coordinates; padding them saves little.
    - Sizes that are not literals (`nn.Linear(d_model, vocab_size)` with `vocab_size` a
      parameter or a config field): the value is not known statically.
    - Embeddings used only as lookup tables (`nn.Embedding(1473, d)` for categories, an
      untied vocabulary): a lookup is a gather, not a GEMM, so its row count does not matter;
      nor does an embedding's width by itself (the `nn.Linear` layers that consume it are
      checked on their own).
    - Convolutions and other layers whose sizes do not map directly onto one GEMM's dims.

    ## Fix safety
    No fix: padding a size changes the shapes the model computes. A padded `out_features`, or
    the vocabulary of an embedding whose weight is used as an output layer (`head.weight =
    embed.weight`, `F.linear(h, embed.weight)`), adds output logits: the output grows from
    `[..., 32001]` to `[..., 32064]` (`logits.view(-1, 32001)` then raises) and the extra
    logits enter the softmax and the loss unless they are masked or sliced off. A padded
    `in_features` needs inputs padded to match. Either way checkpoints saved with the old
    size no longer load.
    """

    # A layer is `nn.Linear(...)`, `torch.nn.Embedding(...)`, or a bare name bound to one (`Linear(...)`).
    only = {"visit_Call": Only(attrs=frozenset(name.rsplit(".", 1)[1] for name in _LAYERS))}

    def visit_Call(self, node: ast.Call) -> None:
        qualname = self.ctx.qualname(node.func)
        params = _LAYERS.get(qualname)
        if params is None or any(isinstance(a, ast.Starred) for a in node.args):
            return
        given = dict(zip(params, node.args))
        given.update({k.arg: k.value for k in node.keywords if k.arg in params})
        for param in params:
            expr = given.get(param)
            dim = _kinds.constant_int(self.ctx, expr) if expr is not None else None
            if dim is None or dim < self.opts["min_dim"] or dim % 8 == 0:
                continue
            if param == "num_embeddings" and not self._weight_used_in_gemm():
                continue
            self.report(expr, f"`{_SHORT[qualname]}` {param}={dim} is not a multiple of 8, so its bf16/fp16 "
                              f"GEMMs miss the tensor-core fast path (K=8191 ran 5.3× slower than K=8192 on an "
                              f"H100); pad to {padded(dim)}{_HOW_TO_PAD.get(param, '')}")

    def _weight_used_in_gemm(self) -> bool:
        """The embedding being built (`self.wte = nn.Embedding(...)`) has its `.weight` tied to an
        output layer or multiplied directly: only then is its row count a GEMM dimension."""
        parent = self.ctx.parent
        if not isinstance(parent, ast.Assign) or len(parent.targets) != 1:
            return False
        target = parent.targets[0]
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name is None:
            return False
        use = re.compile(rf"\b{re.escape(name)}\.weight\b")
        for line in self.ctx.lines:
            if use.search(line) and (_GEMM_USE.search(line) or line.count(".weight") >= 2 and "=" in line):
                return True
        return False
