"""MAT605 manual-tanh-gelu: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`
instead of `F.gelu(x, approximate="tanh")`."""
from __future__ import annotations

import ast
import math
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of
from matlint.semantic.kinds import may_mention
from matlint.semantic.names import REFERENCE, TESTS, mentions, outermost_scope, spelling
from matlint.semantic.pointwise import KERNEL_SWITCH, in_compiled_code, torch_op
from matlint.semantic.shapes import module_assignments
from matlint.semantic.tree import code_scope, walk

# A class or function that names one of these has a fused GELU next to the formula (a kernel-hub
# decorator, an `F.gelu` switch): the formula is its fallback or its reference.
_FUSED_PATH = re.compile(KERNEL_SWITCH + r"|fused|triton|liger|^gelu$", re.IGNORECASE)
_SAMPLES = (-3.1, -0.7, 0.0, 0.45, 1.3, 2.9)
_CONSTANTS = {"math.pi": math.pi, "numpy.pi": math.pi, "torch.pi": math.pi, "math.e": math.e}
_UNARY = {"sqrt": math.sqrt, "tanh": math.tanh, "exp": math.exp}
_WRAPPERS = {"tensor", "as_tensor", "float", "to", "type_as"}  # value-keeping calls around constants or x
_TORCH_GELU = frozenset({"torch.nn.GELU", "torch.nn.functional.gelu", "torch.nn.modules.activation.GELU"})


def _power(base: float, exponent: float) -> float:
    """`base ** exponent` over the reals: a negative base to a fractional power has no real value
    (Python would give a complex number), so the expression is not the formula."""
    value = base ** exponent
    if isinstance(value, complex):
        raise _NotArithmetic
    return value


def _tanh_gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class _NotArithmetic(Exception):
    pass


