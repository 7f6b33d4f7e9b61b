"""MAT601's fix: the hand-written chain rewritten into one `F.scaled_dot_product_attention` call
(the mask as attn_mask or is_causal, the scale when it is not the default, the chain's lines deleted)."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.diagnostics import Edit, Fix
from matlint.fixes import call_text, line_runs, own_lines
from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import FunctionFlow
from matlint.semantic.kinds import int_const
from matlint.semantic.names import spelling

from .layout import _Operands
from .scores import _ATOMIC, _Scores, _is_neg_inf, _within
from .weights import _Probs


_SDPA = "scaled_dot_product_attention"


class _SdpaFix:
    """ManualAttention's SDPA rewrite."""

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
            if not flow.same_block(stmt, final) or not own_lines(ctx.lines, stmt):
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
            elif step[0] == "dropout_unknown":
                return None  # a callable passed in from another file: what it does is not known here
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
        call = call_text(ctx.lines, probs.pv.node, f"{prefix}.{_SDPA}", tensors + kwargs,
                         ".squeeze(0)" if operands.rank == 3 else "")
        edits = [ctx.edit(probs.pv.node, call)]
        deleted = {row for stmt in statements if stmt is not final for row in range(stmt.lineno, stmt.end_lineno + 1)}
        edits += [Edit("", first, 1, last + 1, 1) for first, last in line_runs(ctx.lines, deleted)]
        return Fix("replace with F.scaled_dot_product_attention", tuple(edits), safe)

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
