"""MAT502's dataflow of a synced value: whether the host reads it now (a Python number, a branch,
a read before a non-blocking copy lands), only accumulates it, or sends it back to the device."""
from __future__ import annotations

import ast
import builtins
import re
from typing import Optional

from matlint.diagnostics import Fix
from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import CONTAINER_MUTATORS
from matlint.semantic.loops import LoopInfo, bound_names, identifier as _identifier, loaded_names, walk_no_scopes
from matlint.semantic.steps import is_step_loop, runs_a_training_step, step_loop

from .steps import _NESTED_LOOPS, _first_time, _goes_over, _is_gate, _leaves, _stops_on_comparison


_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
# Builtins whose result goes over the items of their arguments, as the host reads them.
_ITEM_BUILTINS = frozenset({"zip", "enumerate", "reversed", "sorted", "list", "tuple"})


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


class _HostReads:
    """HostSyncInLoop's analysis of how a synced value is read."""

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
        # the iteration's body, or in a step function with no loop of its own, the call's
        function = self.ctx.function
        body = self.ctx.loops[-1].body if self.ctx.loops else getattr(function, "body", None)
        if not isinstance(body, list):
            return None  # at module level, or in a lambda
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
        loop = step_loop(self.ctx)
        if loop is None or not isinstance(target, ast.Name):
            return None
        around = self.ctx.loops[:self.ctx.loops.index(loop)]
        while around and is_step_loop(self.ctx, around[-1]):
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

    def _gated_read(self, read: ast.AST, loop: LoopInfo, parents: dict) -> bool:
        """`read` runs on some steps only: under a gate (`if i % 100 == 0:`), in a branch that
        leaves the loop, or in an `except`."""
        child, parent = read, parents.get(read)
        while parent is not None and parent is not loop.node:
            if isinstance(parent, ast.ExceptHandler):
                return True
            if isinstance(parent, ast.If) and child is not parent.test:
                in_body = any(stmt is child for stmt in parent.body)
                branch = parent.body if in_body else parent.orelse
                if _leaves(self.ctx, branch[-1]) or in_body and (_is_gate(parent.test, loop) or _first_time(parent)):
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
            stored = _kinds.assigned_expression(entry)  # `total = 0.0`, `total, n = 0.0, 0`
            if stored is not None and self._number_value(stored):
                continue
            if tag == "aug" and self._number_value(entry[1].value):
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
        convergence test), or Python code goes over it item by item (iterates or indexes it, or a
        `for` goes over it where it is made: `for r, v in zip(rewards, values.cpu().numpy())`); or it
        is an input of host code whose result the loop moves back to the device or hands to the step."""
        if self._back_to_device(node, loop) or self._feeds_the_step(node, loop) or self._iterated_here(node):
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

    def _gone_over_in_function(self, node: ast.AST) -> bool:
        """In a function that runs on every step (a helper of `forward`), the copy, made once per
        call (in no loop of the function), is what a loop of the function then goes over item by
        item to build what the function returns (`memory_len = memory_len.cpu().numpy()`, then
        `for idx in range(memory_len[i]): weight[i].append(...)`, `return memory * weight`): the
        host computes the result from the values. A loop that only logs them returns nothing."""
        function = self.ctx.function
        if function is None:
            return False
        nodes = set(walk_no_scopes(function))
        if any(loop.node in nodes for loop in self.ctx.loops):
            return False
        bound = self._bound_name(node)
        if self._iterated_here(node):
            loops = [parent for parent in self.ctx.parents if isinstance(parent, (ast.For, ast.AsyncFor))]
        elif bound is not None:
            name, statement = bound
            loops = [other for other in walk_no_scopes(function) if isinstance(other, _NESTED_LOOPS)
                     and getattr(other, "lineno", 0) > statement.end_lineno and _goes_over(other, name)]
        else:
            return False
        return any(_returns_what_it_builds(function, loop) for loop in loops)

    def _iterated_here(self, node: ast.AST) -> bool:
        """The copy (through numpy functions and builtins that go over items, as `_bound_name`
        follows them) is what a nested `for` iterates."""
        current = node
        for parent in reversed(self.ctx.parents):
            if isinstance(parent, (ast.For, ast.AsyncFor)):
                return parent.iter is current
            if not self._carries_value(parent, current):
                return False
            current = parent
        return False

    def _carries_value(self, parent: ast.AST, current: ast.AST) -> bool:
        """`parent` holds the values of `current`: an attribute or call of it (`x.cpu().numpy()`),
        a numpy function of it, or a builtin that goes over its items (`zip(names, values)`)."""
        return (isinstance(parent, ast.Attribute) and parent.value is current) or \
            (isinstance(parent, ast.Call) and parent.func is current) or \
            (isinstance(parent, ast.Call) and any(arg is current for arg in parent.args)
             and ((self.ctx.qualname(parent.func) or "").startswith("numpy.")
                  or isinstance(parent.func, ast.Name) and parent.func.id in _ITEM_BUILTINS
                  and not self.ctx.names.binds_locally(parent.func.id)))

    def _feeds_the_step(self, node: ast.AST, loop: LoopInfo) -> bool:
        """The value, bound to a name, goes through host code (numpy arithmetic, items stored into
        arrays) into the arguments of a training step the loop calls in the same iteration (a
        rollout's last values, then advantages computed in numpy for `self._update_network(...,
        returns, advantages)`): the step waits for the host's result, so the host needs the value
        now."""
        bound = self._bound_name(node)
        if bound is None:
            return False
        names = {bound[0]}
        assigns = [a for stmt in loop.body for a in walk_no_scopes(stmt) if isinstance(a, (ast.Assign, ast.AugAssign))]
        changed = True
        while changed:
            changed = False
            for assign in assigns:
                if not loaded_names(assign.value) & names:
                    continue
                for target in assign.targets if isinstance(assign, ast.Assign) else [assign.target]:
                    while isinstance(target, (ast.Subscript, ast.Attribute)):
                        target = target.value  # `advs[t] = ...`: the array holds it
                    new = ({target.id} if isinstance(target, ast.Name) else bound_names(target)) - names
                    if new:
                        names |= new
                        changed = True
        return any(isinstance(call, ast.Call) and any(loaded_names(arg) & names for arg in _call_inputs(call))
                   and runs_a_training_step(self.ctx, call)
                   for stmt in loop.body for call in walk_no_scopes(stmt))

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
        """`call` puts a value read from `names` on the device: `.to(device)` or `.cuda()` of it, a
        tensor made from it with a `device=` (`torch.as_tensor(state, device=device)`), or a
        function of the file that returns a device tensor made from it (`self._get_tensors(obs)`)."""
        func = call.func
        if isinstance(func, ast.Attribute) and loaded_names(func.value) & names:
            return _kinds.moves_to_device(self.ctx, call)
        if not any(loaded_names(arg) & names for arg in call.args):
            return False
        if any(k.arg == "device" for k in call.keywords):
            return _kinds.kind_of(self.ctx, call) == _kinds.TENSOR
        return self.ctx.qualname(func) is None and _kinds.own_call_returns_device_tensor(self.ctx, call)

    def _bound_name(self, node: ast.AST):
        """(name, statement) where the sync's value is bound (`v = x.cpu().tolist()`, `a, b =
        (x.tolist(), y.tolist())`), also through numpy functions of it (`np.squeeze(x.cpu().numpy())`),
        builtins that go over its items (`zip(names, p.tolist())`) and a branch of a conditional
        expression, else None."""
        current, index = node, None
        for parent in reversed(self.ctx.parents):
            if self._carries_value(parent, current) or isinstance(parent, ast.IfExp) and parent.test is not current:
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

    # -- context ------------------------------------------------------------------------
    def _is_device_tensor(self, expr: ast.AST) -> bool:
        """A device tensor by its kind, unless each name that makes it one holds a host value
        where it is read (`anchors = anchors.to("cpu")` reaches `math.log(w / anchors[n][0])`)."""
        if _kinds.kind_of(self.ctx, expr) != _kinds.TENSOR:
            return False
        names = [n for n in _outside_indices(expr) if isinstance(n, ast.Name) and _kinds.kind_of(self.ctx, n) == _kinds.TENSOR]
        return not names or any(_kinds.reaching_kind(self.ctx, n) == _kinds.TENSOR for n in names)

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


def _outside_indices(expr: ast.AST):
    """The nodes of `expr` but those of its subscripts' indices: an item lives where the indexed
    tensor does (`anchors[best_n]` of host `anchors`), whatever the index is."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.Subscript):
            stack.append(node.value)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _root_name(expr: ast.AST) -> Optional[str]:
    while isinstance(expr, (ast.Subscript, ast.Attribute)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _returns_what_it_builds(function: ast.AST, loop: ast.AST) -> bool:
    """What `loop` stores (names it assigns, items it writes, lists it appends to) reaches a
    `return` of `function`, directly or through the statements after the loop."""
    built = set()
    for node in walk_no_scopes(loop):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                built |= {n for n in map(_root_name, [target] + getattr(target, "elts", [])) if n}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and (node.func.attr in CONTAINER_MUTATORS or node.func.attr == "add"):  # `seen.add(x)` of a set
            root = _root_name(node.func.value)
            if root:
                built.add(root)
    if not built:
        return False
    after = [stmt for stmt in walk_no_scopes(function) if isinstance(stmt, ast.stmt)
             and getattr(stmt, "lineno", 0) > loop.end_lineno]
    for stmt in sorted(after, key=lambda s: s.lineno):
        if isinstance(stmt, ast.Return):
            if stmt.value is not None and loaded_names(stmt.value) & built:
                return True
        elif isinstance(stmt, ast.Assign) and loaded_names(stmt.value) & built:
            for target in stmt.targets:
                built |= bound_names(target)
    return False