class ManualTanhGelu(Rule):
    code = "MAT605"
    name = "manual-tanh-gelu"
    quiet_in = (TESTS, REFERENCE)
    summary = "The tanh approximation of GELU written out; `F.gelu(x, approximate=\"tanh\")` is one kernel."
    runtime_docs = """
    The guard follows the arithmetic after a power or square of a tensor x (`torch.pow(x, 3)`,
    `x ** 3`, `x * x * x`, also on autocast's float32 copy of x) and reports a `tanh` of exactly
    sqrt(2 / pi) * (x + 0.044715 * x ** 3). The estimate times the formula against
    `F.gelu(x, approximate="tanh")` on x's shape and dtype, forward and backward where autograd
    recorded it. A spelling that multiplies x by a constant before the power (the factored "fast
    GELU") is found by the static rule only.
    """
    docs = """
    ## What it does
    Flags an arithmetic expression around a `tanh` that computes the tanh approximation of
    GELU, `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`, in any spelling:
    `math.sqrt(2 / math.pi)` or `0.7978845608`, `x ** 3`, `torch.pow(x, 3.0)` or `x * x * x`,
    the factored "fast GELU" form `x * 0.7978845608 * (1 + 0.044715 * x * x)`, `torch.tanh`
    or `.tanh()`, factors in any order, intermediate names. The rule checks the expression
    by evaluating it at several points and comparing with the formula, so reordered or
    refactored spellings are found and near misses are not.

    ## Why is this bad?
    The formula is about nine elementwise kernels (pow, mul, add, mul, tanh, add, mul, mul),
    each reading and writing the whole activation, in the MLP of every layer, with their
    intermediates saved for backward. `F.gelu(x, approximate="tanh")` is one kernel forward
    and one backward.

    ## Example
    ```python
    def gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    ```

    ## Use instead
    ```python
    def gelu(x):
        return F.gelu(x, approximate="tanh")
    ```

    ## Stays quiet on
    - Classes and functions that also have a fused path: a kernel-hub decorator
      (transformers' `@use_kernel_forward_from_hub("NewGELU")`) or an `F.gelu` switch next to
      the formula (`GELUTanh(use_gelu_tanh_python=True)`): the formula is the fallback. Only
      code counts, as whole identifiers or their parts: a docstring that mentions fused kernels,
      or a conv's `kernel_size`, is no fused path.
    - Fallbacks for a torch without GELU: a class or function that is the other branch of a
      switch to torch's on what the installed torch has (`GELU = nn.GELU if hasattr(nn, "GELU")
      else GELU_`, a check of `torch.__version__` or a `TORCH_VERSION`, or a module-level `try`
      whose other branch binds `nn.GELU`, `F.gelu` or `from torch.nn import GELU`). A switch on a
      user's or config's choice (`NewGELU() if tanh_gelu else nn.GELU()`) is no fallback: the
      formula runs whenever it is chosen, and is reported.
    - Compiled code: a function (or class) decorated to be compiled, by a decorator whose name
      says compile, jit or script (`@torch.compile`, `@torch.jit.script`, deepspeed's
      `@jit_script_compat`), or a module-level function handed to one (`fast = torch.compile(gelu)`):
      the formula already runs as one fused kernel. `@torch.jit.ignore`, `@torch.compiler.disable`
      and `@torch.jit.script_if_tracing` keep it eager, and it is reported.
    - The exact GELU (`x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))`, which `F.gelu(x)`
      replaces; a separate shape) and the sigmoid approximation `x * torch.sigmoid(1.702 * x)`.
    - Expressions that differ from the formula (other constants, a missing `0.5`, an extra
      factor), numpy and math scalars (`np.tanh`, `math.tanh`).

    ## Fix safety
    The fix is **safe**: `F.gelu(x, approximate="tanh")` computes the same function (results
    agree to rounding). It is offered when `x` is a plain name or attribute (an expression with
    side effects would be evaluated once instead of several times, so it is left to a human)
    and torch.nn.functional has a name in the file. It is **unsafe** where the formula reads `x`
    through a dtype cast (`x.float()`, `.to(...)`, `.type_as(...)`, also through a name such as
    `xf = x.float()`): `F.gelu(x)` computes in `x`'s dtype, so a bfloat16 `x` upcast in only
    some operands gave a float32 result that the fix would return in bfloat16. Intermediate
    names the formula reads (`cdf = 0.5 * (1 + torch.tanh(...))`) are left in place, unused.
    """

    # The tanh is `torch.tanh(...)`, `x.tanh()` or a bare name bound to it (`torch_op` names it "tanh").
    only = {"visit_Call": Only(attrs=frozenset({"tanh"}), if_file=lambda ctx: may_mention(ctx, "tanh"))}

    def visit_Call(self, node: ast.Call) -> None:
        if not may_mention(self.ctx, "tanh"):
            return  # `torch_op` names an op after the identifier that spells it
        function = code_scope(self.ctx)
        op = torch_op(self.ctx, node)
        if op is None or op.name != "tanh" or len(op.args) != 1 or function is None:
            return
        flow = flow_of(self.ctx, function)
        for candidate in self._outwards(flow, node):
            x = self._gelu_input(flow, candidate)
            if x is not None:
                scope = outermost_scope(self.ctx)
                if (mentions(self.ctx, scope, _FUSED_PATH) or self._is_torch_gelu_fallback(scope)
                        or in_compiled_code(self.ctx)):
                    return
                self.report(candidate, 'hand-written tanh GELU: use `F.gelu(x, approximate="tanh")`, one '
                            "kernel instead of about nine", fix=self._fix(candidate, x, safe=not self._cast))
                return

    def _is_torch_gelu_fallback(self, scope: ast.AST) -> bool:
        """Whether the class or function holding the formula is the other branch of a switch to
        torch's GELU on what torch has: `GELU = nn.GELU if hasattr(nn, "GELU") else GELU_`, a
        module-level `if` on a version, or a `try` whose other branch binds `nn.GELU`
        (`try: from torch.nn import GELU`)."""
        name = getattr(scope, "name", None)
        if name is None:
            return False
        key = ("torch_gelu_fallbacks",)
        fallbacks = self.ctx.shared.get(key)
        if fallbacks is None:
            fallbacks = self.ctx.shared[key] = self._torch_gelu_fallbacks()
        return name in fallbacks

    def _torch_gelu_fallbacks(self) -> set:
        names = set()
        for node in walk(self.ctx.tree):
            if isinstance(node, ast.IfExp) and self._checks_torch(node.test):
                for branch, other in ((node.body, node.orelse), (node.orelse, node.body)):
                    head = branch.func if isinstance(branch, ast.Call) else branch
                    if isinstance(head, ast.Name) and self._names_torch_gelu(other):
                        names.add(head.id)
        for stmt in self.ctx.tree.body:
            if isinstance(stmt, ast.Try) or isinstance(stmt, ast.If) and self._checks_torch(stmt.test):
                branches = ([stmt.body, stmt.orelse] if isinstance(stmt, ast.If)
                            else [stmt.body + stmt.orelse] + [handler.body for handler in stmt.handlers])
                for branch in branches:
                    if not any(self._names_torch_gelu(part) for other in branches if other is not branch
                               for part in other):
                        continue
                    names.update(part.name for part in branch
                                 if isinstance(part, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
        return names

    def _checks_torch(self, test: ast.AST) -> bool:
        """Whether a switch's test asks what the installed torch has: `hasattr(nn, "GELU")`,
        `getattr(F, "gelu", None)`, torch's version (`torch.__version__`, `TORCH_VERSION >= ...`,
        `is_torch_version(...)`). A user's or config's choice (`if tanh_gelu`,
        `config.gelu_version == 2`) is none: the hand-written branch runs whenever it is chosen."""
        for sub in walk(test):
            if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in ("hasattr", "getattr")
                    and sub.args and (self.ctx.qualname(sub.args[0]) or "").startswith("torch")):
                return True
            if isinstance(sub, ast.Attribute) and sub.attr == "__version__":
                if (self.ctx.qualname(sub.value) or "").startswith("torch"):
                    return True
            text = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
            if "torch" in text.lower() and "version" in text.lower():
                return True
        return False

    def _names_torch_gelu(self, node: ast.AST) -> bool:
        """Whether `node` refers to torch's GELU (`nn.GELU`, `F.gelu`, `from torch.nn import GELU`)."""
        for sub in walk(node):
            if isinstance(sub, ast.ImportFrom):
                if (sub.module or "").startswith("torch.nn") and any(a.name in ("GELU", "gelu") for a in sub.names):
                    return True
            elif isinstance(sub, (ast.Name, ast.Attribute)) and self.ctx.qualname(sub) in _TORCH_GELU:
                return True
        return False

    def _outwards(self, flow, node: ast.AST):
        """The arithmetic around the tanh, innermost first, through names read once
        (`t = torch.tanh(...)`, then `0.5 * x * (1 + t)`)."""
        for _ in range(12):
            parent = flow.parent.get(node)
            if isinstance(parent, (ast.BinOp, ast.UnaryOp)):
                node = parent
                yield node
            elif (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1
                  and isinstance(parent.targets[0], ast.Name) and len(flow.uses(parent)) == 1):
                node = flow.uses(parent)[0]
            else:
                return

    def _gelu_input(self, flow, expr: ast.AST) -> Optional[ast.AST]:
        """The x for which `expr` computes tanh-GELU(x), else None."""
        leaves: dict = {}
        self._cast = False
        try:
            self._evaluate(flow, expr, {}, leaves, 0)
        except (_NotArithmetic, ArithmeticError, ValueError):
            return None
        if len(leaves) != 1:
            return None
        (x,) = leaves.values()
        for sample in _SAMPLES:
            try:
                value = self._evaluate(flow, expr, {ast.dump(x): sample}, {}, 0)
            except (_NotArithmetic, ArithmeticError, ValueError):
                return None
            if not math.isclose(value, _tanh_gelu(sample), rel_tol=1e-6, abs_tol=1e-7):
                return None
        return x

    def _evaluate(self, flow, node: ast.AST, env: dict, leaves: dict, depth: int) -> float:
        """The value of `node` with its one variable leaf set from `env` (leaves are collected
        into `leaves` when `env` is empty)."""
        if depth > 40:
            raise _NotArithmetic
        if env:  # dumping every subtree when there is nothing to look up made big expressions quadratic
            key = ast.dump(node)
            if key in env:
                return env[key]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self._evaluate(flow, node.operand, env, leaves, depth + 1)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
            left = self._evaluate(flow, node.left, env, leaves, depth + 1)
            right = self._evaluate(flow, node.right, env, leaves, depth + 1)
            return {ast.Add: lambda: left + right, ast.Sub: lambda: left - right, ast.Mult: lambda: left * right,
                    ast.Div: lambda: left / right, ast.Pow: lambda: _power(left, right)}[type(node.op)]()
        qual = self.ctx.qualname(node) if isinstance(node, ast.Attribute) else None
        if qual in _CONSTANTS:
            return _CONSTANTS[qual]
        if isinstance(node, ast.Call):
            qual = self.ctx.qualname(node.func)
            if qual in ("math.sqrt", "numpy.sqrt") and len(node.args) == 1:
                return math.sqrt(self._evaluate(flow, node.args[0], env, leaves, depth + 1))
            op = torch_op(self.ctx, node)
            if op is not None:
                args = op.args
                if op.name in _UNARY and len(args) == 1:
                    return _UNARY[op.name](self._evaluate(flow, args[0], env, leaves, depth + 1))
                if op.name == "pow" and len(args) == 2:
                    return _power(self._evaluate(flow, args[0], env, leaves, depth + 1),
                                  self._evaluate(flow, args[1], env, leaves, depth + 1))
                if op.name in ("mul", "add") and len(args) == 2:
                    a = self._evaluate(flow, args[0], env, leaves, depth + 1)
                    b = self._evaluate(flow, args[1], env, leaves, depth + 1)
                    return a * b if op.name == "mul" else a + b
                if op.name in _WRAPPERS and len(args) >= 1 and not (op.name == "tensor" and len(args) > 1):
                    if env:
                        return self._evaluate(flow, args[0], env, leaves, depth + 1)
                    wrapped: dict = {}
                    value = self._evaluate(flow, args[0], env, wrapped, depth + 1)
                    if wrapped:  # `x.float()`: F.gelu(x) would not compute in the cast's dtype
                        self._cast = True
                        leaves.update(wrapped)
                    return value
                if op.name in _UNARY or op.name in ("pow", "mul", "add"):
                    raise _NotArithmetic
            if qual is not None and not qual.startswith("torch."):
                raise _NotArithmetic  # math.tanh, np.tanh: scalar/numpy code
        if isinstance(node, ast.Name):
            assign = flow.reaching(node)
            if assign is not None:
                if any(isinstance(n, ast.Name) and flow.stored_between(n.id, assign, node)
                       for n in ast.walk(assign.value)):
                    raise _NotArithmetic  # its inputs changed since: `x` would not be one value
                return self._evaluate(flow, assign.value, env, leaves, depth + 1)
            constant = self._module_constant(flow, node, depth)
            if constant is not None:
                return constant
        if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and not env:
            leaves[ast.dump(node)] = node
            return 1.0
        raise _NotArithmetic

    def _module_constant(self, flow, node: ast.Name, depth: int) -> Optional[float]:
        """The number a free name holds when the module binds it once to arithmetic on numbers
        (`SQRT_2_OVER_PI = math.sqrt(2 / math.pi)` above the function)."""
        if node not in flow.parent or node.id in flow.stores or self.ctx.names.binds_locally(node.id):
            return None  # in a nested scope, or a name of the function's own
        value = module_assignments(self.ctx).get(node.id)
        if value is None:
            return None
        names: dict = {}
        try:
            number = self._evaluate(flow, value, {}, names, depth + 1)
        except (_NotArithmetic, ArithmeticError, ValueError):
            return None
        return None if names else number

    def _fix(self, node: ast.AST, x: ast.AST, safe: bool):
        if not isinstance(x, (ast.Name, ast.Attribute)):
            return None
        prefix = spelling(self.ctx, "torch.nn.functional")
        if prefix is None:
            return None
        return self.replace(node, f'{prefix}.gelu({self.ctx.segment(x)}, approximate="tanh")',
                            'replace with F.gelu(x, approximate="tanh")', safe=safe)
