"""MAT502 host-sync-in-loop: a device-to-host synchronization on every step of a training or
evaluation loop."""
from __future__ import annotations

import ast
import builtins
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from matlint.diagnostics import Fix
from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import function_text, nearby_comments
from matlint.semantic.project import imported_function, imported_paths
from matlint.semantic.steps import STEP_HOOKS, step_of
from matlint.semantic.loops import (LoopInfo, bound_names, identifier as _identifier, is_optimizer_step, is_training_loop, iterates_loader,
                     loaded_names, name_tokens, walk_no_scopes)
from matlint.semantic.names import in_reference_code, in_test_code

_GATE_NAME = re.compile(r"log|print|verbose|debug|interval|every|freq|display|report|eval|save|val",
                        re.IGNORECASE)
# Words of the attributes an `==` can read and still hold on every step: which process this is.
_PROCESS_WORDS = {"rank", "main", "master", "world", "process", "gpu", "device"}
# A comment on the copy that says why it is deliberate, not what it does (`# move to cpu`): the
# values kept on the GPU would exhaust its memory, or the host needs them now.
_MEMORY_REASON = re.compile(
    r"\b(?:oom|out[ -]of[ -]memory|vram)\b|\b(?:gpu|cuda|device|accelerator)(?:'s)?\s+mem"
    r"|\bmem\w*\s+(?:\w+\s+){0,3}?(?:exhaust|runs?\s+out|ran\s+out|explod|blows?\s+up|overflow|pressure|limit)"
    r"|\b(?:sav|free|reduc|spar)\w*\s+(?:\w+\s+){0,2}?mem", re.IGNORECASE)
_HOST_REASON = re.compile(
    r"\bwait(?:s|ing)?\s+(?:for|until)\b|\bready\s+to\s+(?:use|be\s+used)\b"
    r"|\bneed(?:s|ed)?\s+(?:\w+\s+){0,4}?(?:on|by|in)\s+(?:the\s+)?(?:host|cpu|python|numpy)\b"
    r"|\b(?:host|cpu|python|numpy)\s+needs\b", re.IGNORECASE)
# Memory the sync saves by dropping the autograd graph: `.detach()` saves it as well.
_GRAPH_MEMORY = re.compile(r"\bleak|\bgraph\b|autograd", re.IGNORECASE)
_NEGATED = re.compile(r"(?:n't|\bnot|\bno|\bnever|\bwithout|\bavoid\w*)\s+(?:\w+\s+){0,2}?(?:wait|need)",
                      re.IGNORECASE)
_SYNC_TEXT = (".cpu(", ".to(", ".item(", ".tolist(", ".numpy(")
# Functions that run once over a data set (torch_geometric's `Dataset.process()`, calibration):
# whole names, or `_`-separated words of the function's or the file's name.
_ONE_OFF_NAMES = {"process", "_process"}
_ONE_OFF_WORDS = {"preprocess", "precompute", "calibrate", "calibration", "calib"}
# What makes a function move data to an accelerator (or hand it to code that does).
_DEVICE_WORDS = re.compile(r"cuda|device|gpu|\.to\(|accelerat|fabric|parallel|\b(?:xla|mps|npu|xpu|tpu)\b", re.IGNORECASE)
_HOST_BUILTINS = {"len", "max", "min", "sum", "abs", "int", "float", "bool", "round", "list", "tuple", "zip",
                  "range", "enumerate", "isinstance", "print", "sorted", "dict", "set", "str", "any", "all"}
_HOST_METHODS = _kinds.TENSOR_ONLY_METHODS | {
    "max", "min", "sum", "mean", "std", "var", "abs", "item", "tolist", "numpy", "long", "int", "bool",
    "double", "reshape", "squeeze", "nonzero", "square", "sqrt", "append", "extend", "update", "keys",
    "values", "items", "get", "pop", "format"}
_NOT_SYNCED = (_kinds.CPU_TENSOR,) + _kinds.NON_TENSORS
_SYNC_METHODS = {"item", "cpu", "tolist", "to"}
_CONVERSIONS = {"float", "int", "bool"}
_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
_LEAVES_LOOP = (ast.Break, ast.Return)
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_NESTED_LOOPS = (ast.For, ast.AsyncFor, ast.While) + _COMPREHENSIONS
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # `try: ... except* E:` from Python 3.11


def _is_cpu_target(call: ast.Call) -> bool:
    target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    return target is not None and _kinds.is_cpu_literal(target)


def _non_blocking(call: ast.Call) -> bool:
    """`.to("cpu", non_blocking=True)` (or `.to("cpu", dtype, True)`): queued on the stream, the
    host goes on. Anything but a literal False counts: the rule cannot tell it is False."""
    flag = next((k.value for k in call.keywords if k.arg == "non_blocking"), None)
    if flag is None and len(call.args) >= 3:
        flag = call.args[2]
    return flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False)


_COPIES = "waits for the GPU and copies to the host"
# The remedy by what the host does with the value: decides a branch, or needs a Python number.
_BRANCH = ("keep the decision on the device (`torch.where(cond, a, b)`, or masked arithmetic: `x * mask`, "
           "`torch.clamp`, `F.relu`) or check it every N steps")
_ASSERT = "check it every N steps, or use `torch._assert_async`"
_NUMBER = ("the host needs it as a Python number (a `range`, an index, a size): take the number from data "
           "already on the host (lengths, shapes), or keep the shapes fixed (pad, then mask)")
_SIZE_METHODS = frozenset({"view", "reshape", "expand", "repeat", "narrow", "split", "topk", "new_zeros",
                           "new_ones", "new_empty", "new_full"})
_SIZE_FUNCTIONS = frozenset(f"torch.{name}" for name in ("zeros", "ones", "empty", "full", "arange", "rand", "randn",
                                                         "randint", "randperm", "eye"))
_LONGEST_VALUE = 40  # characters of a value's text a message names
# Ops whose output size depends on the values: the host waits to learn it.
_DATA_SIZED = frozenset({"nonzero", "masked_select", "unique", "argwhere"})
_BOOLEAN_FUNCTIONS = frozenset({"torch.isnan", "torch.isinf", "torch.isfinite", "torch.logical_not",
                                "torch.logical_and", "torch.logical_or", "torch.eq", "torch.ne", "torch.gt",
                                "torch.lt", "torch.ge", "torch.le"})


def _may_be_mask(index: ast.AST) -> bool:
    """The index's form allows a boolean tensor (not a slice, a tuple of them, or a number)."""
    return isinstance(index, (ast.Name, ast.Compare, ast.UnaryOp, ast.Call)) and not (
        isinstance(index, ast.UnaryOp) and not isinstance(index.op, ast.Invert))


def _trains_with_project_helpers(ctx) -> bool:
    """The file has a training step and imports modules of the project: calls of their functions
    are routed too (a step may call a helper that syncs)."""
    found = ctx.shared.get("mat502_project_helpers")
    if found is None:
        found = ctx.shared["mat502_project_helpers"] = bool(
            _kinds.may_mention(ctx, "backward") and imported_paths(ctx.source, ctx.filename))
    return found


