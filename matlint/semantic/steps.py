"""Which functions of a file run on every step of a training or evaluation loop, so that what
they do counts per step although no loop is written around it in the function itself.

A function runs every step when it is a training step (it calls both `.backward()` and an
optimizer's `.step()` once per call, outside any loop of its own: TD3's `train(replay_buffer)`,
an agent's `learn()`), an optimizer step (it calls an optimizer's `.step()` once per call:
`optimize_normal()` after the backward pass), a framework's step
hook (`training_step`, `validation_step`, `test_step`), a module's `forward`, or when the file calls it from such a
function or from inside a loop that trains (its body calls `.backward()` or an optimizer's
`.step()`) or goes over a data loader. Built once per file, on first use.

A loop goes over batches (`iterates_loader`) when it iterates a data loader (through wrappers
and names bound to them), an iterator made for a device, or batches it moves to the device
itself or that a function of the project samples and returns on the device. A loop evaluates
(`evaluates_with_model`) when it calls a model, put in evaluation mode or run with gradients off,
on the data each iteration goes over or draws.

`per_step(ctx)` answers the question for the node being visited: does it run on every step (on
every iteration of a loop around it, on every forward call of a module, or on every call of a
function that runs every step), and why. `step_loop(ctx)` gives the loop around it that runs once
per step (a training loop or a pass over a loader; not an epoch loop, a loop over task names or a
one-off pass over a data set), and `updates_every_step(ctx, loop)` whether a loop over parameters
runs on every optimizer step (in an optimizer's or an EMA's update, or in a training loop or
step).
"""
from __future__ import annotations

import ast
import os
import re
from typing import NamedTuple, Optional

from . import kinds as _kinds
from .calls import argument_for, file_calls
from .file import Position
from .kinds import imported_class
from .flow import flow_of
from .loops import (LoopInfo, _attribute_paths, bound_names, file_trains, identifier, is_backward,
                    is_optimizer_step, is_training_loop, loaded_names, may_run_training_step, name_tokens, optimizer_names,
                    walk_no_scopes)
from .project import (SCRIPT_PROJECT_FILES, file_runs_backward, imported_definition, imported_definitions,
                      import_table, imported_function, importers, in_script_project, linted_project_imports, parsed,
                      project_imports, while_unchanged)
from .torch_api import NO_GRAD_CONTEXTS
from .tree import child_nodes, dotted, identifier_text

_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

STEP_HOOKS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


class Step(NamedTuple):
    why: str      # "is a training step", "is called from the training loop on line 12", ...
    training: bool
    forward: bool = False  # runs every step as (part of) a module's `forward`
    loss: bool = False     # ... of a loss module's `forward`, which a training step runs once per step
    # the calling loop hands what the function returns to an environment's step (`action =
    # agent.act(state)`, then `state, reward, done, _ = env.step(action)`): the host needs it
    feeds_host: bool = False
    # the project file whose step runs it, where only a file that imports this one does
    from_file: Optional[str] = None
    # a method that runs its module's forward and hands back what the model computed (a policy's
    # `get_action`, a `predict`): what it returns, its caller asked for
    runs_model: bool = False


def _trains(nodes, optimizers: frozenset = frozenset()) -> tuple:
    """(calls `.backward()`, calls an optimizer's `.step()`) among `nodes`; `optimizers`: as
    `is_optimizer_step` takes them."""
    backward = step = False
    for node in nodes:
        backward = backward or is_backward(node)
        step = step or is_optimizer_step(node, optimizers)
    return backward, step


def trains_in(body: list) -> bool:
    """The statements call `.backward()` or an optimizer's `.step()` (not in nested functions):
    a branch that holds them (`if (i + 1) % n_critic == 0: ... g_opt.step()`) is
    a training step, not a logging gate."""
    return any(is_backward(node) or is_optimizer_step(node) for stmt in body for node in walk_no_scopes(stmt))


def _closures_of_own_optimizer(function: ast.AST, nodes: list) -> list:
    """The closures `function` hands to the `step` of an optimizer it makes itself (`optimizer =
    LBFGS(params, max_iter=n)`, then `optimizer.step(closure)` of a `def closure():` of its
    own), when every optimizer step it takes is such a call; else empty. Such a function sets up
    the optimization, and `step` evaluates the closure as often as the optimizer iterates."""
    defined = {node.name: node for node in nodes if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    made = {target.id for node in nodes if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for target in node.targets if isinstance(target, ast.Name)}
    closures = []
    for node in nodes:
        if not is_optimizer_step(node):
            continue
        receiver = node.func.value
        if not (isinstance(receiver, ast.Name) and receiver.id in made and len(node.args) == 1
                and isinstance(node.args[0], ast.Name) and node.args[0].id in defined):
            return []
        closures.append(defined[node.args[0].id])
    return closures


def _outside_loops(body):
    """The nodes of a function's body that run once per call: not in its loops or nested scopes
    (a function that holds a whole training loop is not itself one step)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _LOOPS + _SCOPES):
            continue
        stack.extend(child_nodes(node))


def _module_method(calls, function: ast.AST) -> bool:
    """A method of a class with a base other than `object`/`ABC` (an `nn.Module`, or a class of
    one): its `forward` runs on every step of whoever calls the module."""
    cls = calls.class_of.get(id(function))
    return cls is not None and any(dotted(base) not in (None, "object", "ABC", "abc.ABC") for base in cls.bases)


def derives_from_module(ctx, cls: ast.ClassDef, depth: int = 0) -> bool:
    """`cls` derives from a module class (`is_module_class`), directly or through classes of
    this file or of the project modules it imports (`class BetaTCVAE(BaseVAE)` with `from models
    import BaseVAE` and `class BaseVAE(nn.Module)` in models/base.py)."""
    for base in cls.bases:
        qual = ctx.qualname(base)
        if _kinds.is_module_class(qual):
            return True
        if not isinstance(base, ast.Name) or depth > 3:
            continue
        local = [s for s in ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == base.id]
        if len(local) == 1 and qual is None:
            if derives_from_module(ctx, local[0], depth + 1):
                return True
            continue
        found = imported_class(ctx, base)
        if found is not None and any(_kinds.is_module_class(found[1].qualname(b)) for b in found[0].bases):
            return True
    return False


# The words of a module class's name that say it scores each step's output: its loss, anywhere in
# the name (`FocalLoss`, `LossModule`), or a metric of it, as the name's last word
# (`AccuracyMetric`, not `MultipleMetricDepthEstimationHeads`).
SCORING_WORDS = {"loss": "loss", "criterion": "loss", "metric": "metric", "accuracy": "metric"}


def _scoring_module(calls, function: ast.AST) -> Optional[str]:
    """"loss" or "metric" for a method of a module that scores a step's output: an `nn.Module`
    whose class name has the word `loss` or `criterion` (`FocalLoss`, `MultiBoxLoss`,
    `YoloLoss`), or ends in `metric` or `accuracy` (`AccuracyMetric`), or that derives from a class so
    named (`nn.modules.loss._Loss`, `LossModule`). A training step computes its loss once per
    step, and its metrics with it, so such a module's `forward` runs on every step, whoever
    calls it."""
    cls = calls.class_of.get(id(function))
    if cls is None or not _module_method(calls, function):
        return None
    for name in [cls.name] + [(dotted(base) or "").rpartition(".")[2] for base in cls.bases]:
        words = name_tokens(name)
        for i, word in enumerate(words):
            kind = SCORING_WORDS.get(word)
            if kind == "loss" or kind == "metric" and i == len(words) - 1:
                return kind
    return None


# Reductions that count what a mask holds: `mask.sum()`, `torch.count_nonzero(m)`, `m.any()`.
_COUNTS = frozenset({"sum", "count_nonzero", "any", "numel"})  # `m.numel() > 0`: not empty


def _counted(ctx, expr: ast.AST, depth: int = 0) -> Optional[str]:
    """The mask `m` whose elements `m.sum()`, `m.any()`, `torch.count_nonzero(m)`, `m.numel()`
    count (a tensor's method or torch's function), also through a name bound only to such a count
    (`num_pos = pos.sum()`); None for anything else."""
    if isinstance(expr, ast.Name) and depth == 0:
        entries = _kinds.bindings(ctx, expr.id) or []
        masks = {_counted(ctx, e[1], 1) if e[0] == "value" else None for e in entries}
        return masks.pop() if len(masks) == 1 else None
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _COUNTS):
        return None
    qualname = ctx.qualname(expr.func)
    if qualname is not None:
        mask = expr.args[0] if qualname == f"torch.{expr.func.attr}" and expr.args else None
    else:
        mask = expr.func.value if not expr.args and _kinds.kind_of(ctx, expr.func.value) not in _kinds.NON_TENSORS \
            else None
    return mask.id if isinstance(mask, ast.Name) else None


def guards_empty_selection(ctx, branch: ast.If) -> bool:
    """`if pos.sum() > 0: ... x[pos] ...`, `if num_pos != 0:`, `if keep.any():`: a test that
    some element of a mask is set, whose body works on what the mask selects. The body is the
    usual path (a batch with matches), run on nearly every call; the `else` handles the empty
    selection."""
    test = branch.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Lt, ast.LtE)):
            left, right = right, left
            op = ast.Gt() if isinstance(op, ast.Lt) else ast.GtE()
        bound = right.value if isinstance(right, ast.Constant) and type(right.value) is int else None
        if not (isinstance(op, (ast.Gt, ast.NotEq)) and bound == 0 or isinstance(op, ast.GtE) and bound == 1):
            return False
        test = left
    mask = _counted(ctx, test)
    return mask is not None and any(mask in loaded_names(stmt) for stmt in branch.body)


def degenerate_size_test(test: ast.AST) -> bool:
    """`if len(time_steps) == 1:`, `if x.size(0) == 0:`: a test that singles out a degenerate
    size (none or one of something). Its `else` is the usual path, run on nearly every call."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    left, right = test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    return isinstance(right, ast.Constant) and type(right.value) is int and right.value in (0, 1) and _is_size(left)


def _is_size(expr: ast.AST) -> bool:
    """`len(x)`, `x.size(d)`, `x.size()[d]`, `x.shape[d]`, `x.numel()`."""
    if isinstance(expr, ast.Call):
        func = expr.func
        return (isinstance(func, ast.Name) and func.id == "len" and len(expr.args) == 1
                or isinstance(func, ast.Attribute) and (func.attr == "size" and len(expr.args) == 1
                                                        or func.attr == "numel" and not expr.args))
    if isinstance(expr, ast.Subscript):
        base = expr.value
        return (isinstance(base, ast.Attribute) and base.attr == "shape"
                or isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr == "size"
                and not base.args)
    return False


# Words of a switch for logging, checks or a schedule, not a setting of the computation: a gate.
# A word of the name starting with one of them counts (`log_interval`, `do_eval`, `validate`),
# and `val` only as a word of its own (`val_every`, not `calculate_loss_over_all_values`).
_GATE_WORDS = ("log", "print", "verbose", "debug", "interval", "every", "freq", "display", "report", "eval", "save",
               "valid")


def gate_name(identifier: Optional[str]) -> bool:
    """`identifier` names a switch for logging, checks or a schedule (`_GATE_WORDS`)."""
    return any(word == "val" or word.startswith(_GATE_WORDS) for word in name_tokens(identifier))


def _mode_branch(ctx, site) -> bool:
    """Every `if` around the call in its function tests the module's mode (`if self.training:` /
    `else:`) or the run's configuration (`configuration_test`, which takes a module's settings
    too): each branch runs on every step of its mode (training, or inference), or on every call
    of a program or module configured so."""
    tests = _tests_around(site.functions[-1].body, site.call, ())
    return tests is not None and all(reads_mode(test) or configuration_test(ctx, site.functions[-1], test, site.cls)
                                     for test in tests)


# Words of a setting that schedules work rather than configuring it: `args.warmup_steps`, `cfg.eval_every`.
_SCHEDULE_NAME = re.compile(r"epoch|step|iter|warmup|start|stop|resume", re.IGNORECASE)
_CONFIGURATION_OPS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


def configuration_test(ctx, function: Optional[ast.AST], test: ast.AST, cls: Optional[ast.ClassDef] = None) -> bool:
    """A test of the run's configuration, the same on every step, so that each of its branches
    runs on every step of the runs configured so: names only the module's top level binds (no
    function binds them, no `global` rebinds them: `if FIXED_ALPHA is None:`, `if USE_PER and not
    DOUBLE:`), attributes of parameters of `function` that it never assigns (a parsed command
    line, a config: `if args.clip_grad:`, `if cfg.model.use_ema and not args.fp16:`), and
    whether such a parameter was passed (`if fp16_scaler is None:`); tested as they are, with
    `not`, `and`/`or`, or compared with `==`, `!=`, `is` and constants. Not a logging, debug or
    schedule switch (`VERBOSE`, `args.log_interval`, `cfg.warmup_epochs`), which is a gate. In a
    method of `cls`, a test of its own attributes is one of its settings (`_tests_settings`)."""
    params = set() if function is None or isinstance(function, ast.Lambda) else {
        a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs}
    if cls is not None and any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(test)):
        return _tests_settings(ctx, cls, test)
    params.discard("self")
    names, attributes = [], []
    for node in ast.walk(test):
        if isinstance(node, ast.Name):
            names.append(node)
        elif isinstance(node, ast.Attribute):
            if not isinstance(node.value, (ast.Name, ast.Attribute)) or gate_name(node.attr) \
                    or _SCHEDULE_NAME.search(node.attr):
                return False
            attributes.append(node)
        elif isinstance(node, ast.Compare):
            if not all(isinstance(op, _CONFIGURATION_OPS) for op in node.ops):
                return False
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.Not):
                return False
        elif not isinstance(node, (ast.BoolOp, ast.Constant, ast.boolop, ast.cmpop, ast.unaryop, ast.expr_context)):
            return False
    if not names:
        return False
    read_as_attributes = {id(a.value) for a in attributes}
    for name in names:
        if name.id in params:
            if id(name) not in read_as_attributes and not _passed_or_not(test, name) \
                    and not _mode_flag(ctx, function, name) \
                    or name.id in _stored_names(ctx, function) and not _defaulted(function, test, name):
                return False  # `if done:`: an argument's value, data of the call; or rebound
        elif not (name.id in _kinds.scope_kinds(ctx, ctx.tree).assigned and name.id not in _global_names(ctx)
                  and not ctx.names.binds_locally(name.id) and ctx.qualname(name) is None
                  and not gate_name(name.id)):
            return False
    return True


