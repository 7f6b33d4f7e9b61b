"""MAT502 host-sync-in-loop: a device-to-host synchronization on every step of a training or
evaluation loop."""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from matlint.diagnostics import Fix
from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.project import cpu_only_project, cpu_only_script, imported_function, moves_work_to_cuda, parsed
from matlint.semantic.loops import LoopInfo, bound_names, is_backward, loaded_names, walk_no_scopes
from matlint.semantic.kinds import TYPED_TENSORS, cuda_tensor_type
from matlint.semantic.steps import iterates_loader, loop_trains, repeating_loops, runs_once, samples_with_model, step_loop
from matlint.semantic.names import REFERENCE, TESTS
from matlint.semantic.shapes import reduces_every_element, shape_of
from matlint.semantic.tree import dotted

from .reads import _HostReads
from .steps import _StepLoops, _steps_with_project_helpers, tested_as_tensor

_NOT_SYNCED = (_kinds.CPU_TENSOR,) + _kinds.NON_TENSORS
_SYNC_METHODS = {"item", "cpu", "tolist", "to"}
_MOVES = frozenset({"to", "cuda", "cpu", "type", "type_as"})  # methods that may put a tensor elsewhere
_CONVERSIONS = {"float", "int", "bool"}
# Python's `math` functions, which convert a tensor argument to a Python number.
_MATH_FUNCTIONS = frozenset({"log", "log10", "log2", "log1p", "exp", "expm1", "sqrt", "pow", "floor", "ceil", "fabs",
                             "isnan", "isinf", "isfinite", "sin", "cos", "tan", "atan", "tanh", "erf"})
_MATH_QUALIFIED = frozenset(f"math.{name}" for name in _MATH_FUNCTIONS)
_TRUTH_BUILTINS = frozenset({"any", "all"})
# Builtins that walk an iterable and test its items on the host: given a tensor, one sync per element.
_ELEMENT_BUILTINS = frozenset({"max", "min", "sorted", "any", "all"})
_DISPLAYS = (ast.GeneratorExp, ast.ListComp, ast.List, ast.Tuple, ast.Set, ast.SetComp)
_TEXT_CALLS = frozenset({"str", "repr"})  # a tensor made text: its values read on the host
# torch functions that take some of their arguments as host data (lengths that size the packed batch)
_HOST_DATA_CALLS = frozenset({"torch.nn.utils.rnn.pack_padded_sequence"})
# tensorboard's and tensorboard_logger's, which convert a tensor to a number
_SCALAR_LOGGERS = frozenset({"add_scalar", "add_scalars", "log_value"})
_SCALAR_LOGGER_FUNCTIONS = frozenset({"tensorboard_logger.log_value"})  # `from tensorboard_logger import log_value`
_FORMAT = "format and log every N steps, or accumulate on the device and format after the loop"  # test each item of what they are given as a Python bool


def _is_cpu_target(call: ast.Call) -> bool:
    target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    return target is not None and _kinds.is_cpu_literal(target)


def _host_tensor_type(ctx, call: ast.Call) -> bool:
    """`x.type(torch.FloatTensor)`, `x.type("torch.LongTensor")`: a legacy CPU tensor type, so
    the cast copies a device tensor to the host."""
    if len(call.args) != 1 or call.keywords:
        return False
    target = call.args[0]
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        module, _, name = target.value.rpartition(".")
    else:
        module, _, name = (ctx.qualname(target) or "").rpartition(".")
    return module == "torch" and name in TYPED_TENSORS


def _non_blocking(call: ast.Call) -> bool:
    """`.to("cpu", non_blocking=True)` (or `.to("cpu", dtype, True)`): queued on the stream, the
    host goes on. Anything but a literal False counts: the rule cannot tell it is False."""
    flag = next((k.value for k in call.keywords if k.arg == "non_blocking"), None)
    if flag is None and len(call.args) >= 3:
        flag = call.args[2]
    return flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False)


def _non_blocking_keyword(call: ast.Call) -> bool:
    return any(k.arg == "non_blocking" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
               for k in call.keywords)


def _copies_to_device(call: ast.Call) -> bool:
    """`.cuda(...)`, or `.to(target, ...)` whose target is not the CPU."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    return func.attr == "cuda" or func.attr == "to" and not _is_cpu_target(call) and bool(
        call.args or any(k.arg == "device" for k in call.keywords))


_COPIES = "waits for the GPU and copies to the host"
# The remedy by what the host does with the value: decides a branch, or needs a Python number.
_BRANCH = ("keep the decision on the device (`torch.where(cond, a, b)`, or masked arithmetic: `x * mask`, "
           "`torch.clamp`, `F.relu`) or check it every N steps")
_ASSERT = "check it every N steps, or use `torch._assert_async`"
_COUNTER = ("the module computes every value it stores in this buffer on the host: keep the value in a Python "
            "attribute as well, and read that")
_NUMBER = ("the host needs it as a Python number (a `range`, an index, a size): take the number from data "
           "already on the host (lengths, shapes), or keep the shapes fixed (pad, then mask)")
_SIZE_METHODS = frozenset({"view", "reshape", "expand", "repeat", "narrow", "split", "topk", "new_zeros",
                           "new_ones", "new_empty", "new_full"})
_SIZE_FUNCTIONS = frozenset(f"torch.{name}" for name in ("zeros", "ones", "empty", "full", "arange", "rand", "randn",
                                                         "randint", "randperm", "eye"))
# Tensors made from Python data: given device tensors, they read each one on the host.
_FROM_DATA = frozenset({"torch.tensor", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.as_tensor"})
_LONGEST_VALUE = 40  # characters of a value's text a message names
# Ops whose output size depends on the values: the host waits to learn it.
_DATA_SIZED = frozenset({"nonzero", "masked_select", "unique", "argwhere"})
_BOOLEAN_FUNCTIONS = frozenset({"torch.isnan", "torch.isinf", "torch.isfinite", "torch.logical_not",
                                "torch.logical_and", "torch.logical_or", "torch.eq", "torch.ne", "torch.gt",
                                "torch.lt", "torch.ge", "torch.le"})


_MASK_DTYPES = ("torch.bool", "torch.uint8")  # a tensor of either indexes as a mask
_MASK_OPERATORS = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.Mult)  # of two boolean tensors: a boolean tensor
# Methods whose result is a boolean tensor, and methods that keep a boolean tensor boolean.
_MASK_METHODS = frozenset({"bool", "byte", "isnan", "isinf", "isfinite", "logical_not", "logical_and", "logical_or",
                           "logical_xor", "gt", "lt", "ge", "le", "eq", "ne", "greater", "less", "greater_equal",
                           "less_equal", "not_equal"})
_SHAPE_METHODS = frozenset({"unsqueeze", "squeeze", "expand", "expand_as", "view", "view_as", "reshape", "flatten",
                            "repeat", "t", "transpose", "permute", "contiguous", "detach", "clone"})


_METADATA = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "training"})
_METADATA_CALLS = frozenset({"size", "dim", "numel", "len", "isinstance", "hasattr", "callable", "is_contiguous"})


def _reads_no_values(test: ast.AST) -> bool:
    """A test made of numbers, names' metadata (`.shape`, `.size()`, `len()`, `.dim()`) and type
    checks, joined by comparisons, `and`/`or` and arithmetic: it reads no tensor's values."""
    if isinstance(test, ast.BoolOp):
        return all(_reads_no_values(v) for v in test.values)
    if isinstance(test, ast.UnaryOp):
        return _reads_no_values(test.operand)
    if isinstance(test, ast.Compare):
        return all(_reads_no_values(v) for v in [test.left, *test.comparators])
    if isinstance(test, ast.BinOp):
        return _reads_no_values(test.left) and _reads_no_values(test.right)
    if isinstance(test, (ast.Constant, ast.Tuple, ast.List)):
        return isinstance(test, ast.Constant) or all(_reads_no_values(e) for e in test.elts)
    if isinstance(test, ast.Subscript):
        return _reads_no_values(test.value)
    if isinstance(test, ast.Attribute):
        return test.attr in _METADATA
    if isinstance(test, ast.Call):
        func = test.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name in _METADATA_CALLS
    return False


def _may_be_mask(index: ast.AST) -> bool:
    """The index's form allows a boolean tensor (not a slice, a tuple of them, or a number)."""
    if isinstance(index, ast.BinOp):
        return isinstance(index.op, _MASK_OPERATORS)
    if isinstance(index, ast.Attribute):
        return index.attr == "data" and _may_be_mask(index.value)  # `x[mask.data]`
    return isinstance(index, (ast.Name, ast.Compare, ast.UnaryOp, ast.Call)) and not (
        isinstance(index, ast.UnaryOp) and not isinstance(index.op, ast.Invert))


_PLAIN_INDEXES = (ast.Slice, ast.Constant)  # `:`, `1:3`, `4`, `...`, `None`


def _mask_position(ctx, index: ast.AST) -> Optional[ast.AST]:
    """The part of a subscript's index that may be a boolean mask: the index itself (`x[m]`), or
    the one such part of a tuple whose other parts are slices, numbers, `...` or `None`
    (`x[m, :]`, `x[m, 4]`, `x[:, m, t]` with a number `t`: the mask still becomes indices, on
    the host)."""
    if _may_be_mask(index):
        return index
    if not isinstance(index, ast.Tuple):
        return None
    masks = [e for e in index.elts if not isinstance(e, _PLAIN_INDEXES)
             and not (isinstance(e, ast.Name) and _kinds.kind_of(ctx, e) == _kinds.SCALAR)]
    return masks[0] if len(masks) == 1 and _may_be_mask(masks[0]) else None


def _self_attribute(expr: ast.AST, attr: str) -> bool:
    return isinstance(expr, ast.Attribute) and expr.attr == attr and isinstance(expr.value, ast.Name) \
        and expr.value.id == "self"


def _unconditional_sync(function: ast.AST, module: Optional[ast.Module] = None, depth: int = 0) -> Optional[ast.Call]:
    """The first sync that every call of `function` runs (`_sync_of_every_run` of its body); also
    one that a function of `module` it calls so runs (`f1` calling `precision`), two calls deep."""
    functions = {s.name: s for s in module.body if isinstance(s, ast.FunctionDef)} if module is not None and depth < 2 else {}
    callees = {name: f for name, f in functions.items() if f is not function}
    return _sync_of_every_run(function.body, lambda callee: _unconditional_sync(callee, module, depth + 1), callees)