def _unconditional_sync(function: ast.AST) -> Optional[ast.Call]:
    """The first `.item()` / `.cpu()` / `.tolist()` that every call of `function` runs (not under
    an `if`, a loop or a `try`)."""
    stack = list(reversed(function.body))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.FunctionDef,
                             ast.AsyncFunctionDef, ast.ClassDef)) or getattr(ast, "TryStar", ast.Try) is type(stmt):
            if isinstance(stmt, ast.With):
                stack.extend(reversed(stmt.body))
            continue
        for node in ast.walk(stmt):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("item", "cpu", "tolist") and not node.args):
                return node
    return None


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


def _position(sync: tuple) -> tuple:
    return (sync[0].lineno, sync[0].col_offset)


def _names(values: list) -> str:
    """`a`, `a` and `b`, `a`, `b` and `c`; past four, `a`, `b`, `c` and 2 more."""
    quoted = [f"`{v}`" for v in values]
    if len(quoted) > 4:
        return f"{', '.join(quoted[:3])} and {len(quoted) - 3} more"
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


class HostSyncInLoop(Rule):
    code = "MAT502"
    name = "host-sync-in-loop"
    summary = "A device-to-host sync (`.item()`, `.cpu()`, `float(t)`, `if t:` ...) on every step of a training or evaluation loop."
    docs = """
    ## What it does
    Flags, inside a training or evaluation loop, the calls that copy a tensor's value to the
    host: `.item()`, `.cpu()` / `.to("cpu")`, `.tolist()`, `float(t)`, `int(t)`, `bool(t)`,
    `if t:` / `while t:` on a tensor, `print(t)` of a tensor, and the syncs that do not look
    like copies: boolean-mask indexing (`x[y > 0]`, `x[~mask]`), `nonzero`, `masked_select` and
    `unique` (their output's size depends on the values), `assert` on a tensor, and
    `torch.cuda.synchronize()` (quiet where the step made non-blocking copies that it must wait
    for). A training loop is a loop
    whose body calls `.backward()` or an optimizer's `.step()`; an evaluation loop iterates
    over a data loader (also through a wrapper that takes it, `metric_logger.log_every(loader,
    10)`), or, in a file that trains, moves what it iterates over to a device itself (`for batch
    in val_iter: text = batch.text.cuda()`). A function that runs every step counts like a loop's body: a training
    step called once per step (it calls `.backward()` and an optimizer's `.step()` outside any
    loop of its own: an agent's `learn()`), a `training_step`/`validation_step` hook, and the
    helpers such a step or loop calls on every pass (not under an `if`): a sync inside a metric
    or logging helper is a sync per step. A helper from another module of the project (`from
    utils import accuracy`, read, never run) whose body syncs on every call is reported where
    the step calls it on values that may be on the device (not host tensors, not only numbers). In a file that never moves work to a CUDA device
    (`.cuda()`, a device string or `torch.device`, `.to(device)`), a step function's tensors
    stay on the CPU and it stays quiet; so does a program (a `__main__` block or a loop at
    module level) that never does, whatever its loops. `.numpy()` is reported through the `.cpu()` that must precede it (on a
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
    - Tests (`test_*.py`, `*_test.py`, `conftest.py`, files under `tests/`, `test/` or `testing/`,
      `test*` functions, `Test*` classes, fixtures) and reference implementations (a function
      or class named with the word `ref` or `reference`: `attention_ref`, `_ReferenceAdam`),
      which spell each step out on purpose to check a fused path against.
    - Values on the CPU by construction (`torch.tensor(...)` without a device, after `.cpu()`,
      batches straight from a `DataLoader` before they are moved), numpy arrays, Python numbers.
      For a name bound to host tensors in one place and device tensors in another (a notebook,
      one program, reuses `X` across its cells), the copy `X.cpu()` / `X.to("cpu")` / `X.item()`
      is judged by the assignments that reach it: `for X, y in loader: X = X.to("cpu")` copies
      nothing, whatever other cells store in `X`.
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
      indices: the host slices with them`, `# needed on the host`), or keeping them on the GPU
      would exhaust its memory (`# kept in CPU tensors, else GPU memory runs out`, `OOM`,
      `to save GPU memory`). A comment that says what the line does (`# move predictions to
      cpu`), a reason `.detach()` meets as well (`# so the graph is not kept alive (memory
      leak)`), or a comment on another line of a multi-line statement does not count.
    - A value the host needs in the same iteration: bound to a name that a later test compares to
      stop the loop in its normal course (`if abs(cur - prev) < tol: break`, PPO's `if approx_kl
      > 1.5 * target_kl: break`), or that Python code then iterates or indexes (`toks =
      out.cpu().tolist()`, then `for i ...: f(toks[i])`; also through numpy functions and
      conditional expressions: `correct = np.squeeze(t.cpu().numpy())`, then `correct[i]`); a sync
      in such a test itself (`if loss.item() < tol: break`, `while loss.item() > tol:`); and an
      input of host code (a call of neither torch nor a Python builtin) whose result the loop
      moves back to the device, in this iteration or the next: an environment step,
      `next_state, reward, done, _ = envs.step(action.cpu().numpy())` (or `action =
      dist.sample().item()`, then `env.step(action)`), with `state = next_state` and
      `torch.FloatTensor(state).to(device)` (or `torch.as_tensor(state, device=device)`): the
      device's next work waits for the host's result anyway. Host code whose result is only
      logged, printed, collected or summed (`total += scorer.score(out.cpu().numpy())`), and
      builtins (`n = int(t.item())`, then `torch.arange(n, device=device)`), are still reported.
      So is a guard that only trips on failure, as it can be checked every N steps: `if
      torch.isnan(loss): break`, or the value past a large literal bound (`if loss_val > 1e4:
      break`, |bound| >= 100).
    - Syncs outside loops, in loops that are not training/evaluation steps (an epoch loop, which
      runs a whole pass over a loader in each iteration whatever else it steps, a loop over
      parameters outside any step loop; a pass under an `if`, such as validation every N steps
      inside a training loop, does not run in each iteration and makes no epoch loop), and
      syncs gated to run every N steps (`if step % log_every == 0:`, `if verbose:`, an `==` on a
      value that changes as the loop runs: `if step == 0:`) or once (in a branch that ends in `return`, `break` or `raise`, in the
      `return` itself, in an `except`). The `else` of a gate runs on the other steps: a sync
      there is reported. `if rank == 0:` is not a gate: it holds on every step of one process
      (an `==` on names the loop does not assign, constants, or attributes and calls that name
      the process: `args.local_rank`, `dist.get_rank()`).
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

    only = {"visit_Call": Only(attrs=frozenset(_SYNC_METHODS | _CONVERSIONS | _DATA_SIZED | {"print", "synchronize"}),
                               every_call_if=_trains_with_project_helpers),
            "visit_While": Only(in_loops=True), "visit_IfExp": Only(in_loops=True)}

    def __init__(self, ctx, options: Optional[dict] = None):
        super().__init__(ctx, options)
        self._statements: dict = {}  # (statement, what, remedy) -> _Statement

    def visit_Call(self, node: ast.Call) -> None:
        if not self.ctx.loops and self.ctx.function is None:
            return
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS:
            self._method(node, func)
        elif isinstance(func, ast.Attribute) and func.attr == "synchronize":
            if (self.ctx.qualname(func) == "torch.cuda.synchronize" and self._step_context() is not None
                    and not self._waits_for_own_copies()):
                self._report(node, "`torch.cuda.synchronize()`",
                             "drop it, or time the step with CUDA events (`torch.cuda.Event(enable_timing=True)`) "
                             "read every N steps", waits="waits for all queued GPU work")
        elif self._data_sized_call(node):
            self._report(node, f"`{self._callee_text(node)}()`",
                         "keep shapes fixed: `torch.where(mask, x, 0)` or `x * mask`, and reduce with the mask",
                         value=self._data_sized_operand(node), detail="(its result's size depends on the values)")
        elif _trains_with_project_helpers(self.ctx):
            self._project_helper(node)
        elif isinstance(func, ast.Name) and self.ctx.qualname(func) is None and node.args:
            if self._step_context() is None:
                return
            if func.id in _CONVERSIONS and len(node.args) == 1 and not node.keywords:
                if self._is_device_tensor(node.args[0]):
                    self._report(node, f"`{func.id}()`", self._remedy(node, "convert after the loop, or keep the "
                                                                            "value on the device"), value=node.args[0])
            elif func.id == "print":
                for arg in node.args:
                    values = [v.value for v in arg.values if isinstance(v, ast.FormattedValue)] \
                        if isinstance(arg, ast.JoinedStr) else [arg]
                    for value in values:
                        if self._is_device_tensor(value):
                            self._report(node, "`print()`", "print every N steps, or accumulate and print after "
                                                            "the loop", value=value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """`x[mask]` with a boolean tensor mask: the host must learn how many elements are kept."""
        if not isinstance(node.ctx, ast.Load) or not _may_be_mask(node.slice):
            return
        if self._step_context() is None or not self._is_device_tensor(node.value) or not self._is_mask(node.slice):
            return
        self._report(node, "boolean-mask indexing",
                     "keep shapes fixed: `torch.where(mask, x, 0)` or `x * mask`, and reduce with the mask "
                     "(`(x * mask).sum() / mask.sum()`)", value=node.value,
                     detail="(its result's size depends on the values)")

    def visit_Assert(self, node: ast.Assert) -> None:
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) else node.test
        if self._step_context() is None or not self._is_device_tensor(test) or self._contains_sync_call(test):
            return
        self._report(test, "`assert` on a tensor", _ASSERT, owner=node)

    def leave_Module(self, node: ast.Module) -> None:
        for found in self._statements.values():
            first = min(found.syncs, key=_position)[0]
            self.report(first, found.message(), fix=found.fix(), noqa_row=found.statement.lineno)

    def _project_helper(self, call: ast.Call) -> None:
        """`accuracy(out, y)` in a step, where `accuracy` comes from a module of the project
        (`from utils import accuracy`) whose body syncs on every call (`return correct.item()`):
        the sync is per step, and the call is where the step can avoid it."""
        if not call.args or self._step_context() is None:
            return
        imported = imported_function(self.ctx, call.func)
        if imported is None:
            return
        kinds = [_kinds.kind_of(self.ctx, a) for a in call.args]
        if _kinds.CPU_TENSOR in kinds or all(k in _kinds.NON_TENSORS for k in kinds):
            return  # host tensors, or no tensor at all (a name, a count): nothing to wait for
        definition, path = imported
        sync = _unconditional_sync(definition)
        if sync is None:
            return
        where = os.path.relpath(path, os.path.dirname(os.path.abspath(self.ctx.filename)))
        self._report(call, f"`{self.ctx.segment(call.func)}()`, whose `.{sync.func.attr}()` on line {sync.lineno} of "
                           f"{where} runs on every call,",
                     f"have it return the tensor and convert once after the loop, or call it every N steps")

    def _waits_for_own_copies(self) -> bool:
        """The step makes non-blocking copies (`.to("cpu", non_blocking=True)`): a synchronize is
        what makes reading them safe."""
        loop = self._step_loop()
        owner = loop.node if loop is not None else self.ctx.function
        return "non_blocking" in self.ctx.segment(owner)

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

    def _is_mask(self, index: ast.AST) -> bool:
        """A boolean device tensor: a comparison of tensors, `~t`, `t.bool()`, `torch.isnan(t)`..., or
        a name bound only to one."""
        if isinstance(index, ast.Name):
            entries = _kinds.bindings(self.ctx, index.id)
            values = [e[1] for e in entries or () if e[0] == "value"]
            return bool(values) and len(values) == len(entries) and all(
                _may_be_mask(v) and self._is_mask(v) for v in values)
        if isinstance(index, ast.Compare):
            return len(index.ops) == 1 and not isinstance(index.ops[0], (ast.In, ast.NotIn, ast.Is, ast.IsNot)) \
                and self._is_device_tensor(index)
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.Invert):
            return self._is_device_tensor(index.operand)
        if isinstance(index, ast.Call):
            qual = self.ctx.qualname(index.func) or ""
            if qual in _BOOLEAN_FUNCTIONS:
                return True
            return isinstance(index.func, ast.Attribute) and index.func.attr in ("bool", "isnan", "isinf", "isfinite",
                                                                                 "logical_not", "logical_and",
                                                                                 "logical_or") \
                and self._is_device_tensor(index.func.value)
        return False

    def visit_If(self, node: ast.If) -> None:
        self._condition(node)

    def visit_While(self, node: ast.While) -> None:
        if self.ctx.loops:
            self._condition(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._condition(node)

    # -- checks ---------------------------------------------------------------------
    def _method(self, node: ast.Call, func: ast.Attribute) -> None:
        receiver = func.value
        if self._step_context() is None or self._chain_already_synced(receiver):
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
        if method == "tolist" and kind not in _kinds.TENSORS:
            return
        remedy = self._remedy(node, None)
        if remedy is not None:
            self._report(node, self._method_text(node, method), remedy, value=receiver)
        elif method == "item":
            accumulation = self._accumulation(node)
            read = self._read_on_every_step(accumulation.target) if accumulation is not None else None
            onto_number = accumulation is not None and read is None and self._python_number(accumulation.target)
            fix = (lambda: self._detach_fix(node, receiver, accumulation.target.id)) if onto_number else None
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
            self._report(node, "`.item()`", instead, value=receiver, fix=fix)
        elif method in ("cpu", "to"):
            self._report(node, self._method_text(node, method),
                         "collect results on the device (`torch.cat`/`torch.stack` after the loop) and copy once",
                         value=receiver)
        else:
            self._report(node, "`.tolist()`", "collect results on the device and convert once after the loop",
                         value=receiver)

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
        bound, loop = self._bound_name(sync), self._step_loop()
        if bound is None or loop is None:
            return False
        name, statement = bound
        return any(isinstance(other, (ast.If, ast.While, ast.IfExp)) and other.lineno > statement.end_lineno
                   and name in loaded_names(other.test) for other in loop.direct_nodes())

    def _condition(self, owner: ast.AST) -> None:
        if self._step_context() is None:
            return
        test = owner.test
        values = test.values if isinstance(test, ast.BoolOp) else [test]
        for value in values:
            inner = value.operand if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not) else value
            if _is_torch_predicate(self.ctx, inner):
                continue
            if self._is_device_tensor(inner) and not self._contains_sync_call(inner):
                self._report(inner, "`bool()`", _BRANCH, value=inner, detail="(a tensor used as a Python `bool`)",
                             owner=owner)

    def _report(self, node: ast.AST, what: str, instead: str, value: Optional[ast.AST] = None, detail: str = "",
                fix: Optional[Callable[[], Optional[Fix]]] = None, owner: Optional[ast.AST] = None,
                waits: str = _COPIES) -> None:
        """Adds the sync `node` to the finding of its statement for `what` and `instead` (reported
        at the end of the file). `value`: the tensor it syncs, named in the message. `fix`: makes
        the fix, once the finding stands. `owner`: the `if`/`while`/`assert` whose test `node`
        is. `waits`: what the sync does."""
        if _kinds.cpu_only_script(self.ctx):
            return  # the program never leaves the CPU: there is no device to wait for
        loop = self._step_loop()
        if loop is None:
            where = self._in_step_function(node)
            fix = None
            if where is None:
                return
        else:
            if self._gated(node, loop, owner):
                return
            training = self._is_training(loop)
            if (owner is None and self._used_now(node, loop)) or self._explained(node) or (not training and self._host_only(loop)):
                return
            if in_test_code(self.ctx) or in_reference_code(self.ctx):
                return
            where = f"on every step of the {'training' if training else 'evaluation'} loop on line {loop.node.lineno}"
        statement = owner if isinstance(owner, ast.stmt) else self.ctx.statement()
        key = (id(statement), what, instead)
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = _Statement(statement, what, detail, waits, where, instead)
        found.syncs.append((node, self._value_text(value) if value is not None else None,
                            fix() if fix is not None else None))

    def _value_text(self, value: ast.AST) -> str:
        text = " ".join(self.ctx.segment(value).split())
        return text if len(text) <= _LONGEST_VALUE else text[:_LONGEST_VALUE - 3].rstrip() + "..."

    def _step_context(self):
        """The step loop around the node, else the step that the function around it runs in (a
        training step, a step hook, a helper the step calls), else None."""
        loop = self._step_loop()
        if loop is not None:
            return loop
        if self.ctx.function is None or not _kinds.may_mention(self.ctx, "backward") and not any(
                _kinds.may_mention(self.ctx, hook) for hook in STEP_HOOKS):
            return None  # no training step and no step hook: only a `forward` could run every step
        if in_test_code(self.ctx) or not _kinds.moves_work_to_cuda(self.ctx):
            return None  # a helper module that never names a device: its callers' tensors may be anywhere
        step = step_of(self.ctx, self.ctx.functions)
        # A module's `forward` branches on its data on purpose (routing, variable lengths): only
        # what a step's own code does counts
        return None if step is None or step.forward else step

    def _in_step_function(self, node: ast.AST) -> Optional[str]:
        """For a sync in a function that runs every step, outside any loop of its own: why it runs
        every step; None where it runs only on some calls (under an `if`, in an error path)."""
        step = self._step_context()
        function = next(f for f in reversed(self.ctx.functions) if not isinstance(f, ast.Lambda))
        start = next((i for i, p in enumerate(self.ctx.parents) if p is function), None)
        chain = self.ctx.parents[start + 1:] if start is not None else []
        if any(isinstance(p, (ast.If, ast.ExceptHandler, ast.Raise, ast.IfExp, ast.Try)) for p in chain):
            return None
        if self._explained(node) or in_reference_code(self.ctx):
            return None
        return f"on every step: `{function.name}` {step.why}"

    def _arguments(self, call: ast.Call) -> str:
        return ", ".join(self.ctx.segment(a) for a in call.args + call.keywords)

    def _read_before_copied(self, call: ast.Call) -> Optional[int]:
        """The line where the host reads the CPU tensor that a non-blocking copy returns, in the same
        iteration with nothing waiting for the copy first: on the copy itself
        (`.to("cpu", non_blocking=True).tolist()`, `float(...)`) or through the name bound to it."""
        current = call
        for parent in reversed(self.ctx.parents):
            if _reads_values(self.ctx, parent, current):
                return parent.lineno
            if not _extends(parent, current):
                break
            current = parent
        bound = self._bound_name(call)
        if bound is None:
            return None
        name, statement = bound
        body = self.ctx.loops[-1].body
        parents = {}
        later = []
        for stmt in body:
            for sub in walk_no_scopes(stmt):
                for child in ast.iter_child_nodes(sub):
                    parents[child] = sub
                if getattr(sub, "lineno", 0) > statement.end_lineno and isinstance(sub, (ast.Name, ast.Call)):
                    later.append(sub)
        later.sort(key=lambda n: (n.lineno, n.col_offset))
        for sub in later:
            if isinstance(sub, ast.Call):
                if _identifier(sub.func) == "synchronize":
                    return None  # `torch.cuda.synchronize()`, `stream.synchronize()`: the copy is done
                continue
            if sub.id != name or not isinstance(sub.ctx, ast.Load):
                continue
            current, parent = sub, parents.get(sub)
            while parent is not None and _extends(parent, current):
                current, parent = parent, parents.get(parent)
            if parent is not None and _reads_values(self.ctx, parent, current):
                return parent.lineno
        return None

    def _accumulation(self, call: ast.Call) -> Optional[ast.AugAssign]:
        """`total += loss.item()`, also scaled on the way (`total += loss.item() * len(batch)`,
        `total_loss += loss.item() / accum`): a running total."""
        value = call
        for parent in reversed(self.ctx.parents):
            if isinstance(parent, ast.AugAssign):
                return parent if parent.value is value and isinstance(parent.op, ast.Add) else None
            if not (isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mult, ast.Div))
                    or isinstance(parent, ast.UnaryOp) and isinstance(parent.op, (ast.USub, ast.UAdd))):
                return None
            value = parent
        return None

    def _read_on_every_step(self, target: ast.AST) -> Optional[int]:
        """The line where host code reads the running total, or a name it flows into (`avg =
        total / (i + 1)`), on every step, outside a gate: in the step loop (`bar.set_postfix(loss=avg)`,
        `pbar.set_postfix({"loss": avg})`) or in a step loop around it (the optimizer's loop around
        a loop over micro-batches)."""
        loop = self._step_loop()
        if loop is None or not isinstance(target, ast.Name):
            return None
        around = self.ctx.loops[:self.ctx.loops.index(loop)]
        while around and self._is_step_loop(around[-1]):
            loop = around.pop()
        parents = self._parents()
        pending, seen, lines = [target.id], set(), []
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            for stmt in loop.body:
                for read in walk_no_scopes(stmt):
                    if not (isinstance(read, ast.Name) and read.id == name and isinstance(read.ctx, ast.Load)):
                        continue
                    child, parent = read, parents.get(read)
                    while isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Dict, ast.List, ast.Tuple)):
                        child, parent = parent, parents.get(parent)
                    if isinstance(parent, ast.AugAssign) and parent.value is child and isinstance(parent.target, ast.Name):
                        pending.append(parent.target.id)
                    elif isinstance(parent, ast.Assign) and parent.value is child and len(parent.targets) == 1 \
                            and isinstance(parent.targets[0], ast.Name):
                        pending.append(parent.targets[0].id)
                    elif _host_reads(parent, child) and not self._gated_read(read, loop, parents):
                        lines.append(read.lineno)
        return min(lines, default=None)

    @staticmethod
    def _gated_read(read: ast.AST, loop: LoopInfo, parents: dict) -> bool:
        """`read` runs on some steps only: under a gate (`if i % 100 == 0:`), in a branch that
        leaves the loop, or in an `except`."""
        child, parent = read, parents.get(read)
        while parent is not None and parent is not loop.node:
            if isinstance(parent, ast.ExceptHandler):
                return True
            if isinstance(parent, ast.If) and child is not parent.test:
                in_body = any(stmt is child for stmt in parent.body)
                branch = parent.body if in_body else parent.orelse
                if isinstance(branch[-1], (ast.Return, ast.Break, ast.Raise)) or in_body and _is_gate(parent.test, loop):
                    return True
            child, parent = parent, parents.get(parent)
        return False

    def _parents(self) -> dict:
        """Each node's parent in the current function (or module), built once."""
        owner = self.ctx.function or self.ctx.tree
        key = ("mat502_parents", id(owner))
        parents = self.ctx.shared.get(key)
        if parents is None:
            parents = self.ctx.shared[key] = {child: node for node in ast.walk(owner)
                                              for child in ast.iter_child_nodes(node)}
        return parents

    def _detach_fix(self, call: ast.Call, receiver: ast.AST, accumulator: str) -> Optional[Fix]:
        """Only onto a Python number (the caller checks): `acc += loss.detach()` onto a CPU tensor
        (`torch.zeros(1)`) raises (the operands are on two devices), and the rule cannot see where
        another tensor is. Only where the number's later uses work the same on a 0-d tensor."""
        text = self.ctx.segment(call)
        if "#" in text:
            return None  # a comment inside the call would go with it
        if not self._uses_work_on_tensor(accumulator):
            return None  # `np.mean([total])`, `log(total)`: host code may not take a device tensor
        receiver_text = self.ctx.segment(receiver)
        if not isinstance(receiver, _ATOMIC):
            receiver_text = f"({receiver_text})"  # `(a + b).item()`: not `a + b.detach()`
        return self.replace(call, f"{receiver_text}.detach()",
                            "Accumulate on the device with `.detach()`; call `.item()` once after the loop",
                            safe=False)

    def _uses_work_on_tensor(self, accumulator: str) -> bool:
        """Every read of the accumulator in its scope, and of the names it flows into
        (`avg = total / n`, `epoch_total += total`), works the same on a 0-d device tensor:
        arithmetic, an f-string or `format`, `float()`/`int()`/`round()`, returning it. Any other
        use (a call, numpy, a comparison, an attribute, a closure) may need a Python number."""
        owner = self.ctx.function or self.ctx.tree
        parents = self._parents()
        reads: dict = {}
        for node in parents:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                reads.setdefault(node.id, []).append(node)
            elif isinstance(node, (ast.Global, ast.Nonlocal)) and accumulator in node.names:
                return False
        pending, seen = [accumulator], set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            for read in reads.get(name, ()):
                flows_into = _use_on_tensor(self.ctx, read, parents, owner)
                if flows_into is False:
                    return False
                if isinstance(flows_into, str):
                    if flows_into != name and not self._python_number_name(flows_into):
                        return False  # `acc += total` onto a CPU tensor raises
                    pending.append(flows_into)
        return True

    def _python_number(self, target: ast.AST) -> bool:
        """Every binding of the accumulator in its scope is a Python number (`total = 0.0`) or adds
        one (`total += x.item()`); an attribute, a tensor or a name of unknown kind is not."""
        return isinstance(target, ast.Name) and self._python_number_name(target.id)

    def _python_number_name(self, name: str) -> bool:
        scope = _kinds.scope_kinds(self.ctx, self.ctx.function or self.ctx.tree)
        entries = scope.assigned.get(name)
        if not entries:
            return False
        for entry in entries:
            tag = entry[0]
            if tag == "value" and self._number_value(entry[1]):
                continue
            if tag == "aug" and self._number_value(entry[1].value):
                continue
            if tag == "unpack" and isinstance(entry[1], (ast.Tuple, ast.List)):  # `total, n = 0.0, 0`
                items = entry[1].elts
                if not any(isinstance(item, ast.Starred) for item in items) and -len(items) <= entry[2] < len(items) \
                        and self._number_value(items[entry[2]]):
                    continue
            if tag == "kind" and entry[1] == _kinds.SCALAR:
                continue
            return False
        return True

    def _number_value(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "item" and not expr.args:
            return True
        if isinstance(expr, ast.BinOp):
            return self._number_value(expr.left) and self._number_value(expr.right)
        if isinstance(expr, ast.UnaryOp):
            return self._number_value(expr.operand)
        return _kinds.kind_of(self.ctx, expr) == _kinds.SCALAR

    # -- when the host needs the value now -------------------------------------------------
    def _used_now(self, node: ast.AST, loop: LoopInfo) -> bool:
        """The value, bound to a name, decides whether the loop stops in this same iteration (a
        convergence test), or Python code goes over it item by item (iterates or indexes it); or
        it is an input of host code whose result the loop moves back to the device."""
        if self._back_to_device(node, loop):
            return True
        bound = self._bound_name(node)
        if bound is None:
            return False
        name, statement = bound
        for other in loop.direct_nodes():
            if getattr(other, "lineno", 0) <= statement.end_lineno:
                continue
            if isinstance(other, ast.If) and _stops_on_comparison(other, lambda compare: name in loaded_names(compare)):
                return True
            if isinstance(other, _NESTED_LOOPS) and _goes_over(other, name):
                return True
        return False

    def _back_to_device(self, node: ast.AST, loop: LoopInfo) -> bool:
        """The copy is an input of host code whose result the loop moves back to the device, in
        this iteration or the next (`next_state, reward, done, _ = envs.step(action.cpu().numpy())`,
        then `state = next_state` and `torch.FloatTensor(state).to(device)`): the device work of
        the loop waits for the host's result, so the host needs the value now."""
        results = self._host_results(node, loop)
        if not results:
            return False
        names = loop.assigned_from(results)
        for stmt in loop.body:
            for call in walk_no_scopes(stmt):
                if isinstance(call, ast.Call) and self._moves_to_device(call, names):
                    return True
        return False

    def _host_results(self, node: ast.AST, loop: LoopInfo) -> set:
        """The names bound to the result of a host call that takes the copied value: given the
        copy itself (`envs.step(action.cpu().numpy())`) or a name bound to it (`action =
        dist.sample().item()`, then `env.step(action)`)."""
        parents, current = self.ctx.parents, node
        for i in range(len(parents) - 1, 0, -1):
            parent = parents[i]
            if _extends(parent, current):
                current = parent
                continue
            assign = parents[i - 1]
            if isinstance(parent, ast.Call) and current in _call_inputs(parent) and self._host_call(parent) \
                    and isinstance(assign, ast.Assign) and assign.value is parent:
                return set().union(*(bound_names(t) for t in assign.targets))
            break
        bound = self._bound_name(node)
        if bound is None:
            return set()
        results = set()
        for stmt in loop.body:
            for assign in walk_no_scopes(stmt):
                if isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Call) and self._host_call(assign.value) \
                        and any(bound[0] in loaded_names(arg) for arg in _call_inputs(assign.value)):
                    results |= set().union(*(bound_names(t) for t in assign.targets))
        return results

    def _host_call(self, call: ast.Call) -> bool:
        """A call of code that runs on the host: neither torch's (nor a tensor's method) nor
        Python's builtins (`int(n.item())` is a number the rule reports for its own remedy)."""
        func, qual = call.func, self.ctx.qualname(call.func)
        if qual is not None:
            return not qual.startswith("torch")
        if isinstance(func, ast.Name):
            return not hasattr(builtins, func.id)
        return not (isinstance(func, ast.Attribute) and _kinds.is_tensor(self.ctx, func.value))

    def _moves_to_device(self, call: ast.Call, names: set) -> bool:
        """`call` puts a value read from `names` on the device: `.to(device)` or `.cuda()` of it, or a
        tensor made from it with a `device=` (`torch.as_tensor(state, device=device)`)."""
        func = call.func
        if isinstance(func, ast.Attribute) and loaded_names(func.value) & names:
            return _kinds.moves_to_device(self.ctx, call)
        return any(k.arg == "device" for k in call.keywords) and any(
            loaded_names(arg) & names for arg in call.args) and _kinds.kind_of(self.ctx, call) == _kinds.TENSOR

    def _bound_name(self, node: ast.AST):
        """(name, statement) where the sync's value is bound (`v = x.cpu().tolist()`, `a, b =
        (x.tolist(), y.tolist())`), also through numpy functions of it (`np.squeeze(x.cpu().numpy())`)
        and a branch of a conditional expression, else None."""
        current, index = node, None
        for parent in reversed(self.ctx.parents):
            if (isinstance(parent, ast.Attribute) and parent.value is current) or \
                    (isinstance(parent, ast.Call) and parent.func is current) or \
                    (isinstance(parent, ast.IfExp) and parent.test is not current) or \
                    (isinstance(parent, ast.Call) and any(arg is current for arg in parent.args)
                     and (self.ctx.qualname(parent.func) or "").startswith("numpy.")):
                current = parent
            elif isinstance(parent, ast.Tuple) and index is None:
                index = next(i for i, elt in enumerate(parent.elts) if elt is current)
                current = parent
            elif isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is current:
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                if len(targets) != 1:
                    return None
                target = targets[0]
                if index is not None:
                    if not (isinstance(target, ast.Tuple) and len(target.elts) == len(current.elts)):
                        return None
                    target = target.elts[index]
                return (target.id, parent) if isinstance(target, ast.Name) else None
            else:
                return None
        return None

    def _explained(self, node: ast.AST) -> bool:
        """A comment on the sync's own lines, or above its statement (heading the run of copies it
        is in), says why the copy is deliberate (`# wait for the indices: the host slices with
        them`, `# kept on the CPU, else GPU memory runs out`). A comment on another line of a
        multi-line statement belongs to that line; one that says what the line does (`# move to
        cpu`) or why not to keep the graph (`.detach()` does that too) explains nothing."""
        statement = self.ctx.statement()
        if statement is None:
            return False
        comments = nearby_comments(self.ctx, node, statement, lambda text: any(sync in text for sync in _SYNC_TEXT))
        return any(_says_why(comment) for comment in comments)

    def _host_only(self, loop: LoopInfo) -> bool:
        """An evaluation loop in a function that never names a device (no `.to(`, `cuda`,
        `device`...) and calls nothing that may run a model (only imported functions, builtins and
        tensor or container methods): its batches stay where the loader made them, on the host."""
        key = ("mat502_host_only", id(loop.node))
        found = self.ctx.shared.get(key)
        if found is None:
            found = self.ctx.shared[key] = self._calls_only_host_code(loop)
        return found

    def _calls_only_host_code(self, loop: LoopInfo) -> bool:
        function = self.ctx.function
        if _DEVICE_WORDS.search(function_text(self.ctx, function) if function is not None else self.ctx.source):
            return False
        for stmt in loop.body:
            for node in walk_no_scopes(stmt):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if self.ctx.qualname(func) is not None:
                    continue  # an imported function (or torch's, numpy's): it runs where its inputs are
                if isinstance(func, ast.Name) and func.id in _HOST_BUILTINS:
                    continue
                if isinstance(func, ast.Attribute) and func.attr in _HOST_METHODS and not self._on_self(func):
                    continue
                return False  # `model(x)`, `self.net(x)`: may move the batch itself (DataParallel)
        return True

    @staticmethod
    def _on_self(func: ast.Attribute) -> bool:
        return isinstance(func.value, ast.Name) and func.value.id == "self"

    # -- context ------------------------------------------------------------------------
    def _is_device_tensor(self, expr: ast.AST) -> bool:
        return _kinds.kind_of(self.ctx, expr) == _kinds.TENSOR

    @staticmethod
    def _contains_sync_call(expr: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("item", "cpu", "tolist")
                   for n in ast.walk(expr))

    @staticmethod
    def _chain_already_synced(receiver: ast.AST) -> bool:
        node = receiver
        while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Attribute) and node.func.attr in ("item", "cpu", "tolist", "numpy"):
                    return True
                node = node.func
            else:
                node = node.value
        return False

    def _step_loop(self) -> Optional[LoopInfo]:
        for loop in reversed(self.ctx.loops):
            if self._is_step_loop(loop):
                return loop
        return None

    def _is_step_loop(self, loop: LoopInfo) -> bool:
        key = ("mat502_step", id(loop.node))
        if key not in self.ctx.shared:
            training = self._is_training(loop)
            # A loop that steps an optimizer is a training step whatever it goes over; one that
            # only runs backward passes may go over the tasks of one step.
            steps = training and any(is_optimizer_step(n) for n in loop.direct_nodes())
            self.ctx.shared[key] = ((training or self._iterates_loader(loop))
                                    and not (not training and self._one_off())
                                    and not (not steps and self._iterates_names(loop))
                                    and not self._epoch_loop(loop))
        return self.ctx.shared[key]

    def _is_training(self, loop: LoopInfo) -> bool:
        """The body calls `.backward()` or an optimizer's `.step()`, itself or in a loop over names
        nested in it (`for name, discr_loss in discr_losses: discr_loss.backward()`): that loop
        goes over the parts of this loop's step."""
        key = ("mat502_training", id(loop.node))
        found = self.ctx.shared.get(key)
        if found is None:
            found = self.ctx.shared[key] = is_training_loop(self.ctx, loop) or any(
                isinstance(node, (ast.For, ast.AsyncFor)) and self._iterates_names(inner := LoopInfo(node, self.ctx))
                and is_training_loop(self.ctx, inner) for node in loop.direct_nodes())
        return found

    def _iterates_loader(self, loop: LoopInfo) -> bool:
        return iterates_loader(self.ctx, loop)

    def _epoch_loop(self, loop: LoopInfo) -> bool:
        """The loop runs a whole pass over a loader in each iteration: an epoch loop, whatever
        else it steps (`sched.step()`). A pass under an `if` (validation every N steps) or in an
        `except` does not run in each iteration."""
        return any(isinstance(stmt, (ast.For, ast.AsyncFor)) and self._iterates_loader(LoopInfo(stmt, self.ctx))
                   for stmt in _every_iteration(loop.node.body if isinstance(loop.node, (ast.For, ast.AsyncFor, ast.While))
                                                else []))

    def _iterates_names(self, loop: LoopInfo) -> bool:
        """`for key in dataset_keys:`, `for task_name in tasks:`, `for k, v in losses.items():`,
        `for name, discr_loss in discr_losses:`: one iteration per data set or task, not per batch.
        Whole words: `fname` names a file, which may hold a batch; and named pairs from a loader
        (`for img_name, img in loader:`) are its batches."""
        it = loop.iter
        while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "sorted", "list") \
                and it.args:
            it = it.args[0]
        if it is None:
            return False
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("keys", "items") \
                and not it.args:
            return True
        if _last_word(_identifier(it)) in ("keys", "names"):
            return True
        target = loop.node.target if isinstance(loop.node, (ast.For, ast.AsyncFor)) else loop.node.generators[0].target
        if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name) \
                and _last_word(target.elts[0].id) in ("key", "name"):
            return not self._iterates_loader(loop)
        return isinstance(target, ast.Name) and _last_word(target.id) in ("key", "name")

    def _one_off(self) -> bool:
        """In a function that runs once over a data set: a `process()` method (torch_geometric's
        `Dataset.process(self)`), `precompute_*`, calibration."""
        function = self.ctx.function
        key = ("mat502_one_off", id(function))
        found = self.ctx.shared.get(key)
        if found is None:
            functions = [f for f in self.ctx.functions if not isinstance(f, ast.Lambda)]
            stem = os.path.splitext(os.path.basename(self.ctx.filename or ""))[0]
            words = {w for n in [f.name for f in functions] + [stem] for w in name_tokens(n)}
            found = self.ctx.shared[key] = bool(any(_dataset_process(f) for f in functions) or words & _ONE_OFF_WORDS)
        return found

    def _gated(self, node: ast.AST, loop: LoopInfo, owner: Optional[ast.AST]) -> bool:
        """The call (`node`) sits under an `if` that lets it run only some steps (every N, verbose...), in
        a branch that leaves the loop (`return`, `break`, `raise`), in an error path, or in a test
        that stops a loop on a comparison (a convergence test)."""
        parents = self.ctx.parents
        start = next((i for i, p in enumerate(parents) if p is loop.node), None)
        if start is None:
            return False
        chain = parents[start + 1:] + ([owner] if owner is not None else [])
        if isinstance(owner, ast.While) and _has_ordering(owner.test):
            return True  # `while (x - prev).norm() > tol:` inside a step: it must know when to stop
        if isinstance(loop.node, ast.While) and chain and chain[0] is loop.node.test and _has_ordering(loop.node.test):
            return True  # `while loss.item() > tol:`: the loop's own stopping test
        for i, parent in enumerate(chain):
            if isinstance(parent, (ast.ExceptHandler, ast.Return, ast.Raise)):
                return True  # an error path, or the statement that leaves the loop: once at most
            if isinstance(parent, ast.If):
                child = chain[i + 1] if i + 1 < len(chain) else None
                if child is None or child is parent.test:  # what is reported is in this `if`'s test
                    if _stops_on_comparison(parent, lambda compare: _overlap(compare, node)):
                        return True  # `if abs(loss.item() - prev) < tol: break`: needed now, to stop
                    continue
                in_body = any(stmt is child for stmt in parent.body)
                branch = parent.body if in_body else parent.orelse
                if branch and isinstance(branch[-1], (ast.Return, ast.Break, ast.Raise)):
                    return True  # the branch leaves the loop: it runs on one step, not every step
                if in_body and _is_gate(parent.test, loop):
                    return True  # (its `else` runs on the other steps)
        return False