def _stored_names(ctx, function: ast.AST) -> set:
    """The names `function` assigns, read once per function."""
    key = ("stored_names", id(function))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = bound_names(function)
    return found


def _global_names(ctx) -> set:
    """The names a `global` statement of the file rebinds."""
    found = ctx.shared.get("global_names")
    if found is None:
        found = ctx.shared["global_names"] = {
            name for node in ast.walk(ctx.tree) if isinstance(node, ast.Global) for name in node.names
        } if "global " in ctx.source else set()
    return found


def _defaulted(function: ast.AST, test: ast.AST, name: ast.Name) -> bool:
    """`if attn_mask is None: attn_mask = make_mask(...)`: a parameter given its default in the
    body of its own `is None` test and bound nowhere else; which branch runs is still the caller's
    choice, the same on every call from one place."""
    if not _passed_or_not(test, name):
        return False
    branch = next((n for n in ast.walk(function) if isinstance(n, ast.If) and n.test is test), None)
    if branch is None:
        return False
    inside = {id(n) for stmt in branch.body for n in ast.walk(stmt)}
    return all(id(n) in inside for n in ast.walk(function)
               if isinstance(n, ast.Name) and n.id == name.id and isinstance(n.ctx, ast.Store))


def _mode_flag(ctx, function: ast.AST, name: ast.Name) -> bool:
    """`if reverse:` in `def forward(self, x, reverse=False)`: a parameter of a module's `forward`
    with a `True`/`False` default that it never rebinds picks the model's mode for the call
    (sampling or training), as `self.training` does. Not a logging or debug switch
    (`verbose=False`), nor a helper's flag (`as_number=False`), which asks for what it returns."""
    if getattr(function, "name", None) not in ("forward", "__call__"):
        return False
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults))
    defaults.update((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    default = defaults.get(name.id)
    return (isinstance(default, ast.Constant) and isinstance(default.value, bool) and not gate_name(name.id)
            and name.id not in _stored_names(ctx, function))


def _passed_or_not(test: ast.AST, name: ast.Name) -> bool:
    """`name is None` / `name is not None` in `test`."""
    return any(isinstance(node, ast.Compare) and node.left is name and isinstance(node.ops[0], (ast.Is, ast.IsNot))
               and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
               for node in ast.walk(test))


def _tests_settings(ctx, cls: Optional[ast.ClassDef], test: ast.AST) -> bool:
    """`if self.bidirectional and self.nlayers > 1:`: attributes of `self` that only the class's
    set-up methods assign (`__init__`, `build`...) and nothing changes in place, or entries of
    one under a constant key (`self.opt["question_merge"] == "avg"`), compared with constants:
    the same on every call. Not a logging or debug switch (`if self.verbose:`, `self.opt["log"]`)."""
    if cls is None:
        return False
    attributes, members = [], set()
    for node in ast.walk(test):
        if id(node) in members:
            continue
        if isinstance(node, ast.Attribute):  # `self.nlayers`, `self.rnn.num_layers`
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                attributes.append(node.attr)
            elif _class_member(ctx, node):
                members.add(id(node.value))
            elif not isinstance(node.value, ast.Attribute):
                return False
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) and node.value.value.id == "self":
            members.add(id(node.slice))  # `self.opt["question_merge"]`: an entry of a settings dict
            if gate_name(str(node.slice.value)):
                return False
        elif not isinstance(node, (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Constant, ast.Name, ast.boolop,
                                   ast.unaryop, ast.cmpop, ast.expr_context)):
            return False
        elif isinstance(node, ast.Name) and node.id != "self":
            return False
    if not attributes:
        return False
    changed = _kinds.mutated_attributes(ctx, cls)
    for attr in attributes:
        values = _kinds.class_attribute_values(ctx, cls, attr)
        if not values or gate_name(attr) or attr in changed or not all(
                runs_once(getattr(method, "name", "")) for method, _ in values):
            return False
    return True


def _class_member(ctx, node: ast.Attribute) -> bool:
    """`MaskType.CHECKERBOARD`, `config.MODE`: a member of a class the module defines at its top
    level, or of a name it imports (an enum's, a module's), a constant to compare a setting with."""
    owner = node.value
    if not isinstance(owner, ast.Name) or ctx.names.binds_locally(owner.id):
        return False
    return (any(isinstance(stmt, ast.ClassDef) and stmt.name == owner.id for stmt in ctx.tree.body)
            or owner.id in import_table(ctx))


def _tests_around(body: list, call: ast.Call, tests: tuple) -> Optional[tuple]:
    """The tests of the `if` statements around `call` among `body`'s statements; None when it is
    not there, or sits in an `except` handler or a nested function. An `if` whose other arm calls
    the same function (`if sample: update(m, s) else: update(m)`) runs it on either path: its
    test is not one of them; nor is one that singles out a degenerate size for the `else` the
    call is in (`degenerate_size_test`)."""
    for stmt in body:
        if not (stmt.lineno <= call.lineno and call.end_lineno <= (stmt.end_lineno or stmt.lineno)):
            continue
        if isinstance(stmt, _SCOPES) or isinstance(stmt, _TRY) and any(
                h.lineno <= call.lineno <= h.end_lineno for h in stmt.handlers):
            return None
        if isinstance(stmt, ast.If) and not any(node is call for node in ast.walk(stmt.test)):
            inside = stmt.body if any(node is call for s in stmt.body for node in ast.walk(s)) else stmt.orelse
            other = stmt.orelse if inside is stmt.body else stmt.body
            either = bool(other) and _calls_the_same(other, call) or inside is stmt.orelse and degenerate_size_test(
                stmt.test)
            return _tests_around(stmt.body + stmt.orelse, call, tests if either else tests + (stmt.test,))
        blocks = [s for f in ("body", "orelse", "finalbody") for s in getattr(stmt, f, None) or []
                  if isinstance(s, ast.stmt)]
        if any(s.lineno <= call.lineno <= (s.end_lineno or s.lineno) for s in blocks):
            return _tests_around(blocks, call, tests)
        return tests  # in the statement's own expressions
    return None


def _trains_in_every(arms: Optional[list]) -> bool:
    return bool(arms) and all(trains_in(arm) for arm in arms)


def _arms_around(body: list, call: ast.Call) -> Optional[list]:
    """The arms (`body` or `orelse`) of the `if` statements around `call` among `body`'s
    statements, outermost first; None where `call` is in a test, a handler or a nested scope."""
    arms = []
    while True:
        stmt = next((s for s in body if s.lineno <= call.lineno and call.end_lineno <= (s.end_lineno or s.lineno)), None)
        if stmt is None or isinstance(stmt, _SCOPES) or isinstance(stmt, _TRY) and any(
                h.lineno <= call.lineno <= h.end_lineno for h in stmt.handlers):
            return None
        if isinstance(stmt, ast.If):
            if stmt.test.lineno <= call.lineno <= stmt.test.end_lineno:
                return None
            arm = stmt.body if stmt.body and call.lineno <= (stmt.body[-1].end_lineno or 0) else stmt.orelse
            arms.append(arm)
            body = arm
            continue
        blocks = [s for f in ("body", "orelse", "finalbody") for s in getattr(stmt, f, None) or []
                  if isinstance(s, ast.stmt)]
        if not any(s.lineno <= call.lineno <= (s.end_lineno or s.lineno) for s in blocks):
            return arms
        body = blocks


def _calls_the_same(body: list, call: ast.Call) -> bool:
    """A statement of `body` (not in a nested function or another `if`) calls what `call` calls,
    spelled the same way (`utils.update_metrics`)."""
    name = dotted(call.func)
    if name is None:
        return False
    return any(isinstance(n, ast.Call) and dotted(n.func) == name
               for stmt in body if not isinstance(stmt, ast.If) for n in walk_no_scopes(stmt))


def reads_mode(test: ast.AST) -> bool:
    """`self.training`, `not self.training`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    return isinstance(test, ast.Attribute) and test.attr == "training"


_FORWARD_CALL = re.compile(r"\bself(?:\.forward)?\(")


def _spells_forward_call(ctx, function: ast.AST) -> bool:
    """The text of `function` spells `self(` or `self.forward(` (the lines that do, found once
    per file): only then can `_runs_forward` find a call of the module's forward."""
    lines = ctx.shared.get("forward_call_lines")
    if lines is None:
        text, lines, line, offset = ctx.source, [], 1, 0
        for match in _FORWARD_CALL.finditer(text):
            line += text.count("\n", offset, match.start())
            offset = match.start()
            lines.append(line)
        ctx.shared["forward_call_lines"] = lines
    end = function.end_lineno or function.lineno
    return any(function.lineno <= line <= end for line in lines)


def _runs_forward(function: ast.AST) -> bool:
    """The method calls its module's forward once per call (`self.forward(state)`, `self(x)`),
    outside its own loops: an RL policy's `get_action` or `evaluate`, a `predict`."""
    params = function.args.posonlyargs + function.args.args
    if not params:
        return False
    me = params[0].arg
    for node in _outside_loops(function.body):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == me or isinstance(func, ast.Attribute) and \
                    func.attr == "forward" and isinstance(func.value, ast.Name) and func.value.id == me:
                return True
    return False


def _iterates_loader(loop: ast.AST) -> bool:
    it = getattr(loop, "iter", None)
    while isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    name = dotted(it) if it is not None else None
    return bool(name) and name.lower().rpartition(".")[2].endswith("loader")


def _loop_step(loop: ast.AST, calls=None) -> Optional[Step]:
    # Its own statements, not those of loops in it: an epoch loop around the training loop runs
    # what it calls directly (a validation pass) once per epoch. `calls`: the FileCalls of the
    # loop's file, to tell one update (`agent.learn()`) from a whole loop of them.
    nodes = list(_outside_loops(loop.body))
    backward, step = _trains(nodes)
    if backward or step:
        return Step(f"is called from the training loop on line {loop.lineno}", True)
    if _iterates_loader(loop):
        return Step(f"is called from the loop over batches on line {loop.lineno}", False)
    update = next((node for node in nodes if _one_update(node) and not _runs_many_updates(calls, node)), None)
    if update is not None:
        return Step(f"is called from the loop on line {loop.lineno}, which trains on each pass through "
                    f"`{dotted(update.func) or identifier(update.func)}()`", True)
    return None


_UPDATE_WORDS = frozenset({"learn", "update", "step", "optimize", "optimise"})


def _runs_many_updates(calls, call: ast.Call) -> bool:
    """`call` runs a function of the file that holds a training loop of its own (PPO's
    `self._update_network()`, epochs of minibatches): each call is many steps, not one."""
    if calls is None:
        return False
    func = call.func
    targets = []
    if isinstance(func, ast.Name):
        targets = [calls.module_functions.get(func.id)]
    elif isinstance(func, ast.Attribute):
        owner = dotted(func.value)
        cls = calls.instance_classes.get(owner) if owner is not None else None
        if cls is not None:
            targets = [calls.methods[id(cls)].get(func.attr)]
        elif owner == "self":
            targets = [table.get(func.attr) for table in calls.methods.values()]
    return any(t is not None and _trains_in_nested_loop(t) for t in targets)


def _one_update(node: ast.AST) -> bool:
    """A call of one training update, by its name (`agent.learn()`, `self.update(batch)`,
    `optimize_model()`, `train_step(...)`), as `may_run_training_step` reads it; not a call
    that runs a whole loop of them (`train_epoch(...)`, `fit(...)`)."""
    if not isinstance(node, ast.Call):
        return False
    tokens = set(name_tokens(identifier(node.func) or ""))
    return bool(tokens & _UPDATE_WORDS) and "epoch" not in tokens and "epochs" not in tokens \
        and may_run_training_step(node, True)


def calls_a_step_method(ctx) -> bool:
    """The file spells a call of a `.step(` method (an optimizer's, among others)."""
    found = ctx.shared.get("calls_a_step_method")
    if found is None:
        found = ctx.shared["calls_a_step_method"] = ".step(" in identifier_text(ctx)
    return found


def step_functions(ctx) -> dict:
    """id(function) -> Step, for the functions of the file that run every step."""
    found = ctx.shared.get("step_functions")
    if found is not None:
        return found
    calls = file_calls(ctx)
    found = {}
    trains = calls_a_step_method(ctx)  # an optimizer's step, with or without the backward pass
    closures = []  # the closures that functions which set up their optimizer hand to its `step`
    for function in calls.functions:
        nodes = list(_outside_loops(function.body)) if trains else []
        backward, step = _trains(nodes, optimizer_names(ctx))
        if step and not backward:
            stepped = _closures_of_own_optimizer(function, nodes)
            if stepped:
                closures.extend(stepped)
                step = False  # it sets up the optimization and runs it whole: the closure is the step
        if backward and step:
            found[id(function)] = Step("is a training step", True)
        elif step:
            found[id(function)] = Step("steps the optimizer, once per training step", True)
        elif function.name in STEP_HOOKS:
            found[id(function)] = Step(f"is the `{function.name}` hook", function.name == "training_step")
        elif function.name == "forward" and (scoring := _scoring_module(calls, function)) is not None:
            found[id(function)] = Step(f"is the `forward` of a {scoring} module, run on every training step", True,
                                       True, True)
        elif function.name == "forward" and _module_method(calls, function) and not _trains_in_nested_loop(function):
            # (a `forward` that runs a training loop, a trainer's, runs once)
            found[id(function)] = Step("is a module's `forward`, run on every step", False, True)
        elif "loss" in name_tokens(function.name) and not runs_once(function.name) \
                and id(function) in calls.class_of and derives_from_module(ctx, calls.class_of[id(function)]):
            found[id(function)] = Step(f"is `{function.name}` of a module, the loss of every training step", True,
                                       False, True)
        elif (_module_method(calls, function) and not runs_once(function.name)
              and _spells_forward_call(ctx, function) and _runs_forward(function)):
            found[id(function)] = Step("runs the module's `forward`", False, True, runs_model=True)
    for function in calls.functions if in_script_project(ctx) else ():
        if id(function) in found or not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        trainer = _training_step_called(ctx, calls, function)
        if trainer is not None:
            found[id(function)] = Step(f"runs a training step through `{identifier(trainer.func)}()`", True)
    for closure in closures:
        found.setdefault(id(closure), Step("is the closure an optimizer's `step` evaluates, every step", True))
    for function, step, _ in passed_to_steps(ctx):
        found.setdefault(id(function), step)
    for name, step in steps_from_importers(ctx).items():
        function = calls.module_functions.get(name) or _module_lambdas(ctx).get(name)
        if function is None and name in calls.classes:  # `ProbMask(...)` in a forward: its `__init__`
            function = calls.methods[id(calls.classes[name])].get("__init__")
            step = step._replace(why=f"sets up a `{name}`, which {step.why}")
        elif function is None and "." in name:  # `agent.choose_action(s)` on an `Agent` of this file
            owner, _, method = name.partition(".")
            if owner in calls.classes:
                function = calls.methods[id(calls.classes[owner])].get(method)
        if function is not None and id(function) not in found:
            found[id(function)] = step
    # What a step function calls runs every step too, followed to a fixed point. A site whose
    # caller is no step function is read once: what its loops make of it does not change.
    outside = {}  # id(site) -> its Step (or None) from its loops alone
    changed = True
    while changed:
        changed = False
        for function in calls.functions:
            if id(function) in found:
                continue
            for site in calls.call_sites(function):
                if site.functions and id(site.functions[-1]) in found:
                    step = _step_at(ctx, found, site)
                elif id(site) in outside:
                    step = outside[id(site)]
                else:
                    step = outside[id(site)] = _step_at(ctx, found, site)
                if step is not None:
                    found[id(function)] = step
                    break
            changed = changed or id(function) in found
    ctx.shared["step_functions"] = found
    return found


def _step_at(ctx, found: dict, site, where: str = "") -> Optional[Step]:
    """The Step of what `site` calls, when it runs on every step: called from a function of
    `found` (the step functions of its file) on every call of it, or from a loop that trains or
    goes over batches. `where`: the caller's file, named when it is not the linted file."""
    loops = site.loops
    caller = found.get(id(site.functions[-1])) if site.functions else None
    if site.conditional and not (site.functions and _mode_branch(ctx, site)):
        if caller is not None or not loops or _tests_around(loops[-1].body, site.call, ()) != () and not _trains_in_every(
                _arms_around(loops[-1].body, site.call)):
            # `if self.debug: self.log_grads()`: not every step; but a branch that trains
            # (`if (i + 1) % n_critic == 0: ... g_opt.step(); accumulate(g_ema, g)`) is a step
            return None
        # under a branch outside its loop (`if step % 250 == 0: for ex in examples: score(ex)`):
        # that loop, where it runs, calls it on every pass; the loops outside the branch do not
        loops = loops[-1:]
    if caller is not None:
        # a rollout loop in a training step (`actions = policy(to_np(q))`, then `env.step(actions)`)
        # hands what the call returns to the environment, like a loop step's call does
        return Step(f"is called from `{site.functions[-1].name}`{where}, which {caller.why}", caller.training,
                    caller.forward, caller.loss, from_file=caller.from_file,
                    feeds_host=bool(loops) and _result_to_environment(site))
    calls = file_calls(ctx)
    loop_step = next((s for s in (_loop_step(loop, calls) for loop in reversed(loops)) if s is not None), None)
    if loop_step is None and loops:
        loop_step = _step_loop_here(ctx, site, loops)
    if loop_step is not None and where:
        loop_step = loop_step._replace(why=loop_step.why + where)
    if loop_step is not None and _result_to_environment(site):
        loop_step = loop_step._replace(feeds_host=True)
    return loop_step


def _step_loop_here(ctx, site, loops: tuple) -> Optional[Step]:
    """The Step of a call in one of `loops` (read from the call's function) that samples with a
    model (`scheduler.step(x, eps, t)` after `eps = model(x, t)`) or moves the items it goes over
    to the device (`tokens = tokens.to(device)` per example): once per iteration."""
    at = Position(ctx, site.functions, site.cls)
    for loop in reversed(loops):
        if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
            continue
        info = LoopInfo(loop, at)
        if samples_with_model(at, info):
            return Step(f"is called from the sampling loop on line {loop.lineno}", False)
        if _moves_its_items(at, info) and not _stops_after_a_count(info):
            return Step(f"is called from the loop over batches on line {loop.lineno}", False)
    return None


def _stops_after_a_count(loop: LoopInfo) -> bool:
    """The loop leaves once a counter it keeps reaches a bound (`count += 1`, then `if count ==
    num_examples: break`): it looks at the first few items, a preview, not a pass over the data."""
    counters = {node.target.id for node in loop.direct_nodes() if isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Name) and isinstance(node.op, ast.Add)}
    return bool(counters) and any(isinstance(test, ast.Compare) and loaded_names(test) & counters
                                  for test in _break_tests(loop))


