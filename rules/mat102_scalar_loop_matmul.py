"""MAT102 scalar-loop-matmul: a matrix (or batched, or matrix-vector) product computed one scalar at a time in nested loops."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.loops import loaded_names
from matlint.semantic.shapes import shape_of
from matlint.semantic.kinds import int_const
from matlint.semantic.tree import code_scope, product_factors


def _range_var(node) -> Optional[str]:
    """The counter of `for v in range(n)` / `range(0, n)` (a loop or a comprehension's
    generator), a whole dim from 0, else None."""
    if not isinstance(node, (ast.For, ast.comprehension)) or not isinstance(node.target, ast.Name):
        return None
    it = node.iter
    if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) in (1, 2) and not it.keywords):
        if len(it.args) == 2 and not (isinstance(it.args[0], ast.Constant) and it.args[0].value == 0):
            return None  # `range(1, n)` leaves a row out
        return node.target.id
    return None


def _indices(expr: ast.AST):
    """(base, [index names]) for `x[k]`, `A[i][k]`, `A[i, k]`, `A[b][i][k]`, `A[b, i, k]`, else None."""
    if not isinstance(expr, ast.Subscript):
        return None
    if isinstance(expr.slice, ast.Tuple):
        elts = expr.slice.elts
        if len(elts) in (2, 3) and all(isinstance(e, ast.Name) for e in elts):
            return expr.value, [e.id for e in elts]
        return None
    names = []
    while isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Name) and len(names) < 3:
        names.append(expr.slice.id)
        expr = expr.value
    if isinstance(expr, ast.Subscript) or not names:
        return None
    return expr, names[::-1]


_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Subscript)
_BUFFER_FACTORIES = frozenset({"zeros", "empty", "zeros_like", "empty_like"})
_MOVES = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "contiguous"})


_WHOLE_AXIS = "·"  # the summed counter of `(A[i, :] * B[:, j]).sum()`: the slice itself


def _sliced_indices(expr: ast.AST):
    """(base, [index names]) for a row or column taken whole, `A[i, :]`, `B[:, j]`, with the
    slice as `_WHOLE_AXIS`, else None."""
    if not (isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Tuple) and len(expr.slice.elts) == 2):
        return None
    names = []
    for e in expr.slice.elts:
        if isinstance(e, ast.Name):
            names.append(e.id)
        elif isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None:
            names.append(_WHOLE_AXIS)
        else:
            return None
    return (expr.value, names) if names.count(_WHOLE_AXIS) == 1 else None


def _whole_sum(call: ast.AST, ctx):
    """The summed expression of `x.sum()` / `torch.sum(x)` (also over dim 0 or -1 of the
    one-dim product), else None."""
    if not isinstance(call, ast.Call) or call.keywords and [k.arg for k in call.keywords] != ["dim"]:
        return None
    if isinstance(call.func, ast.Attribute) and call.func.attr == "sum" and ctx.qualname(call.func) is None:
        inner, dims = call.func.value, list(call.args)
    elif ctx.qualname(call.func) == "torch.sum" and call.args:
        inner, dims = call.args[0], list(call.args[1:])
    else:
        return None
    dims = dims + [k.value for k in call.keywords]
    return inner if len(dims) == 0 or len(dims) == 1 and int_const(dims[0]) in (0, -1) else None


def _is_factory_method(call: ast.Call) -> bool:
    """`x.new_zeros(n, m)`, `x.new_empty(n, m)`."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("new_zeros", "new_empty")


def _is_zero(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) in (int, float) and expr.value == 0


def _operand(text: str, expr: ast.AST) -> str:
    return text if isinstance(expr, _ATOMS) else f"({text})"