def _extends(parent: ast.AST, child: ast.AST) -> bool:
    """`child.attr`, `child(...)`, `child[...]`: the expression goes on from `child`."""
    return (isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is child) or \
        (isinstance(parent, ast.Call) and parent.func is child)


def _call_inputs(call: ast.Call) -> list:
    return call.args + [k.value for k in call.keywords]


def _reads_values(ctx, parent: ast.AST, child: ast.AST) -> bool:
    """`parent` reads the values of the tensor `child` on the host: `.tolist()`, `.numpy()`,
    `.item()`, `float()`, `int()`, `bool()`, `list()`, `print()`, `np.asarray()`, an f-string."""
    if isinstance(parent, ast.Attribute):
        return parent.value is child and parent.attr in ("tolist", "numpy", "item")
    if isinstance(parent, ast.Call):
        func = parent.func
        if not any(arg is child for arg in parent.args):
            return False
        if isinstance(func, ast.Name) and ctx.qualname(func) is None:
            return func.id in ("float", "int", "bool", "list", "print")
        return ctx.qualname(func) in ("numpy.asarray", "numpy.array")
    return isinstance(parent, ast.FormattedValue) and parent.value is child


def _host_reads(parent: ast.AST, child: ast.AST) -> bool:
    """`parent` needs the value of `child` on the host: formats it (`f"{avg:.3f}"`), passes it to a
    call (`bar.set_postfix(loss=avg)`, `print(avg)`; not `losses.append(avg)`, which keeps it), or
    compares it."""
    if isinstance(parent, ast.keyword):
        return True
    if isinstance(parent, ast.Call):
        return any(arg is child for arg in parent.args) and not (
            isinstance(parent.func, ast.Attribute) and parent.func.attr in ("append", "extend", "insert", "add"))
    return isinstance(parent, (ast.FormattedValue, ast.Compare))