def _break_tests(loop: LoopInfo):
    """The tests of the loop's own `if ...: break` statements."""
    return (node.test for node in loop.direct_nodes()
            if isinstance(node, ast.If) and any(isinstance(s, ast.Break) for s in node.body))


_ARRAY_MODULES = frozenset({"torch", "np", "numpy", "F", "nn"})


def _result_to_environment(site) -> bool:
    """What the call returns goes, in the same loop, into an environment's step: `action =
    agent.act(state)`, then `state, reward, done, _ = env.step(action)` (or
    `env.step(agent.act(state))`). An environment's step: a call of neither torch nor numpy, on
    something named for an environment or unpacked into three values or more (state, reward,
    done)."""
    loop = site.loops[-1]
    names = set()
    holder = None
    for node in walk_no_scopes(loop):
        if isinstance(node, ast.Assign) and any(n is site.call for n in walk_no_scopes(node.value)):
            names = set().union(*(bound_names(t) for t in node.targets))  # `a = np.array(agent.act(s))`
            holder = node
    for node in walk_no_scopes(loop):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)) or node is holder:
            continue
        call = node.value
        callee = identifier(call.func) or ""
        if callee.split(".")[0] in _ARRAY_MODULES:
            continue
        environment = "env" in name_tokens(callee) or "envs" in name_tokens(callee) or (
            len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) >= 3)
        if environment and any(arg is site.call or isinstance(arg, ast.Name) and arg.id in names for arg in call.args):
            return True
    return False


