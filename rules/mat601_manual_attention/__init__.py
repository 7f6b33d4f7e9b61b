"""MAT601 manual-attention: `softmax(q @ k.transpose(-2, -1) * scale [+ mask]) @ v` written out
by hand instead of one `F.scaled_dot_product_attention` call."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import FunctionFlow, flow_of
from matlint.semantic.kinds import int_const
from matlint.semantic.layout import rank_of
from matlint.semantic.loops import walk_no_scopes
from matlint.semantic.tree import code_scope
from matlint.semantic.names import REFERENCE, TESTS, mentions, outermost_scope

from matlint.rules.mat101_python_loop_matmul import PythonLoopMatmul

from .fix import _SDPA, _SdpaFix
from .layout import _OperandLayout, _Operands
from .scores import _Scores, _ScoresPattern, _within
from .weights import _Probs, _WeightsPattern, _builds_softmax_module

# Identifiers that show the function (or its class) already has, or switches to, a fused
# attention path: the manual one is then a fallback or a reference.
_FUSED_PATH = re.compile(r"scaled_dot_product_attention|sdpa|flash|flex_attention|xformers|memory_efficient|fused_attn|"
                         r"attn_implementation|attention_interface|ATTENTION_FUNCTIONS", re.IGNORECASE)


def _flattened_rows(scores: ast.AST, dim: ast.AST) -> Optional[tuple]:
    """(the scores, the row length) for a softmax over the rows of scores flattened to 2-D
    (`s.view(-1, n)`, `s.reshape(-1, n)` with `dim=1` or `-1`); None for anything else."""
    if not (isinstance(scores, ast.Call) and isinstance(scores.func, ast.Attribute)
            and scores.func.attr in ("view", "reshape") and len(scores.args) == 2 and not scores.keywords
            and int_const(scores.args[0]) == -1 and int_const(dim) in (1, -1)):
        return None
    return scores.func.value, scores.args[1]


class ManualAttention(_ScoresPattern, _WeightsPattern, _OperandLayout, _SdpaFix, Rule):
    code = "MAT601"
    name = "manual-attention"
    quiet_in = (TESTS, REFERENCE)
    summary = ("Attention written out by hand (`softmax(q @ kᵀ * scale [+ mask]) @ v`); "
               "`F.scaled_dot_product_attention` runs it as one fused kernel.")
    runtime_docs = """
    The guard follows attention computed by hand (QKᵀ, scale, mask, softmax, dropout, @V) and
    reports the SDPA call that computes the same: the mask as `attn_mask=` (or `is_causal=True`
    only where it is exactly causal), the scale, `dropout_p`, `enable_gqa` for repeated K/V heads,
    and a note where the weights are used elsewhere (SDPA does not return them). It never suggests
    SDPA at an SDPA call: where a real `scaled_dot_product_attention` call ran its math backend
    because of its operands' layout (a last dim that is not unit-stride) or `enable_gqa` in a
    dtype no fused kernel takes, it says so and what lets a fused kernel run, timed. The estimate
    times the SDPA call against the chain at the observed shapes.
    """
    docs = """
    ## What it does
    Flags scaled dot-product attention computed step by step: a GEMM of queries with
    transposed keys (`q @ k.transpose(-2, -1)`, `.swapaxes`, `torch.transpose`,
    `.permute(0, 1, 3, 2)`, `.mT`, `torch.matmul`, `torch.bmm`, or an `einsum` such as
    `"bhqd,bhkd->bhqk"`; or `torch.matmul(q, k)` / `q @ k` / `torch.bmm(q, k)` on two parameters
    of the function, the caller having transposed the keys, as GPT-2's `split_heads(key, k=True)`
    does, or on two projections the function made (also parts of one split along an axis, `q,
    k, v = torch.split(self.to_qkv(x), c, dim=1)`), the keys laid out (..., E, S) by their
    reshape (`k = self.fc_k(x).view(b, n, h, d).permute(0, 2, 3, 1)`, `k = self.proj_k(h).view(B,
    C, H * W)`): reported with no fix, the message saying to pass `k.transpose(-2, -1)`), optionally scaled (`* scale`, `/ math.sqrt(d)`, `* d ** -0.5`, `/=`,
    `.div()`, `.mul()`, `torch.div`), masked (`+ mask`, `+=`, `.add()`,
    `.masked_fill(mask == 0, float("-inf"))`, an in-place `masked_fill_`, also under an `if`,
    a 0/1 mask applied as `w * b - 1e10 * (1 - b)` (no fix), or a
    function of the project that only writes values into the scores by index, such as
    `mask_(dot, maskval=float("-inf"))`: reported with no fix, the mask's form being the reader's to
    carry over),
    shifted by its row maximum and cast, then a softmax over the last (key) axis (`F.softmax`,
    `torch.softmax`, `.softmax(-1)`, an `nn.Softmax(dim=-1)` module, also built where it is
    called: `nn.Softmax(dim=-1)(scores)`; also over the scores flattened to rows of the key
    count and viewed back, `F.softmax(s.view(-1, values.size(1)), dim=1).view(b, -1, n)`),
    optionally dropout (also a `dropout` the callers pass
    in from another file, `if dropout is not None: p = dropout(p)`: reported, with no fix), then a
    GEMM with the values (also the values on the left of the weights with their last two axes
    swapped, SAGAN's `torch.bmm(v, attn.permute(0, 2, 1))`: reported with no fix, the message
    saying to pass `v.transpose(-2, -1)` and transpose SDPA's result back). The softmax is over
    the key axis: `dim=-1`, or the last axis counted from the front where the rank is known
    (`dim=3` of an einsum's `"nqhd,nkhd->nhqk"`). The steps may be spread over several statements through intermediate
    variables; reading the scores' `.dtype`, `.shape` or `.size()` on the way (`torch.finfo(w.dtype)`,
    a size check, a mask made in their shape with `torch.ones_like(w, dtype=torch.bool).triu(1)`)
    does not hide them. Scores stored in the arms of an `if` (a switch over score functions:
    `if kind == "dot": s = torch.bmm(q, kt)` / `elif kind == "mlp": s = mlp(q, k)`) are read arm
    by arm: each arm whose scores are q·kᵀ is reported, with no fix. Scores that nothing scales
    between the product and the softmax need `scale=1.0` (also where q was scaled beforehand),
    and the message says so. The finding is reported on the q·kᵀ product.

    SDPA's fused kernels take q, k, v as 4-D `(B, H, L, E)` tensors with the head dim last and
    stride 1 along it; on anything else it runs its math path, which is slower than the
    hand-written code. Where the code shows the operands are not like that (3-D `(b h) n d`, 5-D
    windows, a channels-first `"b h d i, b h d j"` einsum, a view whose last axis is not
    unit-stride such as `rearrange(conv_out, "b (h d) x y -> b h (x y) d")`), the message says
    what SDPA needs (split or merge axes, permute, `.contiguous()`).

    ## Why is this bad?
    The manual form writes the whole `L × S` score matrix to memory, reads it back for the
    softmax, writes the probabilities, and reads them again for the second GEMM (and keeps
    them for backward). `F.scaled_dot_product_attention` dispatches to flash or
    memory-efficient kernels that never materialize the scores: on an H100, bf16 forward +
    backward at sequence length 2048 ran 15× faster than the hand-written version, and the
    memory for the scores is gone.

    ## Example
    ```python
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    ```

    ## Use instead
    ```python
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # default scale: 1/sqrt(E)
    ```

    ## Stays quiet on
    - Functions and classes that already use `scaled_dot_product_attention`, or switch to a
      fused path (flash-attn, xformers, `flex_attention`, an `attn_implementation` /
      `fused_attn` / `use_sdpa` switch, `hasattr(F, "scaled_dot_product_attention")`), and manual
      paths inside an `if` in a file that calls SDPA somewhere (the switch may be a module-level
      flag): the manual path there is a guarded fallback or a reference implementation.
    - Attention whose probabilities (or scores) are used for anything else: stored on `self` or
      in a `global` / `nonlocal` name (also by a caller in the file: `x, self.attn_scores =
      Block.attention(q, k, v, mask)`), fed to a loss or a hook. SDPA does not hand them back. (A
      hook registered from another file cannot be seen.) Probabilities that are only returned
      (`return out, p_attn`) are reported, without a fix, with a note that SDPA does not return
      them (call it where the callers drop them), except in a file that has an SDPA path (it
      calls `scaled_dot_product_attention` or dispatches to an `sdpa` implementation): there the
      manual path is the one kept for callers that ask for the weights.
    - Scores changed in ways SDPA cannot express: anything other than scaling, adding a
      bias or mask, `masked_fill`, the row-maximum shift and dtype casts (e.g. talking-heads
      mixing across heads, an unknown function applied to the scores).
    - Cosine and cross-covariance attention whose product takes q and k straight from
      `F.normalize` (directly or through a helper such as `l2norm = lambda t: F.normalize(t,
      dim=-1)` or a `def`, also mapped with `map(l2norm, (q, k))`, as in XCiT and EdgeNeXt):
      the scores are then scaled by a learned per-head temperature, a tensor `scale=` cannot
      take, and the map often runs over channels, where there is nothing to gain. Where q and k
      are rescaled after the normalization (`q = q * self.q_scale`, as in Imagen's "qk
      rmsnorm") and the scores by a constant, SDPA takes the rescaled q and k as they are, so
      that form is reported.
    - A second operand computed from another softmax (the Nyström approximation's
      `kernel_1 @ inv(kernel_2)`): a composition of attention kernels, not attention over values.
    - Additive / MLP attention (`tanh(W q + U k)`), sigmoid gates, a softmax over any axis but
      the last (the query axis, as in slot attention), and keys that are a module's own
      parameters (`x @ self.codebook.T`, `h @ self.embed.weight.mT`, also through a local name
      such as `codebook = self.codebook`: soft assignment, not attention). An attribute stored
      outside `__init__` (other than as an `nn.Parameter`) or written into in place is no weight:
      a KV cache kept on the module (`self.cache_k = k` in forward, `self.cache_k[:, pos] = k`)
      holds activations, and attention over it is reported.

    Operands in a layout SDPA's fused kernels do not take are still reported, because reshaping,
    permuting or copying q, k and v costs little next to the `L × S` scores: on an H100 (bf16,
    forward + backward, 1024 tokens), SDPA called on them as they are took 1.5-2.7× longer than
    the manual code, and after `unsqueeze(0)` (3-D), `flatten(0, 1)` (5-D) or `.contiguous()`
    (a strided view, channels-first) it ran 1.5-2.5× faster than it. The message says what to
    change; there is no fix but for 3-D operands (see Fix safety).

    ## Fix safety
    The fix replaces the final GEMM with one `scaled_dot_product_attention` call and deletes
    the statements that only fed it. It is **safe** only when the call is exactly equivalent:
    no mask, or a causal `tril` buffer sliced `[:T, :T]` and filled with `-inf` (→
    `is_causal=True`); an explicit scale (→ `scale=...`), the default `1/sqrt(q.size(-1))`
    or of `k.size(-1)` (→ no argument) or none (→ `scale=1.0`); no dropout and no dtype casts
    (a row-maximum shift is dropped: softmax does not change); the standard `(..., L, E)` layout.
    Operands known to be 3-D (`torch.bmm`, a `"bid,bjd->bij"` einsum) are passed as
    `q.unsqueeze(0)` (and the result `.squeeze(0)`): the same values as a `(1, B·H, L, E)` batch,
    which the fused kernels take. It is **unsafe** (offered with `--unsafe-fixes`) when the call
    needs judgement: an additive mask becomes `attn_mask=` (a boolean mask means the opposite
    there); a general `masked_fill` becomes a boolean `attn_mask=~(cond)`, and rows where every
    key is masked then come out differently (NaN with a `-inf` fill, the mean of v with a finite
    fill such as `-1e9` or `finfo.min`, zeros from SDPA in recent PyTorch); dropout becomes
    `dropout_p=` (a different random stream); a softmax upcast is dropped; a scale whose type is
    not known to be a Python number; a transpose spelled with positive axes
    (`k.transpose(2, 3)` swaps the last two only if k is 4-D) unless the code shows that rank.
    There is no fix when the layout differs (`"bqhd,bkhd->bhqk"`, channels-first), the operands
    are known to be neither 4-D nor 3-D or have a strided last axis, when the steps sit in different blocks or
    a conditional expression, when a read of the scores' `.shape` / `.dtype` stays in the code,
    or when torch.nn.functional has no name in the file. A call that would pass 120 columns is
    written with its arguments on lines of their own. Nor is there a fix when the attention
    takes one item of a loop at a time (`q[:, h]` in `for h in range(n_heads)`, the loop MAT101
    reports): a call per head would be faster but would hide the loop, which one call on the
    whole tensors replaces (the message says so, and both findings stay).
    """

    # A softmax is a call of `softmax` (an attribute, or a name bound to it), or of `self.<module>`
    # in a file that builds `nn.Softmax`.
    only = {"visit_Call": Only(attrs=frozenset({"softmax", None}),
                               every_call_if=_builds_softmax_module,
                               if_file=lambda ctx: _kinds.may_mention(ctx, "softmax", ignore_case=True))}

    _loop_gemms: Optional[PythonLoopMatmul] = None  # made on first use: few files get that far

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if func.__class__ is ast.Attribute and func.attr != "softmax" and not (
                func.value.__class__ is ast.Name and func.value.id == "self"):
            return  # neither `softmax` nor `self.<module>`: `_softmax` would say None
        function = code_scope(self.ctx)  # a function, or the module: a script's or notebook's top level
        if function is None:
            return
        if not _kinds.may_mention(self.ctx, "softmax", ignore_case=True):
            return  # every softmax spelling `_softmax` knows names it
        softmax = self._softmax(node)
        if softmax is None:
            return
        scores_expr, dim, upcast = softmax
        if int_const(dim) is None or mentions(self.ctx, outermost_scope(self.ctx), _FUSED_PATH):
            return
        flow = flow_of(self.ctx, function)
        if _SDPA in self.ctx.source and any(isinstance(a, ast.If) for a in flow.enclosing(node)):
            return  # a branch in a file that has SDPA: the switch may live elsewhere (`if HAS_SDPA:`)
        rows, keys = _flattened_rows(scores_expr, dim), None
        if rows is not None:  # `F.softmax(s.view(-1, n_keys), dim=1).view(b, -1, n_keys)`
            scores_expr, keys, dim = rows[0], rows[1], ast.Constant(-1)
        scores = self._scores(flow, scores_expr, 0)
        if scores is None:
            for arm in self._arm_scores(flow, scores_expr):
                self._check(node, flow, function, arm, scores_expr, rows, keys, dim, upcast)
        else:
            self._check(node, flow, function, scores, scores_expr, rows, keys, dim, upcast)

    def _check(self, node: ast.Call, flow, function: ast.AST, scores: _Scores, scores_expr: ast.AST,
               rows: Optional[tuple], keys, dim: ast.AST, upcast: bool) -> None:
        """Report the attention whose softmax is `node`, of the scores `scores`, where the rest of
        the pattern (the weights times the values) is there and not kept apart on purpose."""
        if not scores.key_axis_last:
            return
        if rows is not None and not self._counts_keys(keys, scores):
            return
        einsum_rank = len(scores.terms[2]) if scores.terms else None  # `"nqhd,nkhd->nhqk"`: 4-D scores
        if int_const(dim) != -1 and not (scores.gemm.op == "bmm" and int_const(dim) == 2) and not (
                int_const(dim) > 0
                and int_const(dim) + 1 in (rank_of(self.ctx, scores_expr), scores.k_rank, einsum_rank)):
            return  # softmax(dim=3) of 4-D scores (known, as an einsum's output or `k.transpose(2, 3)` says)
        if self._is_cosine(flow, scores):
            return
        probs = self._probs(flow, node, restore=keys if rows is not None else None)
        if probs is None or self._derives_from_softmax(flow, probs.v, 0):
            return
        if self._kept_outside(function, scores.statements + probs.statements, flow.statement(probs.pv.node)):
            return
        if probs.returned and (self._has_sdpa_path() or self._callers_keep_weights(flow, probs)):
            return  # the eager path kept for callers that ask for the weights (`output_attentions`)
        if upcast:
            scores.steps.append(("cast",))
        operands = self._operands(flow, scores, probs)
        per_item = self._per_item(scores.gemm.node)
        if per_item is not None:
            self.report(scores.gemm.node, self._loop_message(scores, probs, *per_item))
            return
        self.report(scores.gemm.node, self._message(scores, probs, operands),
                    fix=None if probs.returned else self._fix(flow, scores, probs, operands))

    def _counts_keys(self, length: ast.AST, scores: _Scores) -> bool:
        """`length` (`values.size(1)`, or a name bound only to it) is the number of keys of
        `scores`: axis 1 or -2 of the keys of a 3-D `bmm(q, k.transpose(1, 2))`, read as
        `k.size(1)` or `k.shape[1]`. A softmax over rows of that length is then one over the
        key axis."""
        if isinstance(length, ast.Name):  # `n = values.size(1)`, `b, n = q.size(0), values.size(1)`
            entries = _kinds.bindings(self.ctx, length.id) or ()
            length = _kinds.assigned_expression(entries[0]) if len(entries) == 1 else None
        if isinstance(length, ast.Call) and isinstance(length.func, ast.Attribute) and length.func.attr == "size" \
                and len(length.args) == 1 and not length.keywords:
            tensor, axis = length.func.value, int_const(length.args[0])
        elif isinstance(length, ast.Subscript) and isinstance(length.value, ast.Attribute) \
                and length.value.attr == "shape":
            tensor, axis = length.value.value, int_const(length.slice)
        else:
            return False
        return scores.gemm.op == "bmm" and axis in (1, -2) and self.ctx.segment(tensor) == self.ctx.segment(scores.k)

    def _per_item(self, gemm: ast.AST) -> Optional[tuple]:
        """(loop, the tensors it slices) when the q·kᵀ GEMM takes one item of a loop at a time
        (`q[:, h]` in `for h in range(n_heads)`), as MAT101 reports it: one SDPA call on the whole
        tensors replaces the loop, and a fix into one call per item would hide the loop."""
        loops = [loop for loop in self.ctx.loops if _within(gemm, loop.node)]
        if not loops:
            return None
        if self._loop_gemms is None:
            self._loop_gemms = PythonLoopMatmul(self.ctx)  # MAT101's analysis of per-item GEMMs
        found = self._loop_gemms.per_item(gemm, loops)
        if found is None:
            return None
        _, loop, batched = found
        return loop, [self.ctx.segment(item.base) for item in batched if item is not None]

    def _has_sdpa_path(self) -> bool:
        """The file calls SDPA or dispatches to it (`sdpa_attention_forward`,
        `config._attn_implementation`): a manual path that returns the weights is the one kept
        for when they are asked for."""
        return (_SDPA in self.ctx.source or _kinds.may_mention(self.ctx, "sdpa", ignore_case=True)
                or _kinds.may_mention(self.ctx, "attn_implementation"))

    @staticmethod
    def _kept_outside(function: ast.AST, statements: list, final: ast.stmt) -> bool:
        """A step before the final GEMM stores the scores or probabilities in a name declared
        `global` or `nonlocal` (`LAST_SCORES = q @ k.mT`, kept for visualisation): they are wanted
        outside the function, as when stored on `self`, and SDPA does not hand them back."""
        outer = {name for sub in walk_no_scopes(function) if isinstance(sub, (ast.Global, ast.Nonlocal))
                 for name in sub.names}
        if not outer:
            return False
        for stmt in statements:
            if stmt is final:
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if any(isinstance(t, ast.Name) and t.id in outer for t in targets):
                return True
        return False

    def _makes_parameter(self, value: ast.AST) -> bool:
        """`nn.Parameter(...)`: a weight, wherever it is created (a lazy `build`)."""
        return isinstance(value, ast.Call) and self.ctx.qualname(value.func) in (
            "torch.nn.Parameter", "torch.nn.parameter.Parameter")

    @staticmethod
    def _written_in_place(flow: FunctionFlow, attr: str) -> bool:
        """The function writes into `self.<attr>` (`self.cache_k[:, pos] = k`,
        `self.cache_k.copy_(k)`): state it updates, not a weight."""
        for node in flow.parent:
            if not (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                continue
            up = flow.parent.get(node)
            if isinstance(up, ast.Subscript) and up.value is node and not isinstance(up.ctx, ast.Load):
                return True
            if (isinstance(up, ast.Attribute) and up.value is node and up.attr.endswith("_")
                    and not up.attr.startswith("_") and isinstance(flow.parent.get(up), ast.Call)):
                return True
        return False

    # -- message and fix -------------------------------------------------------------
    def _message(self, scores: _Scores, probs: _Probs, operands: _Operands) -> str:
        message = self._pattern_message(scores, probs, operands)
        if probs.returned:
            message += ("; SDPA does not return the attention weights, which this function also returns: "
                        "call it where the callers drop them, and keep this path for those that use them")
        return message

    def _loop_message(self, scores: _Scores, probs: _Probs, loop, sliced: list) -> str:
        names = " and ".join(f"`{name}`" for name in dict.fromkeys(sliced))
        return (self._pattern_message(scores, probs, None) + f"; here it runs once per iteration of {loop.described}, on "
                f"slices of {names}: call SDPA once on the whole tensors, the loop's axis as their head (or "
                "batch) axis in (B, H, L, E), instead of once per slice (no fix: the loop goes too)")

    def _pattern_message(self, scores: _Scores, probs: _Probs, operands: Optional[_Operands]) -> str:
        parts = ["q @ k, k laid out (..., E, S)" if scores.keys_transposed else "q @ kᵀ"]
        kinds = {s[0] for s in scores.steps}
        if "scale" in kinds:
            parts.append("scale")
        if kinds & {"mask", "fill"}:
            parts.append("mask")
        parts.append("softmax")
        if any(s[0].startswith("dropout") for s in probs.steps):
            parts.append("dropout")
        parts.append("@ v")
        message = (f"hand-written attention ({' → '.join(parts)}, result at line {probs.pv.node.lineno}): use "
                   "`F.scaled_dot_product_attention(q, k, v, ...)`, one fused flash/memory-efficient kernel "
                   "(15× faster fwd+bwd in bf16 on an H100 at S=2048)")
        notes = self._layout_notes(scores, probs, operands) if operands is not None else []
        if "scale" not in kinds:
            message += ("; pass `scale=1.0`: nothing scales the product before the softmax (a q scaled "
                        "beforehand stays so), and SDPA's default scale is 1/sqrt(E)")
        if any(s[0] == "values_left" for s in probs.steps):
            value = self.ctx.segment(probs.v)
            notes.insert(0, f"the values multiply the weights from the left (`{value} @ weightsᵀ`): pass "
                            f"`{value}.transpose(-2, -1)` as SDPA's value and transpose its result back")
        if scores.keys_transposed:
            key = self.ctx.segment(scores.k)
            notes.insert(0, f"`{key}` holds the keys with their last two axes swapped, so pass "
                            f"`{key}.transpose(-2, -1)` as SDPA's key (or stop transposing it)")
        if notes:
            message += ("; its fused kernels take (B, H, L, E) operands, 4-D with the head dim last and "
                        "stride(-1) == 1 (else a slower math path runs): " + "; ".join(notes))
        return message