def _use_on_tensor(ctx, read: ast.Name, parents: dict, owner: ast.AST):
    """How a read of a Python-number accumulator would take a 0-d tensor in its place: True (the
    same), False (maybe not), or the name the value flows into (`avg = total / n`, `acc += total`),
    whose own reads decide."""
    scope = parents.get(read)
    while scope is not None and scope is not owner:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False  # a closure: it may run anywhere
        scope = parents.get(scope)
    child = read
    while True:
        parent = parents.get(child)
        if isinstance(parent, ast.BinOp) and not isinstance(parent.op, (ast.MatMult, ast.BitAnd, ast.BitOr, ast.BitXor,
                                                                         ast.LShift, ast.RShift)):
            if isinstance(parent.op, ast.Mod) and isinstance(parent.left, (ast.Constant, ast.JoinedStr)):
                # `"%.3f" % total` reads a number; `%s` and `%r` would print `tensor(...)`
                return isinstance(parent.left, ast.Constant) and _numeric_template(parent.left.value, _PERCENT_TEXT)
            child = parent
        elif isinstance(parent, ast.UnaryOp) and isinstance(parent.op, (ast.USub, ast.UAdd)):
            child = parent
        elif isinstance(parent, ast.FormattedValue):
            return parent.conversion == -1  # `{total:.3f}` formats the number; `{total!r}` would not
        elif isinstance(parent, ast.Return):
            return True
        elif isinstance(parent, ast.Tuple) and isinstance(parents.get(parent), ast.Return):
            return True  # `return total, n`
        elif isinstance(parent, ast.Call):
            func = parent.func
            if not any(arg is child for arg in parent.args):
                return False
            if isinstance(func, ast.Name) and ctx.qualname(func) is None and func.id == "round":
                child = parent  # `round(t)` is a tensor again
                continue
            if isinstance(func, ast.Name) and ctx.qualname(func) is None:
                return func.id in ("float", "int")
            return isinstance(func, ast.Attribute) and func.attr == "format" and isinstance(func.value, ast.Constant) \
                and _numeric_template(func.value.value, _CONVERSION_TEXT)
        elif isinstance(parent, ast.AugAssign) and parent.value is child and isinstance(parent.target, ast.Name) \
                and isinstance(parent.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            return parent.target.id
        elif isinstance(parent, ast.Assign) and parent.value is child and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Name):
            return parent.targets[0].id
        else:
            return False