def passed_to_steps(ctx) -> list:
    """(function, Step, the callee's file or None for this one) for the functions of the file
    passed as an argument to a function that calls that parameter from its training loop
    (`trainer.train(get_loss)`, whose loop runs `loss = get_loss(model, batch)`): of this file,
    or a method of a class of this file or of a project module (`trainer = train.Trainer(...)`),
    or a function imported from one. Worked out once per file, in a project's tree, not a
    library's (`SCRIPT_PROJECT_FILES`)."""
    found = ctx.shared.get("passed_to_steps")
    if found is None:
        found = ctx.shared["passed_to_steps"] = _passed_to_steps(ctx)
    return found


_ARGUMENT_NAME = re.compile(r"[(,][ \t]*([A-Za-z_]\w*)[ \t]*(?=[,)])")
_DEF_NAME = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)", re.M)


def _passed_to_steps(ctx) -> list:
    if not in_script_project(ctx):
        return []  # a library's tree: its functions are handed to other modules, not training loops
    text = identifier_text(ctx)
    candidates = set(_DEF_NAME.findall(text)) & set(_ARGUMENT_NAME.findall(text))
    if not candidates:
        return []  # no function of the file is spelled as an argument
    calls = file_calls(ctx)
    names = {f.name: f for f in calls.functions if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             and f.name in candidates}
    passed = list(names)
    if not passed:
        return []
    found = []
    for node in ast.walk(ctx.tree):
        if node.__class__ is not ast.Call or not any(
                isinstance(a, ast.Name) and a.id in passed for a in node.args + [k.value for k in node.keywords]):
            continue
        callee = _callee_definition(ctx, calls, node.func)
        if callee is None:
            continue
        definition, path = callee
        where = f" in {os.path.basename(path)}" if path else ""
        params = [a.arg for a in definition.args.posonlyargs + definition.args.args]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        given = [(params[i], a) for i, a in enumerate(node.args) if i < len(params)] + [
            (k.arg, k.value) for k in node.keywords if k.arg is not None]
        for param, arg in given:
            if isinstance(arg, ast.Name) and arg.id in passed:
                loop = _loop_calling(definition, param)
                if loop is not None:
                    found.append((names[arg.id], Step(f"is passed to `{definition.name}`{where}, which calls it "
                                                      f"from its training loop on line {loop.lineno}", True), path))
    return found


def _callee_definition(ctx, calls, func: ast.AST) -> Optional[tuple]:
    """(the function or method a call of `func` runs, its file or None for this one), for a function of
    the file or imported from a project module, or a method of an instance made from a class of
    either in the same function (`trainer = train.Trainer(...)`, `trainer.train(...)`)."""
    if isinstance(func, ast.Name) and func.id in calls.module_functions:
        return calls.module_functions[func.id], None
    found = imported_function(ctx, func)
    if found is not None:
        return found
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    made = _assigned_values(ctx).get(func.value.id, [])
    if len(made) != 1 or not isinstance(made[0], ast.Call):
        return None
    maker = made[0].func
    if isinstance(maker, ast.Name) and maker.id in calls.classes:
        method = calls.methods[id(calls.classes[maker.id])].get(func.attr)
        return (method, None) if method is not None else None
    found = imported_definition(ctx, maker, (ast.ClassDef,))
    if found is None:
        return None
    method = next((m for m in found[0].body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and m.name == func.attr), None)
    return (method, found[1]) if method is not None else None


def _assigned_values(ctx) -> dict:
    """{name: [value]} of the file's assignments to a plain name, in any scope."""
    found = ctx.shared.get("assigned_values")
    if found is None:
        found = ctx.shared["assigned_values"] = {}
        for n in ast.walk(ctx.tree):
            if n.__class__ is ast.Assign and len(n.targets) == 1 and n.targets[0].__class__ is ast.Name:
                found.setdefault(n.targets[0].id, []).append(n.value)
    return found


def _loop_calling(function: ast.AST, param: str) -> Optional[ast.AST]:
    """The training or batch loop of `function` (`_loop_step`) whose body calls `param(...)`."""
    for loop in walk_no_scopes(function):
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and _loop_step(loop) is not None and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == param
                for stmt in loop.body for n in walk_no_scopes(stmt)):
            return loop
    return None


_IMPORTER_STEPS: dict = {}  # path -> (size, mtime_ns, {(path, name): Step})
_READING: list = []  # the importer being read: its own importers are not followed
# Around a file with more Python files than this (a library's package), the files that import it
# are not read for the steps that call it: each would be analysed once more, for a library's
# modules whose callers are mostly other modules, not training loops.


def steps_from_importers(ctx) -> dict:
    """{name: Step} for the module-level functions and classes of the linted file that a project
    file importing it (`importers`) calls on every step: `create_masks(...)` in train.py's loop
    over batches, `ProbMask(...)` in another module's `forward`, `logger.log_data(...)`
    ("Logger.log_data") in its training loop. A class called so runs its `__init__` every step.
    Also two files away, through a module-level function of an importer that calls it on every
    call of its own, which the importer's importers call every step (`accuracy` in
    `update_metrics` of utils.py, which evaluate.py's loop calls). What makes a function of a
    file run every step is read in that file alone. Not in a library-sized tree
    (`SCRIPT_PROJECT_FILES`)."""
    found = ctx.shared.get("steps_from_importers")
    if found is None:
        found = ctx.shared["steps_from_importers"] = _steps_in_importers(ctx)
    return found


def _steps_in_importers(ctx) -> dict:
    if not ctx.filename or _READING:
        return {}
    target = os.path.abspath(ctx.filename)
    found = {}
    paths = importers(ctx.filename, most=SCRIPT_PROJECT_FILES)
    for path in paths:
        for (defined_in, name), step in _importer_steps(path).items():
            if defined_in == target or _reexported(defined_in, target, name):
                found.setdefault(name, step)
    # Two files away: `accuracy(...)` in `update_metrics` of utils.py, which evaluate.py's loop
    # over batches calls. What runs the relaying function every step is read in its importer alone.
    for path in paths:
        relays = _relay_functions(path).get(target)
        if not relays:
            continue
        for importer in importers(path, most=SCRIPT_PROJECT_FILES):
            if os.path.abspath(importer) == target:
                continue
            steps = _importer_steps(importer)
            for name, callers in relays.items():
                if name in found:
                    continue
                for caller in callers:
                    step = steps.get((os.path.abspath(path), caller)) or next(
                        (each for (defined_in, called), each in steps.items()
                         if called == caller and _reexported(defined_in, os.path.abspath(path), caller)), None)
                    if step is not None:
                        found[name] = step._replace(why=f"is called from `{caller}` in {os.path.basename(path)}, "
                                                        f"which {step.why}")
                        break
    return found


def _reexported(init: str, target: str, name: str) -> bool:
    """The package's `__init__.py` at `init` binds `name` from the module at `target`: `from
    .train_utils import *` (where `target` defines `name`), or `from .train_utils import name`."""
    if os.path.basename(init) != "__init__.py" or init == target:
        return False
    table = project_imports(parsed(init), init) if parsed(init) is not None else {}
    if table.get(name) == (target, name):
        return True
    tree = parsed(target)
    return target in table.get("*", ()) and tree is not None and any(
        isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name
        for stmt in tree.body)


_RELAYS: dict = {}  # path -> (size, mtime_ns, {defined_in: {name: [module-level functions of path calling it]}})


def _relay_functions(path: str) -> dict:
    """{file: {name: [the module-level functions of the file at `path` that call `name` of that
    file on every call of theirs (or of every call configured so: `if samples is not None:`), and
    those of the file that call one of them so (`run_one_iter` calling `render`, which calls
    it)]}}, for the definitions of other project files it calls."""
    return while_unchanged(_RELAYS, path, _read_relays, {})


def _read_relays(path: str) -> dict:
    read = _kinds.importer_calls(path)
    if read is None:
        return {}
    view, calls = read

    def every_call(site) -> bool:
        return (len(site.functions) == 1 and site.cls is None and not site.loops
                and (not site.conditional or _mode_branch(view, site)))

    # the module-level functions of the file that call each of its own on every call of theirs
    # (`run_one_iter` calling `render`), to follow a relay through the file's own helpers
    own_callers = {function.name: [site.functions[0].name for site in calls.call_sites(function) if every_call(site)]
                   for function in calls.module_functions.values()}
    found: dict = {}
    for (defined_in, name), sites in calls.imported_sites.items():
        for site in sites:
            if every_call(site):
                callers = found.setdefault(os.path.abspath(defined_in), {}).setdefault(name, [])
                if site.functions[0].name not in callers:
                    callers.append(site.functions[0].name)
    for relays in found.values():
        for callers in relays.values():
            for caller in callers:  # grows as it goes: callers of callers, within the file
                callers.extend(c for c in own_callers.get(caller, ()) if c not in callers)
    return found


def _importer_steps(path: str) -> dict:
    """{(path, name): Step} for each definition of another project file that the file at `path`
    calls on every step (`_step_at`), worked out once per process while the file is unchanged."""
    return while_unchanged(_IMPORTER_STEPS, path, _read_importer_steps, {})


def _read_importer_steps(path: str) -> dict:
    _READING.append(path)
    try:
        return _steps_called_by(path)
    finally:
        _READING.pop()


def _steps_called_by(path: str) -> dict:
    found = {}
    read = _kinds.importer_calls(path)
    if read is None:
        return found
    view, calls = read
    if not calls.imported_sites:
        return found  # no call of another project file's definitions (a package's `__init__.py` that re-exports)
    steps = step_functions(view)
    where = f" in {os.path.basename(path)}"
    for key, sites in calls.imported_sites.items():
        step = next((s for s in (_step_at(view, steps, site, where) for site in sites) if s is not None), None)
        if step is not None:
            found[key] = step._replace(from_file=path)
    return found


def function_name(function: ast.AST) -> str:
    """The name of a `def`, or of the module-level name a lambda is bound to (`_module_lambdas`)."""
    return getattr(function, "name", None) or getattr(function, "bound_name", "lambda")


def _module_lambdas(ctx) -> dict:
    """{name: the lambda} for the names the module binds once, at its top level, to a lambda
    (`zeros = lambda *x: torch.zeros(*x).cuda()`): a helper as a `def` is."""
    found = ctx.shared.get("module_lambdas")
    if found is None:
        bound, found = {}, {}
        for stmt in ctx.tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
                stmt, (ast.AnnAssign, ast.AugAssign)) else []
            for name in (n for t in targets for n in bound_names(t)):
                bound[name] = bound.get(name, 0) + 1
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and isinstance(stmt.value, ast.Lambda):
                found[stmt.targets[0].id] = stmt.value
        found = ctx.shared["module_lambdas"] = {name: value for name, value in found.items() if bound[name] == 1}
        for name, value in found.items():
            value.bound_name = name  # the name a message calls it by (`function_name`)
    return found


