"""MAT104 per-head-modules: identical per-head modules applied one by one to the same input and
concatenated."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of
from matlint.semantic.kinds import class_attribute_values, sized_factory_rank
from matlint.semantic.loops import bound_names, loaded_names
from matlint.semantic.kinds import imported_class
from matlint.semantic.tree import walk

_JOINS = {"torch.cat", "torch.concat", "torch.concatenate", "torch.stack"}
_MODULE_LISTS = {"torch.nn.ModuleList"}
_LINEAR = {"torch.nn.Linear"}
# Layers that compute several items at once when given their summed output width: the keyword
# of that width. A convolution with `groups` is left alone (its channels are split), also where
# `groups` is passed by position (the seventh argument: in, out, kernel, stride, padding, dilation, groups).
_WIDENABLE = {"torch.nn.Linear": "out_features", "torch.nn.Conv1d": "out_channels", "torch.nn.Conv2d": "out_channels",
              "torch.nn.Conv3d": "out_channels"}
_GROUPS_POSITION = 6
_LIST, _DICT = "torch.nn.ModuleList", "torch.nn.ModuleDict"  # how the heads are read: `self.attr`, `self.attr.values()`
# Methods that lay each head's output out alike: the joined result is one layout of all heads'.
_LAYOUT = frozenset({"view", "reshape", "unsqueeze", "flatten", "permute", "transpose", "contiguous"})
_ATTENTION_CALLS = frozenset({"softmax", "log_softmax", "scaled_dot_product_attention", "Softmax"})


def _self_attr(expr: ast.AST, self_name: str) -> Optional[str]:
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == self_name:
        return expr.attr
    return None


def _atomic(text: str, expr: ast.AST) -> str:
    """`text` of `expr`, parenthesized where a product would bind into it (`n * (d + 1)`)."""
    return text if isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)) else f"({text})"


def _params(fn) -> list:
    return fn.args.posonlyargs + fn.args.args


def _range_stop(expr: ast.AST) -> Optional[ast.AST]:
    """`n` for `range(n)`."""
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "range"
            and len(expr.args) == 1 and not expr.keywords):
        return expr.args[0]
    return None


def _applied_alike(call: ast.Call, item: str) -> bool:
    """`call` has inputs and none of them reads `item` (the loop's head or index)."""
    return bool(call.args) and not any(item in loaded_names(a) for a in call.args + call.keywords)


def _heads_read(iterable: ast.AST, self_name: str):
    """(attr, container) for `self.attr` (a ModuleList's items) and `self.attr.values()` (a
    ModuleDict's), else None."""
    attr = _self_attr(iterable, self_name)
    if attr:
        return attr, _LIST
    if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "values"
            and not iterable.args and not iterable.keywords):
        attr = _self_attr(iterable.func.value, self_name)
        return (attr, _DICT) if attr else None
    return None


def _each_item(target: ast.AST, iterable: ast.AST, self_name: str):
    """(attr, item, index, container) for `for h in self.attr` (index None), `for h in
    self.attr.values()` and `for i, h in enumerate(...)` of either, else None."""
    if isinstance(target, ast.Name):
        read = _heads_read(iterable, self_name)
        return (read[0], target.id, None, read[1]) if read else None
    if (isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts)
            and isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "enumerate"
            and len(iterable.args) == 1):
        read = _heads_read(iterable.args[0], self_name)
        return (read[0], target.elts[1].id, target.elts[0].id, read[1]) if read else None
    return None


def _same_count(stop: str, count: Optional[str]) -> bool:
    """`range(stop)` in a method covers the `count` items `__init__` built: the same number, or
    the same `self.` attribute (a bare name in `__init__` is a local there, not the method's)."""
    return count is not None and stop == count and (count.isdigit() or count.startswith("self."))


def _stop_is_len_of(stop: ast.AST, attr: str, self_name: str) -> bool:
    """`len(self.attr)`."""
    return (isinstance(stop, ast.Call) and isinstance(stop.func, ast.Name) and stop.func.id == "len"
            and len(stop.args) == 1 and _self_attr(stop.args[0], self_name) == attr)