_PERCENT_TEXT = re.compile(r"%[^a-zA-Z%]*[sra]")
_CONVERSION_TEXT = re.compile(r"![sra]")


def _numeric_template(template, text_conversion: re.Pattern) -> bool:
    """A format string that formats its values as numbers, none as text (`%s`, `{!r}`)."""
    return isinstance(template, str) and not text_conversion.search(template)


def _overlap(a: ast.AST, b: ast.AST) -> bool:
    """One of the two nodes holds the other (`if torch.all(step <= tol):` reports the call around the comparison)."""
    return any(n is b for n in ast.walk(a)) or any(n is a for n in ast.walk(b))


def _every_iteration(body: list):
    """The statements of a loop body that run whenever the body runs: into `with` blocks and the
    body, `else` and `finally` of a `try`, not into `if`, `match`, `except` or nested loops."""
    stack = list(body)
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            stack.extend(stmt.body)
        elif isinstance(stmt, _TRY):
            stack.extend(stmt.body + stmt.orelse + stmt.finalbody)


def _last_word(identifier: Optional[str]) -> str:
    return (identifier or "").lower().rsplit("_", 1)[-1]


def _dataset_process(function: ast.AST) -> bool:
    """`def process(self):`, a method (torch_geometric's `Dataset.process`); not `def process(rank, ...)`."""
    params = function.args.posonlyargs + function.args.args
    return function.name in _ONE_OFF_NAMES and bool(params) and params[0].arg == "self"