def step_of(ctx, functions) -> Optional[Step]:
    """The Step of the innermost of `functions` (the engine's function stack) that runs every step."""
    table = step_functions(ctx)
    for function in reversed(functions):
        step = table.get(id(function))  # a lambda is one when the module binds it to a name a step calls
        if step is not None:
            return step
    return None


# A function run once, by its first name token: `__init__`, `init_weights`, `initialize`, `build_model`,
# `setUp`, `load`, `load_model`, `loadModel`, `reset_parameters`; not `loader_step` or `builder`.
_ONE_TIME_FUNCTION = re.compile(
    r"^_*(?:[Ii]nit(?:iali[sz](?:e|ation))?|[Bb]uild|[Ss]et_?[Uu]p|[Ll]oad|reset_parameters)(?![a-z])")
# ... unless another token of its name says it trains (`load_and_train`, `build_and_fit`).
_TRAINING_WORD = re.compile(r"(?:^|_|(?<=[a-z]))(?:[Tt]rain(?:ing)?|[Ff]it)(?![a-z])")
# Bases that make a class a plain Python class, not an nn.Module.
_PLAIN_BASES = {"abc.ABC", "typing.Generic", "typing.Protocol", "typing.NamedTuple", "enum.Enum"}


def runs_once(name: str) -> bool:
    """By its name, a function that runs once (set-up, loading): its first word is `init`,
    `initialize`, `build`, `setup` or `load`, or it is `reset_parameters`; unless another word of
    the name says it trains (`load_and_train`, `build_and_fit`)."""
    return bool(_ONE_TIME_FUNCTION.match(name)) and not _TRAINING_WORD.search(name)


def plain_class(ctx, cls: ast.ClassDef, depth: int = 0) -> bool:
    """A class known not to be an nn.Module (no bases, `object`, `ABC`, or plain classes of this
    file): its `forward` is not called per step of a model, and it has no `register_buffer`."""
    for base in cls.bases:
        if isinstance(base, ast.Subscript):  # Generic[T]
            base = base.value
        if isinstance(base, ast.Name) and base.id == "object" or ctx.qualname(base) in _PLAIN_BASES:
            continue
        if not isinstance(base, ast.Name) or depth > 3 or ctx.qualname(base) is not None:
            return False
        defined = [s for s in ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == base.id]
        if len(defined) != 1 or not plain_class(ctx, defined[0], depth + 1):
            return False
    return True


def _walk_this_loop(node: ast.AST):
    """The nodes of `node` outside nested loops and functions, whose `continue` is not this loop's."""
    yield node
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_this_loop(child)


def repeating_loops(ctx) -> list:
    """The enclosing loops (`ctx.loops`) that may run the node being visited on every iteration:
    not those that its block leaves right after it (`if too_close: return torch.tensor(True, ...)`
    runs at most once per call, `...; break` once per run of the loop it ends). A `continue` in
    the rest of the block, or a `raise` that a `try` in the loop may catch, keeps a loop."""
    loops = ctx.loops
    if not loops:
        return loops
    parents = ctx.parents
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


# Tests true only while a model is traced, scripted or exported, never in an eager step.
_EXPORTING = frozenset({"is_tracing", "_is_tracing", "is_scripting", "is_in_onnx_export"})


def _while_exporting(ctx) -> bool:
    """The node is in the body of an `if` that runs only while the model is traced, scripted or
    exported (`if torch.jit.is_tracing():`, `if torchvision._is_tracing():`, `if
    torch.onnx.is_in_onnx_export():`, also one of several conditions joined by `and`): code that
    no step of eager training or inference runs."""
    parents = ctx.parents
    for k, node in enumerate(parents[:-1]):
        if node.__class__ is ast.If and any(s is parents[k + 1] for s in node.body):
            tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) \
                else [node.test]
            if any(isinstance(t, ast.Call) and (getattr(t.func, "attr", None) or getattr(t.func, "id", None))
                   in _EXPORTING for t in tests):
                return True
    return False


class PerStep(NamedTuple):
    loops: list            # the enclosing loops that run the node on every iteration (`repeating_loops`)
    step: Optional[Step]   # with no such loop, outside a module's `forward`: the step its function runs in
    function: Optional[ast.AST]

    @property
    def where(self) -> str:
        """What the node runs on every one of: "iteration", "forward call", "call of `f`, which
        is a training step"."""
        if self.loops:
            return "iteration"
        if self.step is None:
            return "forward call"
        return f"call of `{function_name(self.function)}`, which {self.step.why}"


def _memoised(function: ast.AST) -> bool:
    """A function under a caching decorator (`functools.lru_cache`, `functools.cache`,
    `cached_property`, a project's `lru_cache_unless_export`): its body runs once per distinct
    arguments, not on every call."""
    for decorator in getattr(function, "decorator_list", ()):
        if isinstance(decorator, ast.Call):
            decorator = decorator.func
        name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
        if "cache" in name.lower():
            return True
    return False


def per_step(ctx) -> Optional[PerStep]:
    """Whether the node being visited runs on every step, and where: on every iteration of a loop
    around it that repeats it (at module level, in a module's `forward`, or in a function that
    does not run once by its name, `runs_once`; in one that does, only where a loop trains), on
    every forward call (directly in the `forward` of a class not known to be plain,
    `plain_class`), or on every call of a function that runs every step (`step_of`). None
    elsewhere."""
    function = ctx.function
    if _while_exporting(ctx):
        return None
    loops = repeating_loops(ctx)
    if function is None:
        return PerStep(loops, None, None) if loops else None
    name = getattr(function, "name", "")
    if name == "forward":
        if loops or ctx.class_ is not None and len(ctx.functions) == 1 and not plain_class(ctx, ctx.class_):
            return PerStep(loops, None, function)
        return None
    if not loops:
        if _memoised(function):
            return None
        step = step_of(ctx, ctx.functions)
        return PerStep(loops, step, function) if step is not None else None
    if not runs_once(name) or any(is_training_loop(ctx, loop) for loop in loops):  # `.backward()`: not run once
        return PerStep(loops, None, function)
    return None


# -- loops over batches -------------------------------------------------------------------------

_LOADER_WRAPPERS = ("enumerate", "iter", "tqdm", "zip")


def iterates_loader(ctx, loop: LoopInfo) -> bool:
    """The loop iterates over a data loader (through enumerate/iter/tqdm/zip, or any wrapper
    that takes it: `metric_logger.log_every(data_loader, 10)`), or over batches it moves to a
    device itself (`for batch in val_iter: text = batch.text.cuda()`)."""
    key = ("iterates_loader", id(loop.node))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _iterates_a_loader(ctx, loop.iter) or _moves_its_items(ctx, loop) or \
            _iterates_device_batches(ctx, loop) or _fetches_device_batches(ctx, loop)
    return found


def _iterates_a_loader(ctx, it, depth: int = 0) -> bool:
    if it is None or not _kinds.may_mention(ctx, "loader", ignore_case=True):
        return False  # a loader kind needs "loader" in a name or `DataLoader`
    while isinstance(it, ast.Call) and it.args:
        if isinstance(it.func, ast.Name) and it.func.id in _LOADER_WRAPPERS or ctx.qualname(it.func) in (
                "tqdm.tqdm", "tqdm.auto.tqdm"):
            it = it.args[0]
            continue
        if ctx.qualname(it.func) == "itertools.cycle":
            return False  # an endless stream: the loop runs until the host decides it is done (a loop that trains is a step anyway)
        return any(_is_loader(ctx, arg) for arg in it.args)  # `log_every(data_loader, 10, header)`
    if isinstance(it, ast.Name) and depth < 2 and not _is_loader(ctx, it):
        # `epoch_iterator = tqdm(test_loader, desc=...)`, then `enumerate(epoch_iterator)`
        values = _bound_values(ctx, _enclosing_scope(ctx), it.id)
        return bool(values) and all(isinstance(v, ast.Call) and _iterates_a_loader(ctx, v, depth + 1)
                                    for _, v in values)
    return _is_loader(ctx, it)


def _is_loader(ctx, expr: ast.AST) -> bool:
    kind = _kinds.kind_of(ctx, expr)
    if kind == _kinds.LOADER:
        return True
    # `train_loader`, `dataloader`; not `loader_names` or `val_loaders` (an item is a whole loader);
    # also one annotated only as a sequence (`data_loader: Iterable`)
    return kind in (None, _kinds.LIST) and (identifier(expr) or "").lower().endswith("loader")


_MOVES = ("cuda", "to")


def trains_here_or_through_project(ctx) -> bool:
    """The file trains (`file_trains`), or calls a function or class that a module of the project
    defines and that calls `.backward()` and an optimizer's `.step()` (`compute_loss =
    LossCompute(crit, opt)` whose `__call__` steps): a training program whose steps live in
    another file."""
    found = ctx.shared.get("trains_through_project")
    if found is None:
        found = ctx.shared["trains_through_project"] = file_trains(ctx) or any(
            _definition_trains(definition) for _, definition, _ in imported_definitions(ctx, ("backward(", ".step(")))
    return found


