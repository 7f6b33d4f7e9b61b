"""MAT505 compile-graph-break: code under `torch.compile` that dynamo cannot put in one graph (a
graph break), and, at run time, compiled code that recompiles."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import file_calls
from matlint.semantic.names import TESTS

_COMPILE = "torch.compile"
# Calls that end dynamo's graph in the default configuration, and what to write instead.
_BREAKS = {
    "item": "keep the value a tensor (a 0-d tensor works in arithmetic and in `torch.where`), or set "
            "`torch._dynamo.config.capture_scalar_outputs = True`",
    "tolist": "keep the values in a tensor on the device",
    "numpy": "keep the values in a tensor on the device; convert outside the compiled function",
    "print": "print outside the compiled function (or every N steps there), or add `print` to "
             "`torch._dynamo.config.reorderable_logging_functions`",
}


def _compiled_functions(ctx) -> frozenset:
    """ids of the functions of the file that run compiled: decorated with `torch.compile` (with or
    without arguments), passed to it (`step = torch.compile(train_step)`), or the `forward` of a
    class of the file whose instance is (`torch.compile(Net())`, or a name bound once to `Net()`)."""
    found = ctx.shared.get("mat505_compiled")
    if found is not None:
        return found
    calls = file_calls(ctx)
    compiled = set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ctx.qualname(target) == _COMPILE:
                    compiled.add(id(node))
        elif isinstance(node, ast.Call) and node.args and ctx.qualname(node.func) == _COMPILE:
            function = _compiled_target(ctx, calls, node.args[0], node)
            if function is not None:
                compiled.add(id(function))
    found = ctx.shared["mat505_compiled"] = frozenset(compiled)
    return found


def _compiled_target(ctx, calls, arg: ast.AST, compile_call: ast.Call) -> Optional[ast.AST]:
    """The function of the file that `compile_call`, `torch.compile(arg)`, compiles, else None."""
    if isinstance(arg, ast.Name) and arg.id in calls.module_functions:
        return calls.module_functions[arg.id]
    if isinstance(arg, ast.Name):
        # `model = Net()`, then `model = torch.compile(model)`: the one other binding of the name
        entries = [e for e in _kinds.bindings(ctx, arg.id) or [] if e[1] is not compile_call]
        values = [e[1] for e in entries if e[0] == "value"]
        if len(values) != 1 or len(entries) != 1:
            return None
        arg = values[0]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in calls.classes:
        return calls.methods.get(id(calls.classes[arg.func.id]), {}).get("forward")
    return None


def _captures_scalars(ctx) -> bool:
    """The file sets `torch._dynamo.config.capture_scalar_outputs = True`: `.item()` stays in the graph."""
    return "capture_scalar_outputs" in ctx.source


class CompileGraphBreak(Rule):
    code = "MAT505"
    name = "compile-graph-break"
    quiet_in = (TESTS,)
    summary = ("Code under `torch.compile` that dynamo cannot keep in one graph (`.item()`, `print()`, "
               "a branch on a tensor), or compiled code that recompiles.")
    runtime_docs = """
    The guard reports what dynamo did while it watched:
    - every graph break, at the line dynamo names, with its reason and dynamo's own hint (a branch
      on a tensor's value, an unsupported builtin, a call dynamo cannot trace...);
    - every function that was recompiled, at its `def`, with the guard failures that made
      dynamo compile it again (a size that changed, a Python value that differs per call).
    Breaks and recompiles from before the guard attached are counted in a note.
    """
    docs = """
    ## What it does
    Statically, flags the calls that end dynamo's graph in a function that runs compiled: a
    function decorated with `@torch.compile` (with or without arguments), one passed to it
    (`step = torch.compile(train_step)`), or the `forward` of a class of the file whose instance
    is (`model = torch.compile(Net())`, or a name bound once to `Net()`). The calls are `.item()`,
    `.tolist()`, `.numpy()` and `print()`.

    ## Why is this bad?
    At a graph break dynamo ends the compiled graph, runs the offending code in Python, and
    resumes in a new graph: the step becomes several graphs with host work between them, each
    launched separately, and the fusions across the break are lost. `.item()` also waits for
    the device. A recompile costs seconds of compilation each time, and dynamo gives up on a
    function after `torch._dynamo.config.recompile_limit` recompiles, running it eagerly from
    then on.

    ## Example
    ```python
    @torch.compile
    def train_step(model, x, y, opt):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(loss.item())
    ```

    ## Use instead
    ```python
    @torch.compile
    def train_step(model, x, y, opt):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()          # read it outside, every N steps
    ```

    ## Stays quiet on
    - The same calls in functions the file does not compile (MAT502 covers syncs in loops).
    - `.item()` where the file sets `torch._dynamo.config.capture_scalar_outputs = True`
      (dynamo then keeps it in the graph).
    - Functions compiled in another file (`torch.compile(model)` of a model imported from
      elsewhere): the static half cannot see them; the guard reports their breaks at run time.

    ## Fix safety
    No fix: what replaces a printed or returned value, or which dim to mark dynamic, is the
    author's choice.
    """

    only = {"visit_Call": Only(attrs=frozenset(_BREAKS), if_file=lambda ctx: _kinds.may_mention(ctx, "compile"))}

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("item", "tolist", "numpy") and not node.args:
            what = func.attr
            if what == "item" and _captures_scalars(self.ctx):
                return
        elif isinstance(func, ast.Name) and func.id == "print" and self.ctx.qualname(func) is None:
            what = "print"
        else:
            return
        function = self.ctx.function
        if function is None or id(function) not in _compiled_functions(self.ctx):
            return
        shown = f"`.{what}()`" if what != "print" else "`print()`"
        self.report(node, f"{shown} in `{function.name}`, which runs under torch.compile, breaks the graph: "
                          f"dynamo ends the compiled graph here, runs it in Python and resumes in a new graph "
                          f"on every call; {_BREAKS[what]}")