def _says_why(comment: str) -> bool:
    if _HOST_REASON.search(comment) and not _NEGATED.search(comment):
        return True
    return bool(_MEMORY_REASON.search(comment)) and not _GRAPH_MEMORY.search(comment)


def _goes_over(loop: ast.AST, name: str) -> bool:
    """The loop iterates over `name` (`for t in tokens`) or indexes it (`tokens[i]`)."""
    if isinstance(loop, (ast.For, ast.AsyncFor)) and name in loaded_names(loop.iter):
        return True
    if isinstance(loop, _COMPREHENSIONS) and any(name in loaded_names(g.iter) for g in loop.generators):
        return True
    return any(isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == name
               for node in walk_no_scopes(loop))


def _has_ordering(test: ast.AST) -> bool:
    return any(isinstance(node, ast.Compare) and any(isinstance(op, _ORDERING) for op in node.ops)
               for node in ast.walk(test))


def _stops_on_comparison(node: ast.If, involves) -> bool:
    """`if abs(loss - prev) < tol: break`, `if approx_kl > 1.5 * target_kl: break`: an ordering on
    the value (`involves(compare)`) that stops the loop in its normal course. A guard that only
    failure trips (`if loss > 1e4: break`, `if isnan: break`) can be checked every N steps."""
    if not (node.body and isinstance(node.body[-1], _LEAVES_LOOP)):
        return False
    return any(isinstance(compare, ast.Compare) and any(isinstance(op, _ORDERING) for op in compare.ops)
               and involves(compare) and not _divergence_guard(compare)
               for compare in ast.walk(node.test))