class ScalarLoopMatmul(Rule):
    code = "MAT102"
    name = "scalar-loop-matmul"
    summary = "A matrix (or matrix-vector) product computed element by element in nested Python loops; `A @ B` does it in one call."
    docs = """
    ## What it does
    Flags three nested `for ... in range(...)` loops whose body accumulates a product of two
    tensor elements into a third: `C[i][j] += A[i][k] * B[k][j]` (also `C[i, j] += ...`, the
    innermost loop written as a sum, `C[i, j] = sum(A[i, k] * B[k, j] for k in range(p))`, or
    as a whole row times a whole column, `C[i, j] = (A[i, :] * B[:, j]).sum()`,
    `C[i][j] = C[i][j] + ...`, and a scalar accumulator `s += A[i, k] * B[k, j]` stored to
    `C[i, j] = s` after the innermost loop), in any loop order and with either operand
    transposed (`A[k][i]`), also scaled by factors the same for every term
    (`alpha * A[i, k] * B[k, j]`). The same holds for a batched product in four loops whose
    batch counter leads every index (`C[b, i, j] += A[b, i, k] * B[b, k, j]`) and for a
    matrix-vector product in two (`y[i] += A[i, k] * x[k]`). The message gives the single call
    (`C = alpha * A @ B`, `y = A @ x`, `C = A.mT @ B`): with `=` where the loops write every
    element from 0 (a scalar accumulator started at 0, `y[i] = 0` or a row `C[i] = 0` set
    before its sum, a `torch.zeros`/`torch.empty` buffer made right before the loops), with
    `+=` where they add onto what the output already held (a tensor passed in, a buffer that an
    outer loop adds to on every pass).

    ## Why is this bad?
    Every scalar multiply-add is a Python operation plus, on tensors, a dispatch and a
    0-d tensor allocation (on a GPU, a kernel launch and a sync per element): millions of times
    slower than one GEMM on the matrix units.

    ## Example
    ```python
    C = torch.zeros(n, m)
    for i in range(n):
        for j in range(m):
            for k in range(p):
                C[i][j] += A[i][k] * B[k][j]
    ```

    ## Use instead
    ```python
    C = A @ B
    ```

    ## Stays quiet on
    - Loops that are not plain `range` counters over whole dims (`range(0, n, step)` tiles,
      `range(1, n)`, a bound that reads another counter as in `range(i + 1)`, loops over
      lists), sums added under an `if`, scalar accumulators not reset to 0 for each element,
      sums whose indices do not form a product (`A[i][k] * B[i][k]`, `A[i][j] * B[j][k]` into
      `C[i][k]` with `j` not a loop counter, a batch index that does not lead), factors that
      change from term to term (`w[i] * A[i, k] * x[k]`, a value computed in the loops), and
      an operand of a known rank other than its index count (`W[i, k]` of a 3-D `W`).
    - An output that is also an operand (`A[i, j] += A[i, k] * A[k, j]`,
      `C[i, j] += C[i, k] * B[k, j]`): the loops read entries they have already updated, which
      `A += A @ A` does not.
    - Single loops (`s += a[i] * b[i]`): the batched call depends on ranks it cannot see.
    - Operands not known to be tensors: Python lists of lists and numpy arrays (textbook code
      about loops), names of unknown kind.

    ## Fix safety
    No automatic fix: the loops may do more than the product (bounds, other statements), and
    replacing them needs a human.
    """

    only = {"visit_AugAssign": Only(in_loops=True), "visit_Assign": Only(in_loops=True)}

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Add) and len(self.ctx.loops) >= 2:
            self._check(node.target, node.value, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1:
            return
        value = node.value
        if isinstance(value, ast.Call):
            self._check_sum(node.targets[0], value, node)
            return
        if len(self.ctx.loops) < 2:
            return
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
            same = self.ctx.segment(node.targets[0])
            if self.ctx.segment(value.left) == same:
                self._check(node.targets[0], value.right, node)
            elif self.ctx.segment(value.right) == same:
                self._check(node.targets[0], value.left, node)

    def _check_sum(self, target: ast.AST, call: ast.Call, stmt: ast.AST) -> None:
        """`C[i, j] = sum(A[i, k] * B[k, j] for k in range(p))` (the innermost loop as a
        generator) and `C[i, j] = (A[i, :] * B[:, j]).sum()` (a whole row times a whole column)."""
        func = call.func
        if (isinstance(func, ast.Name) and func.id == "sum" and self.ctx.qualname(func) is None
                and len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.GeneratorExp)):
            gen = call.args[0]
            if len(gen.generators) != 1 or gen.generators[0].ifs or gen.generators[0].is_async:
                return
            counter = _range_var(gen.generators[0])
            if counter is not None:
                self._check(target, gen.elt, stmt, sum_loop=(counter, gen.generators[0].iter))
            return
        summed = _whole_sum(call, self.ctx)
        if summed is not None:
            self._check(target, summed, stmt, sum_loop=(_WHOLE_AXIS, None))

    def _check(self, target: ast.AST, value: ast.AST, stmt: ast.AST, sum_loop=None) -> None:
        """`out[i, j] += A[i, k] * B[k, j]` (and scaled: `alpha * A[i, k] * B[k, j]`) where the
        innermost loops count every index: one more loop than `out` has indices (`k`, summed
        out). With one index, a matrix-vector product (`y[i] += A[i, k] * x[k]`); with three, a
        batched product whose batch counter leads every index (`C[b, i, j] += A[b, i, k] * B[b, k, j]`)."""
        if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)):
            return
        indexed, scales = [], []
        indices = _sliced_indices if sum_loop is not None and sum_loop[0] == _WHOLE_AXIS else _indices
        for factor in product_factors(value):
            found = indices(factor)
            (indexed if found is not None else scales).append(found or factor)
        if len(indexed) != 2:
            return
        left, right = indexed
        if isinstance(target, ast.Name):
            out = self._stored_accumulator(target.id) if sum_loop is None else None
        else:
            out = _indices(target)
        if out is None:
            return
        out_base, out_names = out
        if self.ctx.segment(out_base) in (self.ctx.segment(left[0]), self.ctx.segment(right[0])):
            return  # `A[i, j] += A[i, k] * A[k, j]` reads entries it has already updated: not `A @ A`
        n_loops = len(out_names) + (1 if sum_loop is None else 0)  # the sum is the innermost loop
        loops = self.ctx.loops[-n_loops:]
        if len(loops) != n_loops:
            return
        counters = [_range_var(loop.node) for loop in loops] + ([sum_loop[0]] if sum_loop is not None else [])
        if None in counters or len(set(counters)) != len(counters):
            return
        iterables = [loop.node.iter for loop in loops] + ([sum_loop[1]] if sum_loop is not None and sum_loop[1] else [])
        if any(loaded_names(it) & set(counters) for it in iterables):
            return  # `range(i + 1)`: a triangular sum, not the whole product
        if stmt not in loops[-1].node.body:
            return  # under an `if` in the innermost loop: not every term is added
        roles = self._roles(out_names, left[1], right[1], set(counters))
        if roles is None:
            return
        batch, row, col, inner = roles
        # Scale factors: the same for every term (no counter, nothing the loops assign).
        varying = set(counters) | loops[0].assigned
        if any(loaded_names(f) & varying or any(isinstance(n, ast.Subscript) for n in ast.walk(f)) for f in scales):
            return
        if not self._tensors(out_base, left[0], right[0]) or not self._elements(left, right):
            return
        # The operand holding the output row (or, for a vector output, the matrix) goes first.
        if row is not None and row not in left[1] or row is None and len(left[1]) < len(right[1]):
            left, right = right, left
        key = ("mat102", id(loops[0].node))
        if key in self.ctx.shared:
            return
        self.ctx.shared[key] = True
        seg = self.ctx.segment
        flip = ".mT" if batch else ".T"
        a = _operand(seg(left[0]), left[0]) + (flip if left[1][-1] != inner else "")
        b = _operand(seg(right[0]), right[0]) + (flip if len(right[1]) > 1 and right[1][-2] != inner else "")
        scale = "".join(f"{_operand(seg(f), f)} * " for f in scales)
        assign = "=" if sum_loop is not None or self._starts_from_zero(target, out_base, out_names, loops, counters) else "+="
        what = {1: "a matrix-vector product", 2: "a matrix product", 3: "a batched matrix product"}[len(out_names)]
        first = loops[0].node
        self.report(first, f"{what} computed one element at a time in nested Python loops; use one call: "
                           f"`{seg(out_base)} {assign} {scale}{a} @ {b}`", end_node=first.iter)

    @staticmethod
    def _roles(out: list, left: list, right: list, counters: set):
        """(batch, row, col, inner) counters when `out += left * right` is a (batched) matrix
        product or a matrix-vector product over exactly the loops' counters, else None. `row`
        or `col` is None for a vector output."""
        if len(set(left)) != len(left) or len(set(right)) != len(right) or len(set(out)) != len(out):
            return None
        if set(out) | set(left) | set(right) != counters:
            return None
        batch = None
        if len(out) == 3:
            batch = out[0]
            if left[0] != batch or right[0] != batch or len(left) != 3 or len(right) != 3:
                return None
            out, left, right = out[1:], left[1:], right[1:]
        inner = (set(left) & set(right)) - set(out)
        if len(inner) != 1:
            return None
        inner = inner.pop()
        if len(out) == 2:
            row, col = out
            if len(left) != 2 or len(right) != 2:
                return None
            if row in right:
                left, right = right, left
            if sorted(left) != sorted([row, inner]) or sorted(right) != sorted([inner, col]):
                return None
            return batch, row, col, inner
        # A vector output `y[i]`: one operand is the matrix `A[i, k]` (or `A[k, i]`), the other `x[k]`.
        (row,) = out
        matrix, vector = (left, right) if len(left) == 2 else (right, left)
        if vector != [inner] or sorted(matrix) != sorted([row, inner]):
            return None
        return None, row, None, inner

    def _stored_accumulator(self, name: str):
        """`s += ...` in the innermost loop, started from 0 just before it, and `C[i][j] = s`
        right after it in the enclosing loop: (C, [i, j])."""
        loops = self.ctx.loops
        innermost = loops[-1].node
        body = loops[-2].node.body
        if innermost not in body:
            return None
        before = body[:body.index(innermost)]
        if not any(isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                   and stmt.targets[0].id == name and isinstance(stmt.value, ast.Constant) and stmt.value.value == 0
                   for stmt in before):
            return None  # not started from 0 for each element: a running sum, not C[i, j]
        for stmt in body[body.index(innermost) + 1:]:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Name)
                    and stmt.value.id == name):
                return _indices(stmt.targets[0])
        return None

    def _starts_from_zero(self, target, out_base, out_names: list, loops: list, counters: list) -> bool:
        """The loops write every element of the output from 0, so they compute `C = A @ B`, not
        `C += A @ B`: a scalar accumulator started from 0, an element (or row) set to 0 before
        the loops that sum into it (`y[i] = 0` then `y[i] += A[i, k] * x[k]`), or a buffer made
        by `torch.zeros`/`torch.empty` right before the loops and not changed since."""
        if isinstance(target, ast.Name):
            return True  # `_stored_accumulator` found `s = 0` before the sum
        seg = self.ctx.segment
        base = seg(out_base)
        for depth, (loop, inner) in enumerate(zip(loops, loops[1:])):
            body = loop.node.body
            if inner.node not in body:
                break
            for stmt in body[:body.index(inner.node)]:
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is_zero(stmt.value)):
                    continue
                reset = _indices(stmt.targets[0])
                # `C[i] = 0` in the `i` loop resets a whole row; `C[j] = 0` there is another element
                if (reset is not None and seg(reset[0]) == base and reset[1] == out_names[:len(reset[1])]
                        and set(reset[1]) == set(counters[:depth + 1])):
                    return True
        return isinstance(out_base, ast.Name) and self._fresh_buffer(out_base, loops[0].node)

    def _fresh_buffer(self, name: ast.Name, first_loop: ast.AST) -> bool:
        """`name` holds a `torch.zeros`/`torch.empty` buffer (`zeros_like`, `x.new_zeros`, also
        moved: `.to(device)`) made in the block that runs the loops, before them, and not changed
        in between: an outer loop around the loops would add the product again on each pass."""
        scope = code_scope(self.ctx)
        if scope is None:
            return False
        flow = flow_of(self.ctx, scope)
        assign = flow.reaching(name)
        if assign is None or not flow.same_block(assign, first_loop):
            return False
        if flow.changed_between(name.id, assign, first_loop):
            return False
        value = assign.value
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and value.func.attr in _MOVES and not _is_factory_method(value)):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return False
        if _is_factory_method(value):
            return True
        qualname = self.ctx.qualname(value.func)
        return qualname is not None and qualname.startswith("torch.") and qualname[6:] in _BUFFER_FACTORIES

    def _elements(self, *operands) -> bool:
        """The matrix operands' indices pick single elements: a matrix of a known rank other
        than its index count (`A[i, k]` of a 3-D `A` is a vector) makes another product."""
        for base, names in operands:
            if len(names) > 1:
                shape = shape_of(self.ctx, base)
                if shape is not None and shape.rank is not None and shape.rank != len(names):
                    return False
        return True

    def _tensors(self, *bases) -> bool:
        kinds = [_kinds.kind_of(self.ctx, b) for b in bases]
        if any(k in _kinds.NON_TENSORS for k in kinds):
            return False
        return sum(k in _kinds.TENSORS or (k is None and _kinds.looks_like_tensor(self.ctx, b))
                   for k, b in zip(kinds, bases)) >= 2
