"""MAT201 trailing-one-broadcast: `(N, 1) - (N,)` silently broadcasts to `(N, N)`."""
from __future__ import annotations

import ast

from matlint.rule import Only, Rule
from matlint.semantic.shapes import broadcast, fmt_shape, never_shaped, shape_of, trailing_one_mismatch

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}
_COMPARES = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FUNCTIONS = {"add": "+", "sub": "-", "subtract": "-", "mul": "*", "multiply": "*", "div": "/",
              "divide": "/", "true_divide": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
              "gt": ">", "ge": ">=", "maximum": "max", "minimum": "min", "pow": "**"}
_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


def operand_source(ctx, node) -> str:
    """Source of `node`, parenthesized unless a postfix (`.attr`, `[...]`, `(...)`) binds to it."""
    text = ctx.segment(node)
    return text if isinstance(node, _ATOMIC) else f"({text})"


def squeezed(ctx, node) -> str:
    return f"{operand_source(ctx, node)}.squeeze(-1)"


class TrailingOneBroadcast(Rule):
    code = "MAT201"
    name = "trailing-one-broadcast"
    summary = "An (N, 1) operand meets an (N,) operand and the result silently grows to (N, N)"
    runtime_docs = """
    The guard reports an element-wise op whose operands of shapes (N, 1) and (N,) broadcast to
    (N, N), from the shapes it observed. Quiet where the two operands are views of the same
    values (`s.unsqueeze(1) - s`: a pairwise matrix on purpose).
    """
    docs = """
    ## What it does
    Finds arithmetic and comparisons (`-`, `+`, `*`, `/`, `**`, `==`, `<`, ...; `torch.sub`,
    `x.mul(y)`, `sub(a, b)` after `from torch import sub`, ...) and `torch.where`/`x.where`
    (its two values and its condition broadcast together) where one operand has shape
    `(..., N, 1)` and the other `(..., N)`, one dim less, with the same `N`. Broadcasting lines
    the trailing 1 up against `N`, so `(N, 1) - (N,)` is an `(N, N)` matrix. Shapes come from
    matlint's symbolic shape analysis (constructors, `nn.Linear` outputs (also of an item of an
    `nn.ModuleList`/`nn.ModuleDict` taken by a fixed key, `self.heads[0](x)`), `view`, indexing,
    reductions, `gather` (the index's shape), jaxtyping annotations, `assert x.shape == ...`,
    `assert x.shape[0] == n`, and what the file's own classes return: another method of the class
    (`self.v(s)`), an instance held in an attribute (`self.critic(s)` after `self.critic =
    Critic(d)`) or module-level name (`net = Net()`), or passed as the argument every call of a
    module-level function passes (`train(model, ...)` after `model = Net()`), read off that method for the
    argument shapes given; a module-level float (`GAMMA = 0.99`) is a number); the rule fires
    only when both shapes are known.

    ## Why is this bad?
    Nothing fails: the result has N² elements instead of N, its mean trains happily toward the
    wrong answer, and the GPU spends N times the memory and work on numbers nobody wanted. The
    classic cases are a regression head `nn.Linear(d, 1)` giving `(N, 1)` predictions against an
    `(N,)` target (an actor-critic's `r + gamma * self.v(s_next).squeeze(-1) - self.v(s)`), and a
    DQN's `q_values.gather(1, actions.unsqueeze(1))`, `(N, 1)`, against an `(N,)` TD target.

    ## Example
    ```python
    head = nn.Linear(d, 1)
    pred = head(torch.randn(n, d))     # (n, 1)
    err = pred - torch.randn(n)        # (n, 1) - (n,) -> (n, n)
    ```

    ## Use instead
    ```python
    err = pred.squeeze(-1) - target    # (n,)
    # or, if an outer difference really is meant, say so:
    diff = pred - target[None, :]
    ```

    ## Stays quiet on
    Operands whose singleton axis the author asked for (`x[:, None]`, `unsqueeze`,
    `keepdim=True`, a literal 1 in `view`/`reshape`), also after shape-keeping functions and
    layers (`torch.sigmoid`, `nn.Sigmoid()`) and `expand(n, 1)`, including pairwise
    constructions such as `a[:, None] - b[None, :]`; `torch.outer`; operands that are both
    `(N, 1)` (a singleton asked for on one of them and not on the other was asked for to line
    the two up: `r.view(-1, 1) - critic(s)` is an `(N, 1)` that states no broadcast, and meeting
    an `(N,)` it is reported); any operand whose shape or rank is not known (a batch built from a Python list
    of items of unknown shape, a module of unknown class); sizes that are different symbols
    (`N` against `M` may differ), and in-place updates (`a -= b` cannot grow `a`).

    A literal 1 in a constructor (`torch.zeros(n, 1)`, `torch.rand(n, 1)`) is not taken as a
    request to broadcast: it gives storage its shape, most often the `(n, 1)` of per-row values
    that an `nn.Linear(d, 1)` head also gives, and an `(n, 1)` buffer of predictions or values
    met by an `(n,)` target is the bug this rule is for. Where an outer result is meant, say so
    on the other operand (`centres[None, :]`). `keepdim=True` stays exempt, also against an
    `(n,)` operand (`logits.argmax(1, keepdim=True).eq(target)` is not reported): the
    squared-distance idiom `(x ** 2).sum(1, keepdim=True) + (y ** 2).sum(1) - 2 * x @ y.T` builds
    its `(n, m)` matrix exactly so.

    ## Fix safety
    The fix squeezes the `(N, 1)` operand (`.squeeze(-1)`). It is unsafe: it changes the
    result's shape and values, which is the point, and code downstream may rely on the old
    shape. In `torch.where(a > b, a, b)` both the comparison and `where`'s values are reported,
    so `--fix` squeezes `a` in both places.
    """

    only = {"visit_Call": Only(attrs=frozenset(_FUNCTIONS) | {"where"})}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        op = _BINOPS.get(type(node.op))
        if op is not None:
            self._check(node, node.left, node.right, op)

    def visit_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) == 1 and type(node.ops[0]) in _COMPARES:
            self._check(node, node.left, node.comparators[0], _COMPARES[type(node.ops[0])])

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if node.keywords or not isinstance(func, (ast.Attribute, ast.Name)):
            return
        qual = self.ctx.qualname(func)
        if qual is not None:  # `torch.sub(a, b)`, or `sub(a, b)` after `from torch import sub`
            name = qual[len("torch."):] if qual.startswith("torch.") else None
            if name == "where" and len(args) == 3:
                self._check_where(node, *args)
            elif name in _FUNCTIONS and len(args) == 2:
                self._check(node, args[0], args[1], _FUNCTIONS[name])
        elif isinstance(func, ast.Attribute):  # `a.sub(b)`, `a.where(cond, b)`
            if func.attr == "where" and len(args) == 2:
                self._check_where(node, args[0], func.value, args[1])
            elif func.attr in _FUNCTIONS and len(args) == 1:
                self._check(node, func.value, args[0], _FUNCTIONS[func.attr])

    def _check_where(self, node, condition, x, y) -> None:
        """`torch.where` broadcasts its three operands together: its values (the usual fix
        leaves `torch.where(a.squeeze(-1) > b, a, b)` still growing) and the condition."""
        for left, right in ((x, y), (condition, x), (condition, y)):
            if self._check(node, left, right, None):
                return

    def _check(self, node, left, right, op) -> bool:
        if never_shaped(left, self.ctx) or never_shaped(right, self.ctx):
            return False  # no shape to compare, and no analysis of the function run for it
        a, b = shape_of(self.ctx, left), shape_of(self.ctx, right)
        if a is None or b is None:
            return False
        if trailing_one_mismatch(a, b):
            column = left
        elif trailing_one_mismatch(b, a):
            column = right
        else:
            return False
        result = broadcast(a, b)
        n = (a if column is left else b).dims[-2]
        operation = (f"{fmt_shape(a)} {op} {fmt_shape(b)}" if op is not None
                     else f"`where` of {fmt_shape(a)} and {fmt_shape(b)}")
        self.report(node, (
            f"{operation} broadcasts to {fmt_shape(result)}: the trailing 1 meets "
            f"{n} and the result grows a dimension; write `.squeeze(-1)` on the {fmt_shape(shape_of(self.ctx, column))} "
            f"operand (or index the other with `[:, None]` if an outer result is meant)"),
            fix=self.replace(column, squeezed(self.ctx, column),
                             "Squeeze the trailing 1 (`.squeeze(-1)`)", safe=False))
        return True
