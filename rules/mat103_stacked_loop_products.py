"""MAT103 stacked-loop-products: per-item products summed out by hand, collected in a list and
stacked, where one broadcasted call (or einsum) computes all items."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import function_may_mention
from matlint.semantic.loops import LoopInfo, loaded_names, walk_no_scopes
from matlint.semantic.torch_api import as_gemm
from matlint.semantic.tree import product_factors
from .mat101_python_loop_matmul import PythonLoopMatmul

_JOINS = {"torch.stack": "stack", "torch.cat": "cat", "torch.concat": "cat", "torch.concatenate": "cat"}


# Methods that reduce a whole item to one number (`p.mean()`): one call with the item dim kept
# does it for every item.
_WHOLE_REDUCTIONS = frozenset({"mean", "sum"})
# List methods that change the list: an `append` loop fills it only when it is the one change.
_LIST_CHANGES = frozenset({"append", "extend", "insert", "reverse", "sort", "pop", "remove", "clear"})


def _range_call(expr: ast.AST) -> Optional[ast.Call]:
    """`range(...)`, else None."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "range":
        return expr
    return None


def _stack_dim(node: ast.Call) -> Optional[int]:
    """The literal dim of `torch.stack(items)` (0), `torch.stack(items, 1)`, `torch.stack(items, dim=1)`;
    None for a negative, computed or unusual one."""
    if len(node.args) > 2 or any(k.arg != "dim" for k in node.keywords):
        return None
    given = node.args[1:] + [k.value for k in node.keywords]
    if not given:
        return 0
    dim = given[0]
    if len(given) == 1 and isinstance(dim, ast.Constant) and type(dim.value) is int and dim.value >= 0:
        return dim.value
    return None


