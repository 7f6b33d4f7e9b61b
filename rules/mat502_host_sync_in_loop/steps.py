"""MAT502's per-step question: which loop runs once per training step (not an epoch loop, a one-off
pass or a host-only evaluation), which function runs every step, and which code in them runs on
every iteration (not gated by a logging interval, not explained by a comment)."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import nearby_comments
from matlint.semantic.tree import function_text
from matlint.semantic.loops import LoopInfo, file_trains, identifier as _identifier, loaded_names, name_tokens, walk_no_scopes
from matlint.semantic.project import (file_moves_to_cuda, imported_by_cuda_code, imported_by_training_code,
                                      imported_files, in_script_project, moves_work_to_cuda)
from matlint.semantic.steps import (SCORING_WORDS, STEP_HOOKS, calls_a_step_method, configuration_test, gate_name,
                                   guards_empty_selection, passed_to_steps, step_functions, step_loop, step_of,
                                   reads_mode, steps_from_importers, trains_in, function_name)



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
    r"|\b(?:host|cpu|python|numpy)\s+needs\b"
    r"|\b(?:faster|quicker|cheaper)\s+on\s+(?:the\s+)?(?:host|cpu)\b", re.IGNORECASE)

# Memory the sync saves by dropping the autograd graph: `.detach()` saves it as well.
_GRAPH_MEMORY = re.compile(r"\bleak|\bgraph\b|autograd", re.IGNORECASE)
_NEGATED = re.compile(r"(?:n't|\bnot|\bno|\bnever|\bwithout|\bavoid\w*)\s+(?:\w+\s+){0,2}?(?:wait|need)",
                      re.IGNORECASE)
_SYNC_TEXT = (".cpu(", ".to(", ".item(", ".tolist(", ".numpy(")


# What makes a function move data to an accelerator (or hand it to code that does).
_DEVICE_WORDS = re.compile(r"cuda|device|gpu|\.to\(|accelerat|fabric|parallel|\b(?:xla|mps|npu|xpu|tpu)\b", re.IGNORECASE)
_HOST_BUILTINS = {"len", "max", "min", "sum", "abs", "int", "float", "bool", "round", "list", "tuple", "zip",
                  "range", "enumerate", "isinstance", "print", "sorted", "dict", "set", "str", "any", "all"}
_HOST_METHODS = _kinds.TENSOR_ONLY_METHODS | {
    "max", "min", "sum", "mean", "std", "var", "abs", "item", "tolist", "numpy", "long", "int", "bool",
    "double", "reshape", "squeeze", "nonzero", "square", "sqrt", "append", "extend", "update", "keys",
    "values", "items", "get", "pop", "format"}
_LEAVES_LOOP = (ast.Break, ast.Return)


def _returned(chain: list, node: ast.AST, function: ast.AST) -> bool:
    """The sync makes what `function` returns: it is in a `return` (`return a.cpu().numpy()`), or
    its statement binds a name that a `return` gives back as it is or indexed, alone or in a
    tuple (`action = a.item()`, then `return action, value`; `return action[0]`)."""
    if any(isinstance(p, ast.Return) for p in chain):
        return True
    statement = next((p for p in reversed(chain) if isinstance(p, ast.stmt)), None)
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)):
        return False
    name = statement.targets[0].id
    for n in ast.walk(function):  # `return action`, `return action, probs, value`
        if isinstance(n, ast.Return) and n.value is not None:
            parts = n.value.elts if isinstance(n.value, ast.Tuple) else [n.value]
            parts = [p.value if isinstance(p, ast.Subscript) else p for p in parts]
            if any(isinstance(p, ast.Name) and p.id == name for p in parts):
                return True
    return False
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_NESTED_LOOPS = (ast.For, ast.AsyncFor, ast.While) + _COMPREHENSIONS


def _steps_with_project_helpers(ctx) -> bool:
    """The file has a training step, or moves work to CUDA (an evaluation script), and imports
    modules of the project: calls of their functions are routed too (a step may call a helper
    that syncs)."""
    found = ctx.shared.get("mat502_project_helpers")
    if found is None:
        found = ctx.shared["mat502_project_helpers"] = bool(
            (_kinds.may_mention(ctx, "backward") or moves_work_to_cuda(ctx))
            and imported_files(ctx))
    return found


def _overlap(a: ast.AST, b: ast.AST) -> bool:
    """One of the two nodes holds the other (`if torch.all(step <= tol):` reports the call around the comparison)."""
    return any(n is b for n in ast.walk(a)) or any(n is a for n in ast.walk(b))


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


_EXITS = frozenset({"sys.exit", "os._exit"})


def _leaves(ctx, stmt: ast.stmt) -> bool:
    """`return`, `break`, `raise`, or `sys.exit(1)`: the statement ends the loop (or the program)."""
    if isinstance(stmt, (ast.Return, ast.Break, ast.Raise)):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and (
        ctx.qualname(stmt.value.func) in _EXITS
        or isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in ("exit", "quit")
        and ctx.qualname(stmt.value.func) is None)


def _first_time(branch: ast.If) -> bool:
    """`if ema is None: ema = ...`: the branch binds the name its test finds unset, so it runs
    until the first time it does."""
    test = branch.test
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Is) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None):
        return False
    name = test.left.id
    return any(isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
               and not (isinstance(stmt.value, ast.Constant) and stmt.value.value is None) for stmt in branch.body)


def _is_gate(test: ast.AST, loop: LoopInfo) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and gate_name(_identifier(node)):
            return True
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq) for op in node.ops) \
                and not all(_same_every_step(operand, loop) for operand in [node.left] + node.comparators):
            return True
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and _first_passes(node, loop):
            return True
    return False


def _first_passes(test: ast.Compare, loop: LoopInfo) -> bool:
    """`if j <= 4:`, `if 10 > i:`: the loop's own count of its passes (the target of `range(...)`,
    the index of `enumerate(...)`) below a number: the first few passes, a preview."""
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, (ast.Gt, ast.GtE)):
        left, right = right, left
    elif not isinstance(op, (ast.Lt, ast.LtE)):
        return False
    if not (isinstance(right, ast.Constant) and type(right.value) is int and isinstance(left, ast.Name)):
        return False
    node = loop.node
    if not isinstance(node, (ast.For, ast.AsyncFor)) or not isinstance(node.iter, ast.Call) \
            or not isinstance(node.iter.func, ast.Name) or left.id in loop.assigned:
        return False
    if node.iter.func.id == "range":
        counter = node.target
    elif node.iter.func.id == "enumerate" and isinstance(node.target, ast.Tuple) and node.target.elts:
        counter = node.target.elts[0]
    else:
        return False
    return isinstance(counter, ast.Name) and counter.id == left.id


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
    return isinstance(operand, ast.Attribute) and _setting_of_argument(operand, loop)


# Attribute words of a value that changes as a run goes on (`trainer.global_step`, `state.epoch`).
_PROGRESS_WORDS = {"step", "steps", "iter", "iters", "iteration", "epoch", "epochs", "count", "counter", "batch",
                   "idx", "index", "updates", "time", "best", "last", "first", "done", "stop"}


def _setting_of_argument(operand: ast.Attribute, loop: LoopInfo) -> bool:
    """`net.n_classes`, `cfg.model.num_classes`: an attribute of a name the loop neither binds nor
    assigns, other than `self` (whose methods the loop may call to change it), named as a setting
    (not a step counter or a state: `trainer.global_step`) and not stored in the loop: the same on
    every step."""
    root, words = operand, []
    while isinstance(root, ast.Attribute):
        words.extend(name_tokens(root.attr))
        root = root.value
    if not isinstance(root, ast.Name) or root.id in ("self", "cls") or root.id in loop.targets \
            or root.id in loop.assigned or _PROGRESS_WORDS.intersection(words):
        return False
    text = ast.dump(operand.value)
    return not any(isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load)
                   and ast.dump(node.value) == text for stmt in loop.body for node in ast.walk(stmt))


class _StepLoops:
    """HostSyncInLoop's analysis of steps and the code that runs on each."""

    def _step_context(self, in_forward: bool = False):
        """The step loop around the node, else the step that the function around it runs in (a
        training step, a step hook, a helper the step calls), else None. `in_forward`: a module's
        `forward` (and what it calls) counts too, wherever the file puts its tensors (for a check
        that is no part of the computation: an `assert`); where a program that trains on the GPU
        runs the model (the file, or a file that imports it), it counts for every sync."""
        loop = step_loop(self.ctx)
        if loop is not None:
            return loop
        if self.ctx.function is None:
            return None
        if in_forward and _kinds.may_mention(self.ctx, "forward"):
            return step_of(self.ctx, self.ctx.functions)
        if _kinds.may_mention(self.ctx, "forward") and (
                file_trains(self.ctx) and moves_work_to_cuda(self.ctx) or imported_by_training_code(self.ctx)):
            # a program that trains on the GPU runs its model's `forward` on its own steps
            step = step_of(self.ctx, self.ctx.functions)
            if step is not None and step.forward:
                return step
        loss = _kinds.may_mention(self.ctx, "forward") and any(
            _kinds.may_mention(self.ctx, word, ignore_case=True) for word in SCORING_WORDS)
        if not loss and not _kinds.may_mention(self.ctx, "backward") and not any(
                _kinds.may_mention(self.ctx, hook) for hook in STEP_HOOKS) and not passed_to_steps(self.ctx) \
                and not steps_from_importers(self.ctx) and not (
                    (calls_a_step_method(self.ctx) or in_script_project(self.ctx)) and step_functions(self.ctx)):
            # no training step (nor a call of a project helper that is one: `update_params(optim,
            # loss)`), optimizer step, step hook, loss module or helper of an importer's step: only
            # a `forward` could run every step
            return None
        step = step_of(self.ctx, self.ctx.functions)
        if not moves_work_to_cuda(self.ctx) and not imported_by_cuda_code(self.ctx) and not any(
                path is not None and file_moves_to_cuda(path) for _, _, path in passed_to_steps(self.ctx)) \
                and not (step is not None and step.from_file is not None and file_moves_to_cuda(step.from_file)):
            return None  # a helper module that never names a device, nor do its importers, callees or steps
        if step is not None and step.from_file is not None and not moves_work_to_cuda(self.ctx) \
                and not file_moves_to_cuda(step.from_file):
            return None  # run every step by an importer whose work stays on the CPU
        # A model's `forward` branches on its data on purpose (routing, variable lengths): only
        # what a step's own code does counts, and a loss module's `forward`, which computes the
        # step's loss (its syncs, box matching through masks, wait on every training step)
        return None if step is None or step.forward and not step.loss and not in_forward else step

    def _in_step_function(self, node: ast.AST, owner: Optional[ast.AST] = None) -> Optional[str]:
        """For a sync in a function that runs every step, outside any loop of its own: why it runs
        every step; None where it runs only on some calls (under an `if`, in an error path). An
        `if` in a loop of the function that picks some of the loop's items by what they are
        (`for name, p in model.named_parameters(): if p.grad is not None:`) runs on every call.
        `owner`: the statement (`if`, `while`, `assert`) whose test `node` is, which the walk has
        not entered."""
        step = self._step_context(in_forward=True)  # the caller has asked its own question first
        function = next((f for f in reversed(self.ctx.functions) if not isinstance(f, ast.Lambda)),
                        self.ctx.functions[-1])  # a lambda the module binds to a name (`_module_lambdas`)
        start = next((i for i, p in enumerate(self.ctx.parents) if p is function), None)
        chain = self.ctx.parents[start + 1:] if start is not None else []
        if any(isinstance(p, (ast.ExceptHandler, ast.Raise, ast.IfExp, ast.Try)) for p in chain):
            return None
        for parent, child in zip(chain, chain[1:] + [owner if isinstance(owner, ast.stmt) else node]):
            if not isinstance(parent, ast.If):
                continue
            in_body = any(s is child for s in parent.body)
            if not (in_body or any(s is child for s in parent.orelse)):
                continue  # its test, which every call runs
            if child is owner and isinstance(owner, ast.If) and parent.orelse == [owner]:
                continue  # the test of an `elif`, which every call that skips the `if` runs
            if isinstance(owner, ast.Assert) and child is owner and _asserts_in_both_arms(parent):
                continue  # `if a: ...; assert ok(x)` / `else: ...; assert ok(y)`: every call checks one
            if not (in_body and (trains_in(parent.body) or guards_empty_selection(self.ctx, parent)
                                 or _selects_items(parent.test, chain[:chain.index(parent)]))) \
                    and not configuration_test(self.ctx, function, parent.test, self.ctx.class_) \
                    and not (self.ctx.class_ is not None and reads_mode(parent.test)) \
                    and not _presence_test(parent, function) and not self._syncs_on_both_paths(parent):
                # not every call runs it; a branch that trains (`if tune_alpha: ... step()`) is the
                # step, the body of `if mask.sum() > 0:` the usual path, a branch of a
                # configuration switch (`if FIXED_ALPHA is None:` / `else:`) runs on every step,
                # a branch on a module's mode (`if self.training:`) on every step of that mode,
                # and so does a sync where the other branch syncs too (`if relative: return
                # d.mean().item()` / `else: return d.sum().item()`): every call waits
                return None
        if self._explained(node):
            return None
        if (step.feeds_host or step.runs_model) and _returned(chain, node, function):
            # the caller hands the value to host code that needs it (an environment), or asked a
            # method that runs the model (`get_action`) for it on the host
            return None
        return f"on every step: `{function_name(function)}` {step.why}"

    def _explained(self, node: ast.AST) -> bool:
        """A comment on the sync's own lines, or above its statement (heading the run of copies it
        is in), says why the copy is deliberate (`# wait for the indices: the host slices with
        them`, `# kept on the CPU, else GPU memory runs out`). A comment on another line of a
        multi-line statement belongs to that line; one that says what the line does (`# move to
        cpu`) or why not to keep the graph (`.detach()` does that too) explains nothing. Nor does
        any comment on `torch.cuda.synchronize()`: it copies no value the host could need, and
        waiting is all it does (`# wait for the GPU to finish work`, to time the step: CUDA
        events time it without the wait); the one need for it, copies to the host still in
        flight, is read from the code (`_waits_for_own_copies`)."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "synchronize":
            return False
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
                if branch and _leaves(self.ctx, branch[-1]):
                    return True  # the branch leaves the loop: it runs on one step, not every step
                if in_body and _is_gate(parent.test, loop) and not trains_in(parent.body):
                    return True  # (its `else` runs on the other steps; a branch that trains is the step itself)
                if in_body and _first_time(parent):
                    return True  # `if loss_ema is None: loss_ema = loss.item()`: the first step only
        return False


def _asserts_in_both_arms(branch: ast.If) -> bool:
    """The body and the `else` of `branch` each hold an `assert` of their own (not under a further branch)."""
    return bool(branch.orelse) and all(any(isinstance(stmt, ast.Assert) for stmt in arm)
                                       for arm in (branch.body, branch.orelse))


def _presence_test(branch: ast.If, function: ast.AST) -> bool:
    """`if loss: log(loss.item())` of a parameter of the function that the branch then reads: a
    logging helper's test of whether the caller passed an optional value, whose branch runs on
    every step that passes one (`configuration_test` takes `if loss is not None:` so). A flag
    the branch does not read (`if done: self.reset()`) is data of the call. So is a test of
    whether the parameter is a tensor (`if torch.is_tensor(output): output = output.cpu()`,
    `isinstance(x, torch.Tensor)`): the branch runs on every step that passes one, and only
    then does it sync."""
    test = tested_as_tensor(branch.test) or branch.test
    args = function.args
    return isinstance(test, ast.Name) and any(
        a.arg == test.id for a in args.posonlyargs + args.args + args.kwonlyargs) and any(
        isinstance(n, ast.Name) and n.id == test.id for stmt in branch.body for n in ast.walk(stmt))


def tested_as_tensor(test: ast.AST) -> Optional[ast.AST]:
    """What `test` asks is a tensor (`torch.is_tensor(x)`, `isinstance(x, torch.Tensor)`), read off
    the syntax (it also serves a module of the project that is parsed, not linted); None if it
    asks nothing of the kind."""
    if not (isinstance(test, ast.Call) and test.args and not test.keywords):
        return None
    func = test.func
    if len(test.args) == 1 and (isinstance(func, ast.Attribute) and func.attr == "is_tensor"
                                or isinstance(func, ast.Name) and func.id == "is_tensor"):
        return test.args[0]
    if isinstance(func, ast.Name) and func.id == "isinstance" and len(test.args) == 2 and any(
            isinstance(n, ast.Attribute) and n.attr == "Tensor" or isinstance(n, ast.Name) and n.id == "Tensor"
            for n in ast.walk(test.args[1])):
        return test.args[0]
    return None


def _selects_items(test: ast.AST, around: list) -> bool:
    """`test` picks items of a loop among `around` by what they are, not by tensor values: it reads
    only the loop's own names and their attributes, compared with `is None` or with strings (`p.grad
    is not None`, `p.requires_grad`, `"bias" in name`)."""
    bound = {n.id for loop in around if isinstance(loop, (ast.For, ast.AsyncFor))
             for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    if not bound or isinstance(test, ast.Name):
        return False  # `if x:` of a tensor item reads its value
    for node in ast.walk(test):
        if isinstance(node, ast.Name):
            if node.id not in bound:
                return False
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Is, ast.IsNot)):
                    if not (isinstance(right, ast.Constant) and right.value is None):
                        return False
                elif not (isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and any(
                        isinstance(side, ast.Constant) and isinstance(side.value, str) for side in (node.left, right))):
                    return False
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.Not):
                return False
        elif not isinstance(node, (ast.Attribute, ast.BoolOp, ast.Constant, ast.boolop, ast.cmpop, ast.unaryop,
                                   ast.expr_context)):
            return False
    return True