def syncing_lambdas(ctx) -> dict:
    """The names the module's top level binds once to a lambda that syncs on every call
    (`to_np = lambda x: x.detach().cpu().numpy()`), each with that sync."""
    found = ctx.shared.get("mat502_syncing_lambdas")
    if found is None:
        found = ctx.shared["mat502_syncing_lambdas"] = {}
        if "lambda" in ctx.source:
            bound = {}
            for stmt in ctx.tree.body:
                for target in (stmt.targets if isinstance(stmt, ast.Assign) else ()):
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append(stmt.value)
            for name, values in bound.items():
                if len(values) == 1 and isinstance(values[0], ast.Lambda):
                    sync = _sync_of_every_run([ast.Expr(values[0].body)])
                    if sync is not None:
                        found[name] = sync
    return found


def _steps_with_helpers(ctx) -> bool:
    """Every call of the file may call a helper that syncs: one of a project module, or a
    lambda the module binds."""
    return _steps_with_project_helpers(ctx) or bool(syncing_lambdas(ctx))


def _sync_of_every_run(body: list, sync_of=None, callees: Optional[dict] = None) -> Optional[ast.Call]:
    """The first sync that every run of the statements `body` runs (not under an `if`, a `while`
    or a `try`; in the body of a `for`, which goes over what the helper is given, before any
    branch that skips the rest of a pass: `for dr, dg in zip(real, fake):
    r_losses.append(r_loss.item())`): `.item()` / `.cpu()` / `.tolist()` /
    `.to("cpu")`, or `float()` / `int()` / `bool()` of what a `torch.` function computes
    (`float(torch.sum(tp))`, `float(correct)` after `correct = torch.sum(pred == gt)`); or the
    sync `sync_of` finds in a function of `callees` that they call."""
    callees = callees or {}
    stack = list(reversed(body))
    made = set()  # names the statements so far bound to what a torch function computes
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.If) and tested_as_tensor(stmt.test) is not None:
            stack.extend(reversed(stmt.body))  # `if torch.is_tensor(x): x = x.cpu()`: runs on every call given one
            continue
        if isinstance(stmt, ast.For) and not stmt.orelse:
            # up to a branch that skips the rest of the pass (`if not n: continue`)
            passes = []
            for inner in stmt.body:
                if isinstance(inner, ast.If) and any(isinstance(n, (ast.Continue, ast.Break, ast.Return))
                                                     for n in ast.walk(inner)):
                    break
                passes.append(inner)
            stack.extend(reversed(passes))
            continue
        if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.FunctionDef,
                             ast.AsyncFunctionDef, ast.ClassDef)) or getattr(ast, "TryStar", ast.Try) is type(stmt):
            if isinstance(stmt, ast.With):
                stack.extend(reversed(stmt.body))
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    node.func.attr in ("item", "cpu", "tolist") and not node.args
                    or node.func.attr == "to" and _is_cpu_target(node)):
                return node
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONVERSIONS \
                    and len(node.args) == 1 and not node.keywords and _torch_computed(node.args[0], made):
                return node
            callee = callees.get(node.func.id) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            if callee is not None:
                found = sync_of(callee)
                if found is not None:
                    return found
        if isinstance(stmt, ast.Assign):
            names = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
            made = made | names if _torch_computed(stmt.value, made) else made - names
    return None


def _torch_computed(expr: ast.AST, made: set) -> bool:
    """`expr` is what a `torch.` function computes (`torch.sum(x)`, `torch.sum(x).float()`,
    arithmetic with one) or a name in `made`."""
    if isinstance(expr, ast.Name):
        return expr.id in made
    if isinstance(expr, ast.BinOp):
        return _torch_computed(expr.left, made) or _torch_computed(expr.right, made)
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute):
            module, _, name = (dotted(func) or "").rpartition(".")
            if module == "torch":  # `torch.sum`; not `torch.numel` or `torch.is_tensor`, which give Python values
                return name not in _kinds.NOT_TENSOR_FUNCTIONS and not name.startswith(("is_", "are_", "get_"))
            return _torch_computed(func.value, made)
    return False


def _is_torch_predicate(ctx, expr: ast.AST) -> bool:
    """`torch.is_autocast_enabled()`, `torch.are_deterministic_algorithms_enabled()`: Python bools."""
    if not isinstance(expr, ast.Call):
        return False
    qual = ctx.qualname(expr.func) or ""
    module, _, attr = qual.rpartition(".")
    return module.split(".")[0] == "torch" and attr.startswith(("is_", "are_"))


@dataclass
class _Statement:
    """The syncs of one kind, with one remedy, in one statement: one finding, at the first."""

    statement: ast.AST
    what: str       # `.item()`
    detail: str     # after the values: `(its result's size depends on the values)`
    waits: str      # what the sync does
    where: str      # `on every step of the training loop on line 5`
    instead: str    # the remedy
    syncs: list = field(default_factory=list)  # (node, the value's text or None, its fix or None)

    def message(self) -> str:
        values = list(dict.fromkeys(text for _, text, _ in sorted(self.syncs, key=_position) if text))
        named = f" of {_names(values)}" if values else ""
        detail = f" {self.detail}" if self.detail else ""
        return f"{self.what}{named}{detail} {self.waits} {self.where}; {self.instead}"

    def fix(self) -> Optional[Fix]:
        """Every sync's fix together; none where one of them has none (it would stay a sync)."""
        fixes = [fix for _, _, fix in self.syncs]
        if any(fix is None for fix in fixes):
            return None
        return Fix(fixes[0].message, tuple(edit for fix in fixes for edit in fix.edits), all(fix.safe for fix in fixes))


def _inside(node: ast.AST, statement: ast.AST) -> bool:
    return (statement.lineno, statement.col_offset) <= (node.lineno, node.col_offset) and \
        (node.end_lineno, node.end_col_offset) <= (statement.end_lineno, statement.end_col_offset)


def _position(sync: tuple) -> tuple:
    return (sync[0].lineno, sync[0].col_offset)


def _names(values: list) -> str:
    """`a`, `a` and `b`, `a`, `b` and `c`; past four, `a`, `b`, `c` and 2 more."""
    quoted = [f"`{v}`" for v in values]
    if len(quoted) > 4:
        return f"{', '.join(quoted[:3])} and {len(quoted) - 3} more"
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


