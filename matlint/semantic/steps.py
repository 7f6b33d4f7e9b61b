"""Which functions of a file run on every step of a training or evaluation loop, so that what
they do counts per step although no loop is written around it in the function itself.

A function runs every step when it is a training step (it calls both `.backward()` and an
optimizer's `.step()` once per call, outside any loop of its own: TD3's `train(replay_buffer)`,
an agent's `learn()`), a framework's step
hook (`training_step`, `validation_step`, `test_step`), a module's `forward`, or when the file calls it from such a
function or from inside a loop that trains (its body calls `.backward()` or an optimizer's
`.step()`) or goes over a data loader. Built once per file, on first use.
"""
from __future__ import annotations

import ast
from typing import NamedTuple, Optional

from .calls import file_calls
from .kinds import may_mention
from .loops import is_backward, is_optimizer_step, walk_no_scopes
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