def _definition_trains(definition: ast.AST) -> bool:
    """A function, or a method of a class, that calls `.backward()` and an optimizer's `.step()`
    (asked once per definition: the parsed modules are shared by the files that import them)."""
    found = _DEFINITION_TRAINS.get(id(definition))
    if found is None or found[0] is not definition:
        functions = [definition] if not isinstance(definition, ast.ClassDef) else [
            s for s in definition.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        found = _DEFINITION_TRAINS[id(definition)] = (definition, any(all(_trains(walk_no_scopes(f)))
                                                                      for f in functions))
    return found[1]


_DEFINITION_TRAINS: dict = {}  # id(definition) -> (definition, whether it trains)


def _moves_its_items(ctx, loop: LoopInfo) -> bool:
    """In a file that trains (`trains_here_or_through_project`), the loop body moves what the loop
    gives it (or values computed from that) to a device (`.cuda()`, `.to(device)`): each iteration brings a batch to the GPU.
    Loops over a model's parameters or buffers move weights, not batches; in code that never
    trains (an inference pipeline), a loop that moves its items goes over prompts or encoders. A
    `while` loop's items are what its counter picks (`while i < n: batch = data[i:i + bs]; ...;
    i += bs`): the names its test reads that its body changes."""
    node = loop.node
    if not isinstance(node, (ast.For, ast.AsyncFor, ast.While)) or not trains_here_or_through_project(ctx):
        return False
    it = getattr(node, "iter", None)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in (
            "parameters", "named_parameters", "buffers", "named_buffers", "children", "modules", "items", "values"):
        return False
    if not (_kinds.may_mention(ctx, "cuda") or _kinds.may_mention(ctx, "to")):
        return False
    carried = set(bound_names(node.target)) if it is not None else loaded_names(node.test) & loop.assigned
    assigns = [sub for sub in loop.direct_nodes() if isinstance(sub, ast.Assign)]
    for _ in range(2):  # in whatever order the walk gives them, a chain of two is followed
        for sub in assigns:
            if loaded_names(sub.value) & carried:
                for target in sub.targets:
                    carried |= bound_names(target)
    return any(isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _MOVES
               and _data_names(sub.func.value) & carried and _kinds.moves_to_device(ctx, sub)
               for sub in loop.direct_nodes())


_METADATA_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim"})


def _data_names(expr: ast.AST) -> set:
    """The names whose values `expr` reads, not only their sizes or types (`x.shape`,
    `x.size(0)`, `len(x)`, `x.dtype`): `torch.Tensor(x.shape).to(d)` moves a new allocation,
    not `x`."""
    parents = {}
    for node in walk_no_scopes(expr):
        for child in child_nodes(node):
            parents[child] = node
    found = set()
    for node in walk_no_scopes(expr):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and (parent.attr in _METADATA_ATTRIBUTES or parent.attr == "size"
                                                  and isinstance(parents.get(parent), ast.Call)):
            continue
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len":
            continue
        found.add(node.id)
    return found


# -- batches on a device, from an iterator made for it or a function of the file ----------------

def _enclosing_scope(ctx) -> ast.AST:
    function = next((f for f in reversed(ctx.functions) if not isinstance(f, ast.Lambda)), None)
    return function if function is not None else ctx.tree


def _bound_values(ctx, scope: ast.AST, name: str, depth: int = 0) -> list:
    """(scope, expression) for each value `name` is bound to in `scope` (or, where it binds
    nothing, at module level): assigned values, the value a tuple target unpacks (`train_it,
    val_it = splits(...)`), and for a parameter what the file's calls of the function pass for it,
    in the caller's scope. Empty where some binding cannot be told (a loop target, `with ... as`)."""
    entries = _kinds.scope_kinds(ctx, scope).assigned.get(name)
    if entries is None and scope is not ctx.tree:
        scope, entries = ctx.tree, _kinds.scope_kinds(ctx, ctx.tree).assigned.get(name)
    if not entries or depth > 2:
        return []
    values = []
    for entry in entries:
        if entry[0] in ("value", "unpack"):
            values.append((scope, entry[1]))
        elif entry[0] == "param":
            sites = file_calls(ctx).call_sites(entry[1])
            if not sites:
                return []
            for site in sites:
                argument = argument_for(site, entry[1], entry[2])
                caller = site.functions[-1] if site.functions else ctx.tree
                found = _bound_values(ctx, caller, argument.id, depth + 1) if isinstance(argument, ast.Name) else \
                    [(caller, argument)] if argument is not None else []
                if not found:
                    return []
                values.extend(found)
        else:
            return []
    return values


def _is_device(ctx, scope: ast.AST, expr: ast.AST) -> bool:
    """`torch.device("cuda")`, or a name bound only to one (`device = torch.device(...)`)."""
    if isinstance(expr, ast.Call):
        return ctx.qualname(expr.func) == "torch.device"
    if isinstance(expr, ast.Name):
        values = _bound_values(ctx, scope, expr.id)
        return bool(values) and all(isinstance(v, ast.Call) and ctx.qualname(v.func) == "torch.device"
                                    for _, v in values)
    return False


def _made_for_device(ctx, scope: ast.AST, call: ast.AST) -> bool:
    """A call, not torch's, that is given a device (`BucketIterator(data, device=device)`,
    `corpus.get_iterator("valid", bsz, device=device)`, `prepare(data_dir, device, opt)`): what
    it makes (an iterator of batches) puts them there."""
    if not isinstance(call, ast.Call) or (ctx.qualname(call.func) or "").split(".")[0] == "torch":
        return False
    if isinstance(call.func, ast.Attribute) and call.func.attr in _MOVES:
        return False
    return any(k.arg == "device" for k in call.keywords) or any(_is_device(ctx, scope, a) for a in call.args)


def _trains_in_nested_loop(node: ast.AST) -> bool:
    return any(isinstance(inner, (ast.For, ast.AsyncFor, ast.While)) and inner is not node and any(
        is_backward(n) or is_optimizer_step(n) for n in walk_no_scopes(inner)) for inner in walk_no_scopes(node))


def _iterates_device_batches(ctx, loop: LoopInfo) -> bool:
    """The loop goes over an iterator that a call given a device made (torchtext's
    `BucketIterator(..., device=device)`): each iteration is a batch on that device. Followed
    through `enumerate`/`tqdm`, names bound to the iterator, and the parameter a function of the
    file receives it as (`def evaluate(eval_iter)`, called `evaluate(va_iter)`). Not a loop with
    a training loop inside (an RL collector's batches, each trained on for several epochs): one
    iteration is many steps."""
    if not isinstance(loop.node, (ast.For, ast.AsyncFor)):
        return False
    if not _kinds.may_mention(ctx, "device"):
        return False
    it = loop.iter
    while isinstance(it, ast.Call) and it.args and isinstance(it.func, ast.Name) and it.func.id in _LOADER_WRAPPERS:
        it = it.args[0]
    scope = _enclosing_scope(ctx)
    if isinstance(it, ast.Call):
        made = _made_for_device(ctx, scope, it)
    elif isinstance(it, ast.Name):
        values = _bound_values(ctx, scope, it.id)
        made = bool(values) and all(_made_for_device(ctx, where, v) for where, v in values)
    else:
        made = False
    return made and not _trains_in_nested_loop(loop.node)


def _fetches_device_batches(ctx, loop: LoopInfo) -> bool:
    """In a file that trains (`trains_here_or_through_project`), each iteration binds the batch a function of the file returns after
    moving it to a device (`X, Y = get_batch("val")`, where `get_batch` ends `x, y = x.to(device),
    y.to(device); return x, y`): an evaluation loop over `eval_iters` batches. Not where the call
    takes what the loop itself stores (`obs_t = to_tensor(self.obs)`, then `self.obs = env.step(a)`):
    that loop steps an environment, its batches are its own state."""
    if not trains_here_or_through_project(ctx):
        return False
    calls = file_calls(ctx)
    stored = None
    for sub in loop.direct_nodes():
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
            callee = _callee(calls, ctx, sub.value)
            if callee is None or not _returns_moved_batch(ctx, callee):
                continue
            if stored is None:
                stored = loop.assigned | {dotted(n) for n in loop.direct_nodes()
                                          if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
            inputs = [a for a in sub.value.args + [k.value for k in sub.value.keywords]]
            if not any((loaded_names(a) | _attribute_paths(a)) & stored for a in inputs):
                return True  # it draws a new batch itself; not the state the loop feeds back (an env's observation)
    return False


def _callee(calls, ctx, call: ast.Call) -> Optional[ast.AST]:
    """The function of the file, or of a module of the project it imports, that `call` calls
    (`get_batch(...)`, `self._generate_batch(...)`)."""
    func = call.func
    if isinstance(func, ast.Name) and func.id in calls.module_functions:
        return calls.module_functions[func.id]
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and ctx.class_ is not None \
            and func.attr in calls.methods.get(id(ctx.class_), {}):
        return calls.methods[id(ctx.class_)][func.attr]
    imported = imported_function(ctx, func)
    return imported[0] if imported is not None else None


# The last word of a call that draws random indices or items: `torch.randint`, `np.random.choice`.
_SAMPLERS = frozenset({"randint", "randperm", "choice", "choices", "sample", "permutation", "integers", "shuffle"})


def _returns_moved_batch(ctx, function: ast.AST) -> bool:
    """The function samples a batch (calls `torch.randint`, `np.random.choice`, `random.sample`...)
    and every `return` gives names (or a tuple of them) that its body bound to a move to a device
    (`x, y = x.to(device), y.to(device)`, `x = x.cuda()`)."""
    key = ("returns_moved_batch", id(function))
    found = ctx.shared.get(key)
    if found is not None:
        return found
    moved = set()
    returns = []
    samples = False
    for node in walk_no_scopes(function):
        if isinstance(node, ast.Call) and identifier(node.func) in _SAMPLERS:
            samples = True
        if isinstance(node, ast.Assign):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
            if len(node.targets) == 1 and len(values) == len(targets):
                for target, value in zip(targets, values):
                    if isinstance(target, ast.Name) and isinstance(value, ast.Call) and \
                            _kinds.moves_to_device(ctx, value):
                        moved.add(target.id)
        elif isinstance(node, ast.Return) and node is not function:
            returns.append(node.value)
    found = samples and bool(returns) and all(
        value is not None and all(isinstance(e, ast.Name) and e.id in moved
                                  for e in (value.elts if isinstance(value, ast.Tuple) else [value]))
        for value in returns)
    ctx.shared[key] = found
    return found


# -- the loop that runs once per step ---------------------------------------------------------

# Functions that run once over a data set (torch_geometric's `Dataset.process()`, calibration):
# whole names, or `_`-separated words of the function's or the file's name.
_ONE_OFF_NAMES = {"process", "_process"}
_ONE_OFF_WORDS = {"preprocess", "precompute", "calibrate", "calibration", "calib"}
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # `try: ... except* E:` from Python 3.11


def every_iteration(body: list):
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


def _last_word(name: Optional[str]) -> str:
    return (name or "").lower().rsplit("_", 1)[-1]


def _dataset_process(function: ast.AST) -> bool:
    """`def process(self):`, a method (torch_geometric's `Dataset.process`); not `def process(rank, ...)`."""
    params = function.args.posonlyargs + function.args.args
    return function.name in _ONE_OFF_NAMES and bool(params) and params[0].arg == "self"


def step_loop(ctx) -> Optional[LoopInfo]:
    """The innermost loop around the node being visited that runs once per step (`is_step_loop`).
    A loop that is a step only because it calls one (`agent.update()`) is not one for what a loop
    nested in it runs: that loop collects the step's data (a rollout of environment steps), and
    what it syncs per item the host needs for it."""
    for loop in reversed(ctx.loops):
        if is_step_loop(ctx, loop):
            if loop is not ctx.loops[-1] and not _trains_itself(ctx, loop):
                return None
            return loop
    return None


def _trains_itself(ctx, loop: LoopInfo) -> bool:
    """`loop_trains` without `_calls_a_training_step`: its own body trains, or goes over a loader."""
    return (is_training_loop(ctx, loop) or iterates_loader(ctx, loop) or any(
        isinstance(node, (ast.For, ast.AsyncFor)) and iterates_names(ctx, inner := LoopInfo(node, ctx))
        and is_training_loop(ctx, inner) for node in loop.direct_nodes()))


def is_step_loop(ctx, loop: LoopInfo) -> bool:
    """A loop each iteration of which is one step: it trains (`loop_trains`), goes over a data
    loader or samples with a model (`samples_with_model`); not a one-off pass over a data set
    (`one_off`) unless it trains, not a loop over task or data-set names unless it steps an
    optimizer, not an epoch loop (`epoch_loop`)."""
    key = ("step_loop", id(loop.node))
    if key not in ctx.shared:
        training = loop_trains(ctx, loop)
        # A loop that steps an optimizer is a training step whatever it goes over; one that
        # only runs backward passes may go over the tasks of one step.
        optimizers = optimizer_names(ctx)
        steps = training and any(is_optimizer_step(n, optimizers) for n in loop.direct_nodes())
        ctx.shared[key] = ((training or iterates_loader(ctx, loop) or samples_with_model(ctx, loop)
                            or evaluates_with_model(ctx, loop))
                           and not (not training and (one_off(ctx) or _one_batch(ctx, loop)))
                           and not (not steps and iterates_names(ctx, loop))
                           and not epoch_loop(ctx, loop))
    return ctx.shared[key]


def _one_batch(ctx, loop: LoopInfo) -> bool:
    """The loop goes over a loader that yields its whole data set as one batch, so that its
    body runs once per pass (an evaluation over `DataLoader(test_set, batch_size=len(test_set))`):
    a loader bound in the function, or one every caller passes for the parameter it goes over
    (`model.train_model(train_loader, test_loader, ...)` in train.py)."""
    it = loop.iter
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "iter") \
            and it.args:
        it = it.args[0]
    function = ctx.function
    if not isinstance(it, ast.Name) or function is None or isinstance(function, ast.Lambda):
        return False
    params = {a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs}
    if it.id not in params:
        assign = flow_of(ctx, function).reaching(it)
        return assign is not None and _whole_set_loader(ctx, assign.value, function)
    passed = _kinds.passed_values(ctx, function, it.id)
    return bool(passed) and all(site.functions and _whole_set_loader(where, value, site.functions[-1])
                                for where, value, site in passed)


def _whole_set_loader(ctx, value: ast.AST, function: ast.AST) -> bool:
    """`DataLoader(ds, batch_size=len(ds))`, or `DataLoader(test_ds, batch_size=test_size)` after
    `train_ds, test_ds = random_split(data, [train_size, test_size])` in `function`."""
    if not isinstance(value, ast.Call) or ctx.qualname(value.func) != "torch.utils.data.DataLoader" or not value.args:
        return False
    dataset = value.args[0]
    size = next((k.value for k in value.keywords if k.arg == "batch_size"), value.args[1] if len(value.args) > 1 else None)
    if size is None:
        return False
    if (isinstance(size, ast.Call) and isinstance(size.func, ast.Name) and size.func.id == "len" and len(size.args) == 1
            and ast.dump(size.args[0]) == ast.dump(dataset)):
        return True
    if not (isinstance(dataset, ast.Name) and isinstance(size, ast.Name)):
        return False
    reaching = flow_of(ctx, function).reaching_all(dataset)
    split = reaching[0][0] if len(reaching) == 1 else None  # the unpacking of the split
    if not isinstance(split, ast.Assign) or not isinstance(split.value, ast.Call) or ctx.qualname(
            split.value.func) != "torch.utils.data.random_split" or len(split.value.args) < 2 or len(split.targets) != 1:
        return False
    targets, sizes = split.targets[0], split.value.args[1]
    if not (isinstance(targets, (ast.Tuple, ast.List)) and isinstance(sizes, (ast.List, ast.Tuple))
            and len(targets.elts) == len(sizes.elts)):
        return False
    return any(isinstance(t, ast.Name) and t.id == dataset.id and isinstance(n, ast.Name) and n.id == size.id
               for t, n in zip(targets.elts, sizes.elts))


def samples_with_model(ctx, loop: LoopInfo) -> bool:
    """Each iteration runs a model on the state the loop carries and updates that state from its
    output (`grad = score_net(x, labels)`, then `x = x + step * grad + noise`; `x = model(x, t)`):
    a sampling or refinement loop (Langevin dynamics, a diffusion sampler), one model step per
    iteration. A model is a module (or a method of one: `model.denoise(x)`), also a parameter the
    function's callers pass one for. Not in a module's `forward`: a loop there is part of the
    forward (refinement iterations, its layers), whose syncs are the model's own; nor a decoder
    that stops on a value it reads back (`_stops_on_host_value`)."""
    key = ("samples_with_model", id(loop.node))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _samples_with_model(ctx, loop)
    return found


_MODULES = (_kinds.MODULE, _kinds.LINEAR, _kinds.USER_MODULE)


def _samples_with_model(ctx, loop: LoopInfo) -> bool:
    if any(getattr(f, "name", "") == "forward" for f in ctx.functions) or _stops_on_host_value(loop):
        return False
    assigns = sorted((node for node in loop.direct_nodes() if node.__class__ is ast.Assign and len(node.targets) == 1
                      and _names_only(node.targets[0])), key=lambda node: (node.lineno, node.col_offset))
    bound = set().union(*(bound_names(node.targets[0]) for node in assigns))
    # the cheap test first: a call that takes a name the loop rebinds
    if not any(call.__class__ is ast.Call and any(loaded_names(a) & bound for a in call.args)
               for node in assigns for call in walk_no_scopes(node.value)):
        return False
    carried = loop.carried
    if not carried:
        return False
    outputs = set()  # names bound to what a model computes from the carried state
    for node in assigns:
        targets, reads = bound_names(node.targets[0]), loaded_names(node.value)
        if any(_runs_model_on(ctx, call, carried | outputs) for call in walk_no_scopes(node.value)):
            if targets & carried and node.targets[0].__class__ is ast.Name:
                return True  # `x = model(x, t)`; not `out, hidden = rnn(x, hidden)`, a recurrence
            outputs |= targets
        elif targets & carried and reads & outputs:
            return True  # `x = x + step * grad + noise`, `x, x0 = scheduler.step(x, eps, t)`
    return False


# With gradients off: also a `torch.set_grad_enabled(...)` region, as evaluation passes write it.
_GRAD_OFF = NO_GRAD_CONTEXTS | {"torch.set_grad_enabled"}


def evaluates_with_model(ctx, loop: LoopInfo) -> bool:
    """Each iteration runs a model for evaluation on data the iteration binds: the function puts
    that model in evaluation mode (`model.eval()`, then `model(data)` or `model.predict(seq)` in
    the loop), or the loop runs with gradients off (`with torch.no_grad():`, a `@torch.no_grad()`
    function) and calls a module. The data is what the loop goes over or what its body draws
    (`data, target = get_batch(source, i)`, `x, y = self.data.get_batch("val")`), not only the
    state it carries: `for layer in
    layers: x = layer(x)` is one forward, not a loop of steps. Not in a module's `forward`, nor
    for a comprehension, nor a decoder that stops on a value it reads back (`_stops_on_host_value`)."""
    key = ("evaluates_with_model", id(loop.node))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _evaluates_with_model(ctx, loop)
    return found


def _evaluates_with_model(ctx, loop: LoopInfo) -> bool:
    function = ctx.function
    if loop.is_comprehension or function is None or any(getattr(f, "name", "") == "forward" for f in ctx.functions) \
            or _stops_on_host_value(loop):
        return False
    evaluated, grad_off = _evaluation_marks(ctx, function)
    grad_off = id(loop.node) in grad_off
    if not evaluated and not grad_off:
        return False
    per_iteration = loop.targets | loop.derived
    drawn = _drawn_names(ctx, loop)
    for call in loop.direct_nodes():
        if call.__class__ is not ast.Call or not any(
                (loop.depends_on_iteration(a) or loaded_names(a) & drawn) and not loop.reads_carried(a)
                for a in call.args):
            continue
        func = call.func
        if loaded_names(func) & per_iteration:
            continue  # `layer(x)` for each layer
        receiver = func.value if func.__class__ is ast.Attribute else None
        if dotted(func) in evaluated or receiver is not None and dotted(receiver) in evaluated:
            return True
        if grad_off and (_kinds.callee_kind(ctx, func) in _MODULES
                         or receiver is not None and _kinds.kind_of(ctx, receiver) in _MODULES):
            return True
    return False


def _evaluation_marks(ctx, function: ast.AST) -> tuple:
    """(what `function` puts in evaluation mode, `model` and `self.model` of `model.eval()`; the
    ids of the loops it runs with gradients off: under `with torch.no_grad():` or
    `torch.inference_mode()`, all of them in a function decorated so, or a loop that wraps its
    inputs as PyTorch 0.3 did for inference, `Variable(x, volatile=True)`), read once per function."""
    key = ("evaluation_marks", id(function))
    found = ctx.shared.get(key)
    if found is not None:
        return found

    def turns_off(expr) -> bool:
        return ctx.qualname(expr.func if isinstance(expr, ast.Call) else expr) in _GRAD_OFF

    evaluated, grad_off = set(), set()
    whole = any(turns_off(d) for d in getattr(function, "decorator_list", ()))
    for node in walk_no_scopes(function):
        if node.__class__ is ast.Call and node.func.__class__ is ast.Attribute and node.func.attr == "eval" \
                and not node.args and not node.keywords and dotted(node.func.value) is not None:
            evaluated.add(dotted(node.func.value))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and (whole or _volatile_inputs(ctx, node)):
            grad_off.add(id(node))
        elif isinstance(node, (ast.With, ast.AsyncWith)) and not whole \
                and any(turns_off(item.context_expr) for item in node.items):
            grad_off.update(id(sub) for stmt in node.body for sub in walk_no_scopes(stmt)
                            if isinstance(sub, (ast.For, ast.AsyncFor, ast.While)))
    found = ctx.shared[key] = (evaluated, grad_off)
    return found


def _drawn_names(ctx, loop: LoopInfo) -> set:
    """The names the loop's body binds to what a method of a data object returns on each pass,
    from nothing the loop carries (`x, y = self.data.get_batch("val")`: the object keeps its
    place in the data), and those it computes from them: the data each pass draws. A function
    called with the same arguments (`batch(data, 0)`) gives the same batch."""
    drawn = set()
    for node in loop.direct_nodes():
        if node.__class__ is not ast.Assign or loop.reads_carried(node.value):
            continue
        value = node.value
        if (value.__class__ is ast.Call and value.func.__class__ is ast.Attribute and ctx.qualname(value.func) is None
                and _kinds.callee_kind(ctx, value.func) not in _MODULES and not loaded_names(value) & loop.carried
                or loaded_names(value) & drawn):
            drawn |= set().union(*(bound_names(t) for t in node.targets))
    return drawn - loop.carried


def _volatile_inputs(ctx, loop: ast.AST) -> bool:
    """The loop's body wraps data in `Variable(..., volatile=True)`: PyTorch 0.3's inference
    without gradients."""
    return any(node.__class__ is ast.Call and ctx.qualname(node.func) == "torch.autograd.Variable"
               and any(k.arg == "volatile" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in node.keywords)
               for stmt in loop.body for node in walk_no_scopes(stmt))


def _names_only(target: ast.AST) -> bool:
    """`x`, `x, x0`: names, or a tuple of names."""
    return target.__class__ is ast.Name or target.__class__ is ast.Tuple and all(
        e.__class__ is ast.Name for e in target.elts)


def _stops_on_host_value(loop: LoopInfo) -> bool:
    """The loop stops on a value it reads back from the device (`if token.item() in stop_tokens:
    break`), or on one it computes in its body (`finished = len([s for s in lengths if s > 0])`,
    then `if finished == k: break`): a decoder that waits for the device on every iteration by
    design, whose fix is a batched stop check, not a line."""
    computed = loop.assigned - loop.targets
    return any(any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                   and call.func.attr in ("item", "tolist", "cpu") for call in ast.walk(test))
               or loaded_names(test) & computed for test in _break_tests(loop))


