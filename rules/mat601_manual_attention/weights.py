"""MAT601's recognition of the weights: the softmax call, the dropout and the second GEMM that
consumes them, and the signs that the softmax is not attention's (cosine scores, weights fed back)."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import argument_for, file_calls
from matlint.semantic.flow import FunctionFlow, flow_of
from matlint.semantic.loops import name_tokens
from matlint.semantic.torch_api import as_gemm

from .scores import _CAST_METHODS, _MAX_DEPTH, _Scores, _arg, _einsum_terms


_SOFTMAX_FUNCTIONS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_DROPOUT_FUNCTIONS = {"torch.nn.functional.dropout", "torch.dropout"}


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
    returned: list = field(default_factory=list)  # the loads by which the function also returns the probabilities


def _builds_softmax_module(ctx) -> bool:
    """The file may build an `nn.Softmax` module (an identifier spells `Softmax`)."""
    return _kinds.may_mention(ctx, "Softmax")


class _WeightsPattern:
    """The weights half of ManualAttention's pattern."""

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
        if (isinstance(func, ast.Call) and ctx.qualname(func.func) == "torch.nn.Softmax" and len(call.args) == 1
                and not call.keywords):
            return call.args[0], _arg(func, 0, "dim"), False  # `nn.Softmax(dim=-1)(scores)`
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

    def _probs(self, flow: FunctionFlow, softmax: ast.Call, restore: Optional[ast.AST] = None) -> Optional[_Probs]:
        """The probabilities' way from `softmax` to the GEMM with the values. `restore`: the row
        length of a softmax over flattened scores, whose result is viewed back to the scores'
        shape (`.view(b, -1, n_keys)`) straight after."""
        returned: list = []
        probs = self._probs_chain(flow, softmax, returned, restore)
        if probs is not None:
            probs.returned = returned
        return probs

    def _callers_keep_weights(self, flow: FunctionFlow, probs: _Probs) -> bool:
        """A caller in this file stores the returned probabilities on `self` (`x, self.scores =
        Block.attention(q, k, v, mask)`): they are kept for later, which SDPA cannot do."""
        for load in probs.returned:
            tuple_ = flow.parent.get(load)
            if not isinstance(tuple_, ast.Tuple):
                continue
            index = next(i for i, elt in enumerate(tuple_.elts) if elt is load)
            for site in file_calls(self.ctx).call_sites(flow.function):
                stmt = site.functions and flow_of(self.ctx, site.functions[-1]).statement(site.call)
                if not (isinstance(stmt, ast.Assign) and stmt.value is site.call and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Tuple) and len(stmt.targets[0].elts) == len(tuple_.elts)):
                    continue
                kept = stmt.targets[0].elts[index]
                if isinstance(kept, ast.Attribute) and isinstance(kept.value, ast.Name) and kept.value.id == "self":
                    return True
        return False

    def _probs_chain(self, flow: FunctionFlow, softmax: ast.Call, returned: list,
                     restore: Optional[ast.AST]) -> Optional[_Probs]:
        """`_probs`' walk; reads of the probabilities that are returned as they are go to `returned`."""
        node, steps, statements = softmax, [], []
        if restore is not None:
            view = flow.parent.get(softmax)
            call = flow.parent.get(view)
            if not (isinstance(view, ast.Attribute) and view.attr in ("view", "reshape") and isinstance(call, ast.Call)
                    and call.func is view and len(call.args) >= 2 and not call.keywords
                    and self.ctx.segment(call.args[-1]) == self.ctx.segment(restore)):
                return None
            node = call
        for _ in range(_MAX_DEPTH):
            parent = flow.parent.get(node)
            if isinstance(parent, ast.Assign):
                if not (len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name) and parent.value is node):
                    return None
                uses = flow.uses(parent)
                # `return out, p_attn`: the weights go back to the caller too, which SDPA cannot do
                in_return = [u for u in uses if _returned_as_is(flow, u)]
                uses = [u for u in uses if u not in in_return]
                if len(uses) == 2:
                    # `if self.training: attn = self.drop(attn)`: go on through the update.
                    for last in uses:
                        optional = flow.optional_update(last, tuple(in_return))
                        if optional is not None and optional[1] is parent:
                            uses = [u for u in uses if flow.statement(u) is optional[0]]
                            break
                if len(uses) != 1:
                    return None
                returned.extend(in_return)
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
                outer = flow.parent.get(call)
                gemm = as_gemm(self.ctx, outer) if isinstance(outer, (ast.BinOp, ast.Call)) else None
                swapped = self._untranspose(call, gemm.op) if gemm is not None and len(gemm.operands) == 2 \
                    and gemm.operands[1] is call and gemm.op in ("@", "matmul", "bmm") else None
                if swapped is not None and swapped[0] is node and not swapped[2]:
                    # `torch.bmm(v, attn.permute(0, 2, 1))`: (attn @ vᵀ)ᵀ, the values laid out (..., E, S)
                    return _Probs(gemm, gemm.operands[0], steps + [("layout",), ("values_left",)], statements)
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
        if (qual is None and len(call.args) == 1 and not call.keywords and isinstance(func, ast.Name)
                and self._named_dropout_parameter(func.id)):
            return ("dropout_unknown", func)
        return None

    def _named_dropout_parameter(self, name: str) -> bool:
        """`name` is a parameter of the function, named as a dropout (`dropout`, `attn_drop`), that no
        call of this file passes (the callers live in other files): a dropout of unknown kind,
        which keeps the attention reported but lets no fix be written."""
        function = self.ctx.function
        if function is None or isinstance(function, ast.Lambda):
            return False
        params = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
        return (name in {p.arg for p in params} and not file_calls(self.ctx).call_sites(function)
                and bool({"dropout", "drop"} & set(name_tokens(name))))

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
