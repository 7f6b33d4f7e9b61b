"""MAT601's recognition of the scores: the q·kᵀ GEMM and the steps between it and the softmax (scale,
mask, fill, cast), followed through names, conditional and in-place updates."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import file_calls
from matlint.semantic.flow import FunctionFlow
from matlint.semantic.kinds import int_const
from matlint.semantic.layout import reorder
from matlint.semantic.loops import walk_no_scopes
from matlint.semantic.project import imported_function
from matlint.semantic.pointwise import is_true, product, reads_metadata, torch_op
from matlint.semantic.torch_api import as_gemm

# Methods that lay a tensor out anew and keep its values: what they give is what they were given.
_RESHAPES = frozenset({"view", "reshape", "permute", "transpose", "contiguous", "flatten", "unflatten"})


_CAST_METHODS = {"to", "type_as", "type", "float", "half", "bfloat16", "double"}
_MAX_DEPTH = 24
_TRANSPOSE_METHODS = frozenset({"transpose", "swapaxes", "swapdims"})
_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


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
    keys_transposed: bool = False  # `q @ k` with k handed in as (..., E, S): SDPA takes `k.transpose(-2, -1)`


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


def _gated_by_mask(left: ast.AST, right: ast.AST) -> Optional[ast.AST]:
    """`w` in `w * b - c * (1 - b)` or `w * b + c * (1 - b)` (either factor order): scores kept
    where the 0/1 mask `b` is 1 and pushed to a large constant where it is 0."""
    if not (isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mult)
            and isinstance(right, ast.BinOp) and isinstance(right.op, ast.Mult)):
        return None
    complements = [side.right for side in (right.left, right.right)
                   if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Sub)
                   and isinstance(side.left, ast.Constant) and side.left.value == 1]
    for scores, mask in ((left.left, left.right), (left.right, left.left)):
        if any(ast.dump(mask) == ast.dump(c) for c in complements):
            return scores
    return None


def _within(node: ast.AST, outer: ast.AST) -> bool:
    return ((outer.lineno, outer.col_offset) <= (node.lineno, node.col_offset)
            and (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset))


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


def _only_fills_first_argument(function: ast.AST) -> bool:
    """`function` writes values into its first parameter by index (`m[..., i, j] = value`) and
    reads it otherwise only for its size, shape, dtype or device."""
    params = function.args.posonlyargs + function.args.args
    if not params:
        return False
    name, writes = params[0].arg, 0
    for parent in ast.walk(function):
        for node in ast.iter_child_nodes(parent):
            if not (isinstance(node, ast.Name) and node.id == name):
                continue
            if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store) and parent.value is node:
                writes += 1
            elif not (isinstance(parent, ast.Attribute) and parent.attr in ("size", "shape", "dtype", "device", "dim")):
                return False
    return writes > 0


class _ScoresPattern:
    """The scores half of ManualAttention's pattern."""

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
            if method in ("masked_fill", "masked_fill_") and len(node.args) == 2 and not node.keywords:
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

    def _arm_scores(self, flow: FunctionFlow, node: ast.AST) -> list:
        """The q·kᵀ chains of the arms of an `if` that each store the scores `node` reads
        (`if kind == "dot": score = torch.bmm(q, kt)` / `elif kind == "scaled": ...` / `else:
        score = mlp(q, k)`): one for each arm that computes attention scores, none where the
        stores are not in exclusive arms."""
        if not isinstance(node, ast.Name):
            return []
        reaching = flow.reaching_all(node)
        stores = [store for store, simple in reaching if simple and isinstance(store, ast.Assign)]
        if len(stores) < 2 or len(stores) != len(reaching) or not all(
                flow.in_exclusive_arms(a, b) for i, a in enumerate(stores) for b in stores[i + 1:]):
            return []
        found = []
        for store in stores:
            arm = self._through(flow, node, store, store.value, None, 0, ())
            if arm is not None:
                arm.conditional = True  # the other arms still need the softmax: no fix
                found.append(arm)
        return found

    def _through(self, flow: FunctionFlow, node: ast.Name, store: ast.stmt, inner: ast.AST, step, depth: int,
                 skip: tuple) -> Optional[_Scores]:
        """The chain through `store`, the statement whose value `node` reads, when nothing else
        reads that value but in-place fills and metadata (`.shape`, `.dtype`, `.size()`)."""
        readers = flow.uses(store) if isinstance(store, ast.Assign) else self._readers(flow, store)
        if isinstance(node.ctx, ast.Load) and node not in readers:
            return None
        metadata, fills, other_branch = [], [], False
        for use in readers:
            if use is node or use in skip:
                continue
            if reads_metadata(flow, use):
                metadata.append(use)
                continue
            if flow.in_exclusive_arms(use, node):
                other_branch = True  # `if mask is not None: ...softmax(s + mask) else: ...softmax(s)`
                continue
            fill = self._in_place_fill(flow, use, store, node) or self._masking_call(flow, use, store, node)
            if fill is None:
                return None
            fills.append(fill)
        found = self._scores(flow, inner, depth + 1)
        if found:
            found.conditional |= other_branch  # the other arm still needs the statement: no fix
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
        if op in (ast.Add, ast.Sub):
            gated = _gated_by_mask(left, right)
            if gated is not None:
                # `w * b - 1e10 * (1 - b)`: a 0/1 mask applied as product and offset (no fix: no one
                # mask argument says it)
                found = self._scores(flow, gated, depth + 1, skip)
                if found:
                    found.steps.append(("mask", None))
                return found
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

    def _masking_call(self, flow: FunctionFlow, use: ast.Name, assign: ast.stmt, later: ast.Name):
        """(statement, step) for `mask_(scores, maskval=float("-inf"))`, a statement of its own before
        `later` reads the scores, calling a function of the project that only writes values into
        its first argument by index (`matrices[..., i, j] = maskval`): a mask applied in place,
        whose exact form is left to the reader (no fix); else None."""
        call = flow.parent.get(use)
        statement = flow.parent.get(call)
        if not (isinstance(call, ast.Call) and call.args and call.args[0] is use and isinstance(statement, ast.Expr)
                and (statement.end_lineno, statement.end_col_offset) <= (later.lineno, later.col_offset)):
            return None
        definition = file_calls(self.ctx).module_functions.get(getattr(call.func, "id", None))
        if definition is None:
            imported = imported_function(self.ctx, call.func)
            definition = imported[0] if imported else None
        if definition is None or not _only_fills_first_argument(definition):
            return None
        branch = statement
        while not flow.same_block(branch, assign):
            branch = flow.parent.get(branch)
            if not isinstance(branch, ast.If):
                return None
        return statement, ("mask", None)

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
            if gemm.op in ("@", "matmul", "bmm") and (self._handed_in(flow, kt) and self._handed_in(flow, q) or (
                    isinstance(q, ast.Name) and isinstance(kt, ast.Name) and self._projected(flow, q)
                    and self._projected(flow, kt))):
                # `torch.matmul(q, k)` on tensors the function is given, k transposed by the caller
                # (GPT-2's `split_heads(key, k=True)`), or on projections it made with the keys laid
                # out (..., E, S) (`k = self.fc_k(x).view(b, n, h, d).permute(0, 2, 3, 1)`): the
                # softmax and the product with v after it make it attention all the same.
                return _Scores(gemm, q, kt, False, True, keys_transposed=True)
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

    def _projected(self, flow: FunctionFlow, node: ast.Name, depth: int = 0) -> bool:
        """`node` holds a module's output reshaped (`self.fc_k(keys).view(...).permute(...)`,
        `self.proj_k(h)` then `k.view(B, C, H * W)`), or a part of one split along an axis (`q,
        k, v = torch.split(self.to_qkv(x), c, dim=1)`, `.chunk(3, dim=1)`): an activation of this
        call, not a weight."""
        reaching = flow.reaching_all(node)
        if len(reaching) != 1 or not isinstance(reaching[0][0], ast.Assign) or depth > 3:
            return False
        assign, simple = reaching[0]
        value = assign.value
        if not simple:  # `q, k, v = torch.split(self.to_qkv(x), c, dim=1)`
            if not (isinstance(assign.targets[0], ast.Tuple) and isinstance(value, ast.Call) and value.args
                    and isinstance(value.func, ast.Attribute) and value.func.attr in ("split", "chunk", "tensor_split")):
                return False
            value = value.args[0] if self.ctx.qualname(value.func) is not None else value.func.value
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _RESHAPES:
            value = value.func.value
        if isinstance(value, ast.Name):  # `k = k.view(B, C, H * W)`: what it held before
            return self._projected(flow, value, depth + 1)
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)  # a submodule's output
                and isinstance(value.func.value, ast.Name) and value.func.value.id == "self")

    @staticmethod
    def _handed_in(flow: FunctionFlow, node: ast.AST) -> bool:
        """`node` is a parameter of the function, read as it was given (no other store reaches it)."""
        return isinstance(node, ast.Name) and [stmt for stmt, _ in flow.reaching_all(node)] == [None]

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