def _runs_model_on(ctx, call: ast.AST, names: set) -> bool:
    """`call` runs a model on a value of `names`."""
    if call.__class__ is not ast.Call or not any(loaded_names(a) & names for a in call.args):
        return False
    func = call.func
    if _kinds.callee_kind(ctx, func) in _MODULES:
        return True
    return func.__class__ is ast.Attribute and _kinds.kind_of(ctx, func.value) in _MODULES


def loop_trains(ctx, loop: LoopInfo) -> bool:
    """The body calls `.backward()` or an optimizer's `.step()`, itself or in a loop over names
    nested in it (`for name, discr_loss in discr_losses: discr_loss.backward()`): that loop
    goes over the parts of this loop's step."""
    key = ("loop_trains", id(loop.node))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = is_training_loop(ctx, loop) or any(
            isinstance(node, (ast.For, ast.AsyncFor)) and iterates_names(ctx, inner := LoopInfo(node, ctx))
            and is_training_loop(ctx, inner) for node in loop.direct_nodes()) or _calls_a_training_step(ctx, loop)
    return found


def _calls_a_training_step(ctx, loop: LoopInfo) -> bool:
    """The body calls a function that is one training step (it calls `.backward()` and an
    optimizer's `.step()` outside any loop of its own): a function of the file or of a project
    module, a method of the class being read (`self.learn()`), or a method of an instance of a
    class of either (`agent.update(batch)` after `agent = Agent(...)`); training in its loops over
    `range(...)` counts (see `_outside_data_loops`). Each iteration is a step."""
    return trains_here_or_through_project(ctx) and any(
        node.__class__ is ast.Call and runs_a_training_step(ctx, node) for node in loop.direct_nodes())


