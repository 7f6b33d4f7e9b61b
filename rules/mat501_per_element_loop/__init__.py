"""MAT501 per-element-loop: tensor elements (or rows) computed one by one in a Python loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.loops import LoopInfo, loaded_names, walk_no_scopes
from matlint.semantic.names import TESTS

# Element-wise functions an element expression may call, by qualified name or tensor method.
_ELEMENTWISE_FUNCTIONS = {
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs", "sin", "cos", "tan", "tanh", "sigmoid", "relu",
    "clamp", "clip", "pow", "maximum", "minimum", "floor", "ceil", "round", "sign", "square", "erf",
}
_SMALL_RANGE = 8
# Reads of a tensor's metadata, not of its values: `x.shape`, `x.size(0)`, `len(x)`.
_METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda"}
_METADATA_METHODS = {"size", "dim", "numel", "nelement", "stride"}
# Methods whose result shares memory with the receiver: `y = x.view(-1)` writes through to `x`.
_VIEW_METHODS = {"view", "view_as", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose",
                 "permute", "t", "narrow", "select", "expand", "expand_as", "detach", "as_strided", "movedim",
                 "contiguous", "unfold", "diagonal"}


def _index_parts(node: ast.Subscript):
    """The base of `x[i][j]` / `x[i, j]` and its index parts, outermost subscript first."""
    parts = []
    while isinstance(node, ast.Subscript):
        index = node.slice
        parts.extend(index.elts if isinstance(index, ast.Tuple) else [index])
        node = node.value
    return node, parts


def _literal_length(expr) -> Optional[int]:
    if isinstance(expr, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in expr.elts):
        return len(expr.elts)
    return None


def _is_slab(parts) -> bool:
    """An index that keeps whole dimensions: `x[:, i]`, `x[..., i]`."""
    return any(isinstance(p, ast.Slice) or (isinstance(p, ast.Constant) and p.value is Ellipsis) for p in parts)


def _writes_matrices(target: ast.AST) -> bool:
    """`K[..., i, i, :, :] = ...`, `x[:, :, c] = ...`: two or more whole dimensions spelled out, so
    each iteration works on at least a matrix, not on an element or a row."""
    if not isinstance(target, ast.Subscript):
        return False
    whole = [p for p in _index_parts(target)[1] if isinstance(p, ast.Slice) and not (p.lower or p.upper or p.step)]
    return len(whole) >= 2


def _view_root(expr: ast.AST) -> Optional[str]:
    """`x` for `x`, `x[0]`, `x.T`, `x.view(-1)`: the name whose memory `expr` shares."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Subscript) or (isinstance(expr, ast.Attribute) and expr.attr in ("T", "mT", "data")):
            expr = expr.value
        elif (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
              and expr.func.attr in _VIEW_METHODS):
            expr = expr.func.value
        else:
            return None


def _range_bound(loop: LoopInfo) -> Optional[ast.AST]:
    """The stop of `for i in range(...)`, or None when the loop is not a range loop over a name."""
    node = loop.node
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return None
    it = node.iter
    if not (isinstance(it, ast.Call) and getattr(it.func, "id", None) == "range" and it.args and not it.keywords):
        return None
    return it.args[1] if len(it.args) >= 2 else it.args[0]