_GEMM_FUNCTIONS = frozenset({"torch.mm", "torch.matmul", "torch.bmm", "torch.einsum", "torch.nn.functional.linear"})


def _multiplies_parameter_matrix(cls: ast.ClassDef, qualname) -> bool:
    """`cls` stores a matrix parameter (`self.W = nn.Parameter(torch.empty(size=(d, k)))`) and
    multiplies by it (`torch.mm(h, self.W)`, `h @ self.W`, `F.linear(h, self.W)`): its own projection."""
    matrices = set()
    for node in ast.walk(cls):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call) and qualname(node.value.func) == "torch.nn.Parameter"
                and node.value.args and sized_factory_rank(node.value.args[0], qualname) == 2):
            matrices.add(node.targets[0].attr)
    if not matrices:
        return False

    def is_matrix(expr):
        return isinstance(expr, ast.Attribute) and expr.attr in matrices and isinstance(expr.value, ast.Name)
    for node in ast.walk(cls):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and (is_matrix(node.left) or is_matrix(node.right)):
            return True
        if isinstance(node, ast.Call) and qualname(node.func) in _GEMM_FUNCTIONS and any(map(is_matrix, node.args)):
            return True
    return False


_LIST_CHANGES = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort", "update",
                           "popitem", "setdefault"})


