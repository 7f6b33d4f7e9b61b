"""MAT601 manual-attention: `softmax(q @ k.transpose(-2, -1) * scale [+ mask]) @ v` written out
by hand instead of one `F.scaled_dot_product_attention` call."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Optional

from matlint.diagnostics import Edit, Fix
from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import argument_for, file_calls
from matlint.semantic.flow import FunctionFlow, flow_of
from matlint.semantic.kinds import int_const
from matlint.semantic.layout import rank_of, reorder
from matlint.semantic.loops import walk_no_scopes
from matlint.semantic.names import in_reference_code, in_test_code, mentions, outermost_scope, spelling
from matlint.semantic.pointwise import is_true, product, reads_metadata, torch_op
from matlint.semantic.torch_api import as_gemm

from matlint.rules.mat101_python_loop_matmul import PythonLoopMatmul

_SOFTMAX_FUNCTIONS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_DROPOUT_FUNCTIONS = {"torch.nn.functional.dropout", "torch.dropout"}
_CAST_METHODS = {"to", "type_as", "type", "float", "half", "bfloat16", "double"}
# Identifiers that show the function (or its class) already has, or switches to, a fused
# attention path: the manual one is then a fallback or a reference.
_FUSED_PATH = re.compile(r"scaled_dot_product|sdpa|flash|flex_attention|xformers|memory_efficient|fused_attn|"
                         r"attn_implementation|attention_interface|ATTENTION_FUNCTIONS", re.IGNORECASE)
_SDPA = "scaled_dot_product_attention"
_MAX_DEPTH = 24
_TRANSPOSE_METHODS = frozenset({"transpose", "swapaxes", "swapdims"})
_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
_TO_4D = {2: "add the batch and head axes (`q[None, None]`, ...)",
          3: "split the heads out of the batch axis, or add a leading one (`q.unsqueeze(0)`, ...)",
          5: "merge the leading axes into the batch (`q.flatten(0, 1)`, ...)"}


@dataclass
class _Scores:
    """The pre-softmax scores: the q·kᵀ GEMM and what was applied to its result."""
    gemm: object
    q: ast.AST
    k: ast.AST
    exact_layout: bool          # q, k are (..., L, E), (..., S, E) as SDPA takes them
    key_axis_last: bool         # the GEMM's last output axis runs over the keys
    # ("scale", expr, op) / ("mask", expr) / ("fill", cond, value) / ("cast",) / ("shift",)
    steps: list = field(default_factory=list)
    statements: list = field(default_factory=list)  # the `name = ...` statements the chain ran through
    terms: Optional[tuple] = None  # an einsum's q and k terms, and the ones SDPA takes: (a, b, want_a, want_b)
    k_rank: Optional[int] = None   # the rank of k its transpose implies (`.t()`: 2, `.permute(0, 1, 3, 2)`: 4)
    rank_assumed: bool = False     # ... only if positive axes (`k.transpose(2, 3)`) mean the last two
    metadata_reads: list = field(default_factory=list)  # `scores.dtype`, `scores.size(-1)`: reads that are not uses
    conditional: bool = False      # a step under a conditional expression (`s if m is None else s.masked_fill(...)`)


def _returned_as_is(flow: FunctionFlow, use: ast.AST) -> bool:
    """`use` (a read of a name) is returned unchanged: `return p` or an item of `return out, p`."""
    parent = flow.parent.get(use)
    if isinstance(parent, ast.Tuple):
        parent = flow.parent.get(parent)
    return isinstance(parent, ast.Return)


@dataclass
class _Probs:
    pv: object                  # the probabilities @ v GEMM
    v: ast.AST
    steps: list = field(default_factory=list)       # ("dropout", p, training) / ("cast",)
    statements: list = field(default_factory=list)
    terms: Optional[tuple] = None  # an einsum's v term and the one SDPA takes
    returned: bool = False      # the function also returns the probabilities


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


def _arg(call: ast.Call, index: int, name: str) -> Optional[ast.AST]:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == name), None)


def _einsum_terms(subscripts: Optional[str]):
    """(inputs, output) of a two-operand einsum equation, `...` counted as one letter."""
    if not subscripts or "->" not in subscripts:
        return None
    lhs, out = subscripts.replace(" ", "").replace("...", "*").split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    return terms[0], terms[1], out


def _within(node: ast.AST, outer: ast.AST) -> bool:
    return ((outer.lineno, outer.col_offset) <= (node.lineno, node.col_offset)
            and (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset))


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


def _is_neg_inf(node: ast.AST) -> bool:
    """-inf, or a finite fill so negative that exp() of it is 0 in every float dtype."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float)):
            return inner.value >= 1e4
        if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "float" and inner.args:
            arg = inner.args[0]
            return isinstance(arg, ast.Constant) and str(arg.value).lower() in ("inf", "infinity")
        return isinstance(inner, ast.Attribute) and inner.attr == "inf"
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "float" and node.args:
        arg = node.args[0]
        return isinstance(arg, ast.Constant) and str(arg.value).lower() in ("-inf", "-infinity")
    if isinstance(node, ast.Attribute) and node.attr == "min" and isinstance(node.value, ast.Call):
        return getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "finfo"
    return False


def _fills_a_constant(value: ast.AST) -> bool:
    """A fill that is a number exp() does not send to 0 (`0.0`, `1e4`): the filled scores still
    count in the softmax, which no attention mask can say."""
    number = value.operand if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub) else value
    return (isinstance(number, ast.Constant) and isinstance(number.value, (int, float))
            and not isinstance(number.value, bool) and not _is_neg_inf(value))


# Multipliers of the scores that are not one number for all of them: a mask, a gate, a bias, a
# per-position factor (`k.norm(dim=-1).unsqueeze(-2)`, `torch.tril(...)`), which `scale=` cannot take.
_NOT_A_SCALE_NAME = re.compile(r"mask|gate|bias|weight|prob|score|attn|decay", re.IGNORECASE)
_PER_POSITION_OPS = frozenset({
    "unsqueeze", "view", "reshape", "expand", "expand_as", "tril", "triu", "ones", "zeros", "full", "rand",
    "randn", "ones_like", "zeros_like", "full_like", "norm", "transpose", "permute", "repeat", "masked_fill",
    "where", "sigmoid", "softmax", "cumsum", "arange", "matmul", "bmm", "einsum", "outer", "stack", "cat"})