def runs_a_training_step(ctx, call: ast.Call) -> bool:
    """`call` runs a function that is one training step (see `_calls_a_training_step`)."""
    definition = _called_definition(ctx, file_calls(ctx), call.func)
    return definition is not None and all(_trains(_outside_data_loops(definition.body), optimizer_names(ctx)))


def _outside_data_loops(body):
    """The nodes of a function's body outside its nested scopes and outside its loops over
    anything but `range(...)`: a function that trains once per agent or a fixed number of times
    (`for agent in range(n_agents): ... opt.step()`) is one call's steps; one that goes over a
    loader or a data set holds a whole training loop (an epoch), as does a loop over a range
    that draws the next batch on each pass (`x, y = next(training_set)`)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES) or isinstance(node, _LOOPS) and not (
                isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
                and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range"
                and not _draws_next(node)):
            continue
        stack.extend(child_nodes(node))


def _draws_next(loop: ast.For) -> bool:
    """The loop's body calls `next(...)`: it takes the next item of an iterator on each pass."""
    return any(node.__class__ is ast.Call and node.func.__class__ is ast.Name and node.func.id == "next"
               for stmt in loop.body for node in walk_no_scopes(stmt))


def _called_definition(ctx, calls, func: ast.AST) -> Optional[ast.AST]:
    """The function or method that a call of `func` runs (see `_calls_a_training_step`), else None."""
    if isinstance(func, ast.Name):
        if func.id in calls.module_functions and not ctx.names.binds_locally(func.id):
            return calls.module_functions[func.id]
        found = imported_function(ctx, func)
        return found[0] if found is not None else _made_function(ctx, calls, func.id)
    if not isinstance(func, ast.Attribute):
        return None
    owner = dotted(func.value)
    if owner is None:
        return None
    cls = calls.instance_classes.get(owner)
    if cls is None and ctx.class_ is not None and ctx.function is not None and owner == _kinds.scope_kinds(
            ctx, ctx.function).self_name:
        cls = ctx.class_
    if cls is not None:
        return calls.methods.get(id(cls), {}).get(func.attr) or _inherited_method(ctx, cls, func.attr) \
            or _held_callable(ctx, cls, func.attr)
    found = _callee_definition(ctx, calls, func)
    return found[0] if found is not None else None  # `utils.train_step(...)`, `agent.update(...)`


def _training_step_called(ctx, calls, function: ast.AST) -> Optional[ast.Call]:
    """The call, outside the function's loops, of a method of its class (own or inherited) or of a
    function of the file or of a project module that is one training step
    (`self.take_optimisation_step(optimizer, net, loss)`, `update_params(optim, loss)`, which
    call `.backward()` and the optimizer's `.step()`): the function is that step."""
    cls = calls.class_of.get(id(function))
    at = None
    trainers = ctx.shared.setdefault("training_step_methods", {})  # (id(class), name) -> trains
    for node in _outside_loops(function.body):
        if node.__class__ is not ast.Call:
            continue
        if node.func.__class__ is ast.Name and not ctx.names.binds_locally(node.func.id):
            imported = linted_project_imports(ctx).get(node.func.id)
            if node.func.id not in calls.module_functions and (
                    imported is None or imported[1] is None or not file_runs_backward(imported[0])):
                continue  # neither the file's own function nor one of a project module that trains
            key = (None, node.func.id)
        elif cls is not None and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "self":
            key = (id(cls), node.func.attr)
        else:
            continue
        trains = trainers.get(key)
        if trains is None:
            at = at or Position(ctx, (function,), cls)
            trains = trainers[key] = runs_a_training_step(at, node)
        if trains:
            return node
    return None


def _held_callable(ctx, cls: ast.ClassDef, attr: str) -> Optional[ast.AST]:
    """The `__call__` of the one object the class keeps in `self.<attr>`, made from a class of
    this file or of a project module (`self._model_opt = tools.Optimizer(...)`, whose `__call__`
    runs the backward pass and the optimizer's step)."""
    values = _kinds.class_attribute_values(ctx, cls, attr)
    if len(values) != 1 or not isinstance(values[0][1], ast.Call):
        return None
    found = _class_named(ctx, values[0][1].func)
    if found is None:
        return None
    held, where = found
    return next((m for m in held.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and m.name == "__call__"), None) or _inherited_method(where, held, "__call__")


def _class_named(ctx, func: ast.AST) -> Optional[tuple]:
    """(the class, the file it is in) that the name `func` names: one the file defines at its top
    level, or one of a project module it imports (`Base_Agent` after `from agents.Base_Agent import
    Base_Agent`)."""
    if not isinstance(func, ast.Name):
        return imported_class(ctx, func)
    local = [s for s in ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == func.id]
    return (local[0], ctx) if len(local) == 1 and ctx.qualname(func) is None else imported_class(ctx, func)


def _inherited_method(ctx, cls: ast.ClassDef, name: str, depth: int = 0) -> Optional[ast.AST]:
    """The method `name` that `cls` inherits from a base class of this file or of a project module
    (`class DQN(Base_Agent)` after `from agents.Base_Agent import Base_Agent`), nearest base first."""
    if depth > 4:
        return None
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        found = _class_named(ctx, base)
        if found is None:
            continue
        parent, where = found
        method = next((m for m in parent.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and m.name == name), None)
        if method is None:
            method = _inherited_method(where, parent, name, depth + 1)
        if method is not None:
            return method
    return None


def _made_function(ctx, calls, name: str) -> Optional[ast.AST]:
    """The nested function that `name` is bound to, once, by a call of a function of the file that
    defines it and returns it (`tuning_step = make_tuning_step(model, optimizer)`): a step
    function made by a factory."""
    made = _assigned_values(ctx).get(name, [])
    if len(made) != 1 or not isinstance(made[0], ast.Call) or not isinstance(made[0].func, ast.Name):
        return None
    factory = calls.module_functions.get(made[0].func.id)
    if factory is None:
        return None
    nested = {s.name: s for s in factory.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    returned = [n.value for stmt in factory.body if not isinstance(stmt, _SCOPES)
                for n in walk_no_scopes(stmt) if isinstance(n, ast.Return)]
    if len(returned) == 1 and isinstance(returned[0], ast.Name) and returned[0].id in nested:
        return nested[returned[0].id]
    return None


def epoch_loop(ctx, loop: LoopInfo) -> bool:
    """The loop runs a whole pass over a loader in each iteration: an epoch loop, whatever
    else it steps (`sched.step()`). A pass under an `if` (validation every N steps) or in an
    `except` does not run in each iteration, nor is a loop over the parts of the loop's own
    item one (`for vi, data in enumerate(val_loader): input, gt = data` / `for input_slice,
    gt_slice in zip(input, gt): input_slice = input_slice.cuda()`: the slices of one batch)."""
    if not isinstance(loop.node, (ast.For, ast.AsyncFor, ast.While)):
        return False
    body = list(every_iteration(loop.node.body))
    item = None
    for stmt in body:
        if not (isinstance(stmt, (ast.For, ast.AsyncFor)) and iterates_loader(ctx, inner := LoopInfo(stmt, ctx))):
            continue
        if item is None:
            item = _item_names(loop, body)
        if not (loaded_names(inner.iter) & item) or _iterates_a_loader(ctx, inner.iter):
            return True
    return False


def _item_names(loop: LoopInfo, body: list) -> set:
    """The names that hold the loop's item or parts of it: its target, and what the statements
    of each iteration unpack or compute from them (`input, gt, slices_info = data`)."""
    names = bound_names(loop.node.target) if isinstance(loop.node, (ast.For, ast.AsyncFor)) else set()
    for stmt in body:
        if isinstance(stmt, ast.Assign) and loaded_names(stmt.value) & names:
            for target in stmt.targets:
                names |= bound_names(target)
    return names


def iterates_names(ctx, loop: LoopInfo) -> bool:
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
    if _last_word(identifier(it)) in ("keys", "names"):
        return True
    target = loop.node.target if isinstance(loop.node, (ast.For, ast.AsyncFor)) else loop.node.generators[0].target
    if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name) \
            and _last_word(target.elts[0].id) in ("key", "name"):
        return not iterates_loader(ctx, loop)
    return isinstance(target, ast.Name) and _last_word(target.id) in ("key", "name")


def one_off(ctx) -> bool:
    """In a function that runs once over a data set: a `process()` method (torch_geometric's
    `Dataset.process(self)`), `precompute_*`, calibration."""
    function = ctx.function
    key = ("one_off", id(function))
    found = ctx.shared.get(key)
    if found is None:
        functions = [f for f in ctx.functions if not isinstance(f, ast.Lambda)]
        stem = os.path.splitext(os.path.basename(ctx.filename or ""))[0]
        words = {w for n in [f.name for f in functions] + [stem] for w in name_tokens(n)}
        found = ctx.shared[key] = bool(any(_dataset_process(f) for f in functions) or words & _ONE_OFF_WORDS)
    return found


# -- parameter updates on every optimizer step --------------------------------------------------

OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop",
                        "Rprop", "ASGD"})
# Name tokens of a function that runs on every update (`sgd_step`, `update_ema`, `applyGradients`):
# whole tokens, so `remap`, `swap` and `schema` do not count.
_UPDATE_TOKENS = frozenset({"step", "steps", "update", "updates", "ema", "average", "averages", "avg", "swa", "sgd"}
                           | {name.lower() for name in OPTIMIZERS})
# A function that changes parameters once: set-up, loading, conversion, pruning, checkpoints.
_PARAMETERS_ONCE = re.compile(r"init|reset|load|build|setup|copy|convert|prune|quantiz|checkpoint|ckpt",
                              re.IGNORECASE)


def updates_once(name: str) -> bool:
    """By its name, a function whose loops over parameters change them once (initialization,
    loading, conversion, pruning, quantization, checkpoints), not on every step."""
    return bool(_PARAMETERS_ONCE.search(name))


def _update_name(name: str) -> bool:
    tokens = name_tokens(name)
    return any(token in _UPDATE_TOKENS or (token == "apply" and following.startswith("grad"))
               for token, following in zip(tokens, tokens[1:] + [""]))


def updates_every_step(ctx, loop: LoopInfo) -> bool:
    """A loop over parameters runs on every optimizer step: in an optimizer's `step`, an
    EMA/`update` function (or the `__call__` of an `EMA` class), inside a training loop, or in a
    function a training step runs."""
    function = ctx.function
    if function is not None:
        name = getattr(function, "name", "")
        if name == "__call__" and ctx.class_ is not None:
            name = ctx.class_.name
        if _update_name(name):
            return True
    if any(is_training_loop(ctx, outer) for outer in ctx.loops if outer is not loop):
        return True
    step = step_of(ctx, ctx.functions)
    return step is not None and step.training

