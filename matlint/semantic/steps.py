"""Which functions of a file run on every step of a training or evaluation loop, so that what
they do counts per step although no loop is written around it in the function itself.

A function runs every step when it is a training step (it calls both `.backward()` and an
optimizer's `.step()` once per call, outside any loop of its own: TD3's `train(replay_buffer)`,
an agent's `learn()`), a framework's step
hook (`training_step`, `validation_step`, `test_step`), a module's `forward`, or when the file calls it from such a
function or from inside a loop that trains (its body calls `.backward()` or an optimizer's
`.step()`) or goes over a data loader. Built once per file, on first use.

`per_step(ctx)` answers the question for the node being visited: does it run on every step (on
every iteration of a loop around it, on every forward call of a module, or on every call of a
function that runs every step), and why.
"""
from __future__ import annotations

import ast
import re
from typing import NamedTuple, Optional

from .calls import file_calls
from .kinds import may_mention
from .loops import is_backward, is_optimizer_step, is_training_loop, walk_no_scopes
from .tree import child_nodes, dotted

_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

STEP_HOOKS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


class Step(NamedTuple):
    why: str      # "is a training step", "is called from the training loop on line 12", ...
    training: bool
    forward: bool = False  # runs every step as (part of) a module's `forward`


def _trains(nodes) -> tuple:
    """(calls `.backward()`, calls an optimizer's `.step()`) among `nodes`."""
    backward = step = False
    for node in nodes:
        backward = backward or is_backward(node)
        step = step or is_optimizer_step(node)
    return backward, step


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


def _iterates_loader(loop: ast.AST) -> bool:
    it = getattr(loop, "iter", None)
    while isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    name = dotted(it) if it is not None else None
    return bool(name) and name.lower().rpartition(".")[2].endswith("loader")


def _loop_step(loop: ast.AST) -> Optional[Step]:
    backward, step = _trains(walk_no_scopes(loop))
    if backward or step:
        return Step(f"is called from the training loop on line {loop.lineno}", True)
    if _iterates_loader(loop):
        return Step(f"is called from the loop over batches on line {loop.lineno}", False)
    return None


def step_functions(ctx) -> dict:
    """id(function) -> Step, for the functions of the file that run every step."""
    found = ctx.shared.get("step_functions")
    if found is not None:
        return found
    calls = file_calls(ctx)
    found = {}
    trains = may_mention(ctx, "backward") and may_mention(ctx, "step")
    for function in calls.functions:
        backward, step = _trains(_outside_loops(function.body)) if trains else (False, False)
        if backward and step:
            found[id(function)] = Step("is a training step", True)
        elif function.name in STEP_HOOKS:
            found[id(function)] = Step(f"is the `{function.name}` hook", function.name == "training_step")
        elif function.name == "forward" and _module_method(calls, function):
            found[id(function)] = Step("is a module's `forward`, run on every step", False, True)
    changed = True
    while changed:  # what a step function calls runs every step too, followed to a fixed point
        changed = False
        for function in calls.functions:
            if id(function) in found:
                continue
            for site in calls.call_sites(function):
                if site.conditional:
                    continue  # `if self.debug: self.log_grads()`: not every step
                caller = found.get(id(site.functions[-1])) if site.functions else None
                if caller is not None:
                    name = site.functions[-1].name
                    found[id(function)] = Step(f"is called from `{name}`, which {caller.why}", caller.training,
                                               caller.forward)
                    break
                loop_step = next((s for s in map(_loop_step, reversed(site.loops)) if s is not None), None)
                if loop_step is not None:
                    found[id(function)] = loop_step
                    break
            changed = changed or id(function) in found
    ctx.shared["step_functions"] = found
    return found


def step_of(ctx, functions) -> Optional[Step]:
    """The Step of the innermost of `functions` (the engine's function stack) that runs every step."""
    table = step_functions(ctx)
    for function in reversed(functions):
        if isinstance(function, ast.Lambda):
            continue
        step = table.get(id(function))
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
        return f"call of `{self.function.name}`, which {self.step.why}"


def per_step(ctx) -> Optional[PerStep]:
    """Whether the node being visited runs on every step, and where: on every iteration of a loop
    around it that repeats it (at module level, in a module's `forward`, or in a function that
    does not run once by its name, `runs_once`; in one that does, only where a loop trains), on
    every forward call (directly in the `forward` of a class not known to be plain,
    `plain_class`), or on every call of a function that runs every step (`step_of`). None
    elsewhere."""
    function = ctx.function
    loops = repeating_loops(ctx)
    if function is None:
        return PerStep(loops, None, None) if loops else None
    name = getattr(function, "name", "")
    if name == "forward":
        if loops or ctx.class_ is not None and len(ctx.functions) == 1 and not plain_class(ctx, ctx.class_):
            return PerStep(loops, None, function)
        return None
    if not loops:
        step = step_of(ctx, ctx.functions)
        return PerStep(loops, step, function) if step is not None else None
    if not runs_once(name) or any(is_training_loop(ctx, loop) for loop in loops):  # `.backward()`: not run once
        return PerStep(loops, None, function)
    return None