def _builds_softmax_module(ctx) -> bool:
    """The file may build an `nn.Softmax` module (an identifier spells `Softmax`)."""
    return _kinds.may_mention(ctx, "Softmax")


class ManualAttention(Rule):
    code = "MAT601"
    name = "manual-attention"
    summary = ("Attention written out by hand (`softmax(q @ kᵀ * scale [+ mask]) @ v`); "
               "`F.scaled_dot_product_attention` runs it as one fused kernel.")
    docs = """
    ## What it does
    Flags scaled dot-product attention computed step by step: a GEMM of queries with
    transposed keys (`q @ k.transpose(-2, -1)`, `.swapaxes`, `torch.transpose`,
    `.permute(0, 1, 3, 2)`, `.mT`, `torch.matmul`, `torch.bmm`, or an `einsum` such as
    `"bhqd,bhkd->bhqk"`), optionally scaled (`* scale`, `/ math.sqrt(d)`, `* d ** -0.5`, `/=`,
    `.div()`, `.mul()`, `torch.div`), masked (`+ mask`, `+=`, `.add()`,
    `.masked_fill(mask == 0, float("-inf"))`, an in-place `masked_fill_`, also under an `if`),
    shifted by its row maximum and cast, then a softmax over the last (key) axis (`F.softmax`,
    `torch.softmax`, `.softmax(-1)`, an `nn.Softmax(dim=-1)` module), optionally dropout, then a
    GEMM with the values. The steps may be spread over several statements through intermediate
    variables; reading the scores' `.dtype`, `.shape` or `.size()` on the way (`torch.finfo(w.dtype)`,
    a size check) does not hide them. The finding is reported on the q·kᵀ product.

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
    - Tests (`test_*.py`, `*_test.py`, `conftest.py`, files under `tests/`, `test/` or `testing/`,
      `test*` functions, `Test*` classes, fixtures) and reference implementations (a function
      or class named with the word `ref` or `reference`: `attention_ref`, `_ReferenceAdam`),
      which spell each step out on purpose to check a fused path against.
    - Functions and classes that already use `scaled_dot_product_attention`, or switch to a
      fused path (flash-attn, xformers, `flex_attention`, an `attn_implementation` /
      `fused_attn` / `use_sdpa` switch, `hasattr(F, "scaled_dot_product_attention")`), and manual
      paths inside an `if` in a file that calls SDPA somewhere (the switch may be a module-level
      flag): the manual path there is a guarded fallback or a reference implementation.
    - Attention whose probabilities (or scores) are used for anything else: stored on `self` or
      in a `global` / `nonlocal` name, fed to a loss or a hook. SDPA does not hand them back. (A
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
        function = self.ctx.function
        if function is None or isinstance(function, ast.Lambda):
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
        scores = self._scores(flow, scores_expr, 0)
        if scores is None or not scores.key_axis_last:
            return
        if int_const(dim) != -1 and not (scores.gemm.op == "bmm" and int_const(dim) == 2) and not (
                int_const(dim) > 0 and int_const(dim) + 1 in (rank_of(self.ctx, scores_expr), scores.k_rank)):
            return  # softmax(dim=3) of 4-D scores (known, or as `k.transpose(2, 3)` says when it is the key transpose)
        if self._is_cosine(flow, scores):
            return
        probs = self._probs(flow, node)
        if probs is None or self._derives_from_softmax(flow, probs.v, 0):
            return
        if self._kept_outside(function, scores.statements + probs.statements, flow.statement(probs.pv.node)):
            return
        if probs.returned and self._has_sdpa_path():
            return  # the eager path kept for callers that ask for the weights (`output_attentions`)
        if in_test_code(self.ctx) or in_reference_code(self.ctx):
            return
        if upcast:
            scores.steps.append(("cast",))
        operands = self._operands(flow, scores, probs)
        per_item = self._per_item(scores.gemm.node)
        if per_item is not None:
            self.report(scores.gemm.node, self._loop_message(scores, probs, *per_item))
            return
        self.report(scores.gemm.node, self._message(scores, probs, operands),
                    fix=None if probs.returned else self._fix(flow, scores, probs, operands))

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

    def _softmax(self, call: ast.Call):
        """(scores, dim, upcast) for a softmax call, else None."""
        ctx = self.ctx
        func = call.func
        qual = ctx.qualname(func)
        if qual in _SOFTMAX_FUNCTIONS:
            # `F.softmax(input, dim, _stacklevel, dtype)`; `torch.softmax(input, dim, dtype)`
            scores = _arg(call, 0, "input")
            if scores is None:
                return None
            dtype_at = 3 if qual == "torch.nn.functional.softmax" else 2
            return scores, _arg(call, 1, "dim"), _arg(call, dtype_at, "dtype") is not None
        if qual is not None or not isinstance(func, ast.Attribute):
            return None
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            if not _builds_softmax_module(ctx):
                return None
            module = self._self_module(func.attr)
            if (module is not None and len(call.args) == 1 and not call.keywords
                    and ctx.qualname(module.func) == "torch.nn.Softmax"):
                return call.args[0], _arg(module, 0, "dim"), False
            return None
        if func.attr == "softmax" and ctx.qualname(func.value) is None:
            return func.value, _arg(call, 0, "dim"), _arg(call, 1, "dtype") is not None
        return None

    def _self_module(self, attr: str) -> Optional[ast.Call]:
        """The module constructed into `self.<attr>`, when there is exactly one."""
        cls = self.ctx.class_
        if cls is None:
            return None
        values = _kinds.class_attribute_values(self.ctx, cls, attr)
        if len(values) == 1 and isinstance(values[0][1], ast.Call):
            return values[0][1]
        return None

    def _scores(self, flow: FunctionFlow, node: ast.AST, depth: int, skip: tuple = ()) -> Optional[_Scores]:
        """The q·kᵀ chain `node` computes. `skip`: reads of the scores that the caller accounts
        for (the other arm of a conditional update, the row maximum subtracted from them)."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(node, ast.Name):
            return self._named_scores(flow, node, depth, skip)
        gemm = as_gemm(self.ctx, node)
        if gemm is not None:
            return self._qk(flow, gemm)
        if isinstance(node, ast.BinOp):
            return self._combined(flow, node.op.__class__, node.left, node.right, depth, skip)
        if isinstance(node, ast.IfExp):
            return self._either(flow, node, depth, skip)
        if not isinstance(node, ast.Call):
            return None
        scaled = product(self.ctx, node)  # `s.mul(scale)`, `s.div(d)`, `torch.div(s, d)`
        if scaled is not None:
            return self._combined(flow, scaled[0], scaled[1], scaled[2], depth, skip)
        op = torch_op(self.ctx, node)
        if op is not None and op.name in ("add", "sub") and len(op.args) == 2 and not op.keywords:
            return self._combined(flow, ast.Add if op.name == "add" else ast.Sub, op.args[0], op.args[1], depth, skip)
        if isinstance(node.func, ast.Attribute) and self.ctx.qualname(node.func) is None:
            method = node.func.attr
            step = None
            if method == "masked_fill" and len(node.args) == 2 and not node.keywords:
                if _fills_a_constant(node.args[1]):
                    return None
                step = ("fill", node.args[0], node.args[1])
            elif method in _CAST_METHODS:
                step = ("cast",)
            if step:
                found = self._scores(flow, node.func.value, depth + 1, skip)
                if found:
                    found.steps.append(step)
                return found
        return None

    def _named_scores(self, flow: FunctionFlow, node: ast.Name, depth: int, skip: tuple) -> Optional[_Scores]:
        reaching = flow.reaching_all(node)
        if len(reaching) == 1 and reaching[0][0] is not None:
            store, simple = reaching[0]
            if simple:
                return self._through(flow, node, store, store.value, None, depth, skip)
            step = self._update_step(flow, store, node.id)
            if step is not None:  # `attn += mask`, `scores /= math.sqrt(d)`
                return self._through(flow, node, store, store.target, step, depth, skip)
            return None
        if len(reaching) == 2:
            return self._optional_update(flow, node, reaching, depth, skip)
        return None

    def _through(self, flow: FunctionFlow, node: ast.Name, store: ast.stmt, inner: ast.AST, step, depth: int,
                 skip: tuple) -> Optional[_Scores]:
        """The chain through `store`, the statement whose value `node` reads, when nothing else
        reads that value but in-place fills and metadata (`.shape`, `.dtype`, `.size()`)."""
        readers = flow.uses(store) if isinstance(store, ast.Assign) else self._readers(flow, store)
        if isinstance(node.ctx, ast.Load) and node not in readers:
            return None
        metadata, fills = [], []
        for use in readers:
            if use is node or use in skip:
                continue
            if reads_metadata(flow, use):
                metadata.append(use)
                continue
            fill = self._in_place_fill(flow, use, store, node)
            if fill is None:
                return None
            fills.append(fill)
        found = self._scores(flow, inner, depth + 1)
        if found:
            found.statements.append(store)
            if step:
                found.steps.append(step)
            found.metadata_reads.extend(metadata)
            for statement, fill_step in sorted(fills, key=lambda f: f[0].lineno):
                found.steps.append(fill_step)
                found.statements.append(statement)
        return found

    def _readers(self, flow: FunctionFlow, update: ast.AugAssign) -> list:
        """The loads that read the value an augmented assignment stores."""
        return [load for load in flow.loads.get(update.target.id, ())
                if any(store is update for store, _ in flow.reaching_all(load))]

    def _update_step(self, flow: FunctionFlow, store: ast.stmt, name: str):
        """The step `scores += mask` / `scores *= scale` / `scores /= d` applies, else None."""
        if not (isinstance(store, ast.AugAssign) and isinstance(store.target, ast.Name) and store.target.id == name):
            return None
        op = store.op.__class__
        if op is ast.Add:
            return ("mask", store.value)
        if op is ast.Sub:
            return ("mask", None)
        if op in (ast.Mult, ast.Div) and not self._contains_gemm(store.value) and self._may_be_scale(flow, store.value, 0):
            return ("scale", store.value, "*" if op is ast.Mult else "/")
        return None

    def _optional_update(self, flow: FunctionFlow, node: ast.Name, reaching: list, depth: int,
                         skip: tuple) -> Optional[_Scores]:
        """`if mask is not None: scores = scores + mask` (or `scores += mask`): `node` reads the
        update or the value before it, which the update reads (metadata reads aside) once."""
        for (update, plain), (before, simple) in (reaching, reaching[::-1]):
            if not simple:
                continue
            if isinstance(update, ast.AugAssign):
                step = self._update_step(flow, update, node.id)
                if step is None or flow.reaching(update.target) is not before:
                    continue
                readers = self._readers(flow, update)
            elif plain:
                step = None
                inner = [n for n in walk_no_scopes(update.value) if isinstance(n, ast.Name) and n.id == node.id
                         and not reads_metadata(flow, n)]
                if len(inner) != 1 or flow.reaching(inner[0]) is not before:
                    continue
                readers = flow.uses(update)
            else:
                continue
            if any(use is not node and use not in skip and not reads_metadata(flow, use) for use in readers):
                return None
            if step is None:
                found = self._scores(flow, update.value, depth + 1, skip + (node,))
            else:
                found = self._through(flow, update.target, before, before.value, None, depth, skip + (node,))
                if found:
                    found.steps.append(step)
            if found:
                found.statements.append(update)  # in another block: no fix
            return found
        return None

    def _combined(self, flow: FunctionFlow, op: type, left: ast.AST, right: ast.AST, depth: int,
                  skip: tuple) -> Optional[_Scores]:
        """The chain through `left <op> right`, one side being the scores."""
        if op is ast.Mult:
            sides = [(left, ("scale", right, "*")), (right, ("scale", left, "*"))]
        elif op is ast.Div:
            sides = [(left, ("scale", right, "/"))]
        elif op is ast.Add:
            sides = [(left, ("mask", right)), (right, ("mask", left))]
        elif op is ast.Sub:
            row_max = self._row_max_of(right)
            if isinstance(left, ast.Name) and isinstance(row_max, ast.Name) and row_max.id == left.id:
                # `sim - sim.amax(-1, keepdim=True).detach()`: softmax is the same without the shift
                found = self._scores(flow, left, depth + 1, skip + (row_max,))
                if found:
                    found.steps.append(("shift",))
                return found
            sides = [(left, ("mask", None))]
        else:
            return None
        for inner, step in sides:
            if step[0] == "scale" and (self._contains_gemm(step[1]) or not self._may_be_scale(flow, step[1], 0)):
                continue
            found = self._scores(flow, inner, depth + 1, skip)
            if found:
                found.steps.append(step)
                return found
        return None

    def _either(self, flow: FunctionFlow, node: ast.IfExp, depth: int, skip: tuple) -> Optional[_Scores]:
        """`s if mask is None else s.masked_fill(~mask, float("-inf"))`: a conditional step."""
        for plain, changed in ((node.body, node.orelse), (node.orelse, node.body)):
            if not isinstance(plain, ast.Name):
                continue
            before = flow.reaching(plain)
            found = self._scores(flow, changed, depth + 1, skip + (plain,))
            if found and before is not None and before in found.statements:
                found.conditional = True
                return found
        return None

    def _row_max_of(self, node: ast.AST) -> Optional[ast.AST]:
        """`x` for its row maximum `x.amax(-1, keepdim=True)` (or `x.max(dim=-1, keepdim=True).values`,
        `torch.max(x, -1, keepdim=True)[0]`), detached or not; else None."""
        node = self._undetached(node)
        indexed = False
        if isinstance(node, ast.Attribute) and node.attr == "values":
            node, indexed = node.value, True
        elif isinstance(node, ast.Subscript) and int_const(node.slice) == 0:
            node, indexed = node.value, True
        op = torch_op(self.ctx, self._undetached(node))
        if op is None or op.name != ("max" if indexed else "amax") or len(op.args) > 3:
            return None
        if int_const(op.arg(1, "dim")) != -1 or not is_true(op.arg(2, "keepdim")) or set(op.keywords) - {"dim", "keepdim"}:
            return None
        return self._undetached(op.args[0])

    def _undetached(self, node: ast.AST) -> ast.AST:
        op = torch_op(self.ctx, node)
        if op is not None and op.name == "detach" and len(op.args) == 1 and not op.keywords:
            return op.args[0]
        return node

    def _in_place_fill(self, flow: FunctionFlow, use: ast.Name, assign: ast.stmt, later: ast.Name):
        """(statement, step) for `scores.masked_fill_(cond, value)`, a statement of its own (in the
        block of `assign`, or under an `if` there), before `later` reads the scores, that fills them
        in place; else None."""
        attribute = flow.parent.get(use)
        call = flow.parent.get(attribute)
        statement = flow.parent.get(call)
        if not (isinstance(attribute, ast.Attribute) and attribute.attr == "masked_fill_"
                and isinstance(call, ast.Call) and call.func is attribute and len(call.args) == 2
                and not call.keywords and isinstance(statement, ast.Expr)
                and (statement.end_lineno, statement.end_col_offset) <= (later.lineno, later.col_offset)
                and not _fills_a_constant(call.args[1])):
            return None
        branch = statement
        while not flow.same_block(branch, assign):
            branch = flow.parent.get(branch)
            if not isinstance(branch, ast.If):
                return None  # in a loop, a `with`, a nested function...
        return statement, ("fill", call.args[0], call.args[1])

    def _may_be_scale(self, flow: FunctionFlow, expr: ast.AST, depth: int) -> bool:
        """Whether `expr` can be one number that scales every score (`self.scale`, `math.sqrt(d)`,
        `torch.sqrt(torch.tensor(d_k))`): not a mask, gate or per-position tensor, by its names, the
        ops that compute it, the annotation of a parameter it is, and (twice over) what it is assigned."""
        if self._is_number(expr):
            return True
        for sub in ast.walk(expr):
            name = getattr(sub, "id", None) or getattr(sub, "attr", None)
            if isinstance(sub, (ast.Name, ast.Attribute)) and _NOT_A_SCALE_NAME.search(name):
                return False
            if isinstance(sub, ast.Call):
                func = sub.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in _PER_POSITION_OPS:
                    return False
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                reaching = flow.reaching_all(sub)
                if len(reaching) == 1 and reaching[0][0] is None and _kinds.is_tensor(self.ctx, sub):
                    return False  # a parameter annotated as a tensor: of any shape
                assign = flow.reaching(sub)
                if assign is not None and depth < 2 and not self._may_be_scale(flow, assign.value, depth + 1):
                    return False
        return True

    def _contains_gemm(self, node: ast.AST) -> bool:
        return any(as_gemm(self.ctx, sub) for sub in ast.walk(node) if isinstance(sub, (ast.BinOp, ast.Call)))

    def _qk(self, flow: FunctionFlow, gemm) -> Optional[_Scores]:
        if len(gemm.operands) != 2:
            return None
        q, kt = gemm.operands
        if gemm.op == "einsum":
            terms = _einsum_terms(gemm.subscripts)
            if terms is None:
                return None
            a, b, out = terms
            contracted = (set(a) & set(b)) - set(out)
            rows_q, rows_k = set(a) - set(b), set(b) - set(a)
            if len(contracted) != 1 or len(rows_q) != 1 or len(rows_k) != 1 or not (rows_q | rows_k) <= set(out):
                return None
            if self._is_own_parameter(flow, kt):
                return None
            (d,), (i,), (j,) = contracted, rows_q, rows_k
            prefix = out[:-2]
            exact = a == prefix + i + d and b == prefix + j + d and out == prefix + i + j
            return _Scores(gemm, q, kt, exact, out[-1] == j, terms=(a, b, prefix + i + d, prefix + j + d))
        if gemm.op not in ("@", "matmul", "bmm", "mm"):
            return None
        untransposed = self._untranspose(kt, gemm.op)
        statements = []
        if untransposed is None and isinstance(kt, ast.Name):
            # `kt = k.transpose(-2, -1)` ... `q @ kt`, where only the product reads kt
            assign = flow.reaching(kt)
            if assign is not None and flow.uses(assign) == [kt]:
                untransposed = self._untranspose(assign.value, gemm.op)
                statements.append(assign)
        if untransposed is None:
            return None
        k, rank, assumed = untransposed
        if self._is_own_parameter(flow, k):
            return None
        return _Scores(gemm, q, k, True, True, statements=statements, k_rank=rank, rank_assumed=assumed)

    def _untranspose(self, node: ast.AST, op: str):
        """(k, rank, assumed) for an expression that is `k` with its last two axes swapped (`.mT`,
        `.transpose(-2, -1)`, `.swapaxes`, `torch.transpose`, `.permute(0, 1, 3, 2)`). `rank` is the
        rank of k the spelling implies (None: any); `assumed`, when that comes only from positive
        axes (`k.transpose(2, 3)` swaps the last two only if k is 4-D)."""
        # The usual spellings need not ask the shape analysis for k's rank.
        if isinstance(node, ast.Attribute) and node.attr == "mT":
            return node.value, None, False
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords
                and node.func.attr in _TRANSPOSE_METHODS and len(node.args) == 2
                and {int_const(a) for a in node.args} == {-2, -1} and self.ctx.qualname(node.func) is None):
            return node.func.value, None, False
        found = reorder(self.ctx, node, {"bmm": 3, "mm": 2}.get(op))
        if found is None:
            return None
        if found.last_two_only:
            return found.base, len(found.perm) if found.perm is not None else None, False
        if found.perm is None and isinstance(node, ast.Call):
            axes = [int_const(a) for a in node.args[-2:]]
            if None in axes:
                return None
            axes.sort()
            if axes[0] >= 0 and axes[1] == axes[0] + 1:
                return found.base, axes[1] + 1, True
        return None

    def _is_own_parameter(self, flow: FunctionFlow, node: ast.AST) -> bool:
        """`self.codebook`, `self.gate.weight` (or a local name for one): keys that are a module's own
        weights. An attribute stored outside `__init__` (`self.cache_k = k` in forward, a cache
        filled in place with `self.cache_k[:, pos] = k`) holds activations, not weights."""
        if isinstance(node, ast.Name):
            assign = flow.reaching(node)
            if assign is None:
                return False
            node = assign.value
        if not isinstance(node, ast.Attribute):
            return False
        attr = None
        while isinstance(node, ast.Attribute):
            node, attr = node.value, node.attr
        if not (isinstance(node, ast.Name) and node.id == "self"):
            return False
        cls = self.ctx.class_
        if cls is None:
            return True
        if any(getattr(method, "name", None) != "__init__" and not self._makes_parameter(value)
               for method, value in _kinds.class_attribute_values(self.ctx, cls, attr)):
            return False
        return not self._written_in_place(flow, attr)

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

    def _probs(self, flow: FunctionFlow, softmax: ast.Call) -> Optional[_Probs]:
        returned: list = []
        probs = self._probs_chain(flow, softmax, returned)
        if probs is not None:
            probs.returned = bool(returned)
        return probs

    def _probs_chain(self, flow: FunctionFlow, softmax: ast.Call, returned: list) -> Optional[_Probs]:
        """`_probs`' walk; reads of the probabilities that are returned as they are go to `returned`."""
        node, steps, statements = softmax, [], []
        for _ in range(_MAX_DEPTH):
            parent = flow.parent.get(node)
            if isinstance(parent, ast.Assign):
                if not (len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name) and parent.value is node):
                    return None
                uses = flow.uses(parent)
                # `return out, p_attn`: the weights go back to the caller too, which SDPA cannot do
                in_return = [u for u in uses if _returned_as_is(flow, u)]
                if in_return and len(uses) - len(in_return) == 1:
                    returned.extend(in_return)
                    uses = [u for u in uses if u not in in_return]
                if len(uses) == 2:
                    # `if self.training: attn = self.drop(attn)`: go on through the update.
                    for last in uses:
                        optional = flow.optional_update(last)
                        if optional is not None and optional[1] is parent:
                            uses = [u for u in uses if flow.statement(u) is optional[0]]
                            break
                if len(uses) != 1:
                    return None
                statements.append(parent)
                node = uses[0]
                continue
            if isinstance(parent, (ast.List, ast.Tuple)):
                parent = flow.parent.get(parent)  # `torch.einsum(eq, [attn, v])`: checked below
            if isinstance(parent, ast.Attribute) and parent.value is node:
                call = flow.parent.get(parent)
                if not (isinstance(call, ast.Call) and call.func is parent and self.ctx.qualname(parent) is None):
                    return None
                if parent.attr in _CAST_METHODS:
                    steps.append(("cast",))
                    node = call
                    continue
                parent = call  # `attn.matmul(v)`, `attn.bmm(v)`: the GEMM, checked below
            if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
                dropout = self._dropout(parent)
                if dropout is not None:
                    steps.append(dropout)
                    node = parent
                    continue
            gemm = as_gemm(self.ctx, parent) if isinstance(parent, (ast.BinOp, ast.Call)) else None
            if gemm is None or len(gemm.operands) != 2:
                return None
            if gemm.op in ("@", "matmul", "bmm", "mm") and gemm.operands[0] is node:
                return _Probs(gemm, gemm.operands[1], steps, statements)
            if gemm.op == "einsum" and node in gemm.operands:
                terms = _einsum_terms(gemm.subscripts)
                if terms is None:
                    return None
                first, second, out = terms
                probs_term, v_term = (first, second) if gemm.operands[0] is node else (second, first)
                if (set(probs_term) & set(v_term)) - set(out) != {probs_term[-1]}:
                    return None  # not contracted over the key axis
                exact = gemm.operands[0] is node and out == probs_term[:-1] + v_term[-1] and v_term == (
                    probs_term[:-2] + probs_term[-1] + v_term[-1])
                probs = _Probs(gemm, gemm.operands[1] if gemm.operands[0] is node else gemm.operands[0], steps,
                               statements)
                value_axes = set(v_term) - set(probs_term)
                if len(value_axes) == 1:
                    probs.terms = (v_term, probs_term[:-2] + probs_term[-1] + value_axes.pop())
                if not exact:
                    probs.steps.append(("layout",))
                return probs
            return None
        return None

    def _dropout(self, call: ast.Call):
        qual = self.ctx.qualname(call.func)
        if qual in _DROPOUT_FUNCTIONS:
            return ("dropout", _arg(call, 1, "p"), _arg(call, 2, "training"), qual)
        func = call.func
        if (qual is None and len(call.args) == 1 and not call.keywords and isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name) and func.value.id == "self"):
            module = self._self_module(func.attr)
            if module is not None and self.ctx.qualname(module.func) == "torch.nn.Dropout":
                return ("dropout_module", func)
        if (qual is None and len(call.args) == 1 and not call.keywords and isinstance(func, ast.Name)
                and self._passed_dropout(func.id)):
            return ("dropout_parameter", func)
        return None

    def _passed_dropout(self, name: str) -> bool:
        """`name` is a parameter of the function that every call of the file passes an
        `nn.Dropout` module held by the caller (`dropout=self.dropout`) or None
        (`attention(q, k, v, mask, dropout=None)`): The Annotated Transformer's `attention()`."""
        function = self.ctx.function
        if function is None or isinstance(function, ast.Lambda):
            return False
        params = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
        if name not in {p.arg for p in params}:
            return False
        sites = file_calls(self.ctx).call_sites(function)
        if not sites:
            return False
        dropouts = 0
        for site in sites:
            value = argument_for(site, function, name)
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and site.cls is not None):
                return False
            built = _kinds.class_attribute_values(self.ctx, site.cls, value.attr)
            if not built or not all(isinstance(v, ast.Call) and self.ctx.qualname(v.func) == "torch.nn.Dropout"
                                    for _, v in built):
                return False
            dropouts += 1
        return dropouts > 0

    def _is_cosine(self, flow: FunctionFlow, scores: _Scores) -> bool:
        """q and k both L2-normalized: cosine or cross-covariance attention (XCiT), whose learned
        per-head temperature `scale=` cannot take, and whose map may run over channels."""
        return self._normalized(flow, scores.q) and self._normalized(flow, scores.k)

    def _normalized(self, flow: FunctionFlow, node: ast.AST) -> bool:
        """`F.normalize(x)`, directly or through a helper (`l2norm = lambda t: F.normalize(t, dim=-1)`,
        a `def`), also mapped over several tensors (`q, k = map(l2norm, (q, k))`)."""
        for _ in range(4):
            if not isinstance(node, ast.Name):
                break
            origin = self._origin(flow, node)
            if origin is None:
                return False
            node, _, mapped = origin
            if mapped is not None:
                return self._returns_normalized(flow, mapped)
        if not isinstance(node, ast.Call):
            return False
        if self.ctx.qualname(node.func) == "torch.nn.functional.normalize":
            return True
        return len(node.args) == 1 and not node.keywords and self._returns_normalized(flow, node.func)

    def _returns_normalized(self, flow: FunctionFlow, func: ast.AST) -> bool:
        """`func` is a lambda, or names one or a `def` (in this function or at module level), that
        returns `F.normalize(...)`."""
        if isinstance(func, ast.Name):
            assign = flow.reaching(func)
            if assign is not None:
                func = assign.value
            else:
                body = flow.function.body if isinstance(flow.function.body, list) else []
                found = [s.value if isinstance(s, ast.Assign) else s for s in body + self.ctx.tree.body
                         if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == func.id
                         or isinstance(s, ast.Assign) and len(s.targets) == 1
                         and isinstance(s.targets[0], ast.Name) and s.targets[0].id == func.id]
                if len(found) != 1:
                    return False
                func = found[0]
        if isinstance(func, ast.Lambda):
            returned = func.body
        elif isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            statements = [s for s in func.body if not (
                isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
            if len(statements) != 1 or not isinstance(statements[0], ast.Return):
                return False
            returned = statements[0].value
        else:
            return False
        return isinstance(returned, ast.Call) and self.ctx.qualname(returned.func) == "torch.nn.functional.normalize"

    def _origin(self, flow: FunctionFlow, name: ast.Name):
        """(expression, names it binds, mapped function) for what `name` holds: the value of its one
        `name = value`, or one element of an unpacking (`q, k, v = a, b, c`; `= (f(t) for t in xs)`;
        `= map(lambda t: f(t), xs)`, whose `t` the names bound say is an element; `= map(f, xs)`,
        whose f comes back as the mapped function); else None."""
        reaching = flow.reaching_all(name)
        if len(reaching) != 1 or reaching[0][0] is None:
            return None
        store, simple = reaching[0]
        if simple:
            return store.value, frozenset(), None
        if not (isinstance(store, ast.Assign) and len(store.targets) == 1
                and isinstance(store.targets[0], (ast.Tuple, ast.List))):
            return None
        names = store.targets[0].elts
        index = next((i for i, e in enumerate(names) if isinstance(e, ast.Name) and e.id == name.id), None)
        if index is None or any(isinstance(e, ast.Starred) for e in names):
            return None
        value = store.value
        if isinstance(value, (ast.Tuple, ast.List)):
            if len(value.elts) != len(names) or any(isinstance(e, ast.Starred) for e in value.elts):
                return None
            return value.elts[index], frozenset(), None
        if isinstance(value, (ast.GeneratorExp, ast.ListComp)):
            loop = value.generators[0]
            if len(value.generators) == 1 and not loop.ifs and isinstance(loop.target, ast.Name):
                return value.elt, frozenset({loop.target.id}), None
            return None
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "map"
                and self.ctx.qualname(value.func) is None and len(value.args) == 2 and not value.keywords):
            func = value.args[0]
            if isinstance(func, ast.Lambda):
                params = func.args
                if len(params.args) == 1 and not (params.posonlyargs or params.kwonlyargs or params.vararg
                                                  or params.kwarg):
                    return func.body, frozenset({params.args[0].arg}), None
                return None
            return None, frozenset(), func
        return None

    def _derives_from_softmax(self, flow: FunctionFlow, node: ast.AST, depth: int) -> bool:
        """The "values" are computed from another softmax (a Nyström factor, a kernel product):
        a composition of attention kernels, not attention over values."""
        if depth > 3:
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and self._softmax(sub) is not None:
                return True
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                assign = flow.reaching(sub)
                if assign is not None and self._derives_from_softmax(flow, assign.value, depth + 1):
                    return True
        return False

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

    # -- message and fix -------------------------------------------------------------
    def _message(self, scores: _Scores, probs: _Probs, operands: _Operands) -> str:
        message = self._pattern_message(scores, probs, operands)
        if probs.returned:
            message += ("; SDPA does not return the attention weights, which this function also returns: "
                        "call it where the callers drop them, and keep this path for those that use them")
        return message

    def _loop_message(self, scores: _Scores, probs: _Probs, loop, sliced: list) -> str:
        node = loop.node
        where = (f"the comprehension on line {node.lineno}" if loop.is_comprehension else
                 f"the `while` loop on line {node.lineno}" if isinstance(node, ast.While) else
                 f"the `for {self.ctx.segment(node.target)}` loop on line {node.lineno}")
        names = " and ".join(f"`{name}`" for name in dict.fromkeys(sliced))
        return (self._pattern_message(scores, probs, None) + f"; here it runs once per iteration of {where}, on "
                f"slices of {names}: call SDPA once on the whole tensors, the loop's axis as their head (or "
                "batch) axis in (B, H, L, E), instead of once per slice (no fix: the loop goes too)")

    def _pattern_message(self, scores: _Scores, probs: _Probs, operands: Optional[_Operands]) -> str:
        parts = ["q @ kᵀ"]
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
        if notes:
            message += ("; its fused kernels take (B, H, L, E) operands, 4-D with the head dim last and "
                        "stride(-1) == 1 (else a slower math path runs): " + "; ".join(notes))
        return message

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

    def _fix(self, flow: FunctionFlow, scores: _Scores, probs: _Probs, operands: _Operands) -> Optional[Fix]:
        ctx = self.ctx
        if not scores.exact_layout or scores.conditional or any(s[0] == "layout" for s in probs.steps):
            return None
        if operands.strided or operands.conflicting or operands.rank not in (None, 4) and not (
                operands.rank == 3 and operands.pinned):
            return None  # SDPA would run its slow math path on them as they are: the message says why
        prefix = spelling(self.ctx, "torch.nn.functional")
        if prefix is None:
            return None
        final = flow.statement(probs.pv.node)
        statements = scores.statements + probs.statements
        for stmt in statements:
            if not flow.same_block(stmt, final) or not self._own_lines(stmt):
                return None
        # Everything the call reads must still mean at the final statement what it meant where
        # it was read.
        moved = [scores.q, scores.k] + [part for step in scores.steps + probs.steps for part in step[1:]
                                        if isinstance(part, ast.expr)]
        for expr in moved:
            for sub in ast.walk(expr):
                if isinstance(sub, ast.Name) and flow.stored_between(sub.id, flow.statement(expr), probs.pv.node):
                    return None
        # The call is written from these; the statements around them go.
        emitted = [scores.q, scores.k, probs.v] + [part for step in scores.steps + probs.steps
                                                   if step[0] in ("scale", "mask", "fill", "dropout", "dropout_module",
                                                                  "dropout_parameter")
                                                   for part in step[1:3] if isinstance(part, ast.expr)
                                                   and not (step[0] == "fill" and part is step[2])]
        for read in scores.metadata_reads:  # `scores.shape`: it must go with the statements that read it
            stmt = flow.statement(read)
            stays = stmt is final and not _within(read, probs.pv.node) or stmt is not final and not any(
                stmt is s for s in statements)
            if stays or any(_within(read, part) for part in emitted):
                return None
        safe = not scores.rank_assumed or operands.rank_confirmed
        kwargs = []
        scale, mask, causal = [], None, False
        fills = [s for s in scores.steps if s[0] == "fill"]
        masks = [s for s in scores.steps if s[0] == "mask"]
        if len(fills) + len(masks) > 1:
            return None
        seen_mask = False
        for step in scores.steps:
            if step[0] == "scale":
                if seen_mask and not causal:
                    return None  # a scaled mask: SDPA adds the mask after scaling
                scale.append(step)
            elif step[0] == "mask":
                if step[1] is None:
                    return None
                mask, seen_mask, safe = ctx.segment(step[1]), True, False
            elif step[0] == "fill":
                cond, value = step[1], step[2]
                if not _is_neg_inf(value):
                    return None
                seen_mask = True
                if self._is_causal_condition(cond):
                    causal = True
                else:
                    mask, safe = self._keep_mask(cond), False
            elif step[0] == "cast":
                safe = False
        for step in probs.steps:
            if step[0] == "cast":
                safe = False
            elif step[0] == "dropout":
                _, p, training, qual = step
                if p is None:
                    return None
                safe = False
                if training is None and qual == "torch.nn.functional.dropout":
                    kwargs.append(f"dropout_p={ctx.segment(p)}")
                elif training is not None:
                    kwargs.append(f"dropout_p=({ctx.segment(p)} if {ctx.segment(training)} else 0.0)")
                else:
                    return None
            elif step[0] == "dropout_module":
                safe = False
                kwargs.append(f"dropout_p=({ctx.segment(step[1])}.p if self.training else 0.0)")
            elif step[0] == "dropout_parameter":
                safe = False
                name = ctx.segment(step[1])
                kwargs.append(f"dropout_p=({name}.p if {name} is not None and {name}.training else 0.0)")
        if mask is not None:
            kwargs.insert(0, f"attn_mask={mask}")
        if len(scale) > 1:
            return None
        if scale:
            _, expr, op = scale[0]
            if not (self._is_default_scale(expr, op, scores.q) or self._is_default_scale(expr, op, scores.k)):
                text = ctx.segment(expr)
                if op == "/" and not isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Subscript)):
                    text = f"({text})"
                kwargs.append(f"scale={text}" if op == "*" else f"scale=1 / {text}")
                if not self._is_number(expr):
                    if any(_kinds.is_tensor(ctx, sub) for sub in ast.walk(expr) if isinstance(sub, ast.expr)):
                        return None  # SDPA's scale is a float; a tensor scale would have to move into q
                    safe = False
        else:
            kwargs.append("scale=1.0")
        if causal:
            kwargs.append("is_causal=True")
        tensors = [ctx.segment(x) for x in (scores.q, scores.k, probs.v)]
        if operands.rank == 3:  # (B·H, L, E) as (1, B·H, L, E): 4-D for the fused kernels
            tensors = [(text if isinstance(x, _ATOMIC) else f"({text})") + ".unsqueeze(0)"
                       for text, x in zip(tensors, (scores.q, scores.k, probs.v))]
        if any("\n" in arg for arg in tensors + kwargs):
            return None
        call = self._call_text(probs.pv.node, f"{prefix}.{_SDPA}", tensors + kwargs,
                               ".squeeze(0)" if operands.rank == 3 else "")
        edits = [ctx.edit(probs.pv.node, call)]
        deleted = {row for stmt in statements if stmt is not final for row in range(stmt.lineno, stmt.end_lineno + 1)}
        edits += [Edit("", first, 1, last + 1, 1) for first, last in self._line_runs(deleted)]
        return Fix("replace with F.scaled_dot_product_attention", tuple(edits), safe)

    def _call_text(self, node: ast.AST, func: str, args: list, after: str) -> str:
        """`func(args)after` to replace `node` with: on one line, or, where that line would pass
        120 columns, with the arguments on lines of their own, as black and ruff format a call."""
        one = f"{func}({', '.join(args)}){after}"
        line = self.ctx.lines[node.lineno - 1]
        if node.lineno != node.end_lineno or len(line) - (node.end_col_offset - node.col_offset) + len(one) <= 120:
            return one
        indent = line[:len(line) - len(line.lstrip())]
        rows = [""]
        for arg in args:
            if rows[-1] and len(indent) + 4 + len(rows[-1]) + len(arg) + 2 > 120:
                rows.append("")
            rows[-1] += f"{' ' if rows[-1] else ''}{arg},"
        inner = "\n".join(f"{indent}    {row}" for row in rows)
        return f"{func}(\n{inner}\n{indent}){after}"

    def _line_runs(self, deleted: set) -> list:
        """Runs of rows to delete: the statements' rows, plus a blank row that would otherwise
        follow another blank row once they are gone."""
        lines = self.ctx.lines
        blank = lambda row: not lines[row - 1].strip()  # noqa: E731
        rows = set(deleted)
        for row in sorted(deleted):
            before, after = row - 1, row + 1
            while before in rows:
                before -= 1
            while after in rows:
                after += 1
            if before >= 1 and after <= len(lines) and blank(before) and blank(after):
                rows.add(after)
        runs, start = [], None
        for row in sorted(rows):
            if start is None:
                start = prev = row
            elif row == prev + 1:
                prev = row
            else:
                runs.append((start, prev))
                start = prev = row
        if start is not None:
            runs.append((start, prev))
        return runs

    def _own_lines(self, stmt: ast.stmt) -> bool:
        lines = self.ctx.lines
        before = lines[stmt.lineno - 1][:stmt.col_offset]
        after = lines[stmt.end_lineno - 1].encode()[stmt.end_col_offset:].decode(errors="replace")
        alone = not before.strip() and (not after.strip() or after.strip().startswith("#"))
        return alone and stmt.end_lineno < len(lines)

    def _is_causal_condition(self, cond: ast.AST) -> bool:
        """`tril_buffer[..., :T, :T] == 0` (or `~tril[...]`, `.logical_not()`) for a lower-triangular buffer of ones."""
        if isinstance(cond, ast.Compare) and len(cond.ops) == 1 and isinstance(cond.ops[0], ast.Eq):
            zero = cond.comparators[0]
            if not (isinstance(zero, ast.Constant) and zero.value in (0, False)):
                return False
            keep = cond.left
        elif isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Invert):
            keep = cond.operand
        else:
            return False
        if not isinstance(keep, ast.Subscript):
            return False
        slices = keep.slice.elts if isinstance(keep.slice, ast.Tuple) else [keep.slice]
        if len(slices) < 2 or not all(isinstance(s, ast.Slice) and s.lower is None and s.step is None for s in slices):
            return False
        rows, cols = slices[-2].upper, slices[-1].upper
        if rows is None or cols is None or ast.dump(rows) != ast.dump(cols):
            return False
        if any(s.upper is not None for s in slices[:-2]):
            return False
        base = keep.value
        if not (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self"):
            return False
        values = _kinds.class_attribute_values(self.ctx, self.ctx.class_, base.attr) if self.ctx.class_ else []
        return len(values) == 1 and self._is_tril_of_ones(values[0][1])

    def _is_tril_of_ones(self, node: ast.AST) -> bool:
        # torch.tril(torch.ones(n, n)).view(1, 1, n, n), possibly with .bool() / .to(...)
        while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("view", "reshape", "bool", "to", "unsqueeze", "float", "byte")):
            node = node.func.value
        if not isinstance(node, ast.Call):
            return False
        if self.ctx.qualname(node.func) == "torch.tril":
            if len(node.args) != 1 or any(k.arg == "diagonal" for k in node.keywords):
                return False
            ones = node.args[0]
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "tril" and not node.args and not node.keywords:
            ones = node.func.value
        else:
            return False
        if not (isinstance(ones, ast.Call) and self.ctx.qualname(ones.func) == "torch.ones"):
            return False
        dims = [a for a in ones.args]
        return len(dims) == 2 and ast.dump(dims[0]) == ast.dump(dims[1])

    def _keep_mask(self, cond: ast.AST) -> str:
        ctx = self.ctx
        if (isinstance(cond, ast.Compare) and len(cond.ops) == 1 and isinstance(cond.ops[0], ast.Eq)
                and isinstance(cond.comparators[0], ast.Constant) and cond.comparators[0].value == 0):
            return f"{ctx.segment(cond.left)} != 0"
        if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Invert):
            return ctx.segment(cond.operand)
        return f"~({ctx.segment(cond)})"

    def _is_default_scale(self, expr: ast.AST, op: str, q: ast.AST) -> bool:
        """`/ math.sqrt(q.size(-1))`, `* q.shape[-1] ** -0.5` and friends: SDPA's own default
        (called with k too: q @ kᵀ makes their last dims equal)."""
        def last_dim(node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size":
                return len(node.args) == 1 and int_const(node.args[0]) == -1 and ast.dump(node.func.value) == ast.dump(q)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
                return int_const(node.slice) == -1 and ast.dump(node.value.value) == ast.dump(q)
            return False

        def sqrt_of_last_dim(node):
            if isinstance(node, ast.Call) and self.ctx.qualname(node.func) in ("math.sqrt",) and len(node.args) == 1:
                return last_dim(node.args[0])
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
                exp = node.right
                return isinstance(exp, ast.Constant) and exp.value == 0.5 and last_dim(node.left)
            return False

        if op == "/":
            return sqrt_of_last_dim(expr)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Pow):
            exp = expr.right
            return (isinstance(exp, ast.UnaryOp) and isinstance(exp.op, ast.USub)
                    and isinstance(exp.operand, ast.Constant) and exp.operand.value == 0.5 and last_dim(expr.left))
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
            one = expr.left
            return isinstance(one, ast.Constant) and one.value in (1, 1.0) and sqrt_of_last_dim(expr.right)
        return False

    def _is_number(self, expr: ast.AST) -> bool:
        """A Python number, not a tensor: SDPA's `scale` must be a float."""
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
        if isinstance(expr, ast.BinOp):
            return self._is_number(expr.left) and self._is_number(expr.right)
        if isinstance(expr, ast.UnaryOp):
            return self._is_number(expr.operand)
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func)
            if qual in ("math.sqrt", "math.log", "math.exp"):
                return all(self._is_number(a) for a in expr.args)
            if isinstance(expr.func, ast.Attribute) and expr.func.attr == "size":
                return True
            return isinstance(expr.func, ast.Name) and expr.func.id in ("float", "int", "len")
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape":
            return True
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return _kinds.kind_of(self.ctx, expr) == _kinds.SCALAR
        return False
