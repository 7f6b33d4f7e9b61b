"""MAT503 tensor-creation-in-loop: tensors built on the host and copied to the device on every
iteration or every forward call."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import code_scope, flow_of
from matlint.semantic.steps import step_of
from matlint.semantic.loops import identifier, is_training_loop
from matlint.semantic.names import in_test_code
from matlint.semantic.torch_api import TYPED_TENSORS, cuda_tensor_type

# Factories built from sizes alone (their values, to the last bit, in `_same_values_on_device`).
_FILLS = {"zeros", "ones", "full", "empty", "arange", "eye", "linspace", "logspace", "tril_indices", "triu_indices"}


def _same_values_on_device(name: str, call: ast.Call) -> bool:
    """Whether the factory gives bit-identical values on any device: fills of one value, and
    `arange` stepping by a whole number. Interpolating factories round differently per device."""
    if name in ("linspace", "logspace") or name not in _FILLS:
        return False
    if name == "arange":
        step = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "step"), None)
        return step is None or (isinstance(step, ast.Constant) and type(step.value) is int)
    return True


# Factories that take sizes: every positional argument, but only the first of `full` and the last of
# `randint` (the others are values).
_SIZED_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "eye"}
# Factories whose values come from the generator of the device they are created on.
_RANDOM = {"rand", "randn", "randint", "randperm", "normal", "bernoulli"}
_FROM_DATA = {"tensor", "as_tensor", "asarray", "Tensor", "FloatTensor", "LongTensor"}
# numpy factories that fill an array from sizes alone (torch has each, with `device=`).
_NUMPY_FILLS = {"zeros", "ones", "full", "empty", "eye", "arange"}
# Legacy constructors: `torch.Tensor(2, 4)` takes sizes (uninitialised memory), `torch.Tensor([2, 4])` data.
_LEGACY_CONSTRUCTORS = {"Tensor": "", "FloatTensor": "dtype=torch.float32, ", "LongTensor": "dtype=torch.long, "}
# Tests that read a tensor's values on the host: the branch under them handles what the data says
# (an empty mask, a NaN, an out-of-range loss), not the work of every call.
_VALUE_CHECKS = {"item", "any", "all", "isnan", "isinf", "isfinite", "equal", "allclose", "is_nonzero"}
# Reductions whose result, compared on the host (`if mask.sum() > 0:`), reads the tensor's values.
_REDUCTIONS = {"sum", "count_nonzero", "max", "min", "amax", "amin", "mean", "prod", "norm", "nansum"}
# Bases that make a class a plain Python class, not an nn.Module.
_PLAIN_BASES = {"abc.ABC", "typing.Generic", "typing.Protocol", "typing.NamedTuple", "enum.Enum"}
# Ops whose result lives where their input does (`torch.tril(torch.ones(T, T)).to(device)`).
_SAME_DEVICE_FUNCTIONS = {"torch.tril", "torch.triu", "torch.autograd.Variable", "torch.autograd.variable.Variable"}
_SAME_DEVICE_METHODS = {"tril", "triu", "bool", "float", "half", "bfloat16", "long", "int"}
# A function run once, by its first name token: `__init__`, `init_weights`, `initialize`, `build_model`,
# `setUp`, `load`, `load_model`, `loadModel`, `reset_parameters`; not `loader_step` or `builder`.
_ONE_TIME_FUNCTION = re.compile(
    r"^_*(?:[Ii]nit(?:iali[sz](?:e|ation))?|[Bb]uild|[Ss]et_?[Uu]p|[Ll]oad|reset_parameters)(?![a-z])")
# ... unless another token of its name says it trains (`load_and_train`, `build_and_fit`).
_TRAINING_WORD = re.compile(r"(?:^|_|(?<=[a-z]))(?:[Tt]rain(?:ing)?|[Ff]it)(?![a-z])")


def _is_constant_data(expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float, bool)) and expr.value is not None
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        return _is_constant_data(expr.operand)
    if isinstance(expr, (ast.List, ast.Tuple)):
        return bool(expr.elts) and all(_is_constant_data(e) for e in expr.elts)
    return False


def _is_false(expr: ast.AST) -> bool:
    """`requires_grad=False`, `pin_memory=False`: the default, as if the keyword were not there."""
    return isinstance(expr, ast.Constant) and expr.value is False


def _is_scalar_data(expr: ast.AST) -> bool:
    return _is_constant_data(expr) and not isinstance(expr, (ast.List, ast.Tuple))


def _scalar_value(expr: ast.AST):
    """The number a scalar literal (`_is_scalar_data`) spells: `-1.0`, `+2`, `True`."""
    if isinstance(expr, ast.UnaryOp):
        value = _scalar_value(expr.operand)
        return -value if isinstance(expr.op, ast.USub) else value
    return expr.value


def _one_value(expr: ast.AST) -> Optional[tuple]:
    """(the number, the shape) of constant data that repeats one number (`[0.0, 0.0]`, `[[1, 1],
    [1, 1]]`): a fill, not data. None for ragged or mixed data."""
    if _is_scalar_data(expr):
        return _scalar_value(expr), ()
    if not isinstance(expr, (ast.List, ast.Tuple)) or not expr.elts:
        return None
    items = [_one_value(e) for e in expr.elts]
    first = items[0]
    if first is None or any(i is None or i != first or type(i[0]) is not type(first[0]) for i in items):
        return None
    return first[0], (len(items),) + first[1]


def _takes_device(name: str, call: ast.Call) -> bool:
    """`torch.bernoulli(p)` and `torch.normal(mean_tensor, std)` sample from a tensor, with no
    `device=`; `torch.normal(mean, std, size)` and the other factories take one."""
    if name == "bernoulli":
        return False
    if name == "normal":
        return len(call.args) >= 3 or any(k.arg == "size" for k in call.keywords)
    return True


def _walk_this_loop(node: ast.AST):
    """The nodes of `node` outside nested loops and functions, whose `continue` is not this loop's."""
    yield node
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_this_loop(child)