class PerHeadModules(Rule):
    code = "MAT104"
    name = "per-head-modules"
    summary = "Identical per-head modules run one after another on the same input and concatenated; one batched module runs all heads at once."
    docs = """
    ## What it does
    Flags `torch.cat`/`torch.stack` of the outputs of a `ModuleList`'s modules applied one by one
    to the same input (`torch.cat([h(x) for h in self.heads], dim=-1)`, also through
    `enumerate(self.heads)`, by index over all of them `[self.heads[i](x) for i in
    range(len(self.heads))]` or `range(self.n_heads)` when `__init__` stored its count parameter
    there, or a loop appending `head(x)` to a list that is then concatenated) when `__init__`
    built the list from one class with the same arguments for every item
    (`nn.ModuleList([Head(d) for _ in range(n)])`, or a loop of `append`s; also copies of one
    module, `[copy.deepcopy(layer) for _ in range(n)]` or a helper of the file that only returns
    that list, `clones(layer, n)`; or a `ModuleDict` built by `{k: Head(d) for k in keys}` whose
    `.values()` are applied), and that class is `nn.Linear`, an `nn.Conv1d`/`2d`/`3d` without
    `groups` (a capsule network's primary capsules), an `nn.Sequential` of `torch.nn` layers
    built in the call that holds an `nn.Linear`, or a class of the same file that holds
    `nn.Linear` projections. The advice depends on the class: one wider `nn.Linear` (or
    convolution, with `n * out_channels` outputs) for Linear or convolution items, a head dim for an attention
    head (a class computing a softmax), stacked member weights (`torch.func.stack_module_state`
    with `torch.vmap`, or batched GEMMs) for any other class, such as an ensemble of small models.

    ## Why is this bad?
    Each head runs its own small GEMMs (and softmax, and launches): `n_heads` times the kernels
    of one batched computation, each too small to fill the matrix units. A single projection
    to `n_heads * head_size` followed by a reshape to a head dim computes the same function in
    one GEMM, and attention over the head dim is one batched call
    (`F.scaled_dot_product_attention` takes `(B, heads, T, d)`).

    ## Example
    ```python
    self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
    ...
    out = torch.cat([h(x) for h in self.heads], dim=-1)
    ```

    ## Use instead
    ```python
    self.qkv = nn.Linear(n_embd, 3 * num_heads * head_size)
    ...
    q, k, v = self.qkv(x).view(B, T, 3, num_heads, head_size).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
    ```

    ## Stays quiet on
    - Lists of different modules, or of one class built with per-item arguments
      (`Block(i)`, `nn.Linear(dims[i], dims[i + 1])`): not identical.
    - Sequential use (`for layer in self.layers: x = layer(x)`) and heads given different inputs
      (`expert(x[idx])`, `h(x_i)`).
    - Lists of classes from other files whose content it cannot see (ensembles of full models
      defined elsewhere), and lists not built in `__init__` of the same class.
    - Indexing over a range not known to cover every item (`range(k)` for a list built with
      `range(n)`, `range(self.n_heads)` where `self.n_heads` is stored more than once or from a
      changed local).

    ## Fix safety
    No automatic fix: the weights must be re-laid out into one module (checkpoints change).
    """

    # The join is `torch.cat(...)`-like, or a bare name bound to one. The heads may be a class of
    # a project module the file imports, in a plain list: no word of this file tells them apart.
    only = {"visit_Call": Only(attrs=frozenset(name.rsplit(".", 1)[1] for name in _JOINS))}

    def visit_Call(self, node: ast.Call) -> None:
        fn, cls = self.ctx.function, self.ctx.class_
        if fn is None or cls is None or not node.args or self.ctx.qualname(node.func) not in _JOINS:
            return
        if fn not in cls.body or not _params(fn):
            return
        self_name = _params(fn)[0].arg
        applied = self._applied_heads(node.args[0], fn, self_name)
        if applied is None:
            return
        attr, call_text, stop, container = applied
        built = self._identical_items(cls, attr, container)
        if built is None:
            return
        module_call, count = built
        seg = self.ctx.segment
        if stop is not None and not (_same_count(seg(stop), count) or _stop_is_len_of(stop, attr, self_name)
                                     or self._holds_count(cls, stop, self_name, count)):
            return  # `self.heads[i] for i in range(k)`: not known to apply every head
        kind = module_call.func
        if self.ctx.qualname(kind) in _WIDENABLE:
            width = module_call.args[1] if len(module_call.args) >= 2 else next(
                (k.value for k in module_call.keywords if k.arg == _WIDENABLE[self.ctx.qualname(kind)]), None)
            if width is None:
                return
            times = f"{count or 'n'} * {_atomic(seg(width), width)}"
            args = [times if a is width else seg(a) for a in module_call.args] + [
                f"{k.arg}={times}" if k.value is width else seg(k) for k in module_call.keywords]
            how = (f"one `{seg(kind)}({', '.join(args)})` computes every "
                   f"item at once (then `view` out the item dim)")
        elif self._is_attention(kind):
            how = ("hold the heads' weights in one module with a head dim (one projection to "
                   "`n_heads * head_size`, attention batched over heads) and run them in one call")
        else:
            how = ("hold the members' weights stacked along a member dim (batched GEMMs with `torch.bmm`/"
                   "`torch.einsum`, or `torch.func.stack_module_state` with `torch.vmap`) and run all "
                   "members in one call")
        self.report(node, f"`self.{attr}` holds identical `{seg(kind)}` modules applied one by one to the same "
                          f"input (`{call_text}`) and joined: {how}")

    def _holds_count(self, cls: ast.ClassDef, stop: ast.AST, self_name: str, count: Optional[str]) -> bool:
        """`range(self.n_heads)` where `__init__` built the list over `range(n_heads)` and
        `self.n_heads = n_heads` is the one store of `self.n_heads` in the class, of the
        unchanged parameter `n_heads`."""
        attr = _self_attr(stop, self_name)
        if attr is None or count is None or not count.isidentifier():
            return False
        values = class_attribute_values(self.ctx, cls, attr)
        if len(values) != 1:
            return False
        method, value = values[0]
        if method.name != "__init__" or not (isinstance(value, ast.Name) and value.id == count):
            return False
        if count not in {a.arg for a in _params(method) + method.args.kwonlyargs}:
            return False
        return not any(isinstance(n, ast.Name) and n.id == count and not isinstance(n.ctx, ast.Load)
                       for n in ast.walk(method))

    def _applied_heads(self, joined: ast.AST, fn, self_name: str):
        """(attr, call, stop, container) for `[h(x) for h in self.attr]` (inline or through a
        name; also `self.attr.values()`), a list filled by `for h in self.attr: out.append(h(x))`,
        or `[self.attr[i](x) for i in range(stop)]` (stop None where every item is applied by
        construction); `container` is the class the heads must be read from."""
        if isinstance(joined, (ast.ListComp, ast.GeneratorExp)) and len(joined.generators) == 1:
            gen = joined.generators[0]
            if gen.ifs or gen.is_async:
                return None
            head = _each_item(gen.target, gen.iter, self_name)
            if head is not None:
                attr, item, index, container = head
                if self._same_input_call(joined.elt, item, index):
                    return attr, self.ctx.segment(joined.elt), None, container
                return None
            if not isinstance(gen.target, ast.Name):
                return None
            stop = _range_stop(gen.iter)
            elt = joined.elt
            if (stop is not None and isinstance(elt, ast.Call) and isinstance(elt.func, ast.Subscript)
                    and isinstance(elt.func.slice, ast.Name) and elt.func.slice.id == gen.target.id
                    and _applied_alike(elt, gen.target.id)):
                attr = _self_attr(elt.func.value, self_name)
                if attr:
                    return attr, self.ctx.segment(elt), stop, _LIST
            return None
        if not isinstance(joined, ast.Name):
            return None
        key = ("mat104.loops_and_comprehensions", id(fn))
        found = self.ctx.shared.get(key)
        if found is None:
            loops, comprehensions = [], set()
            for stmt in walk(fn):
                if isinstance(stmt, ast.For) and len(stmt.body) == 1 and _each_item(stmt.target, stmt.iter, self_name):
                    loops.append(stmt)
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.ListComp, ast.GeneratorExp)):
                    comprehensions.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
            found = self.ctx.shared[key] = (loops, comprehensions)
        loops, comprehensions = found
        if joined.id in comprehensions:  # `outs = [h(x) for h in self.heads]`, if that is what reaches here
            assign = flow_of(self.ctx, fn).reaching(joined)
            if assign is not None and isinstance(assign.value, (ast.ListComp, ast.GeneratorExp)):
                return self._applied_heads(assign.value, fn, self_name)
        for stmt in loops:
            attr, item, index, container = _each_item(stmt.target, stmt.iter, self_name)
            call = stmt.body[0].value if isinstance(stmt.body[0], ast.Expr) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append" and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == joined.id and len(call.args) == 1
                    and self._same_input_call(call.args[0], item, index)):
                return attr, self.ctx.segment(call.args[0]), None, container
        return None

    @staticmethod
    def _same_input_call(expr: ast.AST, item: str, index: Optional[str] = None) -> bool:
        """`h(x)`, also laid out alike for every item (`capsule(x).view(b, -1, 1)`)."""
        while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _LAYOUT
               and not any(name in loaded_names(a) for a in expr.args + expr.keywords
                           for name in (item, index) if name is not None)):
            expr = expr.func.value
        return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == item
                and _applied_alike(expr, item) and (index is None or _applied_alike(expr, index)))

    def _identical_items(self, cls: ast.ClassDef, attr: str, container: str):
        """(module constructor call, count text) when `__init__` fills `self.attr` (a `container`)
        with one class, same arguments."""
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is None or not _params(init):
            return None
        self_name = _params(init)[0].arg
        found = []
        for stmt in ast.walk(init):
            if isinstance(stmt, ast.Assign) and any(_self_attr(t, self_name) == attr for t in stmt.targets):
                found.append(self._from_container(stmt.value, container, init))
            elif isinstance(stmt, ast.For) and container == _LIST:
                for sub in stmt.body:
                    call = sub.value if isinstance(sub, ast.Expr) else None
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "append"
                            and _self_attr(call.func.value, self_name) == attr and len(call.args) == 1):
                        found.append(self._item(call.args[0], bound_names(stmt.target), stmt.iter, init))
        if len(found) == 2 and found[0] == "empty":
            found = found[1:]
        if self._changed_elsewhere(cls, attr, init, self_name):
            return None
        if len(found) != 1 or found[0] in (None, "empty"):
            return None
        module_call, count = found[0]
        return (module_call, count) if self._holds_projections(module_call) else None

    @staticmethod
    def _changed_elsewhere(cls: ast.ClassDef, attr: str, init: ast.FunctionDef, self_name: str) -> bool:
        """`self.attr` gets items other than by the one fill of `__init__` (a later `.append`, an
        `.extend`, `self.attr[0] = ...`, anywhere in the class): its modules may differ."""
        fills = {id(sub.value) for stmt in ast.walk(init) if isinstance(stmt, ast.For)
                 for sub in stmt.body if isinstance(sub, ast.Expr)}
        for node in ast.walk(cls):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LIST_CHANGES
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == attr
                    and id(node) not in fills):
                return True
            if (isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Attribute) and node.value.attr == attr):
                return True
        return False

    def _from_container(self, value: ast.AST, container: str, init: ast.FunctionDef):
        """What `self.attr = value` fills the container with: `nn.ModuleList([Head() for _ in
        range(n)])`, `nn.ModuleDict({k: Head() for k in keys})`, or a helper of the file that
        returns copies of its argument (`clones(layer, n)`)."""
        if container == _LIST and isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            value = ast.Call(func=None, args=[value], keywords=[])  # `[Head(d) for _ in range(n)]`: a plain list of them
        elif not isinstance(value, ast.Call):
            return None
        elif container == _LIST and not value.keywords:
            cloned = self._cloned(value)
            if cloned is not None:
                module, count = cloned
                call = self._built_once(module, init)
                return None if call is None else (call, self._count_text(count))
        if value.func is not None and self.ctx.qualname(value.func) != container:
            return None
        if not value.args:
            return "empty"
        items = value.args[0]
        comprehension = ast.DictComp if container == _DICT else (ast.ListComp, ast.GeneratorExp)
        if isinstance(items, comprehension) and len(items.generators) == 1 and not items.generators[0].ifs:
            gen = items.generators[0]
            elt = items.value if container == _DICT else items.elt
            return self._item(elt, bound_names(gen.target), gen.iter, init, counted=container == _LIST)
        return None

    def _cloned(self, call: ast.Call):
        """(module, count) for `clones(module, count)` where `clones` is a function of the file
        that only returns `nn.ModuleList([copy.deepcopy(module) for _ in range(count)])`."""
        if not isinstance(call.func, ast.Name) or any(isinstance(a, ast.Starred) for a in call.args):
            return None
        fn = next((stmt for stmt in self.ctx.tree.body if isinstance(stmt, ast.FunctionDef)
                   and stmt.name == call.func.id), None)
        if fn is None or fn.args.vararg or fn.args.kwarg or len(fn.args.args) != len(call.args):
            return None
        body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
        made = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
        if not (isinstance(made, ast.Call) and self.ctx.qualname(made.func) == _LIST and len(made.args) == 1
                and not made.keywords and isinstance(made.args[0], (ast.ListComp, ast.GeneratorExp))):
            return None
        items = made.args[0]
        gen, copied = items.generators[0], items.elt
        count = _range_stop(gen.iter)
        params = [a.arg for a in fn.args.args]
        if (len(items.generators) != 1 or gen.ifs or not isinstance(count, ast.Name) or count.id not in params
                or not (isinstance(copied, ast.Call) and self.ctx.qualname(copied.func) == "copy.deepcopy"
                        and len(copied.args) == 1 and not copied.keywords and isinstance(copied.args[0], ast.Name))
                or copied.args[0].id not in params or copied.args[0].id in bound_names(gen.target)):
            return None
        return call.args[params.index(copied.args[0].id)], call.args[params.index(count.id)]

    def _item(self, call: ast.AST, loop_names: set, iterable: ast.AST, init: ast.FunctionDef, counted: bool = True):
        """(module constructor call, count text) for the item a fill builds on each pass over
        `iterable` (`range(n)`, or, not `counted`, any keys), where it reads none of `loop_names`:
        a constructor call, or a copy (`copy.deepcopy(layer)`) of a module built once in `init`."""
        if not isinstance(call, ast.Call) or any(loop_names & loaded_names(a) for a in call.args + call.keywords):
            return None
        if self.ctx.qualname(call.func) == "copy.deepcopy":
            if len(call.args) != 1 or call.keywords:
                return None
            call = self._built_once(call.args[0], init)
            if call is None:
                return None
        count = _range_stop(iterable)
        if count is None:
            return (call, None) if not counted else None
        return call, self._count_text(count)

    def _count_text(self, count: ast.AST) -> Optional[str]:
        return self.ctx.segment(count) if isinstance(count, (ast.Name, ast.Constant, ast.Attribute)) else None

    @staticmethod
    def _built_once(module: ast.AST, init: ast.FunctionDef) -> Optional[ast.Call]:
        """The constructor call `module` is: the call itself, or the one call a name of `init`
        (bound nowhere else there) is assigned."""
        if isinstance(module, ast.Call):
            return module
        if not isinstance(module, ast.Name) or module.id in {a.arg for a in _params(init) + init.args.kwonlyargs}:
            return None
        stores = [n for n in ast.walk(init) if isinstance(n, ast.Name) and n.id == module.id and not isinstance(n.ctx, ast.Load)]
        assigns = [s for s in ast.walk(init) if isinstance(s, ast.Assign) and len(s.targets) == 1
                   and isinstance(s.targets[0], ast.Name) and s.targets[0].id == module.id]
        if len(stores) != 1 or len(assigns) != 1 or not isinstance(assigns[0].value, ast.Call):
            return None
        return assigns[0].value

    def _is_attention(self, func: ast.AST) -> bool:
        """The class that `func` names (of this file or a project module it imports) computes a
        softmax (an attention head), rather than being a whole model of its own (an ensemble
        member, `QNet`)."""
        cls, _ = self._head_class(func)
        return cls is not None and any(
            (isinstance(n, ast.Attribute) and n.attr in _ATTENTION_CALLS)
            or (isinstance(n, ast.Name) and n.id in _ATTENTION_CALLS) for n in ast.walk(cls))

    def _head_class(self, func: ast.AST) -> tuple:
        """(the class `func` names, a `qualname` for the names its module binds): a class of this
        file, or one imported from a project module (`from .head import Head`); (None, None)."""
        if isinstance(func, ast.Name):
            cls = next((stmt for stmt in self.ctx.tree.body if isinstance(stmt, ast.ClassDef)
                        and stmt.name == func.id), None)
            if cls is not None:
                return cls, self.ctx.qualname
        found = imported_class(self.ctx, func)
        return (found[0], found[1].qualname) if found is not None else (None, None)

    def _holds_projections(self, module_call: ast.Call) -> bool:
        func = module_call.func
        if self.ctx.qualname(func) in _WIDENABLE:
            return not any(k.arg == "groups" for k in module_call.keywords) and len(module_call.args) <= _GROUPS_POSITION
        if self.ctx.qualname(func) == "torch.nn.Sequential":
            # Layers built in the call (a module passed by name would be one module shared by all).
            return (bool(module_call.args) and not module_call.keywords
                    and all(isinstance(a, ast.Call) and (self.ctx.qualname(a.func) or "").startswith("torch.nn.")
                            for a in module_call.args)
                    and any(self.ctx.qualname(a.func) in _LINEAR for a in module_call.args))
        cls, qualname = self._head_class(func)
        if cls is None:
            return False
        return (any(isinstance(n, ast.Call) and qualname(n.func) in _LINEAR for n in ast.walk(cls))
                or _multiplies_parameter_matrix(cls, qualname))
