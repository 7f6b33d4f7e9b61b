"""MAT402 float64-in-model: float64 parameters or activations on a model's compute path."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.loops import bound_names, loaded_names, walk_no_scopes
from matlint.semantic.names import TESTS

_FLOAT64 = {"torch.float64", "torch.double"}
_CASTS = {"float", "half", "bfloat16", "to", "type", "type_as"}
# Methods and functions whose result is no float64 tensor: an integer or bool tensor, a Python value.
_EXITS = {"long", "int", "short", "bool", "item", "tolist", "numpy"}
_EXIT_FUNCTIONS = {"torch.allclose", "torch.equal", "torch.isclose"}
# Keywords of a `.to(...)` that moves a value and leaves its dtype alone.
_DEVICE_KEYWORDS = frozenset({"device", "non_blocking", "copy", "memory_format"})
_HOST_KINDS = (_kinds.CPU_TENSOR, _kinds.NUMPY, _kinds.SCALAR, _kinds.LIST, _kinds.LOADER, _kinds.OTHER)
_MODULE_KINDS = (_kinds.MODULE, _kinds.LINEAR, _kinds.MODULE_LIST, _kinds.USER_MODULE)


def _names_float64_anywhere(ctx) -> bool:
    return _kinds.may_mention(ctx, "float64") or _kinds.may_mention(ctx, "double", ignore_case=True)


class Float64InModel(Rule):
    code = "MAT402"
    name = "float64-in-model"
    quiet_in = (TESTS,)
    summary = "float64 (`.double()`, `dtype=torch.float64`) on a model's compute path."
    docs = """
    ## What it does
    Flags float64 on the compute path of model code:
    - in an `nn.Module`'s `forward`: `.double()`, `.to(torch.float64)`, `.type(torch.double)`
      and tensors created with `dtype=torch.float64` / `torch.double`;
    - in its `__init__`: parameters and layers created in float64 (`nn.Parameter(w.double())`,
      `nn.Linear(..., dtype=torch.float64)`) and `self.double()`;
    - anywhere: a whole model cast to float64 (`model.double()`, `model.to(torch.float64)`,
      `model.to(device, dtype=torch.float64)`, also after a move: `model = model.cuda();
      model = model.double()`) and `torch.set_default_dtype(torch.float64)` (or the older
      `torch.set_default_tensor_type(torch.DoubleTensor)`).

    ## Why is this bad?
    Tensor cores do not compute in float64. An H100 runs float64 at a small fraction of its
    bf16/TF32 tensor-core rate (and consumer GPUs at 1/64 of float32); float64 tensors also
    double memory traffic, and any float32 activation that meets a float64 tensor is promoted,
    so one float64 buffer can turn the rest of the forward into float64.

    ## Example
    ```python
    def forward(self, x):
        scores = x.double() @ self.proj.weight.double().T
        return scores.softmax(-1)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        return (x @ self.proj.weight.T).softmax(-1)   # run under torch.autocast for bf16
    ```

    ## Stays quiet on
    - Deliberate float64 numerics that are cast back: an upcast whose result (directly, or
      through the names assigned from it) is later cast with `.float()`, `.to(x.dtype)`,
      `.to(x)`, `.type_as(x)`... in the same function, e.g. RoPE frequency tables built in
      float64 and then cast, or a numerically sensitive reduction done in float64 and returned
      in the input's dtype; also float64 that leaves at once for integers, Python values or
      numpy (`(lengths.double() * r).ceil().long()`, `x.double().sum().item()`,
      `img.to(torch.double).numpy()`, `torch.allclose(a.double(), b.double())`). A `.to(...)`
      that names only a device (`.to(x.device)`, `.to(device, non_blocking=True)`) casts
      nothing back.
    - Values on the CPU by construction (a factory with no device,
      `torch.arange(n, dtype=torch.float64)`, or a host tensor's `.double()`) unless the same
      function moves them to a device (`.to(x.device)`, `.cuda()`).
    - Branches that test a dtype (`if x.dtype == torch.float64:`), numpy arrays, and buffers
      or tables computed once in `__init__` that do not become parameters.
    - Methods other than `forward` and `__init__` (metrics, statistics, export helpers) and
      code outside `nn.Module` classes, except a whole model cast to float64.

    A whole-model cast is reported even when float64 is what the model needs (some
    physics-informed networks): the rule cannot tell, so mark those with `# noqa: MAT402`.

    ## Fix safety
    No fix: leaving float64 changes the numbers the model computes, which only the author can
    judge.
    """

    # Every float64 spelling the checks read is an identifier naming `float64`, `double` or
    # `DoubleTensor`, but for a string given to `.to(...)` / `.type(...)`: in a file with no such
    # identifier, only those two calls are worth a look.
    only = {"visit_Call": Only(attrs=frozenset({"to", "type"}), every_call_if=_names_float64_anywhere)}
    _file_names_float64 = None  # per file (a rule object lints one file), on the first call

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if self._file_names_float64 is None:
            self._file_names_float64 = _names_float64_anywhere(self.ctx)
        if not (self._file_names_float64 or self._may_name_dtype_in_a_string(node)):
            return
        qualname = self.ctx.qualname(func)
        if qualname in ("torch.set_default_dtype", "torch.set_default_tensor_type"):
            if node.args and self._names_float64(node.args[0]):
                self.report(node, f"`{self.ctx.segment(func)}({self.ctx.segment(node.args[0])})` makes every model "
                                  "and tensor float64, which tensor cores cannot compute; keep float32 (and train "
                                  "under bf16 autocast)")
            return
        method = func.attr if isinstance(func, ast.Attribute) else None
        casts_to_64 = method == "double" and not node.args or method in ("to", "type") and self._float64_arg(node)
        if casts_to_64 and _kinds.kind_of(self.ctx, func.value) in _MODULE_KINDS:
            self.report(node, f"`{self.ctx.segment(func)}(...)` casts the whole model to float64, which tensor "
                              "cores cannot compute; keep it float32 and train under bf16 autocast")
            return
        where = self._model_method()
        if where is None:
            return
        if casts_to_64:
            if where == "__init__" and not self._is_self(func.value):
                if not self._inside_parameter(node):
                    return
            else:
                receiver = _kinds.kind_of(self.ctx, func.value)
                if receiver in _HOST_KINDS and not (receiver == _kinds.CPU_TENSOR and self._moved_to_device(node)):
                    return
            self._report(node, f"`{self.ctx.segment(node)}`", where)
            return
        dtype = next((k.value for k in node.keywords if k.arg == "dtype"), None)
        if dtype is None or self.ctx.qualname(dtype) not in _FLOAT64:
            return
        if where == "__init__" and not (self._inside_parameter(node) or self._is_layer(qualname)):
            return
        if qualname is None and not isinstance(func, ast.Attribute):
            return
        if where == "forward" and _kinds.kind_of(self.ctx, node) == _kinds.CPU_TENSOR and not self._moved_to_device(node):
            return  # `torch.arange(n, dtype=torch.float64)`: on the CPU, unless moved to the device
        self._report(dtype, f"`dtype={self.ctx.segment(dtype)}`", where)

    # -- helpers ----------------------------------------------------------------
    def _names_float64(self, arg: ast.AST) -> bool:
        """`torch.float64`, `torch.double`, `torch.DoubleTensor`, `"torch.cuda.DoubleTensor"`."""
        if isinstance(arg, ast.Constant):
            return arg.value in ("torch.DoubleTensor", "torch.cuda.DoubleTensor")
        return self.ctx.qualname(arg) in _FLOAT64 | {"torch.DoubleTensor", "torch.cuda.DoubleTensor"}

    @staticmethod
    def _may_name_dtype_in_a_string(node: ast.Call) -> bool:
        """`.to("torch.DoubleTensor")` / `.type(...)` with a string argument: `_float64_arg` reads
        strings, which can spell the type without the source text doing so (escapes, implicit
        concatenation), so the source-text gate must not skip them."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in ("to", "type")):
            return False
        return any(isinstance(value, ast.Constant) and isinstance(value.value, str)
                   for value in [*node.args, *(k.value for k in node.keywords)])

    def _float64_arg(self, node: ast.Call) -> bool:
        values = list(node.args) + [k.value for k in node.keywords if k.arg == "dtype"]
        for value in values:
            if self.ctx.qualname(value) in _FLOAT64 | {"torch.DoubleTensor", "torch.cuda.DoubleTensor"}:
                return True
            if isinstance(value, ast.Constant) and value.value in ("torch.DoubleTensor", "torch.cuda.DoubleTensor"):
                return True
        return False

    def _model_method(self) -> Optional[str]:
        """'forward' or '__init__' when directly inside that method of an nn.Module class."""
        cls, function = self.ctx.class_, self.ctx.function
        if cls is None or function is None or len(self.ctx.functions) != 1:
            return None
        if getattr(function, "name", None) not in ("forward", "__init__"):
            return None
        return function.name if self._is_module_class(cls) else None

    def _is_module_class(self, cls: ast.ClassDef) -> bool:
        for base in cls.bases:
            qualname = self.ctx.qualname(base) or ""
            name = qualname or (ast.unparse(base) if isinstance(base, (ast.Name, ast.Attribute)) else "")
            if name.startswith("torch.nn") or name.endswith("Module"):
                return True
        return any(isinstance(s, ast.FunctionDef) and s.name == "forward" for s in cls.body)

    def _is_self(self, expr: ast.AST) -> bool:
        args = self.ctx.function.args.args
        node = expr
        while isinstance(node, ast.Attribute):
            node = node.value
        return bool(args) and isinstance(node, ast.Name) and node.id == args[0].arg

    def _is_layer(self, qualname: Optional[str]) -> bool:
        return bool(qualname) and qualname.startswith("torch.nn.") and qualname.split(".")[-1][:1].isupper()

    def _inside_parameter(self, node: ast.AST) -> bool:
        return any(isinstance(p, ast.Call) and self.ctx.qualname(p.func) in ("torch.nn.Parameter", "torch.nn.parameter.Parameter")
                   for p in self.ctx.parents)

    def _report(self, node: ast.AST, what: str, where: str) -> None:
        if self._dtype_guarded() or self._cast_back(node):
            return
        place = "the model's `forward`" if where == "forward" else "a parameter of the model"
        self.report(node, f"{what} puts float64 on {place}: tensor cores do not compute in float64, "
                          "and float32 activations that meet it are promoted; keep float32 (bf16 under autocast)")

    def _dtype_guarded(self) -> bool:
        for parent in self.ctx.parents:
            if isinstance(parent, (ast.If, ast.IfExp)):
                text = ast.unparse(parent.test)
                if "dtype" in text or "float64" in text or "double" in text:
                    return True
        return False

    def _cast_back(self, node: ast.AST) -> bool:
        """The float64 value, or a name assigned from it, is cast to another dtype in this
        function, or leaves float64 at once (`.long()`, `.item()`, `.numpy()`, `torch.allclose(...)`)."""
        statement = self.ctx.statement()
        for parent in reversed(self.ctx.parents):
            if parent is statement:
                break
            if (isinstance(parent, ast.Call) and self.ctx.qualname(parent.func) in _EXIT_FUNCTIONS
                    and any(n is node for a in parent.args for n in ast.walk(a))):
                return True
        return self._called_on_value(node, self._is_cast_call)

    def _moved_to_device(self, node: ast.AST) -> bool:
        """The value (on the CPU by construction), or a name assigned from it, is moved to a
        device: `.cuda()`, `.to(x.device)`, `.to("cuda")`."""
        return self._called_on_value(node, self._is_device_move)

    def _called_on_value(self, node: ast.AST, wanted) -> bool:
        """A method call for which `wanted` holds is made on the value of `node`: around it in its
        statement, or on a name assigned from it (directly or through other names) in this function."""
        statement = self.ctx.statement()
        if statement is None:
            return False
        for parent in reversed(self.ctx.parents):  # the expressions around the value, inside out
            if parent is statement:
                break
            if wanted(parent) and any(n is node for n in ast.walk(parent.func.value)):
                return True
        tainted = set()
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                tainted |= bound_names(target)
        if not tainted:
            return False
        function = self.ctx.function
        assignments = [(set().union(*(bound_names(t) for t in s.targets)), loaded_names(s.value))
                       for s in walk_no_scopes(function) if isinstance(s, ast.Assign)]
        changed = True
        while changed:
            changed = False
            for targets, reads in assignments:
                if reads & tainted and not targets <= tainted:
                    tainted |= targets
                    changed = True
        return any(wanted(n) and loaded_names(n.func.value) & tainted for n in walk_no_scopes(function))

    def _is_cast_call(self, node: ast.AST) -> bool:
        """A call that takes the value out of float64: `.float()`, `.type_as(x)`, `.to(x.dtype)`,
        `.to(x)` (x's dtype), `.long()`, `.item()`... A `.to(...)` that names only a device is none."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and (node.func.attr in _CASTS or node.func.attr in _EXITS)):
            return False
        if node.func.attr in ("to", "type"):
            if not (node.args or node.keywords) or self._float64_arg(node):
                return False
            return node.func.attr == "type" or not self._names_only_a_device(node)
        return True

    def _is_device_move(self, node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        if node.func.attr == "cuda":
            return True
        return (node.func.attr == "to" and self._names_only_a_device(node)
                and not any(isinstance(a, ast.Constant) and str(a.value).split(":")[0] == "cpu"
                            for a in [*node.args, *(k.value for k in node.keywords)]))

    def _names_only_a_device(self, node: ast.Call) -> bool:
        """`.to(x.device)`, `.to(device)`, `.to("cuda", non_blocking=True)`, `.to(device=dev)`: no
        dtype and no tensor to take one from (an argument that might be either is neither)."""
        if any(k.arg not in _DEVICE_KEYWORDS for k in node.keywords) or len(node.args) > 1:
            return False
        return all(self._is_device(a) for a in [*node.args, *(k.value for k in node.keywords if k.arg == "device")])

    def _is_device(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, (str, int)) and not isinstance(expr.value, bool)
        if isinstance(expr, ast.Call):
            return self.ctx.qualname(expr.func) == "torch.device"
        name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
        return name is not None and ("device" in name.lower() or name in ("dev", "rank", "local_rank"))
