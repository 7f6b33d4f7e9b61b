"""MAT502 host-sync-in-loop: a device-to-host synchronization on every step of a training or
evaluation loop."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.diagnostics import Fix
from matlint.rule import Only, Rule, bad, good

from . import _kinds
from ._loops import LoopInfo, identifier as _identifier, is_training_loop, iterates_loader

_GATE_NAME = re.compile(r"log|print|verbose|debug|interval|every|freq|display|report|eval|save|val",
                        re.IGNORECASE)
_NOT_SYNCED = (_kinds.CPU_TENSOR,) + _kinds.NON_TENSORS
_SYNC_METHODS = {"item", "cpu", "tolist", "to"}
_CONVERSIONS = {"float", "int", "bool"}


def _is_cpu_target(call: ast.Call) -> bool:
    target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    return target is not None and _kinds._is_cpu_literal(target)


class HostSyncInLoop(Rule):
    code = "MAT502"
    name = "host-sync-in-loop"
    summary = "A device-to-host sync (`.item()`, `.cpu()`, `float(t)`, `if t:` ...) on every step of a training or evaluation loop."
    docs = """
    ## What it does
    Flags, inside a training or evaluation loop, the calls that copy a tensor's value to the
    host: `.item()`, `.cpu()` / `.to("cpu")`, `.tolist()`, `float(t)`, `int(t)`, `bool(t)`,
    `if t:` / `while t:` on a tensor, and `print(t)` of a tensor. A training loop is a loop
    whose body calls `.backward()` or an optimizer's `.step()`; an evaluation loop iterates
    over a data loader. `.numpy()` is reported through the `.cpu()` that must precede it (on a
    GPU tensor `.numpy()` alone raises instead of syncing).

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
    - Syncs outside loops, in loops that are not training/evaluation steps (an epoch loop whose
      steps run in an inner loop, a loop over parameters outside any step loop), and syncs gated
      to run every N steps (`if step % log_every == 0:`, `if verbose:`) or once (in a branch
      that ends in `return`, `break` or `raise`, in the `return` itself, in an `except`).
    - Loops over a list of loaders or of their names (`for loader in val_loaders:`): one step
      per dataset, not per batch. A loader is a `DataLoader` or a name ending in `loader`.
    - Values whose kind it cannot tell, for `float()`, `int()`, `bool()`, `if`, `print()` and
      `.tolist()` (those need a value known to be a tensor).

    ## Fix safety
    `total += loss.item()` has an unsafe fix to `total += loss.detach()`: the accumulator
    becomes a tensor, which changes how it prints and what type later code sees.
    """
    examples = [
        bad("""
            import torch
            def train(model, loader, opt, criterion):
                total = 0.0
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    loss.backward()
                    opt.step()
                    total += loss.item()
                return total
            """, (8, 18),
            fixed="""
            import torch
            def train(model, loader, opt, criterion):
                total = 0.0
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    loss.backward()
                    opt.step()
                    total += loss.detach()
                return total
            """, unsafe=True),
        bad("""
            import torch
            import torch.nn.functional as F
            @torch.no_grad()
            def evaluate(model, val_loader):
                correct = 0
                preds = []
                for x, y in val_loader:
                    logits = model(x.to("cuda"))
                    loss = F.cross_entropy(logits, y.to("cuda"))
                    preds.append(logits.argmax(-1).cpu())
                    if torch.isnan(loss):
                        break
                    print(loss)
                return preds
            """, (10, 22), (11, 12), (13, 9)),
        bad("""
            import torch
            import torch.nn.functional as F
            def train(model, loader, opt):
                for x, y in loader:
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                    if torch.isnan(loss).any():
                        continue
                    loss.backward()
                    if not loss.isfinite().all():
                        raise RuntimeError("non-finite loss")
                    opt.step()
            """, (6, 12), (9, 16)),
        bad("""
            import torch
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            step = 0
            while step < 100:
                x = torch.randn(8, 4, device="cuda")
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                losses = loss.tolist()
                value = float(loss)
                step += 1
            """, (10, 14), (11, 13)),
        good("""
            import torch
            def train(model, loader, opt, log_every=100):
                for step, (x, y) in enumerate(loader):
                    loss = model(x.cuda(), y.cuda())
                    loss.backward()
                    opt.step()
                    if step % log_every == 0:
                        print(loss.item())
                print(loss.item())
            """),
        good("""
            import torch
            def epochs(model, loader, opt, n):
                for epoch in range(n):
                    for x, y in loader:
                        loss = model(x, y)
                        loss.backward()
                        opt.step()
                    print(f"epoch {epoch}: {loss.item():.3f}")
            """),
        good("""
            import numpy as np
            import torch
            def evaluate(model, loader):
                for x, y in loader:
                    labels = y.tolist()
                    arr = np.zeros(3)
                    v = arr.item()
                    t = torch.tensor([1.0, 2.0])
                    s = t.sum().item()
                    moved = x.cpu()
            """),
        good("""
            import torch
            def stats(model):
                for name, p in model.named_parameters():
                    print(name, p.norm().item())
            """),
        good("""
            import torch
            import torch.nn.functional as F
            def evaluate_all(model, loader_names, val_loaders, evaluate):
                results = [evaluate(model, name).item() for name in loader_names]
                for loader in val_loaders:
                    results.append(evaluate(model, loader).item())
                return results
            def longest(loader, arrays):
                n = 0
                for ids, lengths in loader:
                    n = max(n, lengths.max().item(), torch.from_numpy(arrays[0]).max().item())
                return n
            def train(model, loader, opt, max_steps, skip):
                for step, (x, y) in enumerate(loader):
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                    loss.backward()
                    opt.step()
                    if step + 1 >= max_steps:
                        print(f"stopped at {loss.item():.3f}")
                        break
                    if step in skip:
                        raise ValueError(f"loss is {loss.item()}")
                return loss.item()
            """),
    ]

    only = {name: Only(in_loops=True) for name in ("visit_Call", "visit_If", "visit_While", "visit_IfExp")}

    def visit_Call(self, node: ast.Call) -> None:
        if not self.ctx.loops:
            return
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS:
            self._method(node, func)
        elif isinstance(func, ast.Name) and self.ctx.qualname(func) is None and node.args:
            if self._step_loop() is None:
                return
            if func.id in _CONVERSIONS and len(node.args) == 1 and not node.keywords:
                if self._is_device_tensor(node.args[0]):
                    self._report(node, f"`{func.id}(tensor)`", "convert after the loop, or keep the value on the device")
            elif func.id == "print":
                for arg in node.args:
                    values = [v.value for v in arg.values if isinstance(v, ast.FormattedValue)] \
                        if isinstance(arg, ast.JoinedStr) else [arg]
                    if any(self._is_device_tensor(v) for v in values):
                        self._report(node, "`print()` of a tensor", "print every N steps, or accumulate and print after the loop")
                        return

    def visit_If(self, node: ast.If) -> None:
        self._condition(node.test)

    def visit_While(self, node: ast.While) -> None:
        if self.ctx.loops:
            self._condition(node.test)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._condition(node.test)

    # -- checks ---------------------------------------------------------------------
    def _method(self, node: ast.Call, func: ast.Attribute) -> None:
        receiver = func.value
        if self._step_loop() is None or self._chain_already_synced(receiver):
            return
        kind = _kinds.kind_of(self.ctx, receiver)
        if kind in _NOT_SYNCED:
            return
        method = func.attr
        if method == "to" and not _is_cpu_target(node):
            return
        if method == "tolist" and kind not in _kinds.TENSORS:
            return
        if method == "item":
            fix = self._detach_fix(node, receiver)
            instead = ("keep the running value on the device (`total += loss.detach()`) and call `.item()` once after the loop"
                       if fix else "keep the values on the device and convert them once after the loop "
                                   "(`torch.stack(values).tolist()`), or log every N steps")
            self._report(node, "`.item()`", instead, fix=fix)
        elif method in ("cpu", "to"):
            self._report(node, f"`.{method}({'' if method == 'cpu' else self.ctx.segment(node.args[0] if node.args else node)})`",
                         "collect results on the device (`torch.cat`/`torch.stack` after the loop) and copy once")
        else:
            self._report(node, "`.tolist()`", "collect results on the device and convert once after the loop")

    def _condition(self, test: ast.AST) -> None:
        if not self.ctx.loops or self._step_loop() is None:
            return
        values = test.values if isinstance(test, ast.BoolOp) else [test]
        for value in values:
            inner = value.operand if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not) else value
            if self._is_device_tensor(inner) and not self._contains_sync_call(inner):
                self._report(inner, "a tensor used as a Python `bool`",
                             "keep the decision on the device (`torch.where`, masking) or check it every N steps",
                             in_test=True)
                return

    def _report(self, node: ast.AST, what: str, instead: str, fix: Optional[Fix] = None, in_test: bool = False) -> None:
        loop = self._step_loop()
        if loop is None or self._gated(loop, in_test):
            return
        kind = "training" if self._is_training(loop) else "evaluation"
        self.report(node, f"{what} waits for the GPU and copies to the host on every step of the {kind} "
                          f"loop on line {loop.node.lineno}; {instead}", fix=fix)

    def _detach_fix(self, call: ast.Call, receiver: ast.AST) -> Optional[Fix]:
        parent = self.ctx.parent
        if isinstance(parent, ast.AugAssign) and parent.value is call and isinstance(parent.op, ast.Add):
            return self.replace(call, f"{self.ctx.segment(receiver)}.detach()",
                                "Accumulate on the device with `.detach()`; call `.item()` once after the loop",
                                safe=False)
        return None

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
            self.ctx.shared[key] = self._is_training(loop) or self._iterates_loader(loop)
        return self.ctx.shared[key]

    def _is_training(self, loop: LoopInfo) -> bool:
        return is_training_loop(self.ctx, loop)

    def _iterates_loader(self, loop: LoopInfo) -> bool:
        return iterates_loader(self.ctx, loop)

    def _gated(self, loop: LoopInfo, in_test: bool) -> bool:
        """The call sits under an `if` that lets it run only some steps (every N, verbose...), in
        a branch that leaves the loop (`return`, `break`, `raise`), or in an error path."""
        parents = self.ctx.parents
        start = next((i for i, p in enumerate(parents) if p is loop.node), None)
        if start is None:
            return False
        chain = parents[start + 1:]
        for i, parent in enumerate(chain):
            if isinstance(parent, (ast.ExceptHandler, ast.Return, ast.Raise)):
                return True  # an error path, or the statement that leaves the loop: once at most
            if isinstance(parent, ast.If):
                child = chain[i + 1] if i + 1 < len(chain) else None
                if child is parent.test or (in_test and child is None):
                    continue
                branch = parent.body if any(stmt is child for stmt in parent.body) else parent.orelse
                if branch and isinstance(branch[-1], (ast.Return, ast.Break, ast.Raise)):
                    return True  # the branch leaves the loop: it runs on one step, not every step
                if _is_gate(parent.test):
                    return True
        return False


def _is_gate(test: ast.AST) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and _GATE_NAME.search(_identifier(node) or ""):
            return True
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq,)) for op in node.ops):
            return True
    return False