def _divergence_guard(compare: ast.Compare) -> bool:
    """`loss_val > 1e4`, `1e3 < abs(loss)`, `ll < -1e6`: the value past a large literal bound
    (|bound| >= 100), where only a diverging run goes."""
    if len(compare.ops) != 1:
        return False
    left, right = compare.left, compare.comparators[0]
    if isinstance(compare.ops[0], (ast.Lt, ast.LtE)):
        left, right = right, left  # read every comparison as `left > right`
    low, high = _literal_number(right), _literal_number(left)
    if low is not None and high is None:
        return low >= 100   # `value > 1e4`
    if high is not None and low is None:
        return high <= -100  # `-1e6 > value`
    return False


def _literal_number(expr: ast.AST) -> Optional[float]:
    """`1e4`, `-1e4`; None for anything else."""
    sign = 1
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        sign = -1 if isinstance(expr.op, ast.USub) else 1
        expr = expr.operand
    if isinstance(expr, ast.Constant) and isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool):
        return sign * expr.value
    return None


def _is_gate(test: ast.AST, loop: LoopInfo) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and _GATE_NAME.search(_identifier(node) or ""):
            return True
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq) for op in node.ops) \
                and not all(_same_every_step(operand, loop) for operand in [node.left] + node.comparators):
            return True
    return False


def _same_every_step(operand: ast.AST, loop: LoopInfo) -> bool:
    """`rank`, `0`, `args.local_rank`, `dist.get_rank()`: an `==` on these is true on every step
    or on none, not a gate; `step`, `self.global_step` change as the loop runs."""
    if isinstance(operand, ast.Constant):
        return True
    if isinstance(operand, ast.Name):
        return operand.id not in loop.targets and operand.id not in loop.assigned
    if isinstance(operand, ast.Call) and not operand.args and not operand.keywords:
        operand = operand.func
    if isinstance(operand, ast.Attribute) and _PROCESS_WORDS.intersection(name_tokens(operand.attr)):
        root = operand.value
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and root.id not in loop.targets and root.id not in loop.assigned
    return False