class StackedLoopProducts(Rule):
    code = "MAT103"
    name = "stacked-loop-products"
    summary = "Per-item multiply-and-sum products collected in a list and stacked; one broadcasted call or einsum computes them all."
    docs = """
    ## What it does
    Flags `torch.stack`/`torch.cat` of a list built one item at a time (a comprehension, also
    inside `tuple(...)`, or a `for` or `while` loop appending to the list), and a tensor buffer
    filled row by row in a `for i in range(...)` loop (`out[i] = ...`, the loop's one use of
    `out`), when each item is a contraction written out by hand: an elementwise product (of two
    factors or more) summed over some dims, `(x[i] * w).sum(-1)`, `torch.sum(a[i] * b[i], dim=-1)`,
    where the factors are the loop's slice of a tensor (`x[i]`, `x[:, i]`, `for xi in x`), values
    computed from it element by element (`torch.log(p)`) or reducing it whole (`p.mean()`, which
    is `probs.mean(1, keepdim=True)` for all items), and values fixed across the loop; the sum may
    be negated (`-torch.sum(p * torch.log(p))`). The list may be rebound to what its stack makes
    (`xs = torch.stack(xs)`). The message spells out the single call where it is exact:
    the loop takes every item from the first (`range(n)`, not `range(1, n)` or a `while`
    counter) and the items are stacked along the dim they were taken from (`x[i]` with `dim=0`,
    `x[:, h]` with `dim=1`); otherwise it describes the rewrite.

    This rule and MAT101 split the work: a loop whose items are GEMMs (`@`, `matmul`, `bmm`,
    `einsum`, `dot`, `nn.Linear`...) is MAT101's, which reports each GEMM; MAT103 stays quiet on
    any stacked list whose items contain a GEMM, and reports only the products MAT101 does not
    see: multiply-then-sum written with `*` and `sum`.

    ## Why is this bad?
    Each item costs a multiply kernel, a reduction kernel, and a temporary, plus the final
    copy into the stacked tensor: for n items that is 2n+1 launches where one broadcasted
    product and sum (or one `einsum`, which runs as a GEMM on the matrix units) does the same
    work in one or two.

    ## Example
    ```python
    scores = torch.stack([(q[i] * k[i]).sum(-1) for i in range(n)])
    ```

    ## Use instead
    ```python
    scores = (q * k).sum(-1)              # or torch.einsum("nd,nd->n", q, k)
    ```

    ## Stays quiet on
    - Items containing a GEMM (MAT101 reports those) and items that are not a product summed
      out (`x[i] * w` alone, `f(x[i])`).
    - Items of lists (their shapes may differ), chunked loops, numpy arrays, names of unknown kind.
    - Recurrences (an item depends on the previous one, also through a name: `prev = buf[i]`
      where the loop writes `buf[i + 1]`, or an attribute: `self.prev` read, then rebound),
      factors the loop rebinds or changes in place (`self.scale = x[i]`), lists that get other appends or changes too
      (`out.reverse()`, `out[0] = ...`), appends under an `if` (filtered items), and loops
      with `break`, `continue`, `return` or `raise`.

    ## Fix safety
    No automatic fix: the broadcasted form may need `unsqueeze` to align dims, which needs the
    shapes; the message gives the call where it is exact.
    """

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        # MAT101's analysis of per-step items, reused rather than copied.
        self._loop_gemms = PythonLoopMatmul(ctx)

    # A join is `torch.stack(...)`, `T.cat(...)`, or a bare name bound to one (`stack(...)`).
    only = {"visit_Call": Only(attrs=frozenset(name.rsplit(".", 1)[1] for name in _JOINS)),
            "visit_Assign": Only(in_loops=True)}

    def visit_Assign(self, node: ast.Assign) -> None:
        """`out[i] = (x[i] * y[i]).sum(-1)` in `for i in ...`: a tensor buffer filled item by
        item, the same products as a stacked list."""
        target = node.targets[0] if len(node.targets) == 1 else None
        if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and isinstance(target.slice, ast.Name)):
            return
        product = self._product_sum(node.value)  # syntax only: first, it rules out most statements
        if product is None:
            return
        loop = self.ctx.loops[-1]
        buffer = target.value.id
        if (not isinstance(loop.node, ast.For) or _range_call(loop.node.iter) is None
                or loop.targets != {target.slice.id} or node not in loop.node.body
                or buffer in loaded_names(node.value) or not _kinds.is_tensor(self.ctx, target.value)):
            return
        for stmt in loop.node.body + loop.node.orelse:
            for sub in walk_no_scopes(stmt):
                if isinstance(sub, (ast.Break, ast.Continue, ast.Return, ast.Raise)):
                    return
                if isinstance(sub, ast.Name) and sub.id == buffer and sub is not target.value:
                    return  # the loop reads or changes the buffer elsewhere too
        found = self._judge(loop, node.value, product)
        if found is None:
            return
        factors, rebuild, dims, slices = found
        seg = self.ctx.segment
        fill = lambda whole: f"{seg(target.value)} = {rebuild(whole)}"
        self.report(node, f"each item is a product summed out by hand, computed one item at a time and written into "
                          f"`{seg(target.value)}`: {self._suggestion('stack', 0, dims, factors, slices, fill, loop)}")

    def visit_Call(self, node: ast.Call) -> None:
        join = _JOINS.get(self.ctx.qualname(node.func))
        if join is None or not node.args:
            return
        function = self.ctx.function
        if not function_may_mention(self.ctx, function if function is not None else self.ctx.tree, ("sum",)):
            return  # no item can be `(...).sum(...)` or `torch.sum(...)`: skip the loop analyses
        listed = node.args[0]
        if (isinstance(listed, ast.Call) and isinstance(listed.func, ast.Name) and listed.func.id in ("tuple", "list")
                and len(listed.args) == 1 and not listed.keywords and self.ctx.qualname(listed.func) is None
                and isinstance(listed.args[0], (ast.ListComp, ast.GeneratorExp))):
            listed = listed.args[0]  # `torch.stack(tuple(... for i in range(n)))`
        if isinstance(listed, ast.Name):
            value = self._single_value(listed.id)
            listed = value if isinstance(value, ast.ListComp) else listed
        if isinstance(listed, (ast.ListComp, ast.GeneratorExp)):
            loop = LoopInfo(listed, self.ctx)
            if len(listed.generators) != 1 or listed.generators[0].ifs:
                return
            item = listed.elt
        elif isinstance(listed, ast.Name):
            found = self._appending_loop(listed.id, node)
            if found is None:
                return
            loop, item = found
            if isinstance(item, ast.Name) and item.id not in loop.targets:
                if item.id in loop.carried_all:
                    return  # appends the value of the iteration before
                item = self._loop_gemms._single_assignment(loop, item.id)  # `s = (q[i] * k[i]).sum(-1)`
                if item is None:
                    return
        else:
            return
        product = self._product_sum(item)  # syntax only: first, it rules out most items
        if product is None:
            return
        found = self._judge(loop, item, product)
        if found is None:
            return
        factors, rebuild, dims, slices = found
        self.report(node, f"each item is a product summed out by hand, computed one item at a time and "
                          f"{'stacked' if join == 'stack' else 'concatenated'}: "
                          f"{self._suggestion(join, _stack_dim(node), dims, factors, slices, rebuild, loop)}")

    def _judge(self, loop: LoopInfo, item: ast.AST, product):
        """(factors, rebuild, dims, [(factor, its batched form)]) when `item`, a product summed
        out, takes the loop's slice of some factors and reads nothing else that changes."""
        if loop.reads_carried(item):
            return None
        if any(as_gemm(self.ctx, sub) for sub in walk_no_scopes(item) if isinstance(sub, (ast.BinOp, ast.Call))):
            return None
        factors, rebuild, dims = product
        slices = []
        for factor in factors:
            if loop.depends_on_iteration(factor) or loop.changes(factor):
                batched = self._per_item(loop, factor)
                if batched is None:
                    return None
                slices.append((factor, batched))
            elif loaded_names(factor) & loop.targets:
                return None
        return (factors, rebuild, dims, slices) if slices else None

    def _per_item(self, loop: LoopInfo, factor: ast.AST):
        """The factor's batched form: the loop's item, computed from items element by element
        (`torch.log(p)` for `p` in `probs`), or the item reduced whole (`p.mean()`, which is
        `probs.mean(1, keepdim=True)` over all items)."""
        if isinstance(factor, ast.Name) and factor.id not in loop.targets:
            # `xi = x[i]` then `xi * w`: judge the assigned value.
            assigned = self._loop_gemms._single_assignment(loop, factor.id)
            return self._loop_gemms._batched(loop, assigned, 0, transforms=True) if assigned is not None else None
        if (isinstance(factor, ast.Call) and isinstance(factor.func, ast.Attribute) and factor.func.attr in _WHOLE_REDUCTIONS
                and not factor.args and not factor.keywords and self.ctx.qualname(factor.func) is None):
            reduced = self._loop_gemms._batched(loop, factor.func.value, 0, transforms=True)
            return reduced.wrapped() if reduced is not None else None
        return self._loop_gemms._batched(loop, factor, 0, transforms=True)

    def _product_sum(self, item: ast.AST):
        """([factors], rebuild, [dim args]) for `(a * b).sum(...)` / `torch.sum(a * b, ...)`; `rebuild(product)` writes the call anew."""
        seg = self.ctx.segment
        if isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.USub):
            found = self._product_sum(item.operand)  # `-torch.sum(p * torch.log(p))`
            if found is None:
                return None
            factors, rebuild, dims = found
            return factors, lambda product: "-" + rebuild(product), dims
        if not isinstance(item, ast.Call):
            return None
        if self.ctx.qualname(item.func) == "torch.sum" and item.args:
            inner, positional = item.args[0], item.args[1:]
            rest = [seg(a) for a in positional] + [seg(k) for k in item.keywords]
            rebuild = lambda product: f"{seg(item.func)}({', '.join([product] + rest)})"
        elif isinstance(item.func, ast.Attribute) and item.func.attr == "sum" and self.ctx.qualname(item.func) is None:
            inner, positional = item.func.value, item.args
            rest = [seg(a) for a in positional] + [seg(k) for k in item.keywords]
            rebuild = lambda product: f"({product}).sum({', '.join(rest)})"
        else:
            return None
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Mult):
            factors = product_factors(inner)  # `(q[b] * k[b] * m[b]).sum(-1)`: every factor
        elif (isinstance(inner, ast.Call) and not inner.keywords and self.ctx.qualname(inner.func) == "torch.mul"
              and len(inner.args) == 2):
            factors = list(inner.args)
        elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "mul"
              and self.ctx.qualname(inner.func) is None and len(inner.args) == 1 and not inner.keywords):
            factors = [inner.func.value, inner.args[0]]  # `q[i].mul(k[i])`
        else:
            return None
        if any(isinstance(f, ast.Starred) for f in factors):
            return None
        dims = positional[:1] + [k.value for k in item.keywords if k.arg == "dim"]
        return factors, rebuild, dims

    def _takes_every_item(self, loop: LoopInfo) -> bool:
        """The loop walks its items from the first: `range(n)`, `range(0, n)`, `for xi in x`,
        `enumerate(x)` (not `range(1, n)`, nor a `while` counter whose start and step are not read)."""
        it = loop.iter
        if it is None:
            return False
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            return len(it.args) == 1 or (len(it.args) == 2 and isinstance(it.args[0], ast.Constant)
                                         and it.args[0].value == 0)
        return True

    @staticmethod
    def _reduces_trailing_dims(dims: list) -> bool:
        """A sum over negative dims only: those name the same dims with or without the item dim."""
        if len(dims) != 1:
            return False
        dim = dims[0]
        elts = dim.elts if isinstance(dim, (ast.Tuple, ast.List)) else [dim]
        return all(isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant)
                   for e in elts)

    def _suggestion(self, join, stack_dim, dims, factors, slices, rebuild, loop) -> str:
        seg = self.ctx.segment
        if not self._reduces_trailing_dims(dims):
            return "multiply the whole tensors once with the item dim kept (broadcasting or `torch.einsum`) and sum out the same dims"
        # The items are stacked along the dim they were taken from, and every item is taken.
        aligned = (join == "stack" and stack_dim is not None and self._takes_every_item(loop)
                   and all(b.plain and b.dim == stack_dim for _, b in slices))
        if aligned and len(slices) == len(factors):
            product = " * ".join(seg(b.base) for _, b in slices)
            return f"use one call over all items: `{rebuild(product)}`"
        if aligned and stack_dim == 0:
            whole = {id(f): seg(b.base) for f, b in slices}
            product = " * ".join(whole.get(id(f), seg(f)) for f in factors)
            return (f"use one broadcasted call over all items, e.g. `{rebuild(product)}` (check that the fixed "
                    f"factor lines up with the item dims, `unsqueeze(0)` if not), or `torch.einsum`")
        return "multiply the whole tensors once with the item dim kept (broadcasting or `torch.einsum`) and sum out the same dims"

    def _bindings(self):
        """For the function being walked (a lambda's one expression), or the module, in one walk:
        {name: [values of `name = value`]}, {name: stores of the name}, its for loops, and
        {name: changes of the list `name` (`name.append(...)`, `.sort()`, `name[i] = ...`)}."""
        fn = self.ctx.function
        key = ("mat103.bindings", id(fn if fn is not None else self.ctx.tree))
        found = self.ctx.shared.get(key)
        if found is not None:
            return found
        body = self.ctx.tree.body if fn is None else fn.body if isinstance(fn.body, list) else [fn.body]
        values, stores, loops, appends = {}, {}, [], {}
        for stmt in body:
            for sub in walk_no_scopes(stmt):
                cls = sub.__class__
                if cls is ast.Assign:
                    if len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                        values.setdefault(sub.targets[0].id, []).append(sub.value)
                elif cls is ast.Name:
                    if isinstance(sub.ctx, ast.Store):
                        stores[sub.id] = stores.get(sub.id, 0) + 1
                elif cls is ast.For or cls is ast.AsyncFor or cls is ast.While:
                    loops.append(sub)
                elif cls is ast.Call:
                    func = sub.func
                    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                            and func.attr in _LIST_CHANGES):
                        appends.setdefault(func.value.id, []).append(sub)
                elif cls is ast.Subscript and not isinstance(sub.ctx, ast.Load) and isinstance(sub.value, ast.Name):
                    appends.setdefault(sub.value.id, []).append(sub)  # `out[0] = ...`, `del out[-1]`
        found = self.ctx.shared[key] = (values, stores, loops, appends)
        return found

    def _single_value(self, name: str) -> Optional[ast.AST]:
        """The value of `name` when the function binds it exactly once, by `name = value`."""
        values, stores, _, _ = self._bindings()
        found = values.get(name, ())
        return found[0] if len(found) == 1 and stores.get(name) == 1 else None

    def _appending_loop(self, name: str, join: ast.Call):
        """The one loop that fills list `name` (bound to `[]`, and else only to a value made by the
        `join` of it: `xs = torch.stack(xs)`) by `name.append(item)`, its only change."""
        values, stores, loops, appends = self._bindings()
        appends = appends.get(name, ())
        if (len(appends) != 1 or not isinstance(appends[0], ast.Call) or appends[0].func.attr != "append"
                or len(appends[0].args) != 1):
            return None
        call = appends[0]
        owners = [loop for loop in loops if any(sub is call for stmt in loop.body for sub in walk_no_scopes(stmt))]
        starts = [v for v in values.get(name, ()) if not any(sub is join for sub in ast.walk(v))]
        if (len(owners) != 1 or len(starts) != 1 or not (isinstance(starts[0], ast.List) and not starts[0].elts)
                or stores.get(name) != len(values.get(name, ()))):
            return None
        owner = owners[0]
        # One item per iteration, in order: the append is a statement of the body itself (not under
        # an `if`), and nothing ends an iteration or the loop early.
        if not any(isinstance(stmt, ast.Expr) and stmt.value is call for stmt in owner.body):
            return None
        if any(isinstance(sub, (ast.Break, ast.Continue, ast.Return, ast.Raise))
               for stmt in owner.body + owner.orelse for sub in walk_no_scopes(stmt)):
            return None
        return LoopInfo(owner, self.ctx), call.args[0]