def _changes_in_place(name: str, stmt: ast.AST) -> bool:
    """`stmt` changes the tensor held by `name` in place: `name += ...`, `name[i] = ...`, `name.add_(...)`,
    `out=name`."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.AugAssign):
            target = node.target
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            target = node
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_")
              and not node.func.attr.startswith("_")):
            target = node.func.value
        elif isinstance(node, ast.keyword) and node.arg == "out":
            target = node.value  # `torch.add(a, b, out=name)`
        else:
            continue
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        if isinstance(target, ast.Name) and target.id == name:
            return True
    return False


class TensorCreationInLoop(Rule):
    code = "MAT503"
    name = "tensor-creation-in-loop"
    summary = "A tensor created on the host and copied to the device on every loop iteration or forward call."
    docs = """
    ## What it does
    Inside a loop, in an `nn.Module`'s `forward`, or in a function that runs every step (a
    training step, or a helper that `forward`, a step or a training/batch loop calls on every
    pass, not under an `if`), flags:
    - a tensor created on the host and then moved (`torch.zeros(n).to(device)`,
      `torch.arange(n).cuda()`, `torch.randn(b, d).to(x.device)`): it can be created on the
      device directly; a sample drawn on the host from a host-made input
      (`torch.bernoulli(p * torch.ones(shape)).to(d)`): `torch.bernoulli` and `torch.normal(mean,
      std)` take no `device=` and sample where their input is, so that input is what to make on
      the device;
    - a constant copied from the host (`torch.tensor([0.5, 2.0], device=x.device)`,
      `torch.tensor(1.0).cuda()`): the same values are uploaded again each time. A constant of
      one repeated value (a scalar `torch.tensor(0.0, device=d)`, often an accumulator updated in
      place, or `torch.tensor([0, 0], device=d)`) gets the fill that makes it on the device
      (`torch.zeros((), device=d)`, `torch.zeros(2, dtype=torch.long, device=d)`: same dtype),
      not a buffer: a fill is a new tensor each time, so it also fits a tensor that is kept,
      returned or changed in place;
    - an uninitialised tensor allocated on the host and moved (`torch.Tensor(2, 4).to(d)`: the
      arguments are sizes): `torch.empty(2, 4, device=d)`;
    - an array that numpy draws or fills on the host on every pass and that is copied to the
      device: `torch.from_numpy(np.random.randn(b, d)).cuda()`, `torch.tensor(np.zeros(n),
      device=d)`, or a legacy CUDA tensor type called on it (`torch.cuda.FloatTensor(...)`, or a
      module-level name bound to one, also under a condition: `Tensor = torch.cuda.FloatTensor
      if cuda else torch.FloatTensor`, then `Tensor(np.random.normal(0, 1, (b, d)))`, as GAN
      scripts write it), directly or through a name assigned in the same loop. The message gives
      the torch call that makes it on the device (`torch.randn((b, d), device=device)`,
      `torch.empty(size, device=d).uniform_(low, high)`, `torch.randint(low, high, size,
      device=d)`, `torch.zeros(...)`).

    ## Why is this bad?
    Creating on the host and copying costs a host allocation, a fill on the CPU and a
    host-to-device copy from pageable memory, which blocks the CPU until the copy is done,
    every iteration. `device=` makes it one fill kernel on the GPU. A constant uploaded per
    step is a copy that never had to happen: create it once, or fill a scalar on the device.

    ## Example
    ```python
    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1]).to(x.device).tril()
        scale = torch.tensor([0.5, 2.0], device=x.device)
        total = torch.tensor(0.0, device=x.device)
        ...
    ```

    ## Use instead
    ```python
    def __init__(self):
        ...
        self.register_buffer("scale", torch.tensor([0.5, 2.0]), persistent=False)

    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1], device=x.device).tril()
        total = torch.zeros((), device=x.device)
        ...
    ```

    ## Stays quiet on
    - Tensors created directly on the device from shapes (`torch.zeros(b, d, device=x.device)`):
      a fill kernel, no copy.
    - Data that changes per iteration (`torch.tensor(batch_ids).to(device)`,
      `torch.from_numpy(states).cuda()` of a loader's batch or an environment's state): it has
      to be copied anyway. numpy draws that stay on the host (`torch.tensor(np.random.normal(0,
      0.2))` added as a scalar), are made once outside the loop, or are filled in afterwards
      (`adv = np.zeros(n)`, then `adv[t] = ...`: computed data), and legacy types called
      with sizes (`Tensor(b, 1).fill_(1.0)` allocates on the device).
    - `.to(x)` / `.to(dtype)` and other `.to` calls whose argument may not be a device, and
      `.to("cpu")`; random tensors drawn from an explicit `generator=` (it lives on the host),
      or sampled from an input whose place is unknown (`torch.bernoulli(probs).to(d)`: `probs`
      may be on the device already);
      factories with `requires_grad=True` (the moved copy is a non-leaf, so `device=` would
      change which tensor gets the gradient; a constant leaf must be a new one each call) or
      `pin_memory=True` (`requires_grad=False` and `pin_memory=False` are the defaults: reported).
    - Constant tensors of several values that each pass needs a tensor of its own for, where
      "create it once" would be wrong: returned or yielded, added to a collection
      (`history.append(stats)`), items of a comprehension (`[torch.tensor([1.0, 2.0], device=d)
      for _ in range(world)]`, an `all_gather` receive list), stored in another object
      (`data.edge_index = torch.tensor(...)`: every result would share it), or changed in place
      later (`offsets[1] += n`, `buf.copy_(x)`, `out=buf`), directly or through the name they
      are assigned to. A constant of one repeated value is still reported, with its fill (see
      above), and so is a factory moved to the device whatever becomes of it: with `device=` it
      is a new tensor each time too.
    - A device that changes with the loop variable (`torch.tensor(0, device=torch.device("cuda",
      i))` to initialize each GPU), and branches that run on one iteration only (`if i ==
      len(steps) - 1:`, `if state is None:`, `if len(state) == 0:`; their `else:` is reported).
    - Blocks that leave the loop right after the creation: a branch ending in `return` or
      `raise` runs at most once per call (`if too_close: return torch.tensor(True, device=d)`),
      one ending in `break` once per run of its loop (still reported when an outer loop runs
      it again, and in a module's `forward`, once per forward call). A `continue` in the rest
      of the block, or a `raise` that a `try` in the loop may catch, keeps it reported.
    - Branches that the data chooses, under a test that reads tensor values on the host (`if
      not torch.any(mask): return torch.tensor(0.0, device=d)`, `if loss.item() > 1.0:`, `if
      total == 0:` for a tensor `total`, a reduction compared: `if mask.sum() > 0:`, `if (z <
      -1).sum() == 0:`): an empty batch or an out-of-range value, not the work of every call.
      `if position_ids is None:` reads no values (the argument was not passed, which is the
      usual call): the default built under it is reported.
    - Loops in functions whose name starts with the word `init` (`__init__`, `init_weights`,
      `initialize`), `build`, `setup`, `load` (`load`, `load_model`; not `loader_step`) or is
      `reset_parameters` (run once), unless the name also says `train` or `fit`
      (`load_and_train`) or the loop calls `.backward()` or an optimizer's `.step()`; loops that
      make one tensor per listed shape (`torch.randn(1, *shape).to(device) for shape in
      input_shapes`: dummy inputs; the loop item is a size, not the fill value of
      `torch.full((b,), t)` for `t in timesteps`), code outside loops, `forward` and the functions that run every step, the
      `forward` of a class known not to be an `nn.Module` (no base, `object`, `ABC`), and tests.
    - Caches filled on the first call: `self._mask = ...` under an `if` that tests `self._mask`
      (`if self._mask is None or self._mask.size(0) < T:`, `if not hasattr(self, "_mask"):`).

    ## Fix safety
    Host-created-then-moved fills (`zeros`, `ones`, `full`, `empty`, `eye`, and `arange` with
    a whole-number step) have a safe fix: pass `device=` to the factory and drop the move; the
    values are identical. `linspace`, `logspace` and `arange` with a fractional step compute
    their values with rounding that differs between CPU and GPU kernels (the last bit of a
    float, or a whole step after a cast to an integer dtype), so their fix is unsafe; so is the
    fix for random factories (`randn`, `rand`, `randint`, `randperm`): the device's generator
    draws different numbers from the CPU's. `device=` goes before the closing parenthesis, or
    right after the last argument when a comment ends the argument list; there is no fix when a
    comment sits between the factory and the end of the move (it would be dropped). Constants
    and `torch.Tensor(sizes)` have no fix: hoisting them (a buffer, a module-level tensor) is
    the author's call. Nor do numpy arrays made per pass: torch's sampler draws other numbers,
    and in float32 where numpy draws float64. Neither do samplers without `device=` (`torch.bernoulli`, `torch.normal`
    of tensors): the message names the factory in their input to create on the device.
    """

    # A move (`.to(...)`, `.cuda()`), or a tensor made from data (`torch.tensor(...)`, `tensor(...)`).
    only = {"visit_Call": Only(attrs=frozenset({"to", "cuda"} | _FROM_DATA | TYPED_TENSORS.keys()))}

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        moves = isinstance(func, ast.Attribute) and func.attr in ("to", "cuda")
        # The call's own shape first: it rules out almost every call, and costs less than the place.
        factory = self._host_made(func.value) if moves else self._factory(node)
        made_at = node  # where the finding goes: the move, or the creation a name carries to it
        carrier = self._unwrapped(func.value) if moves and factory is None else None
        if isinstance(carrier, ast.Name):
            carried = self._carried_to_move(carrier)
            if carried is not None:
                factory, made_at = carried
        cuda_type = None if moves or factory is not None or not node.args else cuda_tensor_type(self.ctx, func)
        if factory is None and cuda_type is None:
            return
        self._loops = self._repeating_loops()
        if not self._hot() or in_test_code(self.ctx) or self._runs_once_per_loop() or self._fills_a_cache():
            return
        if cuda_type is not None:  # `Tensor(np.random.normal(...))` with `Tensor = torch.cuda.FloatTensor`
            self._check_numpy_data(node, node.args[0], '"cuda"' if self.ctx.qualname(func) else "device")
            return
        if moves:
            target = self._device_target(node, func.attr)
            if target is None or (isinstance(target, ast.AST) and self._varies_per_iteration(target)):
                return
            device = target if isinstance(target, str) else self.ctx.segment(target)
            name, call = factory
            if name in _FROM_DATA | {"from_numpy"} and call.args and self._check_numpy_data(node, call.args[0], device):
                return
            if name in _FROM_DATA:
                if self._legacy_sizes(name, call):
                    self._report_sizes(node, name, call, device)
                elif call.args and _is_constant_data(call.args[0]):
                    self._constant(node, call, device)
                return
            if name not in _FILLS and name not in _RANDOM:
                return
            if any(k.arg in ("device", None, "out", "generator") or k.arg in ("requires_grad", "pin_memory")
                   and not _is_false(k.value) for k in call.keywords):
                return  # already placed, unknown keywords, host-only options, or a leaf whose copy is what is used
            if self._sized_by_loop_item(name, call) or self._in_value_checked_branch():
                return
            if not _takes_device(name, call):
                if made_at is node:
                    self._report_sampler(node, call, device)
                return
            if made_at is not node:
                self.report(made_at, f"`{self.ctx.segment(call.func)}(...)` is created on the host and copied to the "
                                     f"device on line {node.lineno}, on every {self._where()}; create it there with "
                                     f"`device={device}` and drop the copy")
                return
            self.report(node, f"`{self.ctx.segment(call.func)}(...)` is created on the host and copied to the device "
                              f"on every {self._where()}; create it there with `device=`",
                        fix=self._device_fix(node, call, device, safe=_same_values_on_device(name, call)))
            return
        if factory[0] not in _FROM_DATA or not node.args:
            return
        device = next((k.value for k in node.keywords if k.arg == "device"), None)
        if device is None or not self._is_device(device) or self._varies_per_iteration(device):
            return
        if not _is_constant_data(node.args[0]):
            self._check_numpy_data(node, node.args[0], self.ctx.segment(device))
        elif not self._legacy_sizes(factory[0], node):  # `torch.FloatTensor(2, 4, device=...)`: sizes
            self._constant(node, node, self.ctx.segment(device))

    # -- helpers --------------------------------------------------------------------
    def _hot(self) -> bool:
        function = self.ctx.function
        loops = self._loops
        if function is None:
            return bool(loops)
        name = getattr(function, "name", "")
        if name == "forward":
            return bool(loops) or (self.ctx.class_ is not None and len(self.ctx.functions) == 1
                                   and not self._plain_class(self.ctx.class_))
        if not loops:
            return step_of(self.ctx, self.ctx.functions) is not None
        if not _ONE_TIME_FUNCTION.match(name) or _TRAINING_WORD.search(name):
            return True
        return any(is_training_loop(self.ctx, loop) for loop in loops)  # `.backward()`: not run once

    def _repeating_loops(self) -> list:
        """The enclosing loops that may run this call on every iteration: not those that its
        block leaves right after it (`if too_close: return torch.tensor(True, ...)` runs at most
        once per call, `...; break` once per run of the loop it ends)."""
        loops = self.ctx.loops
        if not loops:
            return loops
        parents = self.ctx.parents
        first = next((k for k, p in enumerate(parents) if p is loops[0].node), None)
        if first is None:
            return loops
        left = set()
        for k in range(len(parents) - 1, first - 1, -1):
            child = parents[k + 1] if k + 1 < len(parents) else None
            block = next((b for b in (getattr(parents[k], f, None) for f in ("body", "orelse", "finalbody"))
                          if isinstance(b, list) and any(s is child for s in b)), None)
            if block is None:
                continue
            exit_ = block[-1]
            tail = block[next(i for i, s in enumerate(block) if s is child):]
            if not isinstance(exit_, (ast.Return, ast.Raise, ast.Break)) or any(
                    isinstance(n, ast.Continue) for s in tail for n in _walk_this_loop(s)):
                continue
            if isinstance(exit_, ast.Return) or isinstance(exit_, ast.Raise) and not any(
                    isinstance(p, ast.Try) for p in parents[first:k + 1]):
                return []  # a `raise` under a `try` may be caught and the loop go on
            if isinstance(exit_, ast.Break):
                left.add(next(p for p in reversed(parents[:k + 1]) if isinstance(p, (ast.For, ast.AsyncFor, ast.While))))
        return [loop for loop in loops if loop.node not in left] if left else loops

    def _plain_class(self, cls: ast.ClassDef, depth: int = 0) -> bool:
        """A class known not to be an nn.Module (no bases, `object`, `ABC`, or plain classes of this
        file): its `forward` is not called per step of a model, and it has no `register_buffer`."""
        for base in cls.bases:
            if isinstance(base, ast.Subscript):  # Generic[T]
                base = base.value
            if isinstance(base, ast.Name) and base.id == "object" or self.ctx.qualname(base) in _PLAIN_BASES:
                continue
            if not isinstance(base, ast.Name) or depth > 3 or self.ctx.qualname(base) is not None:
                return False
            defined = [s for s in self.ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == base.id]
            if len(defined) != 1 or not self._plain_class(defined[0], depth + 1):
                return False
        return True

    def _runs_once_per_loop(self) -> bool:
        """Under `if i == last:`, `if x is None:`, `if len(state) == 0:` inside the loop: a
        first- or last-iteration branch, not per-iteration work."""
        if not self.ctx.loops:
            return False
        loop_node = self.ctx.loops[-1].node
        parents = self.ctx.parents
        inside = False
        for k, parent in enumerate(parents[:-1]):
            if parent is loop_node:
                inside = True
            elif inside and isinstance(parent, ast.If) and any(s is parents[k + 1] for s in parent.body):
                test = parent.test  # its `else:` runs on the other iterations
                if isinstance(test, ast.Compare) and all(isinstance(op, (ast.Eq, ast.Is)) for op in test.ops):
                    return True
        return False

    def _fills_a_cache(self) -> bool:
        """`self._mask = ...` under `if self._mask is None or ...:` or `if not hasattr(self,
        "_mask"):`: a cache filled on the first call (or when it grows), not per-call work."""
        statement = self.ctx.statement()
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        else:
            return False
        stored = set()
        for target in targets:
            while isinstance(target, ast.Subscript):  # self._cache[key] = ...
                target = target.value
            if isinstance(target, ast.Attribute):
                stored.add(target.attr)
        if not stored:
            return False
        for parent in reversed(self.ctx.parents):
            if parent is self.ctx.function:
                break
            if isinstance(parent, ast.If) and any(
                    (isinstance(sub, ast.Attribute) and sub.attr in stored)
                    or (isinstance(sub, ast.Constant) and sub.value in stored) for sub in ast.walk(parent.test)):
                return True
        return False

    def _varies_per_iteration(self, expr: ast.AST) -> bool:
        """The device (or the whole expression) changes with the loop variable: one tensor per
        device, e.g. initializing every GPU."""
        return any(loop.depends_on_iteration(expr) for loop in self.ctx.loops)

    def _where(self) -> str:
        if self._loops:
            return "iteration"
        function = self.ctx.function
        if getattr(function, "name", "") == "forward":
            return "forward call"
        return f"call of `{function.name}`, which {step_of(self.ctx, self.ctx.functions).why}"

    def _is_number(self, expr: ast.AST) -> bool:
        return (isinstance(expr, ast.Constant) and isinstance(expr.value, (int, float))) or (
            isinstance(expr, ast.Name) and _kinds.kind_of(self.ctx, expr) == _kinds.SCALAR)

    def _carried_to_move(self, name: ast.Name) -> Optional[tuple]:
        """(factory, its call) when `name` holds a tensor made on the host by the one assignment
        that reaches this move, at the same loop depth, and every read of it is a move to the
        device (`z = torch.randn(b, 100)` ... `z = z.cuda()`): the name only carries the tensor
        to the copy."""
        function = self.ctx.function
        if function is None:
            return None
        flow = flow_of(self.ctx, function)
        assign = flow.reaching(name)
        if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
            return None
        factory = self._host_made(assign.value)
        if factory is None:
            return None
        if flow.loops_around(assign) != flow.loops_around(name):
            return None
        moved = False
        for use in flow.uses(assign):
            while isinstance(flow.parent.get(use), ast.Call) and self._unwrapped(flow.parent.get(use)) is use:
                use = flow.parent.get(use)  # `Variable(z)`: the same tensor
            move = flow.parent.get(use)
            call = flow.parent.get(move)
            if isinstance(move, ast.Attribute) and move.value is use and move.attr in ("to", "cuda") \
                    and isinstance(call, ast.Call) and call.func is move:
                moved = True
            elif not isinstance(use, ast.Call):
                return None  # read as it is, on the host (a wrapped copy left on the CPU path reads nothing)
        return (factory, factory[1]) if moved else None

    def _unwrapped(self, expr: ast.AST, making: bool = False) -> ast.AST:
        """`expr` without the calls that keep its device (`Variable(z)`, `z.float()`); `making`:
        also through what may follow a factory in the expression that makes a tensor
        (`torch.ones(T, T).tril(1)`, arithmetic with a number: `torch.ones(n) * i`)."""
        while True:
            if isinstance(expr, ast.BinOp):
                if not (making and isinstance(expr.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))
                        and self._is_number(expr.right)):
                    return expr
                expr = expr.left
                continue
            if not isinstance(expr, ast.Call):
                return expr
            func = expr.func
            if isinstance(func, ast.Attribute) and func.attr in _SAME_DEVICE_METHODS and not expr.keywords and (
                    not expr.args or making and func.attr in ("tril", "triu")) and self.ctx.qualname(func) is None:
                expr = func.value
            elif self.ctx.qualname(func) in _SAME_DEVICE_FUNCTIONS and expr.args and not isinstance(
                    expr.args[0], ast.Starred):
                expr = expr.args[0]
            else:
                return expr

    def _host_made(self, expr: ast.AST) -> Optional[tuple]:
        """The factory call that makes `expr`, directly or through ops that keep its device
        (`torch.ones(T, T).tril().bool()`), as `_factory` gives it."""
        return self._factory(self._unwrapped(expr, making=True))

    def _factory(self, expr: ast.AST) -> Optional[tuple]:
        if not isinstance(expr, ast.Call):
            return None
        qualname = self.ctx.qualname(expr.func) or ""
        module, _, name = qualname.rpartition(".")
        return (name, expr) if module == "torch" else None

    def _device_target(self, call: ast.Call, method: str):
        """The device the tensor moves to (an expression, or '"cuda"' for `.cuda()`), or None
        when it is not surely a device."""
        extra = [k for k in call.keywords if k.arg not in ("device", "non_blocking")]
        if extra:
            return None
        if method == "cuda":
            # `.cuda(i)`, `.cuda(self.gpu_id)`: whatever `.cuda()` is given is a CUDA device
            # (an index `device=` takes as one too).
            given = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
            return '"cuda"' if not given else given[0]
        else:
            given = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
            if len(given) != 1:
                return None
            target = given[0]
        return target if self._is_device(target) else None

    def _is_device(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                return expr.value.split(":")[0] in ("cuda", "mps", "xpu", "hpu", "npu", "meta") or expr.value == "cuda"
            return type(expr.value) is int
        if isinstance(expr, ast.Call):
            if self.ctx.qualname(expr.func) != "torch.device" or not expr.args:
                return False
            return not (isinstance(expr.args[0], ast.Constant) and expr.args[0].value == "cpu")
        name = (identifier(expr) or "").lower()
        return name == "dev" or "device" in name and "cpu" not in name

    def _device_fix(self, move: ast.Call, factory: ast.Call, device: str, safe: bool):
        text = self.ctx.segment(factory)
        if not text.endswith(")"):
            return None
        arguments = factory.args + factory.keywords
        if "#" in text and arguments:
            # A comment after the last argument would swallow a `device=...)` put before the `)`:
            # put it right after the last argument instead.
            last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))
            span = ast.AST(lineno=factory.lineno, col_offset=factory.col_offset,
                           end_lineno=last.end_lineno, end_col_offset=last.end_col_offset)
            head = self.ctx.segment(span)
            if not text.startswith(head):
                return None
            created = f"{head}, device={device}{text[len(head):]}"
        else:
            head = text[:-1].rstrip()
            separator = "" if head.endswith(("(", ",")) else ", "
            if head.endswith(","):
                separator = " "
            created = f"{head}{separator}device={device})"
        moved = self.ctx.segment(move.func.value)
        if moved != text:  # ops between the factory and the move: they now run on the device
            if moved.count(text) != 1:
                return None
            created = moved.replace(text, created)
        if "#" in self.ctx.segment(move).replace(text, ""):
            return None  # a comment between the factory and the end of the move would be dropped
        return self.replace(move, created, "Create the tensor on the device with `device=`", safe=safe)

    def _check_numpy_data(self, node: ast.Call, data: ast.AST, device: str) -> bool:
        """Reports `node`, which copies `data` to the device, when numpy makes that data on this
        pass (a draw of `np.random`, a fill such as `np.zeros`): torch makes the same on the
        device. Data from elsewhere (a loader's batch, an environment's state) has to be copied."""
        made = self._numpy_made(data, 0)
        if made is None:
            return False
        module, _, name = self.ctx.qualname(made.func).rpartition(".")
        drawn = module == "numpy.random"
        instead = self._torch_for_numpy(name, made, device) if drawn else (
            f"torch.{name}({', '.join(self.ctx.segment(a) for a in made.args)}, device={device})")
        self.report(node, f"`{self.ctx.segment(made.func)}(...)` {'draws' if drawn else 'fills'} an array on the host "
                          f"that is copied to the device on every {self._where()}; "
                          + (f"make it there: `{instead}`" if instead else
                             f"draw it there with torch's sampler and `device={device}`"))
        return True

    def _numpy_made(self, expr: ast.AST, depth: int) -> Optional[ast.Call]:
        """The numpy call that makes `expr` on this pass, directly, through `.astype(...)` or
        through a name assigned it in the same loop and not changed in place
        (`noise = np.random.normal(...)`)."""
        while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
               and expr.func.attr in ("astype", "copy") and self.ctx.qualname(expr.func) is None):
            expr = expr.func.value
        if isinstance(expr, ast.Name) and depth < 3 and self.ctx.function is not None:
            flow = flow_of(self.ctx, self.ctx.function)
            assign = flow.reaching(expr)
            if (assign is None or len(assign.targets) != 1 or flow.loops_around(assign) != flow.loops_around(expr)
                    or flow.mutations.get(expr.id)):
                return None  # made elsewhere, or filled in afterwards (`adv[t] = a_t`): data, not a fill
            return self._numpy_made(assign.value, depth + 1)
        if not isinstance(expr, ast.Call):
            return None
        module, _, name = (self.ctx.qualname(expr.func) or "").rpartition(".")
        return expr if module == "numpy.random" or module == "numpy" and name in _NUMPY_FILLS else None

    def _torch_for_numpy(self, name: str, call: ast.Call, device: str) -> Optional[str]:
        """The torch call that draws what `np.random.<name>(...)` draws, on the device."""
        seg = self.ctx.segment
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        if name in ("randn", "rand"):
            return f"torch.{name}({', '.join([seg(a) for a in call.args] + [f'device={device}'])})"
        parameters = {"normal": ("loc", "scale", "size"), "uniform": ("low", "high", "size"),
                      "random": ("size",), "random_sample": ("size",), "randint": ("low", "high", "size")}.get(name)
        if parameters is None:
            return None
        given = dict(zip(parameters, call.args))
        given.update((k.arg, k.value) for k in call.keywords)
        if set(given) - set(parameters) or "size" not in given:
            return None
        size = seg(given["size"])
        if name == "randint":  # torch's takes the size as a tuple
            size = size if isinstance(given["size"], (ast.Tuple, ast.List)) else f"({size},)"
            bounds = ", ".join(seg(given[p]) for p in ("low", "high") if p in given)
            return f"torch.randint({bounds}, {size}, device={device})"
        low, high = (("loc", "scale") if name == "normal" else ("low", "high"))
        default = {"loc": 0, "scale": 1, "low": 0, "high": 1}
        if all(low_high not in given or isinstance(given[low_high], ast.Constant)
               and given[low_high].value == default[low_high] for low_high in (low, high)):
            return f"torch.{'randn' if name == 'normal' else 'rand'}({size}, device={device})"
        bounds = ", ".join(seg(given[p]) if p in given else str(default[p]) for p in (low, high))
        return f"torch.empty({size}, device={device}).{'normal_' if name == 'normal' else 'uniform_'}({bounds})"

    def _constant(self, node: ast.Call, factory: ast.Call, device: str) -> None:
        """`node` uploads the constant `factory` builds (`node` is the factory itself or its move)."""
        if any(k.arg is None or k.arg == "requires_grad" and not _is_false(k.value) for k in factory.keywords):
            return  # a fresh leaf for autograd each time: one shared tensor would not do
        if self._in_value_checked_branch():
            return
        value = factory.args[0]
        filled = _one_value(value)
        if filled is not None:
            self._report_fill(node, factory, value, *filled, device)
            return
        if self._kept_apart(node):
            return  # one tensor made once would be shared by every result, or changed by every call
        self.report(node, f"this constant tensor is copied from the host to the device on every {self._where()}; "
                          "create it once (`self.register_buffer(..., persistent=False)` or outside the loop)")

    def _report_fill(self, node: ast.Call, factory: ast.Call, value: ast.AST, number, shape: tuple,
                     device: str) -> None:
        """A constant of one repeated number (`torch.tensor(0.0, device=d)`, `torch.tensor([0, 0],
        device=d)`): a fill on the device makes a new tensor each time, without a copy, so it
        also fits a tensor that is changed in place, returned or kept."""
        keywords = [f"{k.arg}={self.ctx.segment(k.value)}" for k in factory.keywords if k.arg != "device"]
        if not any(k.arg == "dtype" for k in factory.keywords) and type(number) in (bool, int):
            # `torch.tensor(0)` is int64 and `torch.tensor(True)` bool; `torch.zeros(())` would be float
            keywords.append("dtype=torch.bool" if type(number) is bool else "dtype=torch.long")
        keywords.append(f"device={device}")
        if number in (0, 1):
            size = ", ".join(map(str, shape)) or "()"
            instead = f"torch.{'zeros' if number == 0 else 'ones'}({size}, {', '.join(keywords)})"
        else:
            size = f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"
            text = self.ctx.segment(value) if not shape else repr(number)
            instead = f"torch.full({size}, {text}, {', '.join(keywords)})"
        if not shape:
            self.report(node, f"this scalar is copied from the host to the device on every {self._where()}; "
                              f"`{instead}` fills it on the device without a copy (or pass the Python number "
                              "where the op takes one)")
            return
        self.report(node, f"this constant tensor of one repeated value is copied from the host to the device on "
                          f"every {self._where()}; `{instead}` fills it on the device without a copy")

    def _report_sampler(self, node: ast.Call, call: ast.Call, device: str) -> None:
        """`torch.bernoulli(p * torch.ones(shape)).to(d)`: the sampler has no `device=`; it draws
        where its input is, so the factory in its input is the one to make on the device. An
        input of unknown place (`torch.bernoulli(probs)`) may be on the device already: quiet."""
        inputs = [sub for arg in call.args for sub in ast.walk(arg) if isinstance(sub, ast.Call)
                  and (self._factory(sub) or ("",))[0] in _FILLS | _RANDOM and not any(k.arg == "device" for k in sub.keywords)]
        if len(inputs) != 1:
            return
        func = self.ctx.segment(call.func)
        self.report(node, f"`{func}(...)` samples on the host and its result is copied to the device on every "
                          f"{self._where()}; `{func}` takes no `device=` (it samples where its input is): create "
                          f"`{self.ctx.segment(inputs[0])}` there with `device={device}`")

    def _report_sizes(self, node: ast.Call, name: str, call: ast.Call, device: str) -> None:
        sizes = ", ".join(self.ctx.segment(a) for a in call.args)
        self.report(node, f"`{self.ctx.segment(call)}` allocates an uninitialised tensor on the host and copies it to "
                          f"the device on every {self._where()}; allocate it there: "
                          f"`torch.empty({sizes}, {_LEGACY_CONSTRUCTORS[name]}device={device})`")

    @staticmethod
    def _legacy_sizes(name: str, call: ast.Call) -> bool:
        """`torch.Tensor(2, 4)`, `torch.FloatTensor(3)`: sizes, not data."""
        return name in _LEGACY_CONSTRUCTORS and bool(call.args) and all(
            isinstance(a, ast.Constant) and type(a.value) is int for a in call.args)

    def _in_value_checked_branch(self) -> bool:
        """Under `if not torch.any(mask):`, `if loss.item() > 1.0:`, `if total == 0:` (a tensor): a
        branch the data chooses (an empty batch, an out-of-range value), not work of every call."""
        parents = self.ctx.parents
        for k in range(len(parents) - 2, -1, -1):
            parent = parents[k]
            if parent is self.ctx.function:
                break
            if isinstance(parent, ast.If) and any(s is parents[k + 1] for s in parent.body) \
                    and self._reads_tensor_values(parent.test):
                return True
        return False

    def _reads_tensor_values(self, test: ast.AST) -> bool:
        """The test reads a tensor's values on the host: `.item()`, `.any()`, `torch.isnan(...)`, a
        reduction compared (`mask.sum() > 0`, `(z < -1).sum() == 0`), a tensor compared (`total ==
        0`) or tested for truth. `x is None` reads no values: it is the optional argument's default."""
        operands = [test.operand if isinstance(test, ast.UnaryOp) else test]
        for sub in ast.walk(test):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _VALUE_CHECKS:
                return True
            if isinstance(sub, ast.Compare) and not any(isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops):
                compared = [sub.left, *sub.comparators]
                if any(self._is_reduction(o) for o in compared):
                    return True
                operands.extend(compared)
        return any(isinstance(o, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and _kinds.kind_of(self.ctx, o) in _kinds.TENSORS
                   for o in operands)

    def _is_reduction(self, expr: ast.AST) -> bool:
        """`mask.sum()`, `(z < -1).sum()`, `torch.count_nonzero(m)`: a tensor method or a torch
        function that reduces values (not `len(x)`, `sum(lengths)` or `x.size(0)`)."""
        if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _REDUCTIONS):
            return False
        qualname = self.ctx.qualname(expr.func)
        if qualname is not None:
            return qualname.rpartition(".")[0] == "torch"
        return _kinds.kind_of(self.ctx, expr.func.value) not in _kinds.NON_TENSORS

    def _kept_apart(self, node: ast.Call) -> bool:
        """Each pass needs a tensor of its own: the new one is returned, yielded, added to a
        collection (`.append(...)`), an item of a comprehension (`[torch.tensor(...) for _ in
        range(world)]`, an `all_gather` receive list), stored in another object (`data.edge_index
        = ...`, `out["mask"] = ...`), or changed in place later (`buf.copy_(x)`, `buf[i] = ...`,
        `out=buf`), directly or through the name it is assigned to: a tensor made once would be
        shared by every result, or changed by every pass."""
        scope = code_scope(self.ctx)
        if scope is None:
            return False
        flow = flow_of(self.ctx, scope)
        if self._kept(node, flow.parent):
            return True
        statement = flow.statement(node)
        if not (isinstance(statement, ast.Assign) and statement.value is node and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            return False
        name = statement.targets[0].id
        return (any(_changes_in_place(name, stmt) for stmt in scope.body)
                or any(self._kept(use, flow.parent) for use in flow.uses(statement)))

    def _kept(self, expr: ast.AST, parent: dict) -> bool:
        """The tensor `expr` holds outlives this pass where it stands (see `_kept_apart`)."""
        up = parent.get(expr)
        if isinstance(up, ast.Tuple):
            expr, up = up, parent.get(up)
        if isinstance(up, (ast.Return, ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(up, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return up.elt is expr
        if isinstance(up, ast.DictComp):
            return up.value is expr
        if isinstance(up, ast.keyword):
            return up.arg == "out"
        if isinstance(up, ast.Call):
            return (isinstance(up.func, ast.Attribute) and up.func.attr in ("append", "extend", "insert", "add")
                    and any(a is expr for a in up.args))
        if not isinstance(up, ast.Assign) or up.value is not expr:
            return False
        for target in up.targets:
            if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                return True
            if isinstance(target, ast.Subscript) and _kinds.kind_of(self.ctx, target.value) not in _kinds.TENSORS:
                return True
        return False

    def _sized_by_loop_item(self, name: str, call: ast.Call) -> bool:
        """`torch.randn(1, *shape).to(device) for shape in input_shapes`: one tensor per listed
        shape (dummy inputs built once), not the same work on every iteration. Only the size
        arguments count: in `torch.full((b,), t)` for `t in timesteps`, `t` is the fill value."""
        if not self.ctx.loops or name not in _SIZED_FACTORIES:
            return False
        loop = self.ctx.loops[-1]
        it = loop.iter
        if isinstance(it, ast.Call) and getattr(it.func, "id", None) in ("range", "enumerate"):
            return False
        if name == "full":
            sizes = call.args[:1]
        elif name == "randint":  # randint(high, size), randint(low, high, size)
            sizes = call.args[-1:] if len(call.args) >= 2 else []
        else:
            sizes = call.args
        sizes = [*sizes, *(k.value for k in call.keywords if k.arg == "size")]
        for size in sizes:
            for arg in size.elts if isinstance(size, (ast.Tuple, ast.List)) else [size]:
                if isinstance(arg, ast.Starred):
                    arg = arg.value
                if isinstance(arg, ast.Name) and arg.id in loop.targets:
                    return True
        return False