class HostSyncInLoop(_StepLoops, _HostReads, Rule):
    code = "MAT502"
    name = "host-sync-in-loop"
    quiet_in = (TESTS, REFERENCE)
    summary = "A device-to-host sync (`.item()`, `.cpu()`, `float(t)`, `if t:` ...) on every step of a training or evaluation loop."
    runtime_docs = """
    The guard reports a line from two syncs a step (torch's own among
    them), or from one a step that the user's code makes itself (`loss.item()`). A read of data
    that stays on the host waits for nothing and is not counted: on a GPU, a CPU tensor's; on the
    CPU, which stands in for a GPU, a tensor the program made on the host within the step
    (`torch.randint`, `torch.arange`, `torch.tensor(values)`) and computed on only with other such
    tensors, such as the slice bounds of `torch.stack([data[i:i + n] for i in ix])`; the CPU cannot
    see `device=` or a `.to()` to the CPU, so the model's values and tensors made before the step
    count as on the device. A rollout stays quiet: a line whose values, at least twice a step and
    for most of its reads, come back as the model's next input (a tensor made from Python data
    after the read, `torch.tensor(state)` after `env.step(action.item())`, reaches a GEMM before
    the step ends): the host needs each value to make the next input, as an environment or a
    decoder sampling on the host does. In such a step (two round trips or more), a line that
    works on what came back and syncs at most twice an iteration (a distribution checking its
    arguments, `Categorical(probs)`) stays quiet too: the loop waits for the device at every
    iteration anyway, and the fix is a batched rollout (vectorised environments), not the line.
    The guard cannot see what the host computes from a value,
    only that a tensor made from Python data followed the read: a loop that reads its outputs for
    a log and makes each input from Python data (with no backward in between) looks the same. A
    sync on a line where torch.compile broke the graph is that break's finding (MAT505, with
    dynamo's reason and hint), not a second one here.
    Besides the ops it sees (`.item()`, `bool(t)`, a copy to the host, `nonzero`, `masked_select`,
    `unique`), on CUDA the guard turns on torch's own sync detector and counts the syncs made
    inside ops (boolean-mask indexing, a shape read off the data) at their lines, under the same
    rules.
    """
    docs = """
    ## What it does
    Flags, inside a training or evaluation loop, the calls that copy a tensor's value to the
    host: `.item()` (and `loss.data[0]`, its PyTorch 0.3 spelling, where the host takes it as a
    number: added to a running total, appended or formatted), `.cpu()` / `.to("cpu")`, a
    cast of a device tensor (or a comparison or
    arithmetic of one) to a legacy CPU tensor type (`(mask < p).type(torch.FloatTensor)`: cast on
    the device, `.to(torch.float32)`), `.tolist()`, `float(t)`, `int(t)`, `bool(t)`, a Python
    `math` function of a tensor (`math.log10(peak / mse)`: `torch.log10` stays on the device),
    Python's `max` / `min` / `sorted` / `any` / `all` of a tensor (`max(txt_len)` tests its
    elements one by one on the host: `txt_len.amax()` stays on the device),
    `if t:` / `while t:` on a tensor (also the `if` of a comprehension over a device tensor's
    elements: `[i for i, d in enumerate(done) if d == 0]`, and `any()` / `all()` of tensors,
    `any(not torch.isfinite(p.grad).all() for p in params)`, one per item), `print(t)` of a tensor,
    a tensor made text (`f"{loss:.3f}"`, `"loss %.3f" % loss`, `"{}".format(loss)`, `str(loss)`),
    tensorboard's `writer.add_scalar("loss", loss, step)` / `add_scalars(tag, {"a": loss})` and
    tensorboard_logger's `log_value("loss", loss, step)` of a tensor (they convert the value to a
    Python number), `torch.tensor(values)` of a list of device tensors (a list display, or a list the step
    fills with `.append`), and the syncs that do not look like copies: boolean-mask indexing
    (`x[y > 0]`, `x[~mask]`, `x[(u > 0) * (l == u)]`, `x[m.unsqueeze(2).expand_as(x)]`, `x[t.gt(0)]`,
    `x[t.type(torch.bool)]`, a mask made by a CUDA byte or bool tensor type, `ByteTensor(flags)` after `ByteTensor =
    torch.cuda.ByteTensor if use_cuda else torch.ByteTensor`, with slices or numbers beside the
    mask: `x[pos, :]`, `x[pos, 4]`),
    a device tensor as a slice bound (`x[:, :self.r]` of a buffer `r`, `x[:, :lens.max()]`: Python
    reads it as an int),
    also in place (`l[mask] -= 1`, which reads `l[mask]`) and storing a device tensor through a
    mask (`v[mask] = net(s)`: the mask becomes indices), `nonzero`, `masked_select` and
    `unique` (their output's size depends on the values), `assert` on a tensor,
    `torch.cuda.synchronize()` (quiet where the step made non-blocking copies that may land on
    the host, `.to("cpu", non_blocking=True)` or `buf.copy_(x, non_blocking=True)`, which it must
    wait for; non-blocking copies to the device are ordered on the stream and excuse nothing),
    and `torch.cuda.empty_cache()` (it frees the cached blocks with `cudaFree`, which waits for
    the device, and the next step allocates them again).
    A training loop is a loop
    whose body calls `.backward()` or an optimizer's `.step()`, or a function (of the file or the
    project, or a method of an instance of one of their classes: `agent.update(batch)`) that is one
    training step: it calls both outside its loops over anything but `range(...)`, once per agent or
    a fixed number of times, itself or through a function or an object it calls (`self._model_opt(loss)`
    after `self._model_opt = tools.Optimizer(...)`, whose `__call__` does both); a sampling loop runs a model (a module, or a parameter its callers
    pass one for) on the state it carries and updates that state from the output, outside a
    module's `forward` (Langevin dynamics, a diffusion sampler: `grad = score_net(x)`, then `x = x
    + step * grad + noise`), and that does not stop on a value it reads back (a decoder's `if
    token.item() in stop_tokens: break` waits for the device on every token by design); an
    evaluation loop iterates
    over a data loader (also through a wrapper that takes it, `metric_logger.log_every(loader,
    10)`, or a name bound to one, `it = tqdm(test_loader)`, then `for b in enumerate(it)`; a
    `data_loader: Iterable` parameter is a loader), over an iterator made by a call given a
    device (torchtext's `BucketIterator(data, device=device)`, `prepare(dir, device, opt)` with
    `device = torch.device(...)`; followed into the parameter a function of the file receives it
    as), or, in a file that trains (or calls a training step that a module of the project
    defines: `LossCompute(crit, opt)` whose `__call__` steps), moves what it iterates over to a device itself (`for batch
    in val_iter: text = batch.text.cuda()`) or binds on each iteration the batch that a function
    of the project samples (`torch.randint`, `np.random.choice`...) and returns moved to the
    device (nanoGPT's `for k in range(eval_iters): X, Y = get_batch(split)`); an evaluation loop
    is also one that calls a model on the data each iteration goes over or draws (`x, y =
    get_batch(data, i)`, then `model(x)`), where the function puts that model in evaluation mode
    (`model.eval()`) or the loop runs with gradients off (`with torch.no_grad():`,
    `@torch.no_grad()`) and calls a module; not a loop over layers (`for layer in layers: x =
    layer(x)`, one forward), nor one in a module's `forward`, nor a decoder that stops on a value
    it reads back. A per-batch sync in an evaluation pass is a sync per step. A function that runs every step counts like a loop's body: a training
    step called once per step (it calls `.backward()` and an optimizer's `.step()` outside any
    loop of its own: an agent's `learn()`), an optimizer step (it calls an optimizer's `.step()`
    outside any loop of its own: `optimize()` after the backward pass), the `forward` of a loss
    module (an `nn.Module` whose class name, or a base's, has the word `loss` or `criterion`:
    `FocalLoss`, `MultiBoxLoss`), which computes the step's loss, or of a metric module (a class
    name that ends in the word `metric` or `accuracy`: `AccuracyMetric`), which scores it, a
    module's method named for the loss
    (`loss_function`, `compute_loss`), a `training_step`/`validation_step` hook, and the
    helpers such a step or loop calls on every pass (not under an `if`, or called on both of its
    paths: `if sample: update(...) else: update(...)`), in this file or in a project file that
    imports it, or two files away through a function that calls it on every call of its own
    (`net.accuracy(mu, y)` in `update_metrics` of utils.py, which evaluate.py's loop over
    batches calls) (`utils.clip_gradients(model, clip)` in main.py's training loop;
    a method of an instance bound once, `agent.choose_action(obs)` after `agent = Agent(...)`; a
    loop that trains through one update call each pass, `agent.learn()`, not one that runs a
    training loop of its own, `self._update_network()` over epochs of minibatches),
    and a function handed to one that calls it from its training loop (`trainer.train(get_loss)`
    with `trainer = train.Trainer(...)`, whose loop runs `loss = get_loss(model, batch)`): a sync inside a metric
    or logging helper is a sync per step. Such a helper's parameters take the kinds its callers
    pass, in its file or, where the file never calls it, in the project files that import it
    (`logger.log_data(step, actor_loss, ...)` in main.py, `actor_loss` a tensor a function of
    another project module returns); one run every step only by an importer whose work stays on
    the CPU stays quiet. A branch that trains (`if (i + 1) % n_critic == 0:`
    around `g_loss.backward(); g_opt.step()`, `if self.tune_alpha:` around the alpha update) is
    the step itself, not a gate: its syncs run on every step it takes. In such a function, so do
    the syncs of an `if` whose `else` syncs too, the test reading no tensor (`if relative: return
    d.mean().item()` / `else: return d.sum().item()`: every call waits, whichever way it goes), and
    the branches of a test of the program's configuration (`if FIXED_ALPHA is None:` / `else:`,
    names only the module's top level binds; `if args.clip_grad:`, attributes of a parameter the
    function never assigns; `if scaler is None:`, also when its body gives the parameter a default,
    `if mask is None: mask = ...`; `if self.munchausen:`, attributes only the
    class's set-up assigns; compared with `==`, `!=` or `is`; not a logging or schedule switch
    such as `if VERBOSE:` or `if args.log_interval:`), an `if` in a loop of the function that
    picks items by what they are (`for name, p in model.named_parameters(): if p.grad is not
    None:`), the body of a guard against an empty selection (`if pos.sum() >
    0:` around work on `x[pos]`: the usual path; its `else` handles the empty case), and the
    body of a test of whether a parameter is a tensor (`if torch.is_tensor(output): output =
    output.cpu().numpy()`: it runs on every call that passes one, the only calls that sync). A
    helper from another module of the project (`from utils import accuracy`, or `from utils
    import *` where the file does not bind the name itself; read, never run), called from a file
    that trains or moves work to CUDA (an evaluation script too), whose body syncs on every call
    (`.item()`, `.cpu()`, `.tolist()`, `.to("cpu")`, or `float()` / `int()` / `bool()` of what a
    `torch.` function computes: `float(torch.sum(tp))`, `float(correct)` after `correct =
    torch.sum(pred == gt)`; also through a function of that module it calls, `f1` calling
    `precision`) is reported where the step calls it on values that may be on the device (not
    host tensors, not only numbers); so is a lambda the module binds once whose body syncs
    (`to_np = lambda x: x.detach().cpu().numpy()`, then `metrics["kl"] = to_np(kl)`). In a module's `forward` (and the helpers it calls), an `assert` on a
    tensor (`assert not torch.isnan(h).any()`) is reported, whatever device the file names:
    it checks values on the host on every forward, and is no part of the computation. So is
    one in a step loop on the values of a name that holds a device tensor where it is read
    (`mask = mask.to(device)`, then `assert mask.min() >= 0`). In a file that never moves work to a CUDA device
    (`.cuda()`, a device string or `torch.device`, `.to(device)`), and that no project file
    importing it moves work to one either, a step function's tensors stay on the CPU and it
    stays quiet (a loss-compute class in loss.py whose `__call__` trains, imported by a script
    that moves the model to CUDA, is reported); so does a program (a `__main__` block or a loop at
    module level) that never does, nor does any project module it imports or that imports it, whatever its loops, and a training step in a file that names
    no device whose importers in the project (the scripts that run it) name none either.
    `.numpy()` is reported through the `.cpu()` that must precede it (on a
    GPU tensor `.numpy()` alone raises instead of syncing).

    A statement gets one finding per kind of sync and remedy, at its first sync, naming every
    value it syncs (`` `.item()` of `loss`, `acc` and `lr` ``); a `# noqa: MAT502` on that
    line or on the statement's first line silences it. The remedy follows what the host does
    with the value: a branch that decides on it (`if t.item() > 0:`, `a if t.item() else b`,
    `while t:`, or a name bound to it that a later test reads) can keep the decision on the
    device (`torch.where`, masked arithmetic: `x * mask`, `torch.clamp`, `F.relu`) or check it
    every N steps; a Python number for `range()`, an index or a size can come from data already
    on the host (lengths, shapes) or give way to fixed shapes (pad, then mask); a value logged,
    printed or collected stays on the device, converted once after the loop, or logged every N
    steps.

    ## Why is this bad?
    Each of these waits until the GPU has finished all queued work, then copies the value.
    Once per step, that drains the launch queue: the CPU can no longer run ahead of the GPU,
    and every step pays the full kernel-launch latency again.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
        total += loss.item()
    ```

    ## Use instead
    ```python
    total = torch.zeros((), device="cuda")
    for x, y in loader:
        ...
        total += loss.detach()
    print(total.item())          # one sync, after the loop
    ```

    ## Stays quiet on
    - Values on the CPU by construction (`torch.tensor(...)` without a device, after `.cpu()`,
      batches straight from a `DataLoader` before they are moved), numpy arrays, Python numbers.
      For a name bound to host tensors in one place and device tensors in another (a notebook,
      one program, reuses `X` across its cells), the copy `X.cpu()` / `X.to("cpu")` / `X.item()`
      is judged by the assignments that reach it: `for X, y in loader: X = X.to("cpu")` copies
      nothing, whatever other cells store in `X`; so is a conversion of what is read from such a
      name (`anchors = anchors.to("cpu")`, then `math.log(w / anchors[n][0])`).
    - Evaluation loops whose function never names a device (no `.to(`, `cuda`, `device`...) and
      calls only imported functions, builtins and tensor or container methods: the batches stay
      on the host (a call of a model, `model(x)` or `self.net(x)`, may move them itself).
    - `.to("cpu", non_blocking=True)`: the copy is queued on the stream and the host goes on
      (any `non_blocking` but a literal `False` counts), as long as the host does not read the
      result in the same iteration. Where it does (`.tolist()`, `.numpy()`, `.item()`,
      `float()`, `print()`, `np.asarray()` of the copy, or of the name bound to it, with no
      `synchronize()` in between), the finding says so: that is a data race, the host can read
      values the copy has not written yet.
    - A copy whose own line carries, or whose statement (or run of copies) is headed by, a
      comment saying why it is deliberate: the host needs the values now (`# wait for the
      indices: the host slices with them`, `# needed on the host`, `# it works faster on the
      CPU`), or keeping them on the GPU
      would exhaust its memory (`# kept in CPU tensors, else GPU memory runs out`, `OOM`,
      `to save GPU memory`). A comment that says what the line does (`# move predictions to
      cpu`), a reason `.detach()` meets as well (`# so the graph is not kept alive (memory
      leak)`), or a comment on another line of a multi-line statement does not count, nor does
      any comment on `torch.cuda.synchronize()`, which copies no value (`# wait for the GPU to
      finish work`, to time the step: CUDA events do that without the wait).
    - A value the host needs in the same iteration: one a `for` goes over where it is made (`for
      r, v in zip(rewards, values.cpu().numpy())`); one that goes through host code (numpy
      arithmetic, items stored into arrays) into the arguments of a training step the loop calls
      (a rollout's last values, then advantages in numpy, then `self._update(obs, advantages)`);
      bound to a name that a later test compares to
      stop the loop in its normal course (`if abs(cur - prev) < tol: break`, PPO's `if approx_kl
      > 1.5 * target_kl: break`), or that Python code then iterates or indexes (`toks =
      out.cpu().tolist()`, then `for i ...: f(toks[i])`; also through numpy functions and
      conditional expressions: `correct = np.squeeze(t.cpu().numpy())`, then `correct[i]`; in a
      helper of the step, a later loop of the helper: `lens = lens.cpu().numpy()`, then `for idx
      in range(lens[i])`); a sync
      in such a test itself (`if loss.item() < tol: break`, `while loss.item() > tol:`); and an
      input of host code (a call of neither torch nor a Python builtin) whose result the loop
      moves back to the device, in this iteration or the next: an environment step,
      `next_state, reward, done, _ = envs.step(action.cpu().numpy())` (or `action =
      dist.sample().item()`, then `env.step(action)`), with `state = next_state` and
      `torch.FloatTensor(state).to(device)` (or `torch.as_tensor(state, device=device)`): the
      device's next work waits for the host's result anyway. So is what a function returns (`return
      mu.cpu().numpy()`, `return action, probs, value` of `.item()`s) where the loop that calls it
      hands the result to an environment's step (`action = agent.choose_action(obs)`, then `obs,
      reward, done, info = env.step(action)`). Host code whose result is only
      logged, printed, collected or summed (`total += scorer.score(out.cpu().numpy())`), and
      builtins (`n = int(t.item())`, then `torch.arange(n, device=device)`), are still reported.
      So is a guard that only trips on failure, as it can be checked every N steps: `if
      torch.isnan(loss): break`, or the value past a large literal bound (`if loss_val > 1e4:
      break`, |bound| >= 100).
    - Syncs in a model's `forward` other than an `assert` (`.item()`, `.tolist()`, `nonzero`,
      boolean masks, `if t.any():`), unless a program that trains on the GPU runs that model (the
      file itself, or a program that imports it, through any chain of project imports from a
      program in the file's folder or up to four above it: a file with an `if __name__ ==
      "__main__":` block or a loop at module level that moves work to CUDA and calls `.backward(`,
      itself or in a project module it imports). Such a forward's syncs under `if self.training:`
      run on every training step. A
      library's models serve callers it does not know, branch on their data and size their
      outputs by it on purpose (expert routing, variable lengths), and the rule cannot tell a
      needed sync from a wasted one there; where the project's own training program runs the
      model, its forward's syncs are that program's per-step costs. A loss module's `forward`
      is reported everywhere: it runs once per training step, and its syncs (box matching
      through masks, counts read on the host) can stay on the device.
    - Syncs of a loop that routes work to modules by the data: the loop calls a module it picks
      out of a container by a name it binds, and the sync makes the loop's items or reads them
      (`for e in torch.unique(idx): ... experts[int(e.item())](x[idx == e])`). Expert routing
      sizes each expert's work by the data on purpose. A loop over per-agent critics whose sync
      reads a mask fixed in the loop (`target_q[not_done] = self.critics[agent](s)`) is reported.
    - What a method that runs the model returns (`return action.detach().cpu()` in a policy's
      `get_action`): its caller asked for the value on the host. Data handed to a torch function
      that takes it on the host (`pack_padded_sequence(x, lengths.cpu())`).
      So is `int(self.queue_ptr)` (or `.item()`) of a buffer that the module registers in its
      set-up and only ever fills with Python numbers it computes (`self.queue_ptr[0] = (ptr + n) %
      K`, or `self.initialized.fill_(1)` under `if self.initialized.item() == 0:`, in the same
      method): a counter or flag the host had already, read back from the device.
    - `x[mask] = 0.0` (also `x[mask, :] = 0.0`): a Python number (or a CPU scalar) stored through a boolean mask on `x`'s
      device runs as `masked_fill_`, with no sync.
    - A loop over an iterator made for a device whose body holds a training loop (an RL
      collector's batches, each trained on for several epochs): one iteration is many steps.
      A loop that hands the function that makes its batch what the loop itself stores (`obs_t
      = to_tensor(self.obs)`, then `self.obs = env.step(a)`) steps an environment: it is no pass
      over sampled batches.
    - Syncs in a loop nested in a loop that is a step only because it calls one (`agent.update()`):
      that loop collects the step's data (a rollout of environment steps), and the host needs
      what it copies per item; the fix is a batched rollout, not the line.
    - Syncs outside loops, in loops that are not training/evaluation steps (an epoch loop, which
      runs a whole pass over a loader in each iteration whatever else it steps, a loop over
      parameters outside any step loop; a pass under an `if`, such as validation every N steps
      inside a training loop, does not run in each iteration and makes no epoch loop), and
      syncs gated to run every N steps (`if step % log_every == 0:`, `if verbose:`, an `==` on a
      value that changes as the loop runs: `if step == 0:`; `if ema is None:` around `ema = ...`,
      the first step; `if j <= 4:` on the count of the loop's passes that `range` or `enumerate`
      gives, the first few) or once (in a branch that ends in `return`, `break`, `raise` or
      `sys.exit()`, in the
      `return` itself, in an `except`; in a loop whose body ends in `return` after it: a
      throughput benchmark that times one batch). The `else` of a gate runs on the other steps: a sync
      there is reported. `if rank == 0:` is not a gate: it holds on every step of one process
      (an `==` on names the loop does not assign, constants, or attributes and calls that name
      the process: `args.local_rank`, `dist.get_rank()`). Nor is `if net.n_classes == 1:`: an
      attribute of a name other than `self` that the loop neither binds nor stores to, not named
      as the run's progress (`trainer.global_step`, `state.epoch`, `.count`): a setting.
    - Loops over a list of loaders or of their names (`for loader in val_loaders:`): one step
      per dataset, not per batch. A loader is a `DataLoader` or a name ending in `loader`. So
      are loops over keys or names (`for key in dataset_keys:`, `for name, fn in losses.items():`,
      a loop variable or iterable whose last `_`-word is `key(s)` or `name(s)`: not `fname`;
      named pairs, `for name, discr_loss in discr_losses:`, unless they come from a loader),
      even with a `.backward()` inside: one per task, and the loop around it is the training
      step. A loop that steps an optimizer is a training step whatever it goes over (a round
      robin over `loaders.items()`).
    - One-off passes over a data set that do not train: in a method `process(self)`
      (torch_geometric's `Dataset.process()`; not a `process(rank, ...)` worker), or in a function
      whose name or file name has the word `preprocess`, `precompute`, `calibrate`, `calibration`
      or `calib`. A loop that calls `.backward()` or an optimizer's `.step()` is never one-off.
    - Torch's predicates (`torch.is_autocast_enabled()`, `torch.are_deterministic_algorithms_enabled()`):
      Python bools. Values whose kind it cannot tell, for `float()`, `int()`, `bool()`, `if`,
      `print()` and `.tolist()` (those need a value known to be a tensor).

    ## Fix safety
    A running total gets the running-total remedy (keep it on the device, `.item()` once after
    the loop), other values `torch.stack(values).tolist()` after the loop. Where host code in
    the loop reads the running total, or a name computed from it, on every step (a progress
    bar's `set_postfix(loss=avg)` or `set_postfix({"loss": avg})`, a `print`, a comparison; not
    under a gate), also in a step loop around it (the optimizer's loop around a loop over
    micro-batches), keeping it on the device would not help: the message says to show or log it
    every N steps, with no fix, as the fix would leave the sync in place. A statement's finding
    has a fix only where each of its syncs has one.
    `total += loss.item()` (also scaled: `total += loss.item() * len(batch)`) has an unsafe fix
    to `total += loss.detach()` (a receiver that is not atomic is parenthesized:
    `(a + b).detach()`), offered only where the accumulator is a Python
    number (every binding of the name in its scope is a number or adds one) whose every later
    use works the same on a 0-d tensor: arithmetic, formatting as a number (`f"{total:.3f}"`,
    `"%.3f" % total`, `"{:.2f}".format(total)`), `float()`, `int()`, `round()`, returning it; the
    same for the names it flows into (`avg = total / n`, `epoch_total += total`). Any other use (a
    call such as `np.mean([total])` or `log(total)`, a comparison, `%s`, a closure) may need a
    Python number: no fix. The accumulator becomes a tensor, which changes its precision (float32)
    and what type later code sees; a receiver of more than one element (shape `(1,)`) would not
    format as a number. Onto a tensor accumulator there is no fix (`acc = torch.zeros(1)` is on
    the CPU: `acc += loss.detach()` would raise, the operands being on two devices), nor where the
    call's text holds a comment; the message says to accumulate in a device tensor instead.
    """

    only = {"visit_Call": Only(attrs=frozenset(_SYNC_METHODS | _CONVERSIONS | _DATA_SIZED | _ELEMENT_BUILTINS
                                               | {"print", "synchronize", "empty_cache", "type"} | _TEXT_CALLS | _SCALAR_LOGGERS
                                               | {qual.rpartition(".")[2] for qual in _FROM_DATA} | _MATH_FUNCTIONS),
                               every_call_if=_steps_with_helpers),
            "visit_While": Only(in_loops=True), "visit_IfExp": Only(in_loops=True)}

    def __init__(self, ctx, options: Optional[dict] = None):
        super().__init__(ctx, options)
        self._statements: dict = {}  # (statement, what, remedy) -> _Statement
        self._backward_names: dict = {}  # function -> the names it calls `.backward()` on

    def visit_Call(self, node: ast.Call) -> None:
        if not self.ctx.loops and self.ctx.function is None:
            return
        func = node.func
        if isinstance(func, ast.Attribute) and (func.attr in _SYNC_METHODS or func.attr == "type"
                                                and _host_tensor_type(self.ctx, node)):
            self._method(node, func)
        elif isinstance(func, ast.Attribute) and func.attr == "synchronize":
            if (self.ctx.qualname(func) == "torch.cuda.synchronize" and self._step_context() is not None
                    and not self._waits_for_own_copies()):
                self._report(node, "`torch.cuda.synchronize()`",
                             "drop it, or time the step with CUDA events (`torch.cuda.Event(enable_timing=True)`) "
                             "read every N steps", waits="waits for all queued GPU work")
        elif isinstance(func, ast.Attribute) and func.attr == "empty_cache":
            if self.ctx.qualname(func) == "torch.cuda.empty_cache" and self._step_context() is not None:
                self._report(node, "`torch.cuda.empty_cache()`",
                             "drop it: the caching allocator reuses the step's memory, and emptying it makes "
                             "the next step allocate with `cudaMalloc` again",
                             waits="frees the cached blocks with `cudaFree`, which waits for all queued GPU work")
        elif self._data_sized_call(node):
            self._report(node, f"`{self._callee_text(node)}()`",
                         "keep shapes fixed: `torch.where(mask, x, 0)` or `x * mask`, and reduce with the mask",
                         value=self._data_sized_operand(node), detail="(its result's size depends on the values)")
        elif self.ctx.qualname(func) in _FROM_DATA and node.args and self._device_items(node.args[0]):
            if self._step_context() is not None:
                self._report(node, f"`{self.ctx.segment(func)}()`",
                             "`torch.stack` the tensors (or `torch.cat`) on the device instead",
                             value=node.args[0], detail="(a list of device tensors: it reads each one on the host)")
        elif (isinstance(func, ast.Name) and func.id in _ELEMENT_BUILTINS and self.ctx.qualname(func) is None
              and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], _DISPLAYS)):
            # `max(txt_len)` of a device tensor: Python compares its elements one by one
            if self._step_context() is not None and self._is_device_tensor(node.args[0]) \
                    and not self._contains_sync_call(node.args[0]):
                reduction = {"max": "amax()", "min": "amin()", "sorted": "sort()", "any": "any()", "all": "all()"}[func.id]
                self._report(node, f"`{func.id}()`", self._remedy(node, f"use `{self.ctx.segment(node.args[0])}."
                                                                        f"{reduction}` on the device (one sync at most "
                                                                        "where a Python value is needed)"),
                             value=node.args[0], detail="(it walks the tensor and tests each element on the host)")
        elif (isinstance(func, ast.Name) and func.id in _TRUTH_BUILTINS and self.ctx.qualname(func) is None
              and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp))):
            item = node.args[0].elt
            item = item.operand if isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.Not) else item
            if self._step_context() is not None and self._is_device_tensor(item) and not self._contains_sync_call(item):
                self._report(item, "`bool()`", self._remedy(node, _BRANCH), value=item,
                             detail=f"(a tensor per item, which `{func.id}()` tests as a Python `bool`)")
        elif (isinstance(func, ast.Name) and self.ctx.qualname(func) is None and node.args
              and (func.id in _CONVERSIONS or func.id == "print")):
            if func.id in ("int", "float") and len(node.args) == 1 and self._host_counter(node.args[0]):
                if self._step_context(in_forward=True) is not None:
                    self._report(node, f"`{func.id}()`", _COUNTER, value=node.args[0])
                return
            if self._step_context() is None:
                return
            if func.id in _CONVERSIONS and len(node.args) == 1 and not node.keywords:
                if self._is_device_tensor(node.args[0]):
                    self._report(node, f"`{func.id}()`", self._remedy(node, "convert after the loop, or keep the "
                                                                            "value on the device"), value=node.args[0])
            elif func.id in _TEXT_CALLS and len(node.args) == 1 and self._is_device_tensor(node.args[0]):
                self._report(node, f"`{func.id}()`", _FORMAT, value=node.args[0], detail="(a tensor made text)")
            elif func.id == "print":
                for arg in node.args:
                    values = [v.value for v in arg.values if isinstance(v, ast.FormattedValue)] \
                        if isinstance(arg, ast.JoinedStr) else [arg]
                    for value in values:
                        if self._is_device_tensor(value):
                            self._report(node, "`print()`", "print every N steps, or accumulate and print after "
                                                            "the loop", value=value)
        elif self.ctx.qualname(func) in _MATH_QUALIFIED and node.args:
            # `math.log10(peak ** 2 / mse)`, `math.pow(p.grad.norm(), 2)`: a Python number of a tensor
            if self._step_context() is None:
                return
            value = next((arg for arg in node.args if self._is_device_tensor(arg) and not self._contains_sync_call(arg)),
                         None)
            if value is not None:
                self._report(node, f"`{self.ctx.qualname(func)}()`", self._remedy(node, "use the torch function on "
                                                                                       "the device (`torch.log10`, "
                                                                                       "`torch.sqrt`, ...)"),
                             value=value, detail="(it converts the tensor to a Python number)")
        elif (isinstance(func, ast.Attribute) and func.attr in _SCALAR_LOGGERS
              or isinstance(func, ast.Name) and self.ctx.qualname(func) in _SCALAR_LOGGER_FUNCTIONS) and len(node.args) >= 2:
            if self._step_context() is None:
                return  # `writer.add_scalar("loss", loss, step)`: tensorboard reads the value on the host
            logged = node.args[1]
            spelled = f".{func.attr}()" if isinstance(func, ast.Attribute) else f"{func.id}()"
            values = logged.values if spelled == ".add_scalars()" and isinstance(logged, ast.Dict) else [logged]
            for value in values:
                legacy = isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute) \
                    and value.value.attr == "data"  # `log_value(tag, loss.data[0], step)`: the `.data[0]`'s finding
                if self._is_device_tensor(value) and not self._contains_sync_call(value) and not legacy:
                    self._report(node, f"`{spelled}`", "log every N steps, or accumulate on the device and "
                                                       "log the value after the loop", value=value,
                                 detail="(it converts the tensor to a Python number)")
                    break
        elif isinstance(func, ast.Attribute) and func.attr == "format" and isinstance(func.value, ast.Constant) \
                and self._step_context() is not None:
            for value in node.args:
                if self._is_device_tensor(value):
                    self._report(node, "`str.format()`", _FORMAT, value=value, detail="(a tensor made text)")
                    break
        elif isinstance(func, ast.Name) and func.id in syncing_lambdas(self.ctx):
            self._helper_call(node, syncing_lambdas(self.ctx)[func.id], None)
        elif _steps_with_project_helpers(self.ctx):
            self._project_helper(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """`f"loss {loss:.3f}"` of a device tensor: formatting reads its value on the host."""
        self._made_text(node, "an f-string", [part.value for part in node.values
                                              if isinstance(part, ast.FormattedValue)])

    def visit_BinOp(self, node: ast.BinOp) -> None:
        """`"loss %.3f" % loss`: %-formatting a device tensor reads its value on the host."""
        if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
            self._made_text(node, "`%` formatting",
                            node.right.elts if isinstance(node.right, ast.Tuple) else [node.right])

    def _made_text(self, node: ast.AST, what: str, values: list) -> None:
        """Reports `node`, which formats `values`, at the first device tensor among them that no
        call of its own syncs already; a format that `print()` is given is reported as the print."""
        parent = self.ctx.parent
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "print" \
                or self._step_context() is None:
            return
        for value in values:
            if self._is_device_tensor(value) and not self._contains_sync_call(value):
                self._report(node, what, _FORMAT, value=value, detail="(a tensor made text)")
                return

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """`x[mask]` with a boolean tensor mask: the host must learn how many elements are kept.
        Also `x[mask] += 1`, which reads `x[mask]`, and `x[mask] = y` of a device tensor `y`
        (`index_put_` turns the mask into indices); not `x[mask] = 0.0`, which PyTorch runs as
        `masked_fill_` (a Python number or a CPU scalar, with a mask on `x`'s device)."""
        if self._legacy_item(node):
            return
        self._tensor_bounds(node)
        mask = _mask_position(self.ctx, node.slice)
        if mask is None or isinstance(node.ctx, ast.Del) or self._step_context() is None:
            return
        if isinstance(node.ctx, ast.Store) and not self._stores_through_mask(node):
            return
        if not self._is_mask(mask):
            return
        # what a tensor mask indexes is a tensor on the mask's device (another device raises)
        if _kinds.kind_of(self.ctx, node.value) in _NOT_SYNCED:
            return
        self._report(node, "boolean-mask indexing",
                     "keep shapes fixed: `torch.where(mask, x, 0)` or `x * mask`, and reduce with the mask "
                     "(`(x * mask).sum() / mask.sum()`)", value=node.value,
                     detail="(its result's size depends on the values)")

    def _tensor_bounds(self, node: ast.Subscript) -> None:
        """`x[:, :, :self.r]` with a device tensor as a slice bound: Python asks it for an int
        (`__index__`), which reads it on the host. The bound is a tensor by its spelling: an
        attribute of the module that holds one (a buffer), or a reduction of a device tensor
        (`lens.max()`); a name or an item may hold a Python number."""
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        bounds = [b for part in parts if isinstance(part, ast.Slice) for b in (part.lower, part.upper, part.step)
                  if isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name) and b.value.id == "self"
                  or reduces_every_element(b)]
        for bound in bounds:
            if self._is_device_tensor(bound) and self._step_context() is not None:
                self._report(bound, f"`{self.ctx.segment(bound)}` as a slice bound",
                             "keep the bound a Python int (the host knows it: a count, a setting), or slice "
                             "on the device with a mask", detail="(Python reads the tensor as an int)")
                return

    def _stores_through_mask(self, target: ast.Subscript) -> bool:
        """`x[m] op= v` (reads `x[m]` first), or `x[m] = v` of a device tensor `v`."""
        statement = self.ctx.parents[-1] if self.ctx.parents else None
        if isinstance(statement, ast.AugAssign):
            return statement.target is target
        if isinstance(statement, ast.Assign) and any(t is target for t in statement.targets):
            return self._is_device_tensor(statement.value)
        return False

    def visit_Assert(self, node: ast.Assert) -> None:
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) else node.test
        if _reads_no_values(test):
            return  # `assert x.shape[-1] == dim`, `assert isinstance(x, Tensor)`: nothing waits
        if self._step_context(in_forward=True) is None or not self._on_device(test) \
                or self._contains_sync_call(test):
            return
        self._report(test, "`assert` on a tensor", _ASSERT, owner=node)

    def leave_Module(self, node: ast.Module) -> None:
        for found in self._statements.values():
            first = min(found.syncs, key=_position)[0]
            self.report(first, found.message(), fix=found.fix(), noqa_row=found.statement.lineno)

    def _syncs_on_both_paths(self, branch: ast.If) -> bool:
        """Both the body and the `else` of `branch` run a sync (`_unconditional_sync`) whatever
        else they do, and its test reads no tensor: every call waits, whichever way it goes."""
        if not branch.orelse or self._on_device(branch.test):
            return False
        return all(_sync_of_every_run(arm) is not None for arm in (branch.body, branch.orelse))

    def _project_helper(self, call: ast.Call) -> None:
        """`accuracy(out, y)` in a step, where `accuracy` comes from a module of the project
        (`from utils import accuracy`) whose body syncs on every call (`return correct.item()`):
        the sync is per step, and the call is where the step can avoid it."""
        if not call.args:
            return
        imported = imported_function(self.ctx, call.func)
        if imported is None or self._step_context() is None:
            return
        definition, path = imported
        sync = _unconditional_sync(definition, parsed(path))
        if sync is not None:
            self._helper_call(call, sync, path)

    def _helper_call(self, call: ast.Call, sync: ast.Call, path: Optional[str]) -> None:
        """Report `call` of a helper that runs `sync` on every call (of this file where `path` is
        None), where the step calls it on what may be device tensors."""
        if self._step_context() is None:
            return
        # what each name holds where it is passed (`scale = at.scalar(scale)` of a loader's host batch)
        kinds = [_kinds.reaching_kind(self.ctx, a) if isinstance(a, ast.Name) else _kinds.kind_of(self.ctx, a)
                 for a in call.args]
        if not kinds or _kinds.CPU_TENSOR in kinds or all(k in _kinds.NON_TENSORS for k in kinds) and not (
                set(_kinds.MODULE_KINDS).intersection(kinds) and moves_work_to_cuda(self.ctx)):
            # host tensors, or no tensor at all (a name, a count): nothing to wait for; a model
            # the file moves to the GPU holds its parameters and gradients there (`clip_gradient(model, 10.)`)
            return
        where = "this file" if path is None else os.path.relpath(path, os.path.dirname(os.path.abspath(self.ctx.filename)))
        if isinstance(sync.func, ast.Name):  # `float(correct)`
            spelled = ast.unparse(sync)
        else:
            spelled = "." + sync.func.attr + "(" + ", ".join(
                [ast.unparse(a) for a in sync.args] + [ast.unparse(k) for k in sync.keywords]) + ")"
        self._report(call, f"`{self.ctx.segment(call.func)}()`, whose `{spelled}` on line {sync.lineno} of "
                           f"{where} runs on every call,",
                     "have it return the tensor and convert once after the loop, or call it every N steps")

    def _host_counter(self, expr: ast.AST) -> bool:
        """`self.queue_ptr` read with `int()` in a method of a module that registers it as a buffer
        in its set-up (`register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))`) and whose
        only other use is that same method storing Python numbers into it (`ptr = (ptr + n) % K`,
        then `self.queue_ptr[0] = ptr`): a counter the host computes, read back from the device."""
        function, cls = self.ctx.function, self.ctx.class_
        if function is None or cls is None or len(self.ctx.functions) != 1 or not (
                isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"):
            return False
        key = ("mat502_host_counter", id(function), expr.attr)
        found = self.ctx.shared.get(key)
        if found is None:
            found = self.ctx.shared[key] = self._stores_host_numbers(cls, function, expr.attr)
        return found

    def _stores_host_numbers(self, cls: ast.ClassDef, function: ast.AST, attr: str) -> bool:
        values = _kinds.class_attribute_values(self.ctx, cls, attr)
        if len(values) != 1 or not runs_once(getattr(values[0][0], "name", "")) or not (
                isinstance(values[0][1], ast.Call) and (self.ctx.qualname(values[0][1].func) or "").startswith("torch.")):
            return False  # not a buffer made once by the set-up
        uses = reads = 0
        stored = []
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(method):
                if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
                        and node.value.id == "self":
                    uses += 1
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float") \
                        and len(node.args) == 1 and _self_attribute(node.args[0], attr):
                    reads += 1
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item" \
                        and not node.args and _self_attribute(node.func.value, attr):
                    reads += 1
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript) \
                        and _self_attribute(node.targets[0].value, attr):
                    if method is not function:
                        return False
                    stored.append(node.value)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fill_" \
                        and len(node.args) == 1 and _self_attribute(node.func.value, attr):
                    if method is not function:
                        return False
                    stored.append(node.args[0])  # `self.initialized.fill_(1)`
        return bool(stored) and uses == reads + len(stored) and all(self._host_number(v, set()) for v in stored)

    def _host_number(self, expr: ast.AST, seen: set) -> bool:
        """A Python number the host computes: a literal, `int(...)`, `len(...)`, `x.shape[i]`,
        `x.size(i)`, a plain attribute of the module, arithmetic of these, or a name that the
        function binds only to them."""
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
        if isinstance(expr, ast.BinOp):
            return self._host_number(expr.left, seen) and self._host_number(expr.right, seen)
        if isinstance(expr, ast.Call):
            func = expr.func
            return isinstance(func, ast.Name) and func.id in ("int", "len") and self.ctx.qualname(func) is None \
                or isinstance(func, ast.Attribute) and func.attr == "size" and bool(expr.args)
        if isinstance(expr, ast.Subscript):
            return isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape"
        if isinstance(expr, ast.Attribute):  # `self.K`, set from numbers: not a tensor
            if not (isinstance(expr.value, ast.Name) and expr.value.id == "self") or self.ctx.class_ is None:
                return False
            values = _kinds.class_attribute_values(self.ctx, self.ctx.class_, expr.attr)
            return bool(values) and all(not isinstance(v, ast.Call) for _, v in values)
        if isinstance(expr, ast.Name) and expr.id not in seen:
            entries = _kinds.bindings(self.ctx, expr.id)
            seen.add(expr.id)
            return bool(entries) and all(e[0] == "value" and self._host_number(e[1], seen) for e in entries)
        return isinstance(expr, ast.Name)  # a name met again in its own binding: `ptr = (ptr + n) % K`

    def _device_items(self, data: ast.AST) -> bool:
        """A list of device tensors: a list display of them (`[a, b]`), or a name bound only to
        list displays in its function, every item of which, and every `.append(x)` to which, is a
        device tensor (`target = []`, then `target.append(r[j] + gamma * q[j])` in a loop)."""
        if isinstance(data, (ast.List, ast.Tuple)):  # a name by what reaches it (`n = sum(...)`, then `n = ...` a tensor)
            return bool(data.elts) and all(_kinds.reaching_kind(self.ctx, e, known=True) == _kinds.TENSOR if isinstance(e, ast.Name)
                                           else self._is_device_tensor(e) for e in data.elts)
        if not isinstance(data, ast.Name) or self.ctx.function is None:
            return False
        statement = self.ctx.statement()  # `target = T.tensor(target)` binds the name again after the read
        entries = [e for e in _kinds.bindings(self.ctx, data.id) or []
                   if not (statement is not None and e[0] == "value" and _inside(e[1], statement))]
        if not entries or not all(e[0] == "value" and isinstance(e[1], ast.List) for e in entries):
            return False
        items = [e for entry in entries for e in entry[1].elts]
        for node in ast.walk(self.ctx.function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == data.id:
                if node.func.attr != "append" or len(node.args) != 1:
                    return False  # `extend`, `insert`...: items not looked at
                items.append(node.args[0])
        return bool(items) and all(self._is_device_tensor(item) for item in items)

    def _waits_for_own_copies(self) -> bool:
        """The step makes non-blocking copies that may land on the host (`.to("cpu",
        non_blocking=True)`, `buf.copy_(x, non_blocking=True)`): a synchronize is what makes reading
        them safe. Copies to the device (`.cuda(non_blocking=True)`, `.to(device, non_blocking=True)`)
        are ordered on the stream before the kernels that read them: nothing to wait for."""
        loop = step_loop(self.ctx)
        owner = loop.node if loop is not None else self.ctx.function
        if "non_blocking" not in self.ctx.segment(owner):
            return False
        return any(isinstance(call, ast.Call) and _non_blocking_keyword(call) and not _copies_to_device(call)
                   for call in ast.walk(owner))

    def _data_sized_call(self, node: ast.Call) -> bool:
        """`x.nonzero()`, `torch.nonzero(x)`, `x.masked_select(m)`, `torch.unique(x)` on a device tensor."""
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr not in _DATA_SIZED:
            return False
        operand = self._data_sized_operand(node)
        if operand is None or self._step_context() is None or not self._is_device_tensor(operand):
            return False
        return not any(k.arg == "size" for k in node.keywords)  # `nonzero_static`/`unique(size=)` know their size

    def _data_sized_operand(self, node: ast.Call) -> Optional[ast.AST]:
        """`x` of `x.nonzero()` or `torch.nonzero(x)`."""
        qual = self.ctx.qualname(node.func)
        if qual is None:
            return node.func.value
        return node.args[0] if qual == f"torch.{node.func.attr}" and node.args else None

    def _callee_text(self, node: ast.Call) -> str:
        return self.ctx.segment(node.func) if self.ctx.qualname(node.func) else "." + node.func.attr

    def _is_mask(self, index: ast.AST, reading: frozenset = frozenset()) -> bool:
        """A boolean device tensor: a comparison of tensors, `~t`, `t.bool()`, `torch.isnan(t)`...,
        the `.data` of one, or a name bound only to one (`reading`: the names whose bindings are being read, for `m = m & k`)."""
        if isinstance(index, ast.Name):
            if index.id in reading:
                return True  # `m = m & k`: as much a mask as its other bindings and operands say
            entries = _kinds.bindings(self.ctx, index.id)
            values = [e[1] for e in entries or () if e[0] == "value"]
            return bool(values) and len(values) == len(entries) and all(
                _may_be_mask(v) and self._is_mask(v, reading | {index.id}) for v in values)
        if isinstance(index, ast.Attribute):  # `mask.data`: the mask's own values
            return self._is_mask(index.value, reading)
        if isinstance(index, ast.Compare):
            return len(index.ops) == 1 and not isinstance(index.ops[0], (ast.In, ast.NotIn, ast.Is, ast.IsNot)) \
                and self._is_device_tensor(index)
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.Invert):
            return self._is_device_tensor(index.operand)
        if isinstance(index, ast.BinOp):  # `(u > 0) * (l == u)`, `a & b`
            return _may_be_mask(index) and all(_may_be_mask(side) and self._is_mask(side, reading)
                                               for side in (index.left, index.right))
        if isinstance(index, ast.Call):
            qual = self.ctx.qualname(index.func) or ""
            if qual in _BOOLEAN_FUNCTIONS or cuda_tensor_type(self.ctx, index.func) in _MASK_DTYPES:
                return True  # `torch.isnan(t)`, `ByteTensor(flags)` after `ByteTensor = torch.cuda.ByteTensor`
            if not isinstance(index.func, ast.Attribute) or qual:
                return False
            receiver = index.func.value
            if index.func.attr in _SHAPE_METHODS:  # `pos.unsqueeze(2).expand_as(conf)`
                return _may_be_mask(receiver) and self._is_mask(receiver, reading)
            cast = index.func.attr in ("type", "to") and len(index.args) == 1 and not index.keywords \
                and self.ctx.qualname(index.args[0]) in _MASK_DTYPES  # `t.type(torch.bool)`
            return (index.func.attr in _MASK_METHODS or cast) and self._is_device_tensor(receiver)
        return False

    def visit_If(self, node: ast.If) -> None:
        self._condition(node)

    def visit_While(self, node: ast.While) -> None:
        if self.ctx.loops:
            self._condition(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._condition(node)

    def visit_ListComp(self, node: ast.AST) -> None:
        """`[i for i, done in enumerate(dones) if done == 0]` over a device tensor: each test reads
        one element on the host."""
        for generator in node.generators:
            for test in generator.ifs:
                self._condition(test, test)

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    # -- checks ---------------------------------------------------------------------
    def _method(self, node: ast.Call, func: ast.Attribute) -> None:
        receiver = func.value
        if func.attr == "item" and not node.args and self._host_counter(receiver):
            if self._step_context(in_forward=True) is not None:  # `if self.initialized.item() == 0:`
                self._report(node, "`.item()`", _COUNTER, value=receiver)
            return
        # in an `assert` (`assert x.max().item() < n`), a check that is no part of the computation:
        # a module's `forward` counts too, as for the assert itself
        in_assert = isinstance(self.ctx.statement(), ast.Assert)
        if self._step_context(in_forward=in_assert) is None or self._chain_already_synced(receiver):
            return
        kind = _kinds.kind_of(self.ctx, receiver)
        if kind == _kinds.TENSOR and isinstance(receiver, ast.Name):
            kind = _kinds.reaching_kind(self.ctx, receiver)  # a name bound to host and device tensors
        if kind in _NOT_SYNCED:
            return
        method = func.attr
        if method == "to" and not _is_cpu_target(node):
            return
        if method == "to" and _non_blocking(node):
            read = self._read_before_copied(node)
            if read is not None:  # the copy does not block: not a sync, a race
                self.report(node, f"`.to({self._arguments(node)})` may return before the copy is done, yet the host "
                                  f"reads the result on line {read} in the same iteration: a data race, it can see "
                                  f"values not copied yet; copy with a blocking `.cpu()` where the host needs the "
                                  f"values now, or collect results on the device and copy once after the loop")
            return
        if method == "tolist" and kind not in _kinds.TENSORS or method == "type" and not self._on_device(receiver):
            return
        remedy = self._remedy(node, None)
        if remedy is not None:
            self._report(node, self._method_text(node, method), remedy, value=receiver)
        elif method == "item":
            self._report_item(node, receiver, "`.item()`")
        elif method == "type":
            target = node.args[0]
            name = target.value if isinstance(target, ast.Constant) else self.ctx.qualname(target)
            self._report(node, self._method_text(node, method),
                         f"`{self.ctx.segment(target)}` is a CPU tensor type; cast on the device with "
                         f"`.to({TYPED_TENSORS[name.rpartition('.')[2]]})`", value=receiver)
        elif method in ("cpu", "to"):
            self._report(node, self._method_text(node, method),
                         "collect results on the device (`torch.cat`/`torch.stack` after the loop) and copy once",
                         value=receiver)
        else:
            self._report(node, "`.tolist()`", "collect results on the device and convert once after the loop",
                         value=receiver)

    def _report_item(self, node: ast.AST, receiver: ast.AST, what: str, detail: str = "") -> None:
        """A read of one value (`.item()`, or the legacy `.data[0]`) of `receiver`, remedied by
        what the host does with it: a running total, or values kept for later."""
        accumulation = self._accumulation(node)
        read = self._read_on_every_step(accumulation.target) if accumulation is not None else None
        onto_number = accumulation is not None and read is None and self._python_number(accumulation.target)
        fix = (lambda: self._detach_fix(node, receiver, accumulation.target.id)) \
            if onto_number and isinstance(node, ast.Call) else None
        if read is not None:
            instead = (f"the host reads the running value on every step (line {read}), so keeping it on the "
                       f"device would not help: show or log it every N steps")
        elif onto_number:
            instead = "keep the running value on the device (`total += loss.detach()`) and call `.item()` once after the loop"
        elif accumulation is not None:
            instead = ("accumulate on the device (`total = torch.zeros((), device=loss.device)`, then "
                       "`total += loss.detach()`) and call `.item()` once after the loop")
        else:
            instead = ("keep the values on the device and convert them once after the loop "
                       "(`torch.stack(values).tolist()`), or log every N steps")
        self._report(node, what, instead, value=receiver, fix=fix, detail=detail)

    def _legacy_item(self, node: ast.Subscript) -> bool:
        """`loss.data[0]`, PyTorch 0.3's spelling of `loss.item()` (indexing a one-element tensor
        gave a Python number then), where the host takes it as a number: added to a running total,
        appended to a list or formatted. On PyTorch 0.4 and later it raises on a 0-d loss."""
        value = node.value
        if not (isinstance(node.ctx, ast.Load) and isinstance(value, ast.Attribute) and value.attr == "data"
                and _kinds.int_const(node.slice) == 0
                and (self._taken_as_number(node) or self._one_value(value.value))):
            return False
        parent = self.ctx.parent
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in _CONVERSIONS \
                and parent.args == [node]:
            return True  # `float(loss.data[0])`: the conversion's finding
        if self._step_context() is None or self._chain_already_synced(value.value) \
                or not self._is_device_tensor(value.value):
            return True
        self._report_item(node, value.value, "`.data[0]`",
                          detail="(PyTorch 0.3's `.item()`, which raises on a 0-d tensor since 0.4)")
        return True

    def _one_value(self, receiver: ast.AST) -> bool:
        """`receiver` holds one value: a reduction of all its elements (`R.mean()`, `(a - b).sum()`),
        a name bound only to such a reduction, a name the function calls `.backward()` on with no
        gradient (which only a one-element tensor takes: `loss = 0`, `loss += criterion(out, y)`,
        `loss.backward()`), or a tensor whose shape is known to be `()` (a loss).
        Its `.data[0]` is PyTorch 0.3's `.item()` wherever the host takes it (`log_value(tag,
        loss.data[0], step)`): on PyTorch 0.4 and later it raises."""
        if isinstance(receiver, ast.Name):
            entries = _kinds.bindings(self.ctx, receiver.id) or ()
            values = [entry[1] for entry in entries if entry[0] == "value"]
            if values and len(values) == len(entries) and all(reduces_every_element(v) for v in values):
                return True
            if receiver.id in self._backward_receivers():
                return True
        elif reduces_every_element(receiver):
            return True
        shape = shape_of(self.ctx, receiver)
        return shape is not None and shape.rank == 0

    def _backward_receivers(self) -> frozenset:
        """The names the function being read calls `.backward()` on with no argument."""
        function = self.ctx.function
        found = self._backward_names.get(function)
        if found is None:
            found = self._backward_names[function] = frozenset() if function is None else frozenset(
                node.func.value.id for node in walk_no_scopes(function)
                if is_backward(node) and not node.args and not node.keywords
                and isinstance(node.func.value, ast.Name))
        return found

    def _taken_as_number(self, node: ast.AST) -> bool:
        """`node` is added to a running total (`total += x`), appended (`losses.append(x)`), handed
        to a running meter (`meter.update(x, n)`), formatted
        (`"%.3f" % x`, `"{}".format(x)`, an f-string), also divided or scaled by a number first
        (`meter.update(loss.data[0] / n, n)`); `print(x)` is the print's finding."""
        parents = self.ctx.parents
        depth = len(parents) - 1
        parent = parents[depth] if depth >= 0 else None
        while isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Div, ast.Mult)) and depth > 0 \
                and _kinds.kind_of(self.ctx, parent.right if parent.left is node else parent.left) in _kinds.NON_TENSORS:
            node, depth = parent, depth - 1
            parent = parents[depth]
        if isinstance(parent, ast.AugAssign):
            return parent.value is node and isinstance(parent.op, ast.Add)
        if isinstance(parent, ast.Call):
            func = parent.func
            return node in parent.args and isinstance(func, ast.Attribute) and func.attr in ("append", "format", "update")
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod):
            return isinstance(parent.left, ast.Constant) and isinstance(parent.left.value, str)
        if isinstance(parent, ast.Tuple):
            up = parents[depth - 1] if depth > 0 else None
            return isinstance(up, ast.BinOp) and isinstance(up.op, ast.Mod) and up.right is parent \
                and isinstance(up.left, ast.Constant) and isinstance(up.left.value, str)
        return isinstance(parent, ast.FormattedValue)

    def _on_device(self, expr: ast.AST) -> bool:
        """`expr` is a device tensor, or an elementwise op of one (`mask < p`, `-x`, `x * 2`),
        by the kinds of the values its names hold where it reads them."""
        while isinstance(expr, ast.UnaryOp):
            expr = expr.operand
        if isinstance(expr, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn))
                                                 for op in expr.ops):
            return False  # `x is not None`: identity or membership, a Python bool that reads no values
        if isinstance(expr, (ast.Compare, ast.BinOp, ast.BoolOp)):
            operands = expr.values if isinstance(expr, ast.BoolOp) else [expr.left] + (
                expr.comparators if isinstance(expr, ast.Compare) else [expr.right])
            return any(self._on_device(operand) for operand in operands)
        if isinstance(expr, ast.Name):
            return _kinds.reaching_kind(self.ctx, expr) == _kinds.TENSOR
        kind = _kinds.kind_of(self.ctx, expr)
        if kind in (None, _kinds.TENSOR) and isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and isinstance(expr.func.value, ast.Name) and self.ctx.qualname(expr.func) is None \
                and expr.func.attr not in _MOVES:
            # `mask.min()`: a method of a name that holds a device tensor where it is read
            return self._on_device(expr.func.value)
        return kind == _kinds.TENSOR

    def _method_text(self, node: ast.Call, method: str) -> str:
        return f"`.{method}({self._arguments(node)})`"

    def _remedy(self, sync: ast.AST, default: Optional[str]) -> Optional[str]:
        """What to do instead, by what the host does with the synced value: a branch decides on it
        (`if t.item() > 0:`, `a if t.item() else b`, or a name bound to it that a later test
        reads), or it is a Python number for `range()`, an index or a size; else `default`."""
        child = sync
        for parent in reversed(self.ctx.parents):
            if isinstance(parent, ast.Assert) and child is parent.test:
                return _ASSERT
            if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and child is parent.test or \
                    isinstance(parent, ast.comprehension) and any(child is test for test in parent.ifs):
                return _BRANCH
            if isinstance(parent, ast.Subscript) and child is parent.slice:
                return _NUMBER
            if isinstance(parent, ast.Call) and any(child is arg for arg in parent.args) and self._takes_number(parent):
                return _NUMBER
            if isinstance(parent, (ast.stmt, ast.Lambda)):
                break
            child = parent
        return _BRANCH if self._tested_later(sync) else default

    def _takes_number(self, call: ast.Call) -> bool:
        """`range(n)`, `x.view(-1, n)`, `torch.zeros(n)`: its arguments are counts or sizes."""
        func = call.func
        if isinstance(func, ast.Name) and func.id == "range":
            return self.ctx.qualname(func) is None
        if self.ctx.qualname(func) in _SIZE_FUNCTIONS:
            return True
        return isinstance(func, ast.Attribute) and func.attr in _SIZE_METHODS and self.ctx.qualname(func) is None

    def _tested_later(self, sync: ast.AST) -> bool:
        """The value is bound to a name that the test of a later `if`, `while` or `... if ... else`
        in the step loop reads (`loss_val = loss.item()`, then `if loss_val < best:`)."""
        bound, loop = self._bound_name(sync), step_loop(self.ctx)
        if bound is None or loop is None:
            return False
        name, statement = bound
        return any(isinstance(other, (ast.If, ast.While, ast.IfExp)) and other.lineno > statement.end_lineno
                   and name in loaded_names(other.test) for other in loop.direct_nodes())

    def _condition(self, owner: ast.AST, test: Optional[ast.AST] = None) -> None:
        test = owner.test if test is None else test
        values = test.values if isinstance(test, ast.BoolOp) else [test]
        tensors = []  # the tests' device tensors, read before the (costlier) question of the step
        for value in values:
            inner = value.operand if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not) else value
            if not _is_torch_predicate(self.ctx, inner) and self._is_device_tensor(inner) \
                    and not self._contains_sync_call(inner):
                tensors.append(inner)
        if not tensors or self._step_context() is None:
            return
        # `if torch.isnan(h).any(): raise ...` is an `assert` written out
        check = isinstance(owner, ast.If) and not owner.orelse and all(isinstance(stmt, ast.Raise) for stmt in owner.body)
        for inner in tensors:
            self._report(inner, "`bool()`", _ASSERT if check else _BRANCH, value=inner,
                         detail="(a tensor used as a Python `bool`)", owner=owner)

    def _report(self, node: ast.AST, what: str, instead: str, value: Optional[ast.AST] = None, detail: str = "",
                fix: Optional[Callable[[], Optional[Fix]]] = None, owner: Optional[ast.AST] = None,
                waits: str = _COPIES) -> None:
        """Adds the sync `node` to the finding of its statement for `what` and `instead` (reported
        at the end of the file). `value`: the tensor it syncs, named in the message. `fix`: makes
        the fix, once the finding stands. `owner`: the `if`/`while`/`assert` whose test `node`
        is. `waits`: what the sync does."""
        if cpu_only_script(self.ctx) or cpu_only_project(self.ctx):
            return  # the program never leaves the CPU: there is no device to wait for
        if self._given_to_host_api(node) or self._routes(node):
            return
        loop = step_loop(self.ctx)
        if loop is None:
            where = self._in_step_function(node, owner)
            fix = None
            if where is None or owner is None and self._gone_over_in_function(node):
                return
        else:
            if self._gated(node, loop, owner) or not any(l.node is loop.node for l in repeating_loops(self.ctx)):
                return  # gated, or the loop's body leaves it after this (`...; return`): once
            training = loop_trains(self.ctx, loop)
            if (owner is None and self._used_now(node, loop)) or self._explained(node) or (not training and self._host_only(loop)):
                return
            role = "training" if training else "evaluation" if iterates_loader(self.ctx, loop) else "sampling" \
                if samples_with_model(self.ctx, loop) else "evaluation"
            where = f"on every step of the {role} loop on line {loop.node.lineno}"
        statement = owner if isinstance(owner, ast.stmt) else self.ctx.statement()
        key = (id(statement), what, instead)
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = _Statement(statement, what, detail, waits, where, instead)
        found.syncs.append((node, self._value_text(value) if value is not None else None,
                            fix() if fix is not None else None))

    def _given_to_host_api(self, node: ast.AST) -> bool:
        """The copy is an argument of a torch function that takes that data on the host
        (`pack_padded_sequence(x, lengths.cpu())`, `lengths=lengths.tolist()`): it needs it there."""
        current = node
        for parent in reversed(self.ctx.parents):
            if isinstance(parent, ast.keyword):
                current = parent
                continue
            if isinstance(parent, ast.Call) and current is not parent.func:
                return self.ctx.qualname(parent.func) in _HOST_DATA_CALLS and (
                    any(a is current for a in parent.args) or any(k is current for k in parent.keywords))
            if not self._carries_value(parent, current):
                return False
            current = parent
        return False

    def _routes(self, node: ast.AST) -> bool:
        """The sync is part of a loop that routes to modules: the loop around it, or the loop that
        goes over the name its value is bound to (`experts = torch.unique(idx)`, then `for e in
        experts:`), calls a module it picks out of a container by a name the loop binds
        (`expert_id = int(e.item())`, then `self.experts[expert_id](x)`). Expert routing sizes
        and picks its work by the data on purpose."""
        function = self.ctx.function
        if function is None:
            return False
        # a loop around the sync routes by it where the sync makes the loop's items (`for e in
        # torch.unique(idx)`) or reads them (`x[idx == e]` in `for e in range(n_experts)`), not
        # where it reads a mask fixed in the loop (`q[done_mask] = ...` for each agent)
        read = node.slice if isinstance(node, ast.Subscript) else node  # a mask, or what is read
        loops = [p for p in self.ctx.parents if isinstance(p, (ast.For, ast.AsyncFor)) and _inside(p, function)
                 and (_inside(node, p.iter) or LoopInfo(p, self.ctx).depends_on_iteration(read))]
        statement = self.ctx.statement()
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
            loops += [n for n in walk_no_scopes(function) if isinstance(n, (ast.For, ast.AsyncFor))
                      and isinstance(n.iter, ast.Name) and n.iter.id == name and n.lineno > statement.lineno]
        for loop in loops:
            bound = set().union(bound_names(loop.target), *(bound_names(t) for n in walk_no_scopes(loop)
                                                            if isinstance(n, ast.Assign) for t in n.targets))
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and isinstance(n.func.slice, ast.Name)
                   and n.func.slice.id in bound for n in walk_no_scopes(loop)):
                return True
        return False

    def _value_text(self, value: ast.AST) -> str:
        text = " ".join(self.ctx.segment(value).split())
        return text if len(text) <= _LONGEST_VALUE else text[:_LONGEST_VALUE - 3].rstrip() + "..."