class PerElementLoop(Rule):
    code = "MAT501"
    name = "per-element-loop"
    quiet_in = (TESTS,)
    summary = "Tensor elements (or rows) computed one at a time in a Python `range` loop, one small op per element."
    runtime_docs = """
    The guard reports a line that issues at least 32 ops per step on items picked out of a tensor
    one at a time: elements (`x[i, j]`) or rows (`x[i]`, `x[:, t]`) of at most 65536 elements, or
    values computed only from such items (`inter = (x2 - x1).clamp(min=0)` after `x1 =
    torch.max(a[i, 0], b[i, 0])`), with the ops it issued. On a GPU such a line is reported here,
    not as MAT504. Quiet where an op also reads a whole tensor (a recurrence's state, a weight), on
    GEMMs (MAT101's), and on sums of values of their own (a sum of per-layer losses,
    per-parameter norms), which are not items of a tensor. Ops on data that stays on the host
    launch no kernel and are not counted: on a GPU, CPU tensors; on the CPU, tensors the program
    made on the host within the step (`torch.randint`, `torch.arange`, `torch.tensor(values)`) and
    computed on only with each other, such as the bounds `i + 1` of `data[i + 1:i + n + 1] for i
    in ix` when assembling a batch.
    """
    docs = """
    ## What it does
    Flags, inside `for i in range(...)` loops (nested or not), element-wise tensor work
    written per index:
    - an element or slice of a tensor assigned from an element-wise expression of other
      elements at the loop indices: `out[i] = a[i] * 2 + b[i]`, `t[i, j] = x[i, j].exp()`,
      `t[:, i] = 0`, `if t[i] < 0: t[i] = 0`, `x[i] = x[i] * w[i]` (a read at exactly the
      index written is element-wise);
    - an element assigned a value computed from the loop indices alone, a table of numbers:
      `pe[pos, i] = math.sin(pos / 10000 ** (i / d))` (a positional encoding, in the set-up
      too: its thousands of writes each launch an op), which `torch.arange` builds whole;
    - a Python accumulator summing elements: `total += x[i]`, `s += (a[i] - b[i]) ** 2`, or
      counting the elements a test picks: `if pred[i] == y[i]: correct += 1`, also written as a
      comprehension over `range(n)` of tensors' items (`[1 if pred[j] == y[j] else 0 for j in
      range(n)]`, `sum(int(p[j] != y[j]) for j in range(n))`): `(pred == y).sum()` counts at once;
    - rows picked one item at a time and stacked: `torch.stack([q[i][a[i]] for i in
      range(n)])`, also `q[i, a[i]]` and `q[i].index_select(0, a[i])`, with `torch.cat`, where
      q and a are tensors: `q[torch.arange(n), a]` (or a `gather`) picks them in one op.
    The expression may use numbers, names, other tensors indexed by the loop variables, and
    element-wise functions (`torch.exp`, `math.sqrt`, `.abs()`, `.clamp()` ...).

    ## Why is this bad?
    Every indexing, arithmetic and assignment is a separate tensor op: on the GPU a kernel
    launch (~13 µs on an H100 for a few bytes of work), on the CPU microseconds of dispatch per
    element. One vectorized expression over the whole tensor does the same work in one or a
    few kernels.

    ## Example
    ```python
    for i in range(len(x)):
        out[i] = x[i] * w[i] + b[i]
    for i in range(x.shape[0]):
        if x[i] < 0:
            x[i] = 0
    ```

    ## Use instead
    ```python
    out = x * w + b
    x = x.clamp(min=0)            # or torch.where(x < 0, 0, x)
    ```

    ## Stays quiet on
    - Recurrences and scans: the loop reads a tensor it writes at another index than the one
      written (`h[t] = h[t - 1] * a + x[t]`, `vad[:, i] |= vad[:, i - 1]`, dynamic
      programming), or as a whole, or through another name for its memory (`y = x`, `buf =
      out.view(-1)`), or reads a value carried from the previous iteration.
    - Indices that are data (`t[idx[i]] = ...`, `mask[i, :lengths[i]] = 1`): scatters and
      ragged writes need more than a one-line rewrite.
    - Loops that do anything besides element-wise assignments and tests (other calls,
      `break`, matrix products, per-item logic that happens to write one element), and
      right-hand sides that call anything but element-wise math (modules, losses, `.item()`),
      loops over small ranges (`range(3)` over channels, also spelled `range(C)` with `C = 3`
      or `range(len(MEAN))` over a literal list of 3), loops over a model setting that work on
      whole slabs (`for i in range(self.groups): res += x[..., i] * w`), writes of a slab with two
      or more whole dimensions spelled out (`K[..., i, i, :, :] = K[..., i, i, :, :] + K_base`:
      a matrix per iteration, not an element; one whole dimension, `t[:, j]`, is still a column
      loop and reported), targets that are not known
      to be tensors (lists, numpy arrays), sums of products of indexed tensors over an index
      the target lacks (`s += a[i] * b[i]`, `C[i, j] += alpha * A[i, k] * B[k, j]`, also as
      `C[i, j] = C[i, j] + ...`: a dot or matrix product, the loops family's rules).

    ## Fix safety
    No fix: the vectorized form depends on the shapes and on what the loop covers.
    """

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        self._reported_loops: set = set()
        self._recurrences: dict = {}

    only = {"visit_Assign": Only(in_loops=True), "visit_AugAssign": Only(in_loops=True),
            "visit_Call": Only(attrs=frozenset({"stack", "cat"}))}

    def visit_Call(self, node: ast.Call) -> None:
        """`torch.stack([q[i][a[i]] for i in range(n)])`: one row's pick per item, stacked."""
        if self.ctx.qualname(node.func) not in ("torch.stack", "torch.cat") or len(node.args) != 1:
            return
        comp = node.args[0]
        gen = self._over_range(comp) if isinstance(comp, (ast.ListComp, ast.GeneratorExp)) else None
        if gen is None:
            return
        it = gen.iter
        picked = self._row_pick(comp.elt, gen.target.id)
        if picked is None:
            return
        source, index = (self.ctx.segment(x) for x in picked)
        n = self.ctx.segment(it.args[0])
        self.report(node, f"one row's pick per item, {n} of them, each a separate indexing op (a kernel launch on "
                          f"the GPU), then stacked: `{source}[torch.arange({n}), {index}]` (or `{source}.gather(1, "
                          f"...)`) picks them all at once")

    def visit_ListComp(self, node: ast.AST) -> None:
        """`[1 if pred[j] == y[j] else 0 for j in range(n)]`, `sum(int(p[j] == y[j]) for j in
        range(n))`: a test of each element, counted one by one."""
        gen = self._over_range(node)
        if gen is None:
            return
        elt = node.elt
        if isinstance(elt, ast.IfExp) and all(isinstance(arm, ast.Constant) and type(arm.value) in (int, float, bool)
                                              for arm in (elt.body, elt.orelse)):
            test = elt.test
        elif (isinstance(elt, ast.Call) and getattr(elt.func, "id", None) in ("int", "float")
              and self.ctx.qualname(elt.func) is None and len(elt.args) == 1 and not elt.keywords):
            test = elt.args[0]
        else:
            return
        if not isinstance(test, ast.Compare):
            return
        reads = self._element_reads(test, {gen.target.id})
        if not reads or not all(self._is_tensor(r) for r in reads):
            return
        whole = self._whole(test, gen.target.id)
        self.report(node, "a test of each element counted one by one in a Python loop: every index and comparison "
                          "is a separate small op (a kernel launch on the GPU) per element; compare the whole "
                          + (f"tensors once: `({whole}).sum()`" if whole else "tensors once and `.sum()` the result"))

    visit_GeneratorExp = visit_ListComp

    def _over_range(self, comp: ast.AST) -> Optional[ast.comprehension]:
        """The one `for i in range(n)` of a comprehension, with no `if` and a bound not known to
        be small; else None."""
        if len(comp.generators) != 1:
            return None
        gen = comp.generators[0]
        it = gen.iter
        if (gen.ifs or not isinstance(gen.target, ast.Name) or not isinstance(it, ast.Call)
                or getattr(it.func, "id", None) != "range" or len(it.args) != 1 or it.keywords
                or self._is_small(it.args[0])):
            return None
        return gen

    def _whole(self, test: ast.Compare, index: str) -> Optional[str]:
        """The comparison of whole tensors that `test` makes element by element (`pred[j] == y[j]`
        -> `pred == y`), where each side is a tensor's item `x[j]` or a number; else None."""
        texts = []
        for part in (test.left, *test.comparators):
            if isinstance(part, ast.Subscript) and isinstance(part.slice, ast.Name) and part.slice.id == index:
                texts.append(self.ctx.segment(part.value))
            elif isinstance(part, ast.Constant):
                texts.append(self.ctx.segment(part))
            else:
                return None
        ops = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
        out = texts[0]
        for op, text in zip(test.ops, texts[1:]):
            if type(op) not in ops:
                return None
            out += f" {ops[type(op)]} {text}"
        return out

    def _row_pick(self, elt: ast.AST, i: str) -> Optional[tuple]:
        """(x, idx) for `x[i][idx[i]]`, `x[i, idx[i]]` or `x[i].index_select(0, idx[i])`, both
        tensors that the comprehension does not make: row `i` of x at the data index `idx[i]`."""
        def row(node):  # `x[i]` -> x
            return node.value if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name)
                                  and node.slice.id == i) else None
        if isinstance(elt, ast.Call) and isinstance(elt.func, ast.Attribute) and elt.func.attr == "index_select" \
                and len(elt.args) == 2 and not elt.keywords and _kinds.int_const(elt.args[0]) == 0:
            x, idx = row(elt.func.value), row(elt.args[1])
        elif isinstance(elt, ast.Subscript) and isinstance(elt.slice, ast.Tuple) and len(elt.slice.elts) == 2:
            first, second = elt.slice.elts
            x = elt.value if isinstance(first, ast.Name) and first.id == i else None
            idx = row(second)
        elif isinstance(elt, ast.Subscript):
            x, idx = row(elt.value), row(elt.slice)
        else:
            return None
        if x is None or idx is None or i in loaded_names(x) | loaded_names(idx):
            return None
        return (x, idx) if self._is_tensor(x) and self._is_tensor(idx) else None

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1:
            self._check(node, node.targets[0], node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check(node, node.target, node.value, augmented=node.op)

    def _check(self, node: ast.AST, target: ast.AST, value: ast.AST, augmented=None) -> None:
        loops = self._range_loops()
        if not loops:
            return
        outer = loops[0]
        if id(outer.node) in self._reported_loops:
            return
        indices = set().union(*(loop.targets for loop in loops))
        tests = []
        table = False  # the values are computed from the indices alone
        if isinstance(target, ast.Subscript):
            written = self._element_base(target, indices)
            if written is None or not self._is_tensor(written):
                return
            reads = self._element_reads(value, indices)
            if reads is None or (not reads and not isinstance(value, ast.Constant)
                                 and not (augmented is None and loaded_names(value) & indices)):
                return  # a table of the indices (`pe[pos, i] = math.sin(pos / 10000 ** (i / d))`) is element work
            table = not reads and not isinstance(value, ast.Constant)
            operation, added = augmented, value
            if augmented is None and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
                # `C[i, j] = C[i, j] + A[i, k] * B[k, j]` accumulates as `+=` does
                for own, other in ((value.left, value.right), (value.right, value.left)):
                    if isinstance(own, ast.Subscript) and self.ctx.segment(own) == self.ctx.segment(target):
                        operation, added = value.op, other
            if isinstance(operation, ast.Add) and self._is_product_of_elements(added) and \
                    loaded_names(added) & indices - loaded_names(target):
                return  # `y[i] += A[i, k] * x[k]`: products summed over k, a matrix product (the loops family's)
        elif isinstance(target, ast.Name) and isinstance(augmented, (ast.Add, ast.Sub, ast.Mult)):
            reads = self._element_reads(value, indices)
            if reads == [] and isinstance(value, ast.Constant) and not isinstance(augmented, ast.Mult):
                # `if pred[i] == y[i]: correct += 1`: counting the elements a test picks
                tests = self._enclosing_tests(outer.node)
                for test in tests:
                    test_reads = self._element_reads(test, indices)
                    if test_reads is None:
                        return
                    reads.extend(test_reads)
            if not reads or not any(self._is_tensor(r) for r in reads):
                return
            if isinstance(augmented, ast.Add) and self._is_product_of_elements(value):
                return
        else:
            return
        if self._over_few_slabs(loops, target, value) or _writes_matrices(target):
            return
        recurrent, same_index = self._recurrence(outer.node)
        if recurrent:
            return
        if any(loop.carried - same_index and (loop.reads_carried(value) or any(loop.reads_carried(t) for t in tests))
               for loop in loops):
            return  # reads a value carried from the previous iteration: a scan
        if not self._only_element_work(outer.node.body, indices):
            return
        self._reported_loops.add(id(outer.node))
        if table:
            self.report(node, "a table of the loop indices filled one element at a time in a Python loop: every "
                              "assignment is a separate small op (a kernel launch on the GPU); compute it on whole "
                              "tensors of the indices (`pos = torch.arange(n)[:, None]`, `i = torch.arange(0, d, 2)`, "
                              "then `torch.sin(pos / 10000 ** (i / d))`)")
            return
        self.report(node, "element-by-element tensor work in a Python loop: every index, operation and "
                          "assignment is a separate small op (a kernel launch on the GPU) per element; write "
                          "it once on whole tensors (`out = a * w + b`, slicing, `torch.where`, `.sum()`)")

    # -- helpers --------------------------------------------------------------------
    def _range_loops(self) -> list:
        """The innermost run of enclosing `for i in range(...)` loops, outermost first."""
        run = []
        for loop in reversed(self.ctx.loops):
            bound = _range_bound(loop)
            if bound is None:
                break
            if self._is_small(bound):
                return []
            run.append(loop)
        return list(reversed(run))

    def _is_small(self, bound: ast.AST) -> bool:
        """`range(3)`, `range(C)` with `C = 3`, `range(len(MEAN))` over a 3-item literal list."""
        if isinstance(bound, ast.Call) and getattr(bound.func, "id", None) == "len" and len(bound.args) == 1:
            size = self._literal_length(bound.args[0])
        else:
            size = _kinds.constant_int(self.ctx, bound)
        return size is not None and size <= _SMALL_RANGE

    def _literal_length(self, expr: ast.AST) -> Optional[int]:
        """The length of the literal list or tuple `expr` is, or a name holds in every assignment
        of the scope that binds it (`MEAN = [0.485, 0.456, 0.406]`)."""
        if isinstance(expr, ast.Name):
            entries = _kinds.bindings(self.ctx, expr.id)
            if entries is None:
                return None
            lengths = {_literal_length(e[-1]) if e[0] in ("value", "kind") else None for e in entries}
            return lengths.pop() if len(lengths) == 1 else None
        return _literal_length(expr)

    def _over_few_slabs(self, loops: list, target: ast.AST, value: ast.AST) -> bool:
        """`for i in range(self.groups): res += x[..., i] * w`: whole slabs over a model setting
        (groups, heads), a handful of whole-tensor ops rather than one op per element."""
        if not any(isinstance(_range_bound(loop), ast.Attribute) for loop in loops):
            return False
        return any(isinstance(sub, ast.Subscript) and _is_slab(_index_parts(sub)[1])
                   for part in (target, value) for sub in ast.walk(part))

    def _enclosing_tests(self, outer: ast.AST) -> list:
        """The tests of the `if`s between the outer loop and the node (`if x[i] > 0:`)."""
        parents = self.ctx.parents
        start = next(k for k, parent in enumerate(parents) if parent is outer)
        return [parent.test for parent in parents[start + 1:] if isinstance(parent, ast.If)]

    def _recurrence(self, loop: ast.AST) -> tuple:
        """(whether the loop reads a tensor it writes at another index than it writes, or through
        an alias, as in a scan `h[t] = h[t - 1] * a`; the written tensors read only at the indices
        written, `x[i] = x[i] * w[i]`, which are element-wise)."""
        key = id(loop)
        if key not in self._recurrences:
            self._recurrences[key] = self._find_recurrence(loop)
        return self._recurrences[key]

    def _find_recurrence(self, loop: ast.AST) -> tuple:
        writes: dict = {}
        for stmt in loop.body:
            for sub in walk_no_scopes(stmt):
                if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    base, parts = _index_parts(sub)
                    if isinstance(base, ast.Name):
                        writes.setdefault(base.id, set()).add(tuple(ast.dump(p) for p in parts))
        if not writes:
            return False, frozenset()
        aliases = self._aliases(set(writes))
        stack = list(loop.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Subscript):
                base, parts = _index_parts(node)
                if isinstance(base, ast.Name) and (base.id in writes or base.id in aliases):
                    if base.id in aliases or tuple(ast.dump(p) for p in parts) not in writes[base.id]:
                        return True, frozenset()
                    stack.extend(parts)
                    continue
            elif isinstance(node, ast.Name) and (node.id in writes or node.id in aliases):
                return True, frozenset()  # the whole tensor read or passed on
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in _METADATA_ATTRS:
                continue
            elif isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                     and node.func.attr in _METADATA_METHODS)
                    or (getattr(node.func, "id", None) == "len" and len(node.args) == 1 and isinstance(node.args[0], ast.Name))):
                stack.extend(node.args if isinstance(node.func, ast.Attribute) else [])
                continue
            stack.extend(child for child in ast.iter_child_nodes(node)
                         if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
        return False, frozenset(writes)

    def _aliases(self, names: set) -> set:
        """Other names for the memory of `names` in the scope: `y = x`, `buf = out.view(-1)`, and the
        name a written tensor was taken from (`x = y[0]`)."""
        scope = self.ctx.scope
        aliases = set()
        for stmt in scope.body:
            for sub in walk_no_scopes(stmt):
                if not (isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name)):
                    continue
                target, root = sub.targets[0].id, _view_root(sub.value)
                if root is None or root == target:
                    continue
                if root in names and target not in names:
                    aliases.add(target)
                elif target in names and root not in names:
                    aliases.add(root)
        return aliases

    @staticmethod
    def _element_base(node: ast.Subscript, indices: set) -> Optional[ast.AST]:
        """The tensor an element access indexes (`x[i]`, `x[i, j]`, `x[:, i]`, `x[i][j]`, `x[i + 1]`)
        when every index is a loop variable, a constant or a full slice; else None."""
        node, parts = _index_parts(node)
        uses_loop_variable = False
        for part in parts:
            if isinstance(part, ast.Slice):
                if part.lower or part.upper or part.step:
                    return None
                continue
            names = loaded_names(part)
            if not names <= indices or any(isinstance(n, (ast.Call, ast.Subscript, ast.Attribute)) for n in ast.walk(part)):
                return None
            uses_loop_variable |= bool(names)
        return node if uses_loop_variable else None

    def _element_reads(self, value: ast.AST, indices: set) -> Optional[list]:
        """The indexed reads in an element-wise expression, or None when it is not element-wise."""
        reads = []
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Subscript):
                base = self._element_base(node, indices)
                if base is None:
                    return None
                reads.append(base)
                continue
            if isinstance(node, ast.Call):
                if not self._is_elementwise_call(node):
                    return None
                stack.extend(node.args)
                stack.extend(k.value for k in node.keywords)
                if isinstance(node.func, ast.Attribute) and self.ctx.qualname(node.func) is None:
                    stack.append(node.func.value)
                continue
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                return None
            if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Compare, ast.IfExp, ast.BoolOp)):
                stack.extend(ast.iter_child_nodes(node))
                continue
            if isinstance(node, (ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context)):
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                continue  # self.scale, cfg.eps
            return None
        return reads

    def _only_element_work(self, body: list, indices: set) -> bool:
        """The loop does nothing but element-wise assignments, tests and nested range loops: the
        whole loop is one vectorizable expression, not per-item logic that also writes a result."""
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Subscript):
                        if self._element_base(target, indices) is None:
                            return False
                    elif not isinstance(target, ast.Name):
                        return False
                if self._element_reads(stmt.value, indices) is None:
                    return False
            elif isinstance(stmt, ast.If):
                if self._element_reads(stmt.test, indices) is None:
                    return False
                if not self._only_element_work(stmt.body + stmt.orelse, indices):
                    return False
            elif isinstance(stmt, ast.For):
                if not isinstance(stmt.target, ast.Name):
                    return False
                if not self._only_element_work(stmt.body, indices | {stmt.target.id}):
                    return False
            elif not isinstance(stmt, (ast.Pass, ast.Continue)):
                return False
        return True

    def _is_elementwise_call(self, call: ast.Call) -> bool:
        qualname = self.ctx.qualname(call.func)
        if qualname is not None:
            module, _, name = qualname.rpartition(".")
            return module in ("torch", "math", "torch.nn.functional") and name in _ELEMENTWISE_FUNCTIONS
        if isinstance(call.func, ast.Attribute):
            return call.func.attr in _ELEMENTWISE_FUNCTIONS
        return getattr(call.func, "id", None) in ("abs", "min", "max")

    @staticmethod
    def _is_product_of_elements(value: ast.AST) -> bool:
        """`a[i] * b[i]`, `alpha * A[i, k] * B[k, j]`: a product of two or more indexed factors."""
        factors, stack = 0, [value]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                stack.extend((node.left, node.right))
            elif isinstance(node, ast.Subscript):
                factors += 1
        return factors >= 2 and isinstance(value, ast.BinOp)

    def _is_tensor(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Name):  # by the stores that reach it: `q = net(s)` before `q = q.numpy()`
            return _kinds.reaching_kind(self.ctx, expr) in _kinds.TENSORS or _kinds.looks_like_tensor(self.ctx, expr)
        return _kinds.kind_of(self.ctx, expr) in _kinds.TENSORS
