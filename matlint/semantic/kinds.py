"""What kind of value a name or expression holds: a tensor (and whether it is on the CPU by
construction), a numpy array, a Python list, an `nn.Linear`, another torch module, a data
loader... Flow-insensitive within a function: a name assigned values of two kinds is unknown.
Unknown (None) is an answer: rules that need a kind stay quiet on it."""
from __future__ import annotations

import ast
import os
import re
from typing import Optional

from .calls import CallSite, FileCalls, argument_for, file_calls
from .lazy import BuiltOnFirstUse
from .file import project_file
from .flow import CONTAINER_MUTATORS
from .project import (SCRIPT_PROJECT_FILES, imported_definition, imported_number, importers, in_script_project,
                      project_imports)
# identifier_text lives in tree (a leaf, which calls and flow read too); the rules read it from here
from .tree import _COMPREHENSIONS, block_fields, child_nodes, identifier_text, may_mention, walk_no_scopes

TENSOR = "tensor"            # a tensor whose device is not known to be the CPU
CPU_TENSOR = "cpu_tensor"    # a tensor on the CPU by construction
TENSOR_SEQ = "tensor_seq"    # a sequence of same-shaped tensors (x.unbind())
NUMPY = "numpy"
LIST = "list"                # a Python sequence, items of any shape
SCALAR = "scalar"            # numbers, strings, shapes, devices, dtypes
LINEAR = "linear"            # an nn.Linear (or LazyLinear) module
MODULE = "module"            # a torch.nn module that returns one tensor
MODULE_LIST = "module_list"
LOADER = "loader"
MODULE_CLASS = "module_class"  # a class of the file that subclasses a torch.nn module (`class Net(nn.Module)`)
USER_MODULE = "user_module"  # an instance of one: a model, whose call may return anything
OTHER = "other"              # known, but none of the above (an optimizer, a context manager...)

TENSORS = (TENSOR, CPU_TENSOR)
NON_TENSORS = (NUMPY, LIST, SCALAR, LINEAR, MODULE, MODULE_LIST, LOADER, OTHER, TENSOR_SEQ, MODULE_CLASS,
               USER_MODULE)

_TENSOR_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")
NOT_TENSOR_FUNCTIONS = {
    "device", "dtype", "no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "autocast",
    "manual_seed", "seed", "is_tensor", "is_floating_point", "is_complex", "numel", "get_default_dtype",
    "set_default_dtype", "set_default_device", "compile", "save", "load", "Size", "Generator",
    "set_float32_matmul_precision", "get_float32_matmul_precision", "use_deterministic_algorithms",
    "is_grad_enabled", "typename", "broadcast_shapes", "result_type", "promote_types", "can_cast",
    "finfo", "iinfo", "set_printoptions", "get_rng_state", "set_rng_state", "is_nonzero", "equal", "allclose",
}
_SPLITTING_FUNCTIONS = {"split", "chunk", "tensor_split", "hsplit", "vsplit", "dsplit", "meshgrid",
                        "unravel_index", "where_tuple", "sort", "topk", "max", "min", "median",
                        "mode", "kthvalue", "std_mean", "var_mean", "unique", "lu", "qr", "svd",
                        "eig", "eigh", "slogdet", "frexp", "aminmax", "cummax", "cummin"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
              "randperm", "arange", "linspace", "logspace", "eye", "from_numpy", "asarray",
              "scalar_tensor", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
              "randn_like", "randint_like"}
_NON_TENSOR_METHODS = {
    "item": SCALAR, "tolist": LIST, "size": SCALAR, "dim": SCALAR, "numel": SCALAR, "nelement": SCALAR,
    "stride": SCALAR, "is_contiguous": SCALAR, "data_ptr": SCALAR, "element_size": SCALAR,
    "get_device": SCALAR, "numpy": NUMPY, "unbind": TENSOR_SEQ, "split": LIST, "chunk": LIST,
    "tensor_split": LIST, "backward": OTHER, "register_hook": OTHER, "is_floating_point": SCALAR,
    "is_complex": SCALAR, "storage": OTHER, "untyped_storage": OTHER, "sort": LIST, "topk": LIST,
    "max": None, "min": None, "median": None, "mode": None, "kthvalue": None, "unique": None,
    "type": None, "equal": SCALAR,
}
# ... of those, the ones whose call with no argument reduces every element to a tensor (`x.max()`).
_ONE_VALUE_WITHOUT_DIM = frozenset({"max", "min", "median"})
# Methods whose result is a tensor, or with a dim a `(values, indices)` pair of tensors.
_PAIR_METHODS = frozenset({"max", "min", "median", "nanmedian", "mode", "kthvalue", "sort", "topk", "aminmax",
                           "cummax", "cummin"})

def _pair_method(node: ast.AST) -> bool:
    """`t.max(1)`, `t.topk(k)`: a method call whose result may be a `(values, indices)` pair."""
    return (node.__class__ is ast.Call and node.func.__class__ is ast.Attribute
            and node.func.attr in _PAIR_METHODS)


# Libraries whose classes under these packages are `nn.Module`s (a graph convolution's
# `MessagePassing`), besides torch.nn itself.
_MODULE_PACKAGES = ("torch.nn.", "torch_geometric.nn.", "dgl.nn.")


def is_module_class(qualname: Optional[str]) -> bool:
    """`qualname` names a module class a model derives from: a torch.nn class (`nn.Module`,
    `nn.Linear`), a graph library's layer (`torch_geometric.nn.MessagePassing`), or Lightning's
    `LightningModule`."""
    if not qualname:
        return False
    last = qualname.rpartition(".")[2]
    return qualname.startswith(_MODULE_PACKAGES) and last[:1].isupper() or last == "LightningModule"


# Wrappers that yield the items of what they are given, showing progress.
_PROGRESS_BARS = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm"})

# Legacy typed tensor constructors and the dtype of each.
TYPED_TENSORS = {"FloatTensor": "torch.float32", "DoubleTensor": "torch.float64", "HalfTensor": "torch.float16",
                 "BFloat16Tensor": "torch.bfloat16", "ByteTensor": "torch.uint8", "CharTensor": "torch.int8",
                 "ShortTensor": "torch.int16", "IntTensor": "torch.int32", "LongTensor": "torch.long",
                 "BoolTensor": "torch.bool"}


def _cuda_type(ctx, expr: ast.AST) -> Optional[str]:
    qualname = ctx.qualname(expr) or ""
    module, _, name = qualname.rpartition(".")
    return TYPED_TENSORS.get(name) if module == "torch.cuda" else None


def cuda_tensor_type(ctx, func: ast.AST) -> Optional[str]:
    """The dtype of the legacy CUDA tensor type that `func` names: `torch.cuda.FloatTensor`, or a
    module-level name bound to one, also under a condition (`Tensor = torch.cuda.FloatTensor if
    cuda else torch.FloatTensor`, as GAN and RL scripts write it) or through another such name
    (`Tensor = FloatTensor`). Called on data, such a type
    copies the data to the GPU."""
    found = _cuda_type(ctx, func)
    if found is not None or not isinstance(func, ast.Name):
        return found
    if ctx.names.binds_locally(func.id):
        # `FloatTensor = torch.cuda.FloatTensor if self.use_cuda else torch.FloatTensor` in the function
        function = next((f for f in reversed(ctx.functions) if func.id in scope_kinds(ctx, f).assigned), None)
        entries = scope_kinds(ctx, function).assigned[func.id] if function is not None else []
        dtypes = {_alias_dtype(ctx, entry[1], {}) if entry[0] == "value" else None for entry in entries}
        return dtypes.pop() if len(dtypes) == 1 else None
    aliases = ctx.shared.get("cuda_tensor_aliases")
    if aliases is None:
        aliases = ctx.shared["cuda_tensor_aliases"] = {}
        for stmt in ctx.tree.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                continue
            dtype = _alias_dtype(ctx, stmt.value, aliases)
            if dtype is not None:
                aliases[stmt.targets[0].id] = dtype
    return aliases.get(func.id)


def _alias_dtype(ctx, value: ast.AST, aliases: dict) -> Optional[str]:
    """The dtype of the CUDA tensor type that `value`, bound to a name, makes that name stand for:
    the type, one branch of a conditional expression (`... if cuda else torch.FloatTensor`), or
    another such name of `aliases` (`Tensor = FloatTensor`)."""
    if isinstance(value, ast.Name) and value.id in aliases:
        return aliases[value.id]
    branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
    return next((d for d in map(lambda b: _cuda_type(ctx, b), branches) if d is not None), None)


_NON_TENSOR_ATTRS = {"shape", "device", "dtype", "ndim", "is_cuda", "requires_grad", "layout",
                     "is_leaf", "grad_fn", "names", "is_sparse", "itemsize", "nbytes"}
_SAME_KIND_ATTRS = {"T", "mT", "H", "mH", "data", "grad", "real", "imag"}
# Methods only a tensor has; using one on a name is evidence the name is a tensor.
TENSOR_ONLY_METHODS = {
    "view", "view_as", "permute", "unsqueeze", "size", "contiguous", "masked_fill", "masked_fill_",
    "detach", "cuda", "cpu", "to", "float", "half", "bfloat16", "transpose", "expand", "expand_as",
    "softmax", "log_softmax", "bmm", "mm", "matmul", "type_as", "new_zeros", "new_ones", "new_empty",
    "new_full", "new_tensor", "unflatten", "flatten", "narrow", "unbind", "chunk", "dim", "numel",
    "is_contiguous", "mT", "requires_grad_", "zero_", "fill_", "copy_", "add_", "mul_", "index_select",
    "gather", "scatter", "scatter_add", "masked_select", "repeat_interleave", "movedim", "softplus",
}
_SEQUENCE_ANNOTATIONS = {"List", "list", "Sequence", "Tuple", "tuple", "Iterable", "Iterator",
                         "MutableSequence", "Collection", "Dict", "dict", "Mapping"}
_JAXTYPING = {"Float", "Int", "Bool", "Shaped", "Num", "Real", "Inexact", "Integer", "Complex",
              "Float16", "Float32", "Float64", "BFloat16", "Int8", "Int16", "Int32", "Int64", "UInt8",
              "TensorType"}
_ELEMENTWISE_MODULES = {
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
    "InstanceNorm2d", "Embedding", "EmbeddingBag", "Dropout", "Dropout1d", "Dropout2d", "ReLU", "GELU",
    "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "LeakyReLU", "ELU", "Mish", "Hardswish",
    "Identity", "Flatten", "Unflatten", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "Upsample", "PixelShuffle", "Bilinear", "Sequential",
}
_LINEAR_MODULES = {"torch.nn.Linear", "torch.nn.LazyLinear"}
_RECURRENT_LAYERS = {"torch.nn.RNN", "torch.nn.GRU", "torch.nn.LSTM"}  # return (output, hidden)
_TOTAL_NORMS = frozenset({"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm",
                          "torch.nn.utils.get_total_norm", "torch.nn.utils.clip_grad.clip_grad_norm_"})
_VARIABLE = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})
_PARAMETER_LISTS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers"})
_HOLDS_PARAMETERS = frozenset({None, MODULE, LINEAR, USER_MODULE})  # a module, or a value not known


class _Held:
    """The value a name holds through its other bindings, seen from a binding that reuses it
    (`model = model.double()`, `x = x.to(device)`): the same kind, moved to `moved_to` (TENSOR: a
    device not known to be the CPU; CPU_TENSOR: the CPU; None: not moved). A move keeps a module
    a module and makes a tensor a tensor on that device (see `_combine`)."""
    __slots__ = ("moved_to",)

    def __init__(self, moved_to):
        self.moved_to = moved_to


_RECURSING = _Held(None)     # also marks a name (or attribute) whose kind is being inferred
_MOVED = _Held(TENSOR)
_MOVED_TO_CPU = _Held(CPU_TENSOR)
_STAYS = object()            # `.to(...)` of a dtype only: the value stays where it is
# Methods whose result is the receiver's kind, on the same device (dtype and mode changes,
# shape changes, element-wise ops: `Tz = Tz.clamp(min=lo, max=hi)` is what `Tz` was).
_KIND_KEEPING_METHODS = {"float", "half", "bfloat16", "double", "train", "eval", "requires_grad_", "clone", "detach",
                         "contiguous", "view", "reshape", "flatten", "permute", "transpose", "squeeze", "unsqueeze",
                         "expand", "t", "narrow", "unflatten", "view_as", "expand_as", "repeat", "clamp", "clamp_",
                         "masked_fill", "masked_fill_", "floor", "ceil", "sigmoid", "tanh", "relu", "softmax",
                         "log_softmax", "long", "int", "bool", "mean", "sum", "abs", "exp", "log",
                         "sqrt", "pow", "neg", "norm", "std", "var", "prod", "cumsum", "square", "mul", "add", "sub",
                         "div", "sign", "round"}
_MOVABLE = frozenset({LINEAR, MODULE, USER_MODULE})  # modules, which `.to(device)` / `.cuda()` return
# Modules that run the module they wrap: calling one gives what that module gives.
_MODULE_WRAPPERS = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                              "torch.nn.parallel.DistributedDataParallel"})
_NONE = "none"  # a name's binding to `None`: it adds no kind to the others (see `_combine`)
_DTYPE_NAMES = frozenset({"float32", "float16", "bfloat16", "float64", "int64", "long", "int32", "bool", "float",
                          "half", "double"})
_NOT_YET = object()
_MAX_CALL_SITES = 16  # a parameter takes its callers' kind from at most this many calls


def _is_dtype(qual: str) -> bool:
    """`torch.float64`, `torch.long`..."""
    return qual.startswith("torch.") and qual.rpartition(".")[2] in _DTYPE_NAMES


def is_cpu_literal(expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.split(":")[0] == "cpu"
    if isinstance(expr, ast.Call) and expr.args and not expr.keywords:
        return is_cpu_literal(expr.args[0]) and (getattr(expr.func, "attr", None) == "device"
                                                  or getattr(expr.func, "id", None) == "device")
    return False


def _annotation_kind(ann: Optional[ast.AST]) -> Optional[str]:
    if ann is None:
        return None
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(ann, ast.Subscript):
        head = ann.value.attr if isinstance(ann.value, ast.Attribute) else getattr(ann.value, "id", None)
        if head in ("Optional",):
            return _annotation_kind(ann.slice)
        if head in _SEQUENCE_ANNOTATIONS:
            return LIST
        if head in _JAXTYPING:
            return TENSOR
        return None
    name = ann.attr if isinstance(ann, ast.Attribute) else getattr(ann, "id", None)
    if name in ("Tensor", "FloatTensor", "LongTensor", "BoolTensor", "HalfTensor", "Parameter"):
        return TENSOR
    if name == "ndarray":
        return NUMPY
    if name in _SEQUENCE_ANNOTATIONS:
        return LIST
    if name in ("int", "float", "bool", "str"):
        return SCALAR
    return None


# Nodes `ScopeKinds._collect` reads (every other node only holds them), by what they are.
_COLLECTED_NODES = {
    ast.Assign: "assign", ast.AnnAssign: "annassign", ast.AugAssign: "augassign", ast.For: "for",
    ast.AsyncFor: "for", ast.comprehension: "comprehension", ast.With: "with", ast.AsyncWith: "with",
    ast.NamedExpr: "namedexpr", ast.ExceptHandler: "except", ast.Import: "import", ast.ImportFrom: "import",
    ast.Attribute: "attribute", ast.FunctionDef: "scope", ast.AsyncFunctionDef: "scope", ast.ClassDef: "scope",
    ast.Lambda: "lambda",
}
_STATEMENT_BINDINGS = frozenset({"assign", "annassign", "augassign", "for"})
# Most nodes of a function, and none of them binds a name or has a child that does.
_BINDS_NOTHING = frozenset({ast.Name, ast.Constant}.union(
    *(base.__subclasses__() for base in (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop))))


class ScopeKinds(BuiltOnFirstUse):
    """Assignments and uses of names in one function (or the module), collected once, on first
    use: an inference that never looks a name up in a scope on its chain (`nn.LayerNorm(d)`)
    does not pay for collecting it."""

    _BUILT = frozenset({"assigned", "methods_used"})

    def __init__(self, owner: ast.AST):
        self.owner = owner
        self.cache: dict = {}
        self.self_name = None
        if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = owner.args
            params = args.posonlyargs + args.args + args.kwonlyargs
            if params:
                self.self_name = params[0].arg

    def _build(self) -> None:
        owner = self.owner
        # name -> list of ("value", expr) / ("elem", iter, path[, the for loop, the name]) /
        # ("unpack", expr, index) / ("kind", k)
        # / ("kind", k, annotated value)
        self.assigned: dict = {}
        self.methods_used: dict = {}  # name -> set of attribute names used on it
        if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = owner.args
            params = args.posonlyargs + args.args + args.kwonlyargs
            for i, arg in enumerate(params):
                annotated = _annotation_kind(arg.annotation)
                entry = ("kind", annotated) if annotated is not None or isinstance(owner, ast.Lambda) else (
                    "param", owner, arg.arg)
                self.assigned.setdefault(arg.arg, []).append(entry)
            for arg in (args.vararg, args.kwarg):
                if arg is not None:
                    self.assigned.setdefault(arg.arg, []).append(("kind", LIST if arg is args.vararg else OTHER))
        body = owner.body if isinstance(owner.body, list) else [owner.body]
        for stmt in body:
            self._collect(stmt)

    def _bind(self, target: ast.AST, entry) -> None:
        if isinstance(target, ast.Name):
            if entry[0] == "elem" and len(entry) == 4:
                entry += (target.id,)  # the name whose items the loop may store into
            self.assigned.setdefault(target.id, []).append(entry)
        elif isinstance(target, (ast.Tuple, ast.List)):
            starred = False
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Starred):
                    starred = True
                    self._bind(elt.value, ("kind", LIST))
                elif entry[0] == "elem":
                    self._bind(elt, ("elem", entry[1], entry[2] + (i,)) + entry[3:])
                elif entry[0] == "value":
                    # After `*rest` the targets count from the end: `*rest, last = 1, 2, 3`.
                    self._bind(elt, ("unpack", entry[1], i - len(target.elts) if starred else i))
                else:
                    self._bind(elt, ("kind", None))

    def _bind_statement(self, node: ast.stmt, what: str) -> None:
        """The names an assignment or a `for` stores in its targets (a `for`'s body aside)."""
        if what == "assign":
            for target in node.targets:
                self._bind(target, ("value", node.value))
        elif what == "annassign":
            ann = _annotation_kind(node.annotation)
            if node.value is not None:
                # An annotated value keeps the value too, for `constant_int` (`WIDTH: int = 1001`).
                self._bind(node.target, ("value", node.value) if ann is None else ("kind", ann, node.value))
            elif ann is not None:
                self._bind(node.target, ("kind", ann))
        elif what == "augassign":
            self._bind(node.target, ("aug", node))
        elif what == "for":
            self._bind(node.target, ("elem", node.iter, (), node))

    def _collect(self, root: ast.AST) -> None:
        stack = [root]
        binds = _BINDS_NOTHING
        while stack:
            node = stack.pop()
            node_type = type(node)
            if node_type in binds:
                continue
            what = _COLLECTED_NODES.get(node_type)
            if what is None:  # binds nothing itself (Call, BinOp, Subscript...): look inside
                stack.extend(child_nodes(node))
                continue
            if what in _STATEMENT_BINDINGS:
                self._bind_statement(node, what)
            elif what == "comprehension":
                self._bind(node.target, ("elem", node.iter, ()))
            elif what == "with":
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, ("kind", None))
            elif what == "namedexpr":
                self._bind(node.target, ("value", node.value))
            elif what == "except":
                if node.name:
                    self.assigned.setdefault(node.name, []).append(("kind", OTHER))
            elif what == "import":
                for alias in node.names:
                    name = (alias.asname or alias.name).split(".")[0]
                    entry = ("imported", node, alias.name) if node_type is ast.ImportFrom and node.module else ("kind", OTHER)
                    self.assigned.setdefault(name, []).append(entry)
            elif what == "attribute":
                if type(node.value) is ast.Name:
                    self.methods_used.setdefault(node.value.id, set()).add(node.attr)
            elif what == "scope":
                entry = ("class", node) if node_type is ast.ClassDef else ("kind", OTHER)
                self.assigned.setdefault(node.name, []).append(entry)
                continue
            elif what == "lambda":
                continue
            stack.extend(child_nodes(node))


# -- evidence of use ---------------------------------------------------------------
# What the code does with a name, where its assignments leave its kind unknown (a parameter no
# call of the file passes, the result of a call the analysis cannot follow): methods only a
# tensor has, an argument of an op that takes only tensors, the receiver of `.backward()`.
# Methods that modules (`.to`, `.cuda`, `.float`) or numpy arrays (`.reshape`, `.transpose`,
# `.item`) share with tensors are no evidence.
TENSOR_EVIDENCE_METHODS = frozenset({
    "backward", "permute", "unsqueeze", "contiguous", "masked_fill", "masked_fill_", "detach", "detach_",
    "softmax", "log_softmax", "view_as", "expand", "expand_as", "type_as", "new_zeros", "new_ones", "new_empty",
    "new_full", "new_tensor", "unflatten", "narrow", "unbind", "bmm", "mm", "matmul", "index_select", "gather",
    "scatter", "scatter_", "scatter_add", "scatter_add_", "masked_select", "repeat_interleave", "movedim",
    "numpy", "is_contiguous", "requires_grad_", "zero_", "fill_", "copy_", "add_", "mul_", "sub_", "div_",
    "clamp_", "squeeze_", "unsqueeze_", "t_", "norm", "element_size", "data_ptr", "pin_memory", "numel",
    "masked_scatter", "index_add_", "index_fill_", "index_put_", "baddbmm", "addmm", "lerp_", "addcmul_",
    "clamp_min", "clamp_max", "bernoulli", "bernoulli_", "uniform_", "normal_", "float_power", "logsumexp",
})
# ... and of those, the ones whose argument at this position must be a tensor too:
# `x.expand_as(target)`, `x.masked_fill(mask, v)`, `q.gather(1, index)`.
_TENSOR_ARGUMENT_OF_METHODS = {"expand_as": 0, "view_as": 0, "type_as": 0, "bmm": 0, "mm": 0, "matmul": 0,
                               "masked_fill": 0, "masked_fill_": 0, "masked_select": 0, "masked_scatter": 0,
                               "gather": 1, "index_select": 1, "scatter": 1, "scatter_": 1, "scatter_add": 1,
                               "scatter_add_": 1, "baddbmm": 0, "addmm": 0}
_NUMPY_EVIDENCE_METHODS = frozenset({"astype", "tobytes", "tofile"})
_MODULE_EVIDENCE_METHODS = frozenset({"parameters", "named_parameters", "state_dict", "load_state_dict", "train",
                                      "eval", "modules", "children", "named_modules", "apply", "forward",
                                      "register_forward_hook", "zero_grad", "buffers"})
_LIST_EVIDENCE_METHODS = frozenset({"append", "extend", "insert", "pop", "remove", "keys", "values", "items",
                                    "get", "update", "join", "startswith", "endswith", "format"})
# torch ops whose every positional operand is a tensor (not a number): `torch.matmul(a, b)`.
_ALL_TENSOR_OPERANDS = frozenset({"matmul", "mm", "bmm", "mv", "einsum", "cdist", "baddbmm", "addmm",
                                  "masked_select", "index_select", "gather"})
# Loss functions whose input and target (their first two arguments) are both tensors.
_LOSS_OPERANDS = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss",
                            "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss",
                            "soft_margin_loss", "multilabel_soft_margin_loss", "multilabel_margin_loss",
                            "multi_margin_loss", "hinge_embedding_loss", "gaussian_nll_loss"})
_NOT_TENSOR_FIRST_ARGUMENT = FACTORIES | frozenset({"from_numpy", "as_tensor", "asarray", "tensor", "save", "load",
                                                      "is_tensor", "numel", "manual_seed", "device", "cat", "stack",
                                                      "concat", "concatenate", "hstack", "vstack", "dstack",
                                                      "broadcast_tensors", "block_diag", "cartesian_prod",
                                                      "meshgrid", "atleast_1d", "atleast_2d", "atleast_3d"})


_CONTAINER_DISPLAYS = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
# torch ops that join a sequence of tensors: the items of a list they are given are tensors.
JOINS = frozenset({"cat", "stack", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack"})


def scope_evidence(ctx, scope: "ScopeKinds") -> dict:
    """name -> the kind the uses of the name in `scope` give evidence of (TENSOR, NUMPY, a
    module, LIST), for names with evidence of one kind only."""
    key = ("evidence", id(scope.owner))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _collect_evidence(ctx, scope.owner)
    return found


def _discarded_move(value: ast.AST) -> bool:
    """`model.to(device)`, `net.cuda()`, `model.half()` as a statement of its own: a tensor's move
    or cast returns a new tensor and leaves the name as it was, so a name moved this way holds
    a module, which moves its parameters in place."""
    return (value.__class__ is ast.Call and value.func.__class__ is ast.Attribute
            and value.func.attr in ("to", "cuda", "cpu", "half", "float", "double", "bfloat16")
            and value.func.value.__class__ is ast.Name)


def _collect_evidence(ctx, owner: ast.AST) -> dict:
    seen: dict = {}

    converted = _converted_uses(ctx, owner) if "tensor" in ctx.source or "Tensor" in ctx.source else ()

    def add(name_node: ast.AST, kind: str) -> None:
        if isinstance(name_node, ast.Name) and id(name_node) not in converted:
            seen.setdefault(name_node.id, set()).add(kind)

    called: set = set()  # the attributes called as methods (`x.size()`, not `arr.size`)
    # A comprehension's names live in it alone: the uses in one say nothing of another's.
    comprehended: set = set()
    body = owner.body if isinstance(owner.body, list) else [owner.body]
    for stmt in body:
        for node in walk_no_scopes(stmt):  # a call comes before its function
            if node.__class__ is ast.Expr and _discarded_move(node.value):
                add(node.value.func.value, MODULE)  # `model.to(device)`: only a module moves in place
                continue
            if node.__class__ is ast.Attribute:
                if node.value.__class__ is ast.Name and id(node) not in called:
                    if node.attr == "size":
                        add(node.value, NUMPY)  # `arr.size` read as a number is numpy's
                    elif node.attr in _NUMPY_EVIDENCE_METHODS:
                        add(node.value, NUMPY)
                continue
            if node.__class__ is ast.comprehension:
                comprehended.update(n.id for n in ast.walk(node.target) if n.__class__ is ast.Name)
                continue
            if node.__class__ is not ast.Call or node.func.__class__ is not ast.Attribute:
                continue
            func = node.func
            called.add(id(func))
            receiver = func.value
            if receiver.__class__ is ast.Attribute and receiver.attr in _SAME_KIND_ATTRS:
                receiver = receiver.value  # `x.data.masked_fill_(...)`: what `x.data` is, `x` is
            qual = ctx.qualname(func)
            if qual is None:
                if func.attr in TENSOR_EVIDENCE_METHODS or func.attr == "size":
                    add(receiver, TENSOR)
                    position = _TENSOR_ARGUMENT_OF_METHODS.get(func.attr)
                    if position is not None and len(node.args) > position:
                        add(node.args[position], TENSOR)
                elif func.attr in _MODULE_EVIDENCE_METHODS:
                    add(receiver, MODULE)
                elif func.attr in _LIST_EVIDENCE_METHODS:
                    add(receiver, LIST)
                elif func.attr in _NUMPY_EVIDENCE_METHODS:
                    add(receiver, NUMPY)
                continue
            module, _, attr = qual.rpartition(".")
            if module in _TENSOR_NAMESPACES and attr[:1].islower() and node.args:
                if attr in _ALL_TENSOR_OPERANDS:
                    operands = node.args[1:] if attr == "einsum" else node.args
                elif attr in _LOSS_OPERANDS:
                    operands = node.args[:2]
                elif attr in NOT_TENSOR_FUNCTIONS or attr in _NOT_TENSOR_FIRST_ARGUMENT:
                    operands = []
                else:
                    operands = node.args[:1]
                for operand in operands:
                    add(operand, TENSOR)
                    if (attr in _ALL_TENSOR_OPERANDS or attr in _LOSS_OPERANDS) and operand.__class__ is ast.Subscript:
                        # `torch.matmul(xs[i], ws[i])`, `F.cross_entropy(out, labels[mask])`: items of tensors
                        add(operand.value, TENSOR)
                if attr in JOINS and node.args[0].__class__ in (ast.List, ast.Tuple):
                    for item in node.args[0].elts:  # `torch.cat([sos, y], dim=0)`: tensors, each item
                        add(item, TENSOR)
            elif module in ("numpy", "np") and node.args:
                add(node.args[0], NUMPY)
    # `self.norm(x)` calls a submodule: what a method does with its own object is no evidence
    args = getattr(owner, "args", None)
    params = (args.posonlyargs + args.args) if args is not None else []
    own_object = params[0].arg if params and params[0].arg in ("self", "cls") else None
    evidence = {}
    for name, kinds in seen.items():
        if len(kinds) == 1 and name not in comprehended and name != own_object:
            evidence[name] = kinds.pop()
    return evidence


_CONVERSIONS = frozenset({"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor",
                          "torch.LongTensor"})


def converts_own_value(ctx, value: ast.AST, name: str) -> bool:
    """`value` makes a tensor of what `name` holds (`torch.from_numpy(y)`, `torch.tensor(y,
    device=d)`), also with dtype and layout methods after it (`torch.from_numpy(y).float()`)."""
    while (value.__class__ is ast.Call and value.func.__class__ is ast.Attribute
           and value.func.attr in _KIND_KEEPING_METHODS and ctx.qualname(value.func) is None):
        value = value.func.value
    return (value.__class__ is ast.Call and bool(value.args) and value.args[0].__class__ is ast.Name
            and value.args[0].id == name and ctx.qualname(value.func) in _CONVERSIONS)


def _converts_by_type(ctx, owner: ast.AST, value: ast.AST, name: str) -> bool:
    """`value` makes a tensor of `name` (`converts_own_value`) in the body of an `if` that tests
    the type of what it was given (`if isinstance(y, np.ndarray):`, `if not torch.is_tensor(y):`,
    also of another input converted alike in the same body): the code makes sure `name` holds a
    tensor, whatever it was given."""
    if not converts_own_value(ctx, value, name):
        return False
    from .flow import flow_of  # flow reads identifiers through this module
    flow = flow_of(ctx, owner)
    statement = flow.statement(value)
    branch = flow.parent.get(statement)
    if branch.__class__ is not ast.If or not any(stmt is statement for stmt in branch.body):
        return False
    converted = {stmt.targets[0].id for stmt in branch.body if stmt.__class__ is ast.Assign
                 and len(stmt.targets) == 1 and stmt.targets[0].__class__ is ast.Name
                 and converts_own_value(ctx, stmt.value, stmt.targets[0].id)}
    return any(n.__class__ is ast.Call and bool(n.args) and n.args[0].__class__ is ast.Name and n.args[0].id in converted
               and (n.func.__class__ is ast.Name and n.func.id in ("isinstance", "type")
                    or ctx.qualname(n.func) == "torch.is_tensor") for n in ast.walk(branch.test))


def _converted_uses(ctx, owner: ast.AST) -> set:
    """ids of the reads of a name that follow, in the same block, a statement rebinding it to a
    tensor made of its own value (`beta = torch.tensor(beta, device=d)`, then `torch.log(beta)`):
    what those reads use is the converted value, no evidence of what the name held before."""
    found = set()
    for node in walk_no_scopes(owner):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for k, stmt in enumerate(block):
                if stmt.__class__ is not ast.Assign or len(stmt.targets) != 1 or stmt.targets[0].__class__ is not ast.Name:
                    continue
                if converts_own_value(ctx, stmt.value, stmt.targets[0].id):
                    name = stmt.targets[0].id
                    found.update(id(n) for later in block[k + 1:] for n in ast.walk(later)
                                 if n.__class__ is ast.Name and n.id == name)
    return found


def scope_kinds(ctx, owner) -> ScopeKinds:
    """The kinds analysis of one function (or the module): its bindings, read once per file."""
    key = ("kinds", id(owner))
    scope = ctx.shared.get(key)
    if scope is None:
        scope = ctx.shared[key] = ScopeKinds(owner)
    return scope


def _chain(ctx) -> list:
    return [scope_kinds(ctx, f) for f in reversed(ctx.functions)] + [scope_kinds(ctx, ctx.tree)]


def _stores_items(loop: ast.AST, name: str) -> bool:
    """The body of the `for` loop `loop` stores into an item of `name`, which its target binds
    (`for batch in loader:` ... `batch[k] = v.cuda()`)."""
    return any(node.__class__ is ast.Assign and any(
        t.__class__ is ast.Subscript and t.value.__class__ is ast.Name and t.value.id == name for t in node.targets)
        for stmt in loop.body for node in walk_no_scopes(stmt))


def bindings(ctx, name: str) -> Optional[list]:
    """The assignments of `name` in the innermost scope around the walker that binds it, as
    `ScopeKinds.assigned` records them; None where no scope binds it."""
    for scope in _chain(ctx):
        entries = scope.assigned.get(name)
        if entries is not None:
            return entries
    return None


def _sets_default_device(ctx) -> bool:
    # Once per file: searching the whole source for every inference made big files quadratic.
    found = ctx.shared.get("sets_default_device")
    if found is None:
        found = ctx.shared["sets_default_device"] = "set_default_device" in ctx.source
    return found


class _Inference:
    def __init__(self, ctx, chain, cls=_NOT_YET):
        self.ctx = ctx
        self.chain = chain
        self.cls = ctx.class_ if cls is _NOT_YET else cls
        self.default_device_set = _sets_default_device(ctx)

    def is_self(self, expr: ast.AST) -> bool:
        """`expr` is the name of the instance of `self.cls` in the method being read: the
        method's first parameter, also read from a function nested in it (`def inner(c, q):
        self.proj(c * q)`) where no scope in between binds the name."""
        if self.cls is None or expr.__class__ is not ast.Name:
            return False
        body = self.cls.body
        for scope in self.chain:
            if scope.owner in body:
                return scope.self_name == expr.id
            if expr.id in scope.assigned:
                return False
        return False

    # -- names ----------------------------------------------------------------
    def name(self, ident: str, chain=None) -> Optional[str]:
        chain = chain if chain is not None else self.chain
        for depth, scope in enumerate(chain):
            if ident in scope.assigned:
                cached = scope.cache.get(ident)
                if cached is _RECURSING:
                    return _RECURSING
                if cached is not None or ident in scope.cache:
                    return cached
                scope.cache[ident] = _RECURSING
                entries = scope.assigned[ident]
                kinds = [self.entry(e, chain[depth:]) for e in entries]
                if any(e[0] == "value" and _converts_by_type(self.ctx, scope.owner, e[1], ident) for e in entries):
                    # `if isinstance(y, np.ndarray): y = torch.from_numpy(y)`: what the other
                    # bindings hold, where unknown, is the tensor the conversion makes sure of
                    kinds = [TENSOR if k is None else k for k in kinds]
                result = self._combine(kinds)
                if result is None:
                    result = scope_evidence(self.ctx, scope).get(ident)
                scope.cache[ident] = result
                return result
        return None

    @staticmethod
    def _combine(kinds) -> Optional[str]:
        # `loss = None`, then `loss = crit(...)` on one path: where it is read as a tensor, it is one
        kinds = [k for k in kinds if k is not _NONE] or [None]
        known = [k for k in kinds if k.__class__ is not _Held]
        if not known or any(k is None for k in known):
            return None
        if len(known) < len(kinds):
            moves = [k.moved_to for k in kinds if k.__class__ is _Held and k.moved_to is not None]
            if moves:  # `x = x.to(device)`: a tensor on that device; a module stays a module
                if set(known) <= set(TENSORS):
                    known += moves
                elif not set(known) <= _MOVABLE:
                    return None
        if set(known) <= set(TENSORS):
            return CPU_TENSOR if all(k == CPU_TENSOR for k in known) else TENSOR
        return known[0] if len(set(known)) == 1 else None

    def entry(self, entry, chain) -> Optional[str]:
        sub = _Inference(self.ctx, chain, self.cls)
        tag = entry[0]
        if tag == "kind":
            return entry[1]
        if tag == "imported":  # `from load import SOS_token`, a number there
            node = entry[1]
            return SCALAR if imported_number(self.ctx, node.module, node.level, entry[2]) else OTHER
        if tag == "value":
            if entry[1].__class__ is ast.Constant and entry[1].value is None:
                return _NONE
            return sub._expr(entry[1])  # `model = model.double()` adds no kind of its own: see `_call`
        if tag == "aug":
            node = entry[1]
            value = sub.expr(node.value)
            # `x += 0.5 * np.log(v)`: a number added leaves the name what its other bindings make it
            return value if value in TENSORS else (_NONE if value in (SCALAR, NUMPY) else None)
        if tag == "unpack":
            value, index = entry[1], entry[2]
            if isinstance(value, (ast.Tuple, ast.List)) and -len(value.elts) <= index < len(value.elts):
                item = value.elts[index]
                if item.__class__ is ast.Constant and item.value is None:
                    return _NONE  # `actor_loss, critic_loss = None, None`
                # `x, y = x.to(device), y.to(device)` reuses the names as `x = x.to(device)` does
                return sub._expr(item) if isinstance(item, ast.Call) else sub.expr(item)
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                if (value.func.attr in ("split", "chunk", "unbind", "tensor_split") or value.func.attr in _PAIR_METHODS) \
                        and sub.expr(value.func.value) in TENSORS:
                    return sub.expr(value.func.value)  # `values, order = lengths.sort(descending=True)`
                qual = self.ctx.qualname(value.func)
                if qual is not None and qual.rpartition(".")[0] == "torch" and value.func.attr in _SPLITTING_FUNCTIONS \
                        and value.args and sub.expr(value.args[0]) in TENSORS:
                    return sub.expr(value.args[0])  # `_, pred = torch.max(out, 1)`: tensors where `out` is
            if isinstance(value, ast.Attribute) and value.attr == "shape":
                return SCALAR
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "size":
                return SCALAR
            if isinstance(value, ast.Call):
                own = sub._own_callee(value.func)
                if own is not None:  # `net, optimizer = build(cfg)`: the items its `return`s give
                    return returned_kind(self.ctx, *own, index, sub._call_arguments(value, *own))
                whole = sub.expr(value)
                if whole in TENSORS:
                    return whole  # `scores, lengths = model(x, n)`: a module's outputs, where it runs
                if whole == USER_MODULE or sub.expr(value.func) == USER_MODULE:
                    item = sub._forward_item(value, index)  # `loss, loss_coord = criterion(out, y)`
                    if item is not None:
                        return item
                recurrent = sub._recurrent_layer(value.func)
                if recurrent is not None and (index == 0 or index == 1 and recurrent != "LSTM"):
                    return TENSOR  # `output, hidden = self.gru(x, h0)`; an LSTM's second item is a pair
            return None
        if tag == "elem":
            kind = sub.element(entry[1], entry[2])
            if kind == CPU_TENSOR and len(entry) == 5 and _stores_items(entry[3], entry[4]):
                return None  # `batch[k] = to_var(v)` in the loop: its items may move, whatever the loader gave
            return kind
        if tag == "param":
            return self._passed(entry[1], entry[2])
        if tag == "class":
            return MODULE_CLASS if any(sub._module_base(base) for base in entry[1].bases) else OTHER
        return None

    def _is_parameter(self, ident: str) -> bool:
        """`ident` is bound only as a parameter of the innermost function that binds it."""
        for scope in self.chain:
            entries = scope.assigned.get(ident)
            if entries is not None:
                return all(entry[0] == "param" for entry in entries)
        return False

    def _passed(self, function: ast.AST, name: str) -> Optional[str]:
        """The kind every call of `function` passes for its parameter `name`: the calls in the
        file, or where the file never calls it, those of the project files that import it
        (`logger.log_data(step, actor_loss, ...)` in main.py for `log_data` of logger.py); None
        where there are none, or they disagree or cannot be told."""
        passed = self._arguments_at_calls(function, name)
        if passed is None:
            return None
        kinds = []
        for inference, value, ctx, site in passed:
            value = _held_at_call(ctx, value, site) or value  # what a name holds at the call, not all it ever holds
            kind = inference.expr(value)
            if kind is None:
                return None
            kinds.append(kind)
        return self._combine(kinds)

    def _arguments_at_calls(self, function: ast.AST, name: str) -> Optional[list]:
        """[(an _Inference read where the call is, the expression passed for `name`, the call's
        SourceFile, its CallSite)] for every call of `function` (`_calls_of`); None where there are
        none, or one passes nothing that can be told (`*args`)."""
        sites = self._calls_of(function)
        if sites is None:
            return None
        found = []
        for ctx, site in sites:
            value = argument_for(site, function, name)
            if value is None:
                return None
            chain = [scope_kinds(ctx, f) for f in reversed(site.functions)] + [scope_kinds(ctx, ctx.tree)]
            found.append((_Inference(ctx, chain, site.cls), value, ctx, site))
        return found

    def _calls_of(self, function: ast.AST) -> Optional[list]:
        """[(SourceFile, CallSite)] of the calls of `function` that pass its parameters: those of
        the file, or where the file never calls it, those of the project files that import it;
        None where there are none or too many, and for `__init__`."""
        if function.name == "__init__":
            return None
        if function.name in ("forward", "__call__") or identifier_text(self.ctx).count(function.name + "(") >= 2:
            sites = [(self.ctx, site) for site in file_calls(self.ctx).call_sites(function)]
        else:
            sites = []  # only its `def` names it: the file never calls it (a `forward` is called through its instances)
        if not sites:
            sites = _importer_sites(self.ctx, function)
        return sites if sites and len(sites) <= _MAX_CALL_SITES else None

    def _passed_items(self, function: ast.AST, name: str) -> Optional[str]:
        """The kind of the items of what every call of `function` passes for its parameter `name`,
        from each value the argument may hold at the call (`seq = range(0, T, skip)` in one branch,
        `seq = [int(s) for s in seq]` in another, then `steps(x, seq, model)`: numbers)."""
        passed = self._arguments_at_calls(function, name)
        if passed is None:
            return None
        from .flow import flow_of  # flow reads identifiers through this module
        kinds = []
        for inference, value, ctx, site in passed:
            values = [value]
            if isinstance(value, ast.Name) and site.functions:
                flow = flow_of(ctx, site.functions[-1])
                reaching = flow.reaching_all(value) if value in flow.parent else []
                if not reaching or not all(simple and stmt is not None for stmt, simple in reaching):
                    return None
                values = [stmt.value for stmt, _ in reaching]
            for each in values:
                kind = inference.element(each, ())
                if kind is None:
                    return None
                kinds.append(kind)
        return self._combine(kinds)

    def _module_base(self, base: ast.AST) -> bool:
        """A module class (`is_module_class`), or a module class of the file."""
        qual = self.ctx.qualname(base)
        if qual is not None:
            return is_module_class(qual)
        return isinstance(base, ast.Name) and self.name(base.id) == MODULE_CLASS

    def element(self, iterable: ast.AST, path: tuple) -> Optional[str]:
        """Kind of the item at `path` inside each element of `iterable`."""
        if isinstance(iterable, ast.Subscript) and isinstance(iterable.slice, ast.Slice):
            return self.element(iterable.value, path)  # `list(range(n))[::-1]`: the same items
        if isinstance(iterable, ast.Name) and not path and self._numbers_held(iterable.id):
            return SCALAR  # `indices = list(range(n))[::-1]`, then `indices = tqdm(indices)`
        if isinstance(iterable, ast.Name) and not path and self._is_parameter(iterable.id):
            entry = next(scope.assigned[iterable.id][0] for scope in self.chain if iterable.id in scope.assigned)
            passed = self._passed_items(entry[1], entry[2])
            if passed is not None:
                return passed
        if isinstance(iterable, (ast.ListComp, ast.GeneratorExp)) and not path:
            item = self.expr(iterable.elt)
            return item if item == SCALAR else None  # `[int(s) for s in seq]`: numbers
        if not path and (isinstance(iterable, (ast.List, ast.Tuple)) and iterable.elts and not any(
                isinstance(e, ast.Starred) for e in iterable.elts)):
            items = {self.expr(e) for e in iterable.elts}
            return SCALAR if items == {SCALAR} else None  # `[-1, 0]`: numbers
        if not path and isinstance(iterable, ast.BinOp) and isinstance(iterable.op, ast.Add):
            left = self.element(iterable.left, ())  # `[-1] + list(seq[:-1])`: the items of both
            return left if left == SCALAR and self.element(iterable.right, ()) == SCALAR else None
        if isinstance(iterable, ast.Call):
            fname = getattr(iterable.func, "id", None)
            if fname == "enumerate" and iterable.args:
                if not path:
                    return None
                return SCALAR if path[0] == 0 else self.element(iterable.args[0], path[1:])
            if fname == "zip":
                if not path:
                    return None
                return self.element(iterable.args[path[0]], path[1:]) if path[0] < len(iterable.args) else None
            if fname == "range":
                return SCALAR if not path else None
            if fname in ("tqdm", "iter", "reversed", "sorted", "list") or self.ctx.qualname(iterable.func) in _PROGRESS_BARS:
                return self.element(iterable.args[0], path) if iterable.args else None
            attr = getattr(iterable.func, "attr", None)
            if attr in _PARAMETER_LISTS and self.expr(iterable.func.value) in _HOLDS_PARAMETERS:
                # `for name, p in model.named_parameters()`: the module's tensors, where it runs
                named = attr.startswith("named_")
                return (SCALAR if path == (0,) else TENSOR if path == (1,) else None) if named else (
                    TENSOR if not path else None)
        kind = self.expr(iterable)
        if kind == LOADER:
            return CPU_TENSOR  # batches of a plain DataLoader are host tensors (or tuples of them)
        if path:
            return None
        if kind in TENSORS:
            return kind
        if kind == TENSOR_SEQ:
            return TENSOR
        if kind == MODULE_LIST:
            return None
        return None

    def _numbers_held(self, ident: str) -> bool:
        """Every value the innermost scope binding `ident` assigns it is a sequence of numbers
        (`range(n)`, `list(range(n))[::-1]`, a wrapper of the name itself: `tqdm(indices)`)."""
        scope = next((scope for scope in self.chain if ident in scope.assigned), None)
        if scope is None:
            return False
        key = ("numbers held", ident)
        found = scope.cache.get(key)
        if found is _RECURSING:
            return True  # the name read in its own binding (`indices = tqdm(indices)`) adds no other items
        if found is None:
            scope.cache[key] = _RECURSING
            entries = scope.assigned[ident]
            found = scope.cache[key] = all(e[0] == "value" and self.element(e[1], ()) == SCALAR for e in entries)
        return found

    # -- expressions ------------------------------------------------------------
    def expr(self, node: ast.AST) -> Optional[str]:
        result = self._expr(node)
        return None if result.__class__ is _Held else result

    def _expr(self, node: ast.AST):
        ctx = self.ctx
        if isinstance(node, ast.Name):
            qual = ctx.qualname(node)
            if qual is not None:
                kind = self._qualified(qual)
                if kind is None and self.name(node.id) == SCALAR:
                    return SCALAR  # `SOS_token` after `from load import SOS_token`, a number there
                return kind
            kind = self.name(node.id)
            if kind is None and node.id.lower().endswith("loader"):
                return LOADER  # `train_loader`, `dataloader`; not `loader_names`, `val_loaders`
            return kind
        if isinstance(node, ast.Constant):
            return SCALAR
        if isinstance(node, (ast.List, ast.Tuple, ast.ListComp, ast.Set, ast.Dict, ast.DictComp, ast.SetComp)):
            return LIST
        if isinstance(node, ast.JoinedStr):
            return SCALAR
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Subscript):
            held = self._expr(node.value)
            if held.__class__ is _Held and int_const(node.slice) is None:
                return held  # `x = x[mask]`: a tensor (or array) indexed stays what it was, where it was
            base = None if held.__class__ is _Held else held
            if base in TENSORS or base == NUMPY:
                return base
            if base == LIST and node.value.__class__ is ast.Name and int_const(node.slice) is not None:
                item = self._list_item(node.value.id, int_const(node.slice))
                if item is not None:
                    return item  # `ys[0]` after `ys = [y[y != pad] for y in batch]`
            if base == LIST and node.value.__class__ is ast.Call and int_const(node.slice) is not None:
                own = self._own_callee(node.value.func)  # `build(cfg)[0]`: the item every `return` gives
                if own is not None:
                    return returned_kind(ctx, *own, int_const(node.slice), self._call_arguments(node.value, *own))
            if base is None and int_const(node.slice) in (0, 1) and _pair_method(node.value):
                pair = self.expr(node.value.func.value)  # `q.max(1)[0]`: the values, where q is
                return pair if pair in TENSORS else None
            if base == TENSOR_SEQ:
                return TENSOR
            if base == SCALAR:
                return SCALAR
            # `self.layers[i]` where `self.layers` is a container on one path and a layer on
            # another: only the container can be indexed.
            if base in (MODULE_LIST, MODULE, OTHER, LIST) or base is None and isinstance(node.value, ast.Attribute):
                return self._container_item(node)
            return None
        if isinstance(node, (ast.BinOp,)):
            left, right = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.MatMult) or left in TENSORS or right in TENSORS:
                both = [k for k in (left, right) if k in TENSORS]
                if TENSOR in both or isinstance(node.op, ast.MatMult) and not both:
                    return TENSOR
                return CPU_TENSOR if both else TENSOR
            if left == NUMPY or right == NUMPY:
                return NUMPY
            if left == SCALAR and right == SCALAR:
                return SCALAR
            if left == LIST and right == LIST:
                return LIST
            return None
        if isinstance(node, ast.UnaryOp):
            return SCALAR if isinstance(node.op, ast.Not) else self.expr(node.operand)
        if isinstance(node, ast.Compare):
            kinds = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            if any(isinstance(op, (ast.In, ast.NotIn, ast.Is, ast.IsNot)) for op in node.ops):
                return SCALAR
            if any(isinstance(c, _CONTAINER_DISPLAYS) or isinstance(c, ast.Constant) and isinstance(c.value, str)
                   for c in [node.left] + node.comparators):
                return SCALAR  # `x == []`, `t != "none"`: a tensor is never equal to these, a Python bool
            if TENSOR in kinds:
                return TENSOR
            if CPU_TENSOR in kinds:
                return CPU_TENSOR
            if NUMPY in kinds:
                return NUMPY
            return SCALAR if all(k == SCALAR for k in kinds) else None
        if isinstance(node, ast.IfExp):
            return self._combine([self.expr(node.body), self.expr(node.orelse)])
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _qualified(self, qual: str) -> Optional[str]:
        module, _, attr = qual.rpartition(".")
        if qual.startswith(("numpy.", "np.")):
            return NUMPY if attr and attr[0].islower() else OTHER
        if _is_dtype(qual):
            return SCALAR
        return OTHER if qual.startswith("torch") else None

    def _attribute(self, node: ast.Attribute, base_kind=_NOT_YET) -> Optional[str]:
        """`base_kind`: the kind of `node.value` when the caller has it already (evaluating it
        twice per level made `x.float().float()...` chains exponential)."""
        qual = self.ctx.qualname(node)
        if qual is not None:
            return self._qualified(qual)
        base = node.value
        if self.is_self(base):
            return class_attribute_kind(self.ctx, self.cls, node.attr)
        if base_kind is _NOT_YET:
            base_kind = self.expr(base)
        if base_kind in TENSORS:
            if node.attr in _SAME_KIND_ATTRS:
                return base_kind
            if node.attr in _NON_TENSOR_ATTRS:
                return SCALAR
            return None
        if base_kind == NUMPY:
            return SCALAR if node.attr in ("shape", "ndim", "dtype", "size") else NUMPY if node.attr == "T" else None
        if base_kind in (LINEAR, MODULE) and node.attr in ("weight", "bias"):
            return TENSOR
        if base_kind is None and node.attr == "grad":
            return TENSOR  # `param.grad`: only a tensor has a gradient, on its parameter's device
        return None

    def _call(self, node: ast.Call) -> Optional[str]:
        ctx = self.ctx
        func = node.func
        qual = ctx.qualname(func)
        if qual is not None:
            return self._qualified_call(qual, node)
        bound = ctx.names.set_on_module(func)
        if bound is not None:  # `nn.MaskedLinear(...)` after `nn.MaskedLinear = MaskedLinear`
            return USER_MODULE if self.name(bound) == MODULE_CLASS else None
        if isinstance(func, ast.Name):
            if func.id in ("list", "tuple", "sorted", "map", "filter"):
                return LIST
            if func.id in ("sum", "abs") and node.args and not ctx.names.binds_locally(func.id):
                # `sum(p.grad.norm() ** 2 for p in params)`, `abs(t)`: a tensor of tensors
                arg = node.args[0]
                item = arg.elt if func.id == "sum" and isinstance(arg, (ast.GeneratorExp, ast.ListComp)) else \
                    arg if func.id == "abs" else None
                if item is not None and self.expr(item) in (TENSOR, CPU_TENSOR):
                    return self.expr(item)
            if func.id in ("len", "int", "float", "bool", "str", "round", "sum", "abs", "max", "min",
                           "isinstance", "hasattr", "repr"):
                return SCALAR if func.id not in ("sum", "abs", "max", "min") else None
            if cuda_tensor_type(ctx, func) is not None:
                return TENSOR  # `ByteTensor(flags)` after `ByteTensor = torch.cuda.ByteTensor if cuda else ...`
            callee = self.name(func.id)
            if callee == MODULE_CLASS:
                return USER_MODULE
            own = self._own_callee(func)
            if own is not None:  # `loss = compute_loss(out, y)`
                return returned_kind(ctx, *own, arguments=self._call_arguments(node, *own))
            if callee is None and not ctx.names.binds_locally(func.id):
                imported = self._imported_return(node)  # a name a star import brings
                if imported is not None:
                    return imported
            if callee is None and node.args and self._is_parameter(func.id):
                # `model(x)` of a model passed in: a callable taking tensors only, a module, which
                # gives a tensor on the device it was given one on (given host tensors, the model
                # may move them itself: unknown)
                arg_kinds = {self.expr(a) for a in node.args}
                if arg_kinds <= set(TENSORS) and TENSOR in arg_kinds:
                    return TENSOR
        elif isinstance(func, ast.Subscript):
            callee = self.expr(func)  # `self.critics[i](s, a)`
        elif isinstance(func, ast.Attribute):
            receiver = self._expr(func.value)
            if receiver.__class__ is _Held:
                # `model = model.double()`, `x = x.to(device)`: a dtype or mode change keeps what
                # the name held before, a move moves it
                if func.attr in _KIND_KEEPING_METHODS:
                    return receiver
                where = self._destination(func.attr, node)
                if where is _STAYS:
                    return receiver
                return None if where is None else _MOVED_TO_CPU if where == CPU_TENSOR else _MOVED
            if receiver in TENSORS:
                return self._tensor_method(func.attr, receiver, node)
            if receiver == NUMPY:
                return SCALAR if func.attr in ("item",) else LIST if func.attr == "tolist" else NUMPY
            if receiver in (MODULE, LINEAR, USER_MODULE) and func.attr in (
                    "parameters", "named_parameters", "modules", "children"):
                return OTHER
            if receiver in (MODULE, LINEAR, USER_MODULE) and func.attr in (
                    "cuda", "cpu", "to", "float", "half", "bfloat16", "double", "train", "eval"):
                return receiver
            if receiver == MODULE_LIST:
                return None
            if receiver in (MODULE, LINEAR, USER_MODULE) and func.attr == "forward":
                callee, func = receiver, func.value  # `m.forward(x)`: what calling `m` gives
            else:
                own = self._own_callee(func)
                if own is not None:  # `batch = self.sample(n)`
                    return returned_kind(ctx, *own, arguments=self._call_arguments(node, *own))
                callee = self._attribute(func, receiver)
        elif isinstance(func, ast.Call):
            callee = self.expr(func)  # `nn.L1Loss()(pred, y)`: a module made and called at once
        else:
            callee = None
        if callee in (LINEAR, MODULE):
            # a torch.nn layer computes where its input is (it cannot move it): on host tensors, on the host
            given = [self.expr(a) for a in node.args]
            if given and all(k == CPU_TENSOR for k in given):
                # a model passed in may move host inputs itself (`nn.DataParallel` scatters them): unknown
                passed_in = callee == MODULE and isinstance(func, ast.Name) and self._is_parameter(func.id)
                return None if passed_in else CPU_TENSOR
            return TENSOR
        if callee == USER_MODULE:
            cls = self._module_class(func)
            return TENSOR if cls is not None and _forward_returns_one_tensor(cls) else None
        return None

    def _list_item(self, ident: str, index: int) -> Optional[str]:
        """Kind of item `index` of the list that the name's one binding makes: a list display's item
        there, or what a comprehension's element expression gives."""
        scope = next((scope for scope in self.chain if ident in scope.assigned), None)
        entries = scope.assigned[ident] if scope is not None else []
        if len(entries) != 1 or entries[0][0] != "value":
            return None
        value = entries[0][1]
        if value.__class__ is ast.ListComp:
            return self.expr(value.elt)
        if value.__class__ in (ast.List, ast.Tuple) and -len(value.elts) <= index < len(value.elts) \
                and not any(e.__class__ is ast.Starred for e in value.elts):
            return self.expr(value.elts[index])
        return None

    def _own_callee(self, func: ast.AST) -> Optional[tuple]:
        """(definition, its class or None) of what a call of `func` runs, where it is defined in
        this file: a function of the module level that `func` names (bound once there, not in a
        function around the call), or a method of the class being read that `self.<name>` calls
        in another of its methods."""
        calls = file_calls(self.ctx)
        if func.__class__ is ast.Name:
            definition = calls.module_functions.get(func.id)
            if definition is None:
                return None
            scope = next((scope for scope in self.chain if func.id in scope.assigned), None)
            return (definition, None) if scope is not None and scope.owner is self.ctx.tree else None
        if func.__class__ is not ast.Attribute or not self.is_self(func.value):
            return None
        methods = calls.methods.get(id(self.cls))
        if methods is None:
            return None
        method = methods.get(func.attr)
        return (method, self.cls) if method is not None and not method.decorator_list else None

    def _returned(self, definition: ast.AST, value: ast.AST) -> Optional[str]:
        """Kind of a value `definition` returns; a name by the assignments that reach the `return`
        (`x = torch.tensor(x)`, then `if cuda: x = x.cuda()`: a tensor, on the device where it was
        moved), where it is bound more than once."""
        if value.__class__ is not ast.Name or len(self.chain[0].assigned.get(value.id, ())) < 2:
            return self.expr(value)
        from .flow import flow_of  # flow reads identifiers through this module
        flow = flow_of(self.ctx, definition)
        if value not in flow.parent:
            return self.expr(value)
        found = self._reaching(flow, value, 0)
        return self.expr(value) if found is _NOT_YET else found

    def _reaching(self, flow, load: ast.Name, depth: int):
        """Kind of what `load` reads, from the plain assignments that reach it; an update of the
        name itself (`x = x.cuda()`, `x = x.float()`) is what the name held before it, moved or
        kept. `_NOT_YET` where a store other than a plain assignment reaches it."""
        kinds = []
        for stmt, simple in flow.reaching_all(load):
            if stmt is None or not simple or depth > 8:
                return _NOT_YET  # a parameter, a loop target, an unpacking: all it may hold
            update = stmt.value
            func = update.func if update.__class__ is ast.Call else None
            if func.__class__ is ast.Attribute and func.value.__class__ is ast.Name and func.value.id == load.id:
                before = self._reaching(flow, func.value, depth + 1)
                if before is _NOT_YET or before is None:
                    return before
                where = self._destination(func.attr, update)
                if func.attr in _KIND_KEEPING_METHODS or where is _STAYS:
                    kinds.append(before)
                elif where in (TENSOR, CPU_TENSOR) and before in TENSORS or before in _MOVABLE:
                    kinds.append(where if before in TENSORS else before)
                else:
                    kinds.append(None)
            else:
                kinds.append(self.expr(update))
        return self._combine(kinds) if kinds else _NOT_YET

    def _call_arguments(self, call: ast.Call, definition: ast.AST, cls: Optional[ast.ClassDef]) -> tuple:
        """(parameter, kind) for each parameter of `definition` that `call` passes a value of a
        known kind for (a method's first parameter is its receiver, not passed)."""
        args = definition.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        site = CallSite(call, (), None, cls is not None, (), False)
        found = []
        for name in params[1:] if cls is not None else params:
            value = argument_for(site, definition, name)
            if value is None or value.__class__ is ast.Constant and value.value is None:
                continue  # not told, or `None`: a default that the body replaces
            kind = self.expr(value)
            if kind is not None:
                found.append((name, kind))
        return tuple(found)

    def _recurrent_layer(self, func: ast.AST) -> Optional[str]:
        """The torch.nn recurrent layer ("RNN", "GRU" or "LSTM") that every value `func` (a name,
        or `self.<attr>`) is bound to makes, else None."""
        if isinstance(func, ast.Name):
            values = [e[1] for e in bindings(self.ctx, func.id) or () if e[0] == "value"]
        elif isinstance(func, ast.Attribute) and self.is_self(func.value):
            values = [value for _, value in class_attribute_values(self.ctx, self.cls, func.attr)]
        else:
            return None
        made = {self.ctx.qualname(v.func) if isinstance(v, ast.Call) else None for v in values}
        if len(made) != 1:
            return None
        layer = made.pop() or ""
        return layer[len("torch.nn."):] if layer in _RECURRENT_LAYERS else None

    def _module_class(self, func: ast.AST, depth: int = 0) -> Optional[ast.ClassDef]:
        """The module class whose instance `func` holds (`model = Net(...)`, `self.net =
        Net(...)`), of this file or of a project module it imports, when every value it is bound
        to makes one; for a parameter, when every call passes one of the same class
        (`train(loader, net, criterion)` after `criterion = CrossEntropyLoss2d().cuda()`)."""
        if isinstance(func, ast.Name):
            entries = next((scope.assigned[func.id] for scope in self.chain if func.id in scope.assigned), ())
            if entries and depth < 2 and all(e[0] == "param" for e in entries):
                return self._passed_module_class(entries[0][1], func.id, depth)
            values = [e[1] for e in entries if e[0] == "value"]
        elif isinstance(func, ast.Attribute) and self.is_self(func.value):
            values = [value for _, value in class_attribute_values(self.ctx, self.cls, func.attr)]
        elif isinstance(func, ast.Subscript):  # `self.critics[i]` after `self.critics = [Critic(d) for ...]`
            values = [value for _, value in self._container_items(func) or ()]
        else:
            return None
        if not values:
            return None
        classes = set()
        for value in values:
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in (
                    "to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval"):
                value = value.func.value  # `Net().to(device)`
            if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
                return None
            classes.add(value.func.id)
        if len(classes) != 1:
            return None
        name = classes.pop()
        own = next((s for s in self.ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)
        if own is not None or not in_script_project(self.ctx):
            return own
        found = imported_class(self.ctx, value.func)  # `criterion = FocalLoss().cuda()`, imported from the project
        if found is None:
            return None
        self.ctx.shared[("module_class_file", id(found[0]))] = found[1]
        return found[0]

    def _forward_item(self, call: ast.Call, index: int) -> Optional[str]:
        """The kind of item `index` of the tuple that every `return` of the `forward` of the module
        `call` runs gives (`return self.loss_tot, self.loss_coord`), read in the class's file."""
        cls = self._module_class(call.func)
        if cls is None:
            return None
        view = self.ctx.shared.get(("module_class_file", id(cls)), self.ctx)
        forward = next((s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and s.name == "forward"), None)
        return returned_kind(view, forward, cls, index) if forward is not None else None

    def _passed_module_class(self, function: ast.AST, name: str, depth: int) -> Optional[ast.ClassDef]:
        """The module class of what every call of `function` passes for its parameter `name`."""
        passed = self._arguments_at_calls(function, name)
        if not passed:
            return None
        classes = [inference._module_class(value, depth + 1) for inference, value, _, _ in passed]
        first = classes[0]
        return first if first is not None and all(c is first for c in classes) else None

    def _destination(self, method: str, node: ast.Call):
        """Where `.cpu()` / `.cuda()` / `.to(...)` / `.type_as(other)` puts its receiver: CPU_TENSOR (the CPU), TENSOR
        (a device not known to be the CPU), `_STAYS` (`.to(torch.float16)`, `.to(dtype=...)`); None
        for other methods."""
        if method == "cpu":
            return CPU_TENSOR
        if method == "cuda":
            return TENSOR
        if method == "type_as" and len(node.args) == 1 and not node.keywords:
            other = self.expr(node.args[0])  # `y.type_as(x)`: x's dtype, on x's device
            return other if other in (TENSOR, CPU_TENSOR) else None
        if method != "to":
            return None
        target = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "device"), None)
        if target is None:
            return _STAYS
        if is_cpu_literal(target):
            return CPU_TENSOR
        if isinstance(target, ast.Attribute) and target.attr == "device":  # `.to(x.device)`
            return CPU_TENSOR if self.expr(target.value) == CPU_TENSOR else TENSOR
        kind = self.expr(target)
        if kind == SCALAR and not isinstance(target, ast.Constant):
            devices = self.device_strings(target)
            if devices is None:
                return _STAYS  # .to(torch.float16): a dtype
            return CPU_TENSOR if all(d.split(":")[0] == "cpu" for d in devices) else TENSOR
        return CPU_TENSOR if kind == CPU_TENSOR else TENSOR  # a device, or `.to(other)`: other's device

    def device_strings(self, expr: ast.AST, depth: int = 0) -> Optional[set]:
        """The device strings a name or expression holds (`device = "cuda"`, `dev = "cuda" if
        torch.cuda.is_available() else "cpu"`, `args.device` aside), else None: every value it
        may hold is a string literal."""
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else None
        if isinstance(expr, ast.IfExp):
            body, orelse = self.device_strings(expr.body, depth), self.device_strings(expr.orelse, depth)
            return body | orelse if body is not None and orelse is not None else None
        if isinstance(expr, ast.JoinedStr):  # f"cuda:{rank}"
            head = expr.values[0] if expr.values else None
            return {head.value} if isinstance(head, ast.Constant) and isinstance(head.value, str) else None
        if (isinstance(expr, ast.Call) and len(expr.args) == 1 and not expr.keywords
                and self.ctx.qualname(expr.func) == "torch.device"):
            return self.device_strings(expr.args[0], depth)  # `torch.device("cpu")`
        if not isinstance(expr, ast.Name) or depth > 4:
            return None
        for scope in self.chain:
            entries = scope.assigned.get(expr.id)
            if entries is None:
                continue
            found: set = set()
            for entry in entries:
                if entry[0] == "param":
                    strings = self._passed_strings(entry[1], entry[2], depth + 1)
                else:
                    value = entry[1] if entry[0] == "value" else None
                    strings = self.device_strings(value, depth + 1) if value is not None else None
                if strings is None:
                    return None
                found |= strings
            return found or None
        return None

    def _passed_strings(self, function: ast.AST, name: str, depth: int) -> Optional[set]:
        """The device strings every call of `function` passes for its parameter `name` (`train(...,
        device)` after `device = "cuda"`), else None."""
        passed = self._arguments_at_calls(function, name)
        if passed is None:
            return None
        found: set = set()
        for inference, value, _, _ in passed:
            strings = inference.device_strings(value, depth)
            if strings is None:
                return None
            found |= strings
        return found or None

    def _tensor_method(self, method: str, receiver: str, node: ast.Call) -> Optional[str]:
        if method in ("cpu", "cuda", "to", "type_as"):
            where = self._destination(method, node)
            return receiver if where is _STAYS else where
        if method == "type" and len(node.args) == 1 and not node.keywords:
            return self._retyped(receiver, node.args[0])
        if method in _NON_TENSOR_METHODS:
            if method in _ONE_VALUE_WITHOUT_DIM and not node.args and not node.keywords:
                return receiver  # `hr.max()`: the one largest value, a tensor where the receiver is
            kind = _NON_TENSOR_METHODS[method]
            # `.max()` is a tensor or a (values, indices) pair, but of a host tensor either stays there
            return CPU_TENSOR if kind is None and receiver == CPU_TENSOR else kind
        return receiver

    def _retyped(self, receiver: str, target: ast.AST) -> Optional[str]:
        """`x.type(T)`: on the GPU for a CUDA tensor type (`torch.cuda.FloatTensor`, a name bound to
        one), on the host for a CPU one (`torch.FloatTensor`), where `x` was for a dtype."""
        if cuda_tensor_type(self.ctx, target) is not None:
            return TENSOR
        qual = self.ctx.qualname(target) or ""
        module, _, name = qual.rpartition(".")
        if module == "torch" and (name == "Tensor" or name in TYPED_TENSORS):
            return CPU_TENSOR
        return receiver if module == "torch" and name[:1].islower() else None

    def _container_item(self, node: ast.Subscript) -> Optional[str]:
        """`self.blocks[0]`, `self.layers["proj"]`: the kind of the item a fixed key picks out of a
        container that `__init__` builds and the class never changes in place, from the
        expressions that build that item (all of a comprehension's items are built by one)."""
        items = self._container_items(node)
        if not items:
            return None
        kinds = [_Inference(self.ctx, [scope_kinds(self.ctx, method), scope_kinds(self.ctx, self.ctx.tree)]).expr(item)
                 for method, item in items]
        return self._combine(kinds)

    def _container_items(self, node: ast.Subscript) -> Optional[list]:
        """[(method, expression)] building the item `node` picks out of a container of the class
        (see `_container_item`); None where they cannot be told."""
        container = node.value
        key = fixed_key(node.slice)
        if key is None:
            key = _ANY_KEY  # `self.heads[i]`: the item every item is, where one expression builds them all
        cls = self.cls
        if cls is None or not isinstance(container, ast.Attribute) or not self.is_self(container.value):
            return None
        # A layer on another path (`if individual: ModuleList ... else: nn.Linear`) cannot be
        # indexed: the item comes from the containers.
        entries = [(method, value) for method, value in self._copied_values(cls, container.attr)
                   if not _unindexable_layer(self.ctx, value)]
        built = [(method, module_container(self.ctx, value)) for method, value in entries]
        if container.attr in mutated_attributes(self.ctx, cls):
            # `self.layers = nn.ModuleList()`, then `self.layers.append(nn.Linear(d, d))` in a
            # loop: every item is what the one append makes.
            appended = appended_items(self.ctx, cls, container.attr)
            if appended is None or any(b is None or b.by_key or b.every is not None for _, b in built):
                return None
            items = appended
        else:
            items = []
            for method, container_built in built:
                item = container_built.item(key) if container_built is not None else None
                if item is None:
                    return None
                items.append((method, item[0]))
        return items

    def _copied_values(self, cls: ast.ClassDef, attr: str) -> list:
        """[(method, value)] the class stores in `self.<attr>`, with a copy of another attribute
        (`self.critics_target = deepcopy(self.critics)`) read as what that attribute holds."""
        found = []
        for method, value in class_attribute_values(self.ctx, cls, attr):
            if (value.__class__ is ast.Call and len(value.args) == 1 and not value.keywords
                    and self.ctx.qualname(value.func) in ("copy.deepcopy", "copy.copy")
                    and value.args[0].__class__ is ast.Attribute and self.is_self(value.args[0].value)
                    and value.args[0].attr != attr):
                found.extend(class_attribute_values(self.ctx, cls, value.args[0].attr))
            else:
                found.append((method, value))
        return found

    def _qualified_call(self, qual: str, node: ast.Call) -> Optional[str]:
        module, _, attr = qual.rpartition(".")
        if qual == "copy.deepcopy" and len(node.args) == 1 and not node.keywords:
            return self.expr(node.args[0])
        if qual in _VARIABLE and node.args:  # `x = Variable(x, requires_grad=False)`: the tensor itself
            return self._expr(node.args[0])
        if qual in _LINEAR_MODULES:
            return LINEAR
        if qual == "torch.nn.ModuleList":
            return MODULE_LIST
        if qual in ("torch.nn.Parameter", "torch.nn.Buffer"):
            return TENSOR
        if module == "torch" and (attr == "Tensor" or attr in TYPED_TENSORS):
            return CPU_TENSOR
        if module == "torch.cuda" and attr in TYPED_TENSORS:
            return TENSOR
        if qual == "torch.utils.data.DataLoader":
            return LOADER
        if qual in _PROGRESS_BARS and node.args:
            return LOADER if self.expr(node.args[0]) == LOADER else None  # `tqdm(loader)` yields its batches
        if qual == "torch.from_numpy":
            return CPU_TENSOR  # shares the array's host memory
        if qual in _MODULE_WRAPPERS:
            return USER_MODULE  # `DistributedDataParallel(model)`: a module that runs the one it wraps
        if module == "torch.nn" and attr[:1].isupper():
            return MODULE if (attr in _ELEMENTWISE_MODULES or attr.endswith("Loss")) else OTHER
        if qual.startswith(("numpy.", "np.")):
            return NUMPY if attr[:1].islower() else OTHER
        if module in _TENSOR_NAMESPACES and attr[:1].islower():
            if attr in NOT_TENSOR_FUNCTIONS:
                return SCALAR if attr in ("is_tensor", "numel", "is_floating_point", "is_complex", "is_nonzero",
                                          "equal", "allclose") else OTHER
            if attr in ("max", "min") and not any(k.arg == "dim" for k in node.keywords):
                # `torch.max(x)`: a tensor; `torch.min(q1, q2)`: the element-wise one; `torch.max(x, 1)`: a pair
                operands = [self.expr(a) for a in node.args]
                if len(operands) == 1 or len(operands) == 2 and operands[1] != SCALAR:
                    # two operands share a device: one on the CPU puts the result there
                    return CPU_TENSOR if CPU_TENSOR in operands and TENSOR not in operands else (
                        TENSOR if operands[0] in TENSORS or operands[-1] in TENSORS else None)
            if attr in _SPLITTING_FUNCTIONS:
                return LIST
            if attr == "unbind":
                return TENSOR_SEQ
            if attr in FACTORIES:
                return self._factory_kind(attr, node)
            arg_kinds = [self.expr(a) for a in node.args]
            if CPU_TENSOR in arg_kinds and TENSOR not in arg_kinds:
                return CPU_TENSOR
            return TENSOR
        if qual in _TOTAL_NORMS:
            return TENSOR  # the total norm, a 0-d tensor on the parameters' device
        if qual.startswith("torch."):
            return OTHER
        key = ("imported_call_kind", qual)
        if key not in self.ctx.shared:  # resolving the import reads the disk: once per name
            self.ctx.shared[key] = USER_MODULE if attr[:1].isupper() and _imported_module_class(self.ctx, node.func) \
                else _imported_return_kind(self.ctx, node.func)
        found = self.ctx.shared[key]
        return found if found is not None else self._imported_return(node)

    def _imported_return(self, node: ast.Call) -> Optional[str]:
        """What a function of a project module returns for the kinds this call passes (`loss_nll =
        nll_gaussian(output, target, var)`, also after `from utils import *`), read in its file."""
        found = _imported_function(self.ctx, node.func) if node.args else None
        if found is None:
            return None
        definition, view = found
        return returned_kind(view, definition, None, arguments=self._call_arguments(node, definition, None))

    def _factory_kind(self, attr: str, node: ast.Call) -> str:
        device = next((k.value for k in node.keywords if k.arg == "device"), None)
        if attr.endswith("_like") and node.args:
            like = self.expr(node.args[0])
            if device is None:
                return like if like in TENSORS else TENSOR
        if attr == "from_numpy":
            return CPU_TENSOR
        if device is None:
            return TENSOR if self.default_device_set else CPU_TENSOR
        if is_cpu_literal(device):
            return CPU_TENSOR
        devices = self.device_strings(device) if isinstance(device, ast.Name) else None
        return CPU_TENSOR if devices and all(d.split(":")[0] == "cpu" for d in devices) else TENSOR


def _forward_returns_one_tensor(cls: ast.ClassDef) -> bool:
    """The class's own `forward` returns one value in every `return`: not a tuple, list or dict,
    and not an output record (`ModelOutput(...)`, any call of a capitalized name)."""
    forward = next((s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and s.name == "forward"), None)
    if forward is None:
        return False
    returns = [n.value for n in walk_no_scopes(forward) if isinstance(n, ast.Return)]
    params = forward.args.posonlyargs + forward.args.args
    self_name = params[0].arg if params else None
    for value in returns:
        if value is None or isinstance(value, (ast.Tuple, ast.List, ast.Dict, ast.Set)):
            return False
        if isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self_name:
                continue  # `self.FC4(h)`: a layer of the module, whatever its name
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name[:1].isupper():
                return False
    return bool(returns)


def class_attribute_kind(ctx, cls: ast.ClassDef, attr: str) -> Optional[str]:
    """Kind of `self.<attr>` from the assignments to it in the class's methods."""
    entries = class_attribute_values(ctx, cls, attr)
    if not entries:
        return None
    cache_key = ("class_attr_kind", id(cls), attr)
    if cache_key in ctx.shared:
        result = ctx.shared[cache_key]
        return None if result is _RECURSING else result
    ctx.shared[cache_key] = _RECURSING
    kinds, moves = [], []
    for method, value in entries:
        if keeps_itself(method, value, attr) and len(entries) > 1:
            moves.append(value.func.attr)  # `self.i2h = self.i2h.cuda()`: what the other assignments made, moved
            continue
        inference = _Inference(ctx, [scope_kinds(ctx, method), scope_kinds(ctx, ctx.tree)])
        kinds.append(inference.expr(value))
    result = _Inference._combine(kinds)
    if result == CPU_TENSOR and attr in class_attribute_values(ctx, cls, _BUFFERS):
        result = TENSOR  # a registered buffer moves with its module (`model.cuda()`): not known to be on the host
    if moves and result in TENSORS:  # a tensor moved is on the device it was moved to
        where = {CPU_TENSOR if move == "cpu" else TENSOR if move in ("cuda", "to") else result for move in moves}
        result = _Inference._combine([result, *where])
    if result is None and _called_as_module(ctx, cls, attr, entries):
        result = USER_MODULE
    ctx.shared[cache_key] = result
    return result


def keeps_itself(method: ast.AST, value: ast.AST, attr: str) -> bool:
    """`value`, stored in `self.<attr>` by `method`, is that attribute moved or retyped
    (`self.i2h.cuda()`, `self.net.to(device)`, `self.emb.float()`): of the kind it was."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and (value.func.attr in ("cuda", "to", "cpu") or value.func.attr in _KIND_KEEPING_METHODS)):
        return False
    receiver = value.func.value
    params = method.args.posonlyargs + method.args.args
    return (isinstance(receiver, ast.Attribute) and receiver.attr == attr and isinstance(receiver.value, ast.Name)
            and bool(params) and receiver.value.id == params[0].arg)


# Methods only a module has (an optimizer also has `zero_grad` and `state_dict`).
_MODULE_ONLY_METHODS = ("parameters", "named_parameters", "forward", "modules", "named_modules", "children",
                        "buffers", "named_buffers")


def _called_as_module(ctx, cls: ast.ClassDef, attr: str, entries: list) -> bool:
    """`self.<attr>` holds an instance of a class the file does not define (`self.q_eval =
    DeepQNetwork(...)` after `from deep_q_network import DeepQNetwork`), and the class uses it
    as only a module can be used (`self.q_eval.forward(s)`, `self.q_eval.parameters()`)."""
    if not all(isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and ctx.qualname(value.func) is not None
               and not ctx.qualname(value.func).startswith("torch.") for _, value in entries):
        return False
    text = "\n".join(ctx.lines[cls.lineno - 1:cls.end_lineno])
    return re.search(r"\bself\s*\.\s*%s\s*\.\s*(?:%s)\s*\(" % (re.escape(attr), "|".join(_MODULE_ONLY_METHODS)),
                     text) is not None


_BUFFERS = ("buffers",)  # the key under which `class_attribute_values` lists the names registered as buffers


def class_attribute_values(ctx, cls: ast.ClassDef, attr) -> list:
    """The values assigned to `self.<attr>` (or registered as buffer `attr`) in the class's
    methods, as (method, value expression) pairs; for `_BUFFERS`, the names registered as
    buffers."""
    key = ("class_attrs", id(cls))
    table = ctx.shared.get(key)
    if table is None:
        calls = may_mention(ctx, "register_buffer") or may_mention(ctx, "setattr")
        table = ctx.shared[key] = _class_attribute_values(cls, calls)
    return table.get(attr, [])


_ASSIGNS_AND_CALLS = frozenset({ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Call})


_STATEMENT_FIELDS: dict = {}


def _statement_fields(node_type) -> tuple:
    """`block_fields` in `_fields` order (a `Try`'s handlers come before its `orelse`)."""
    fields = _STATEMENT_FIELDS.get(node_type)
    if fields is None:
        blocks = block_fields(node_type)
        fields = _STATEMENT_FIELDS[node_type] = tuple(f for f in node_type._fields if f in blocks)
    return fields


def _item_of(value: ast.AST, index: int) -> ast.AST:
    """`value[index]`, located where `value` is: the item an unpacking assignment takes from a
    value that is not a literal tuple (`self.net, self.opt = self.build()`)."""
    item = ast.Subscript(value=value, slice=ast.copy_location(ast.Constant(index), value), ctx=ast.Load())
    return ast.copy_location(item, value)


def _class_attribute_values(cls: ast.ClassDef, calls: bool) -> dict:
    """The table of `class_attribute_values`; without `calls` (the file never names
    `register_buffer` or `setattr`) only statements can add to it, and expressions are not entered."""
    table: dict = {}
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = method.args.posonlyargs + method.args.args
        if not params:
            continue
        self_name = params[0].arg
        # `walk(method)`'s order, leaving out the nodes that cannot hold an assignment or a call
        # (without `calls`, an assignment: they are statements, and only statements hold one).
        queue = [method]
        index = 0
        while index < len(queue):
            node = queue[index]
            index += 1
            if calls:
                queue.extend([child for child in child_nodes(node) if type(child) not in _BINDS_NOTHING])
            else:
                for field in _statement_fields(type(node)):
                    queue.extend(getattr(node, field))
            if type(node) not in _ASSIGNS_AND_CALLS:
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == self_name):
                        table.setdefault(target.attr, []).append((method, node.value))
                    elif isinstance(target, (ast.Tuple, ast.List)):
                        # `self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)`: item by item
                        value = node.value
                        paired = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                                  and not any(isinstance(e, ast.Starred) for e in target.elts + value.elts))
                        starred = any(isinstance(e, ast.Starred) for e in target.elts)
                        for i, elt in enumerate(target.elts):
                            if isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == self_name:
                                table.setdefault(elt.attr, []).append(
                                    (method, value.elts[i] if paired else _item_of(value, i) if not starred
                                     else ast.Constant(None)))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                target = node.target
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == self_name):
                    value = node.value if isinstance(node, ast.AnnAssign) and node.value is not None else None
                    table.setdefault(target.attr, []).append((method, value if value is not None else ast.Constant(None)))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "register_buffer" and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == self_name and len(node.args) >= 2
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                table.setdefault(node.args[0].value, []).append((method, node.args[1]))
                table.setdefault(_BUFFERS, []).append(node.args[0].value)
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr"
                  and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == self_name):
                if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                    table.setdefault(node.args[1].value, []).append((method, ast.Constant(None)))
    return table


# -- module containers -------------------------------------------------------------

# ... and of a module container (`layers.add_module(...)`)
_CONTAINER_MUTATORS = CONTAINER_MUTATORS | {"add_module", "register_module", "__setitem__", "__delitem__"}
_MODULE_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.Sequential"})
_INDEXABLE = _MODULE_CONTAINERS | {"torch.nn.ParameterList", "torch.nn.ParameterDict"}


def _unindexable_layer(ctx, value: ast.AST) -> bool:
    """`value` makes a `torch.nn` layer that is no container (`nn.Linear(d, n)`, also on both
    sides of `nn.Linear(d, n) if n > 0 else nn.Identity()`): what a subscript reads is never it."""
    if isinstance(value, ast.IfExp):
        return _unindexable_layer(ctx, value.body) and _unindexable_layer(ctx, value.orelse)
    if not isinstance(value, ast.Call):
        return False
    qual = ctx.qualname(value.func) or ""
    return qual.startswith("torch.nn.") and qual.count(".") == 2 and qual[9:10].isupper() and qual not in _INDEXABLE


def fixed_key(index: ast.AST):
    """The int (negative ones included) or str literal an index is, else None."""
    if isinstance(index, ast.Constant) and isinstance(index.value, str):
        return index.value
    return int_const(index)


_ANY_KEY = object()  # an index known only at run time (`self.heads[i]`)


class ModuleContainer:
    """What an `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential` call holds, read off its
    arguments: `by_key` maps each fixed key (positions counted from both ends, or names) to the
    expression that builds that item; `every` is the expression that builds every item, where a
    comprehension builds them all (`[nn.Linear(d, d) for _ in range(n)]`), and `every_varies`
    whether it reads the comprehension's own names (`nn.Linear(d, sizes[i])`: the same kind of
    module every time, not the same shape)."""

    __slots__ = ("by_key", "every", "every_varies")

    def __init__(self, by_key: dict, every: Optional[ast.AST] = None, every_varies: bool = False):
        self.by_key = by_key
        self.every = every
        self.every_varies = every_varies

    def item(self, key):
        """(expression, the same for every item's shape too) for the item at `key` (`_ANY_KEY`:
        whichever item), else None."""
        if key is _ANY_KEY:
            return (self.every, not self.every_varies) if self.every is not None else None
        if key in self.by_key:
            return self.by_key[key], True
        if self.every is not None:
            return self.every, not self.every_varies
        return None


def module_container(ctx, value: ast.AST) -> Optional[ModuleContainer]:
    """The container `value` builds, when it is a `torch.nn` container call whose items can be
    read: positional modules (`nn.Sequential(a, b)`), a literal list or tuple, a literal dict with
    str keys, or a list/generator/dict comprehension; or a Python list itself, literal or a
    comprehension (`[Critic(d) for _ in range(n)]`). None otherwise (a list built elsewhere,
    `*layers`, `**more`, an `OrderedDict`)."""
    if isinstance(value, (ast.List, ast.Tuple, ast.ListComp)):
        return _listed(value)
    if not isinstance(value, ast.Call) or value.keywords or ctx.qualname(value.func) not in _MODULE_CONTAINERS:
        return None
    qual = ctx.qualname(value.func)
    if qual == "torch.nn.Sequential" and not (len(value.args) == 1 and isinstance(value.args[0], (
            ast.List, ast.ListComp, ast.GeneratorExp))):
        return _by_position(value.args)
    if len(value.args) != 1 or qual == "torch.nn.Sequential":
        return None if value.args or qual == "torch.nn.Sequential" else ModuleContainer({})
    items = value.args[0]
    if isinstance(items, ast.Dict) and qual == "torch.nn.ModuleDict":
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in items.keys):
            return None  # `**more` (a None key) may replace any item
        return ModuleContainer(dict(zip((k.value for k in items.keys), items.values)))
    if isinstance(items, ast.DictComp) and qual == "torch.nn.ModuleDict":
        return _listed(items)
    if isinstance(items, (ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp)) and qual == "torch.nn.ModuleList":
        return _listed(items)
    return None


def _listed(items: ast.AST) -> Optional[ModuleContainer]:
    """The items of a literal list or tuple, by position, or the one expression a comprehension
    builds them all with."""
    if isinstance(items, (ast.ListComp, ast.GeneratorExp, ast.DictComp)):
        every = items.value if isinstance(items, ast.DictComp) else items.elt
        own = {n.id for gen in items.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        varies = any(isinstance(n, ast.Name) and n.id in own for n in ast.walk(every))
        return ModuleContainer({}, every, varies)
    return _by_position(items.elts)


def _by_position(elts: list) -> Optional[ModuleContainer]:
    """`elts` by position, counted from both ends; None where one is starred (`*layers`)."""
    if any(isinstance(item, ast.Starred) for item in elts):
        return None
    by_key = {i: item for i, item in enumerate(elts)}
    by_key.update({i - len(elts): item for i, item in enumerate(elts)})
    return ModuleContainer(by_key)


def appended_items(ctx, cls: ast.ClassDef, attr: str) -> Optional[list]:
    """[(method, expression)] of the one `self.<attr>.append(expression)` of the class, when that
    append, run in a loop or not, is the only way the class changes the container and the
    expression reads no name the loops around it bind (`nn.Linear(d, d)`, not
    `nn.Linear(d, sizes[i])`): every item is built alike. None otherwise."""
    key = ("appended_items", id(cls), attr)
    if key in ctx.shared:
        return ctx.shared[key]
    found = None
    appends, other = [], False
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(method):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CONTAINER_MUTATORS:
                target = node.func.value
            elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                target = node.value
            elif isinstance(node, ast.AugAssign):
                target = node.target
            if not (isinstance(target, ast.Attribute) and target.attr == attr):
                continue
            if (isinstance(node, ast.Call) and node.func.attr == "append" and len(node.args) == 1
                    and not node.keywords):
                appends.append((method, node))
            else:
                other = True
    if len(appends) == 1 and not other:
        method, call = appends[0]
        loops = [n for n in ast.walk(method) if isinstance(n, (ast.For, ast.AsyncFor))
                 and any(inner is call for inner in ast.walk(n))]
        bound = {n.id for loop in loops for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        if not any(isinstance(n, ast.Name) and n.id in bound for n in ast.walk(call.args[0])):
            found = [(method, call.args[0])]
    ctx.shared[key] = found
    return found


def mutated_attributes(ctx, cls: ast.ClassDef) -> frozenset:
    """The `self.<attr>` containers the class changes in place: `self.x.append(...)`,
    `self.x[k] = ...`, `del self.x[k]`, `self.x += ...` (any method's first parameter counts as
    `self`, and so does any other name: erring on the side of forgetting a container)."""
    key = ("mutated_attributes", id(cls))
    found = ctx.shared.get(key)
    if found is None:
        names = set()
        for node in ast.walk(cls):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CONTAINER_MUTATORS:
                target = node.func.value
            elif isinstance(node, (ast.Subscript,)) and not isinstance(node.ctx, ast.Load):
                target = node.value
            elif isinstance(node, ast.AugAssign):
                target = node.target
            if isinstance(target, ast.Attribute):
                names.add(target.attr)
        found = ctx.shared[key] = frozenset(names)
    return found


# -- public API ------------------------------------------------------------------

def kind_of(ctx, expr: ast.AST) -> Optional[str]:
    """Kind of `expr` as seen at the engine's current position."""
    return _Inference(ctx, _chain(ctx)).expr(expr)


def passed_values(ctx, function: ast.AST, name: str) -> Optional[list]:
    """[(the SourceFile of the call, the value passed, the CallSite)] for parameter `name` of `function` at
    every call of it (the file's, or where it never calls it, its importers'; `_calls_of`): a
    name passed is read as the value its one reaching assignment gives it there. None where there
    are no calls or one passes what cannot be told."""
    passed = _Inference(ctx, _chain(ctx))._arguments_at_calls(function, name)
    if passed is None:
        return None
    found = []
    for _, value, where, site in passed:
        if isinstance(value, ast.Name):
            value = _held_at_call(where, value, site)
            if value is None:
                return None
        found.append((where, value, site))
    return found


def _held_at_call(ctx, value: ast.AST, site) -> Optional[ast.AST]:
    """The value of the one assignment that reaches the name `value` where `site` passes it, else None."""
    if not isinstance(value, ast.Name) or not site.functions:
        return None
    from .flow import flow_of  # flow reads identifiers through this module
    assign = flow_of(ctx, site.functions[-1]).reaching(value)
    return assign.value if assign is not None else None


def reaching_kind(ctx, name: ast.Name, known: bool = False) -> Optional[str]:
    """Kind of the value `name` reads where it stands, from the assignments of its scope that
    reach it (`FunctionFlow.reaching_all`) rather than from all of them: in a notebook, `for X, y
    in loader:` binds host batches, whatever device tensors other cells store in `X`. A name bound
    once, a reaching store that is not an assignment or a `for` target (a parameter, `with ... as`),
    and a comprehension's own variable get `kind_of`'s answer; another name a comprehension reads
    is judged by the stores that reach the comprehension. Reaching assignments of no kind it can
    tell (`n = sum(sizes)`, then `n = torch.as_tensor([n])`) get `kind_of`'s answer too, unless
    `known`: then None."""
    whole = kind_of(ctx, name)
    from .flow import flow_of  # flow reads identifiers through this module
    from .tree import code_scope
    scope = code_scope(ctx)
    if scope is None or len(scope_kinds(ctx, scope).assigned.get(name.id, ())) < 2:
        return whole
    flow = flow_of(ctx, scope)
    if name not in flow.parent:
        return whole
    comprehensions = [n for n in flow.enclosing(name) if isinstance(n, _COMPREHENSIONS)]
    if any(isinstance(n, ast.Name) and n.id == name.id for c in comprehensions for g in c.generators
           for n in ast.walk(g.target)):
        return whole  # the comprehension's own variable
    # a comprehension reads the scope's names where it runs
    reaching = flow.reaching_all_at(name.id, comprehensions[-1]) if comprehensions else flow.reaching_all(name)
    binder = ScopeKinds(scope)
    binder.assigned = {}  # set here, so the scope's own collection never runs
    for stmt, _ in reaching:
        what = _COLLECTED_NODES.get(type(stmt)) if stmt is not None else None
        if what not in _STATEMENT_BINDINGS:
            return whole
        before = len(binder.assigned.get(name.id, ()))
        binder._bind_statement(stmt, what)
        if len(binder.assigned.get(name.id, ())) == before:
            return whole  # the store is elsewhere in the statement (`:=`)
    entries = binder.assigned.get(name.id)
    if not entries:
        return whole
    inference = _Inference(ctx, _chain(ctx))
    kind = inference._combine([inference.entry(entry, inference.chain) for entry in entries])
    return whole if kind is None and not known else kind


def callee_kind(ctx, func: ast.AST) -> Optional[str]:
    """Kind of the module `func` names where it is called: its kind, or, for `self.<attr>`
    assigned an `nn.ModuleList` on one path and a module on another (`if individual: ... else:
    self.Linear = nn.Linear(...)`), the module: a ModuleList cannot be called."""
    kind = kind_of(ctx, func)
    if kind is not None or ctx.class_ is None or not isinstance(func, ast.Attribute) or not may_mention(
            ctx, "ModuleList"):
        return kind
    if not (isinstance(func.value, ast.Name) and ctx.functions and func.value.id == scope_kinds(ctx, ctx.functions[0]).self_name):
        return None
    values = class_attribute_values(ctx, ctx.class_, func.attr)
    if len(values) < 2:
        return None  # one value: `kind_of` has said what it is
    kinds = set()
    for method, value in values:
        kinds.add(_Inference(ctx, [scope_kinds(ctx, method), scope_kinds(ctx, ctx.tree)]).expr(value))
    kinds.discard(MODULE_LIST)
    return kinds.pop() if len(kinds) == 1 else None


MODULE_KINDS = (LINEAR, MODULE, USER_MODULE)


def module_output(ctx, expr: ast.AST, depth: int = 0) -> bool:
    """`expr` is what a module computes, or is computed from it by indexing, tensor methods,
    torch functions and arithmetic: `net(s)`, `self.q_eval.forward(s)`, `self.q.value(s)` (a
    method of a module), `net(s).max(1)[0]`, `torch.add(v, a - a.mean(1, keepdim=True))`, or a
    name that the one assignment reaching it binds to one (`v, a = net(s)` too). A model's
    output lies on the model's device, wherever the batch it was given came from."""
    if depth > 8:
        return False
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.BinOp):
        return module_output(ctx, expr.left, depth + 1) or module_output(ctx, expr.right, depth + 1)
    if isinstance(expr, ast.Name):
        from .flow import flow_of  # flow reads identifiers through this module
        flow = flow_of(ctx, ctx.scope)
        reaching = flow.reaching_all(expr) if expr in flow.parent else []
        assign = reaching[0][0] if len(reaching) == 1 else None
        if not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
            return False
        target = assign.targets[0]
        if isinstance(target, ast.Name) or isinstance(target, (ast.Tuple, ast.List)) and isinstance(assign.value, ast.Call):
            return module_output(ctx, assign.value, depth + 1)  # `v, a = net(s)`: the items of its output
        return False
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    if callee_kind(ctx, func) in MODULE_KINDS:
        return True
    qual = ctx.qualname(func)
    if qual is not None:
        module, _, attr = qual.rpartition(".")
        return module in _TENSOR_NAMESPACES and attr not in FACTORIES and any(
            module_output(ctx, arg, depth + 1) for arg in expr.args)
    if not isinstance(func, ast.Attribute):
        return False
    receiver = kind_of(ctx, func.value)
    if receiver in MODULE_KINDS:
        return True  # `net.forward(s)`, `self.q.value(s)`
    return receiver in TENSORS and module_output(ctx, func.value, depth + 1)  # `q.detach()`, `q.max(1)`


def moves_to_device(ctx, call: ast.Call) -> bool:
    """`x.cuda()`, `x.to(device)`, `x.to("cuda:0")`, `x.type(FloatTensor)` after `FloatTensor =
    torch.cuda.FloatTensor if cuda else torch.FloatTensor`: a move to a device not known to be
    the CPU (not a dtype change like `x.to(torch.float16)`)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "type" and len(call.args) == 1 and not call.keywords:
        return cuda_tensor_type(ctx, call.args[0]) is not None
    if not isinstance(func, ast.Attribute) or func.attr not in ("cuda", "to"):
        return False
    return _Inference(ctx, _chain(ctx))._destination(func.attr, call) == TENSOR


def own_call_returns_device_tensor(ctx, call: ast.Call) -> bool:
    """`call` runs a function or method of the file (`self._get_tensors(obs)`) that returns a
    tensor on a device for the arguments it is given."""
    inference = _Inference(ctx, _chain(ctx))
    return inference._own_callee(call.func) is not None and inference.expr(call) == TENSOR


def is_tensor(ctx, expr: ast.AST) -> bool:
    return kind_of(ctx, expr) in TENSORS


def is_non_tensor(ctx, expr: ast.AST) -> bool:
    return kind_of(ctx, expr) in NON_TENSORS


def looks_like_tensor(ctx, expr: ast.AST) -> bool:
    """A tensor by kind, or a name the code uses as only a tensor can be used."""
    kind = kind_of(ctx, expr)
    if kind in TENSORS:
        return True
    if kind is not None:
        return False
    if isinstance(expr, ast.Name):
        for scope in _chain(ctx):
            used = scope.methods_used.get(expr.id, set())
            if used & TENSOR_ONLY_METHODS:
                return True
            if "shape" in used and not ctx.names.is_imported("numpy"):
                return True
            if expr.id in scope.assigned:
                break
    return False


def int_const(node: ast.AST) -> Optional[int]:
    """A literal int, negative ones included."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_const(node.operand)
        return -inner if inner is not None else None
    return None


_ORDERINGS = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)


def names_used_as_counts(function: ast.AST) -> set:
    """The names `function` uses in a way only an integer allows (a tuple or `torch.Size`
    raises there): `range(n)`, `n // 2`, `n % k`, `x[:n]`, or ordered against an int or a
    `len(...)` (`if len(memory) < batch_size`)."""
    def count_like(node) -> bool:
        return int_const(node) is not None or (
            node.__class__ is ast.Call and node.func.__class__ is ast.Name and node.func.id == "len")

    found = set()
    for node in walk_no_scopes(function):
        cls = node.__class__
        if cls is ast.Call and node.func.__class__ is ast.Name and node.func.id == "range":
            found.update(a.id for a in node.args if a.__class__ is ast.Name)
        elif cls is ast.BinOp and node.op.__class__ in (ast.FloorDiv, ast.Mod):
            if node.left.__class__ is ast.Name and int_const(node.right) is not None:
                found.add(node.left.id)
        elif cls is ast.Slice:
            found.update(b.id for b in (node.lower, node.upper) if b.__class__ is ast.Name)
        elif cls is ast.Compare and len(node.ops) == 1 and node.ops[0].__class__ in _ORDERINGS:
            left, right = node.left, node.comparators[0]
            if left.__class__ is ast.Name and count_like(right):
                found.add(left.id)
            elif right.__class__ is ast.Name and count_like(left):
                found.add(right.id)
    return found


def assigned_expression(entry) -> Optional[ast.AST]:
    """The expression one binding (an entry of `ScopeKinds.assigned`) stores in its name: the
    value of `n = e`, the item of a display unpacked into names, `a, n = x, e`; None for others."""
    tag = entry[0]
    if tag == "value":
        return entry[1]
    if tag == "unpack":
        value, index = entry[1], entry[2]
        if (isinstance(value, (ast.Tuple, ast.List)) and -len(value.elts) <= index < len(value.elts)
                and not any(isinstance(e, ast.Starred) for e in value.elts)):
            return value.elts[index]
    return None


def _assigned_int(entry) -> Optional[int]:
    """The int literal one assignment stores: `n = 1001`, `n: int = 1001`, `a, n = 8, 1001`."""
    if entry[0] == "kind" and len(entry) == 3:
        return int_const(entry[2])
    stored = assigned_expression(entry)
    return int_const(stored) if stored is not None else None


def constant_int(ctx, expr: ast.AST) -> Optional[int]:
    """The int `expr` always holds: a literal, or a name whose every assignment in the scope
    that binds it is that same literal (`vocab_size = 50257`, `width: int = 1001`, `d_in, d_out
    = 1001, 512`). Parameters are not constants."""
    if not isinstance(expr, ast.Name):
        return int_const(expr)
    entries = bindings(ctx, expr.id)
    if entries is None:
        return None
    values = {_assigned_int(e) for e in entries}
    return values.pop() if len(values) == 1 else None


# Factories whose sizes are their positional arguments or `size=` (`torch.randn(d, k)`,
# `torch.empty((d, k))`, `torch.empty(size=(d, k))`).
SIZED_FACTORIES = frozenset({"zeros", "ones", "empty", "rand", "randn"})


def sized_factory_rank(call: ast.AST, qualname) -> Optional[int]:
    """The rank of the tensor a sized torch factory call makes (`qualname` resolves names in the
    call's module), or None when `call` is none or its rank is not written out (one argument may
    be a size tuple held in a name)."""
    qual = qualname(call.func) if isinstance(call, ast.Call) else None
    if qual is None or qual.rpartition(".")[0] != "torch" or qual.rpartition(".")[2] not in SIZED_FACTORIES:
        return None
    sizes = list(call.args) or [k.value for k in call.keywords if k.arg == "size"]
    if not sizes or any(isinstance(a, ast.Starred) for a in sizes):
        return None
    if len(sizes) == 1 and isinstance(sizes[0], (ast.Tuple, ast.List)):
        elts = sizes[0].elts
        return None if any(isinstance(e, ast.Starred) for e in elts) else len(elts)
    return len(sizes) if len(sizes) > 1 else None


def imported_class(ctx, func: ast.AST) -> Optional[tuple]:
    """(the class definition, the SourceFile of its module) that `func` names through an import
    of a project module (`Head` after `from .head import Head`), else None."""
    found = imported_definition(ctx, func, (ast.ClassDef,))
    source = project_file(found[1]) if found is not None else None
    return (found[0], source) if source is not None else None


def _imported_module_class(ctx, func: ast.AST) -> bool:
    """`func` names a class of a project module that derives from a torch.nn class there
    (`OptionCriticFeatures` after `from option_critic import OptionCriticFeatures`)."""
    found = imported_class(ctx, func) if in_script_project(ctx) else None
    return found is not None and any((found[1].qualname(base) or "").startswith("torch.nn.")
                                     for base in found[0].bases)


def _imported_return_kind(ctx, func: ast.AST) -> Optional[str]:
    """The kind a function of a project module returns (`loss = actor_loss_fn(obs, ...)` after
    `from option_critic import actor_loss as actor_loss_fn`), read in its own file (see
    `returned_kind`)."""
    found = _imported_function(ctx, func)
    return returned_kind(found[1], found[0], None) if found is not None else None


def _imported_function(ctx, func: ast.AST) -> Optional[tuple]:
    """(the definition, the SourceFile of its module) of the project module's function that
    `func` names, in a script's project."""
    found = imported_definition(ctx, func, (ast.FunctionDef,)) if in_script_project(ctx) else None
    view = project_file(found[1]) if found is not None else None
    return (found[0], view) if view is not None else None


def returned_kind(view, definition: ast.AST, cls: Optional[ast.ClassDef], index: Optional[int] = None,
                  arguments: tuple = ()) -> Optional[str]:
    """The kind a function or method (of `cls`) of the file `view` returns: what every one of its
    `return`s gives, read there, its parameters of `arguments` (`(name, kind)` pairs: what one
    call passes) of those kinds, the others taking theirs from that file's calls (and, for one no
    call there passes, from the calls of the files that import it); with `index`, the item at
    that place of the tuple every `return` gives (`net, opt = build()`). None where they
    disagree, where one returns nothing, or for a generator."""
    key = ("return_kind", id(definition), index, arguments)
    if key in view.shared:
        result = view.shared[key]
        return None if result is _RECURSING else result
    view.shared[key] = _RECURSING
    returns = [n for n in walk_no_scopes(definition) if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom))]
    result = None
    if returns and all(isinstance(n, ast.Return) and n.value is not None for n in returns):
        values = [n.value for n in returns]
        if index is not None:
            values = [v.elts[index] if isinstance(v, ast.Tuple) and -len(v.elts) <= index < len(v.elts)
                      and not any(isinstance(e, ast.Starred) for e in v.elts) else None for v in values]
        if all(v is not None for v in values):
            scope = scope_kinds(view, definition)
            if arguments:  # this call's kinds, for the parameters it passes one for
                scope = ScopeKinds(definition)
                for name, kind in arguments:
                    scope.assigned[name] = [("kind", kind) if entry[0] == "param" else entry
                                            for entry in scope.assigned[name]]
            chain = [scope, scope_kinds(view, view.tree)]
            inference = _Inference(view, chain, cls)
            result = inference._combine([inference._returned(definition, v) for v in values])
    view.shared[key] = result
    return result


def _importer_sites(ctx, function: ast.AST) -> list:
    """(the importer's SourceFile, CallSite) for each call of `function`, a module-level function
    or a method of a module-level class of the linted file, in the project files that import it
    (`accuracy(out, y)` after `from utils import accuracy`, `logger.log_data(...)` on a `Logger`
    made there); a method's call is read with its first parameter bound."""
    if not ctx.filename or function not in ctx.tree.body and not any(
            isinstance(stmt, ast.ClassDef) and function in stmt.body for stmt in ctx.tree.body):
        return []
    table = ctx.shared.get("importer_sites")
    if table is None:
        table = ctx.shared["importer_sites"] = _calls_from_importers(ctx)
    cls = file_calls(ctx).class_of.get(id(function))
    if cls is None:
        return table.get(function.name, [])
    found = [site for owner in _inheriting(ctx, cls, function.name) for site in table.get(f"{owner}.{function.name}", [])]
    return [(view, site._replace(bound=True)) for view, site in found]


def _inheriting(ctx, cls: ast.ClassDef, method: str) -> list:
    """The names of `cls` and of the classes of the file that derive from it (directly or
    through one another) without defining `method` themselves: `PAM.train_model` runs `GKT`'s
    for `class PAM(GKT)`."""
    names, changed = [cls.name], True
    classes = [stmt for stmt in ctx.tree.body if isinstance(stmt, ast.ClassDef)]
    while changed:
        changed = False
        for other in classes:
            if other.name not in names and any(isinstance(b, ast.Name) and b.id in names for b in other.bases) \
                    and not any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == method
                                for f in other.body):
                names.append(other.name)
                changed = True
    return names


def _calls_from_importers(ctx) -> dict:
    """{name or "Class.method": [(SourceFile, CallSite)]} of the linted file's definitions that
    the project files importing it call; empty in a library-sized tree, and while one of them is
    read for another (no file is read for its own importers' importers)."""
    if _READING_IMPORTERS or not in_script_project(ctx):
        return {}
    target = os.path.abspath(ctx.filename)
    found: dict = {}
    _READING_IMPORTERS.append(target)
    try:
        for path in importers(ctx.filename, most=SCRIPT_PROJECT_FILES):
            read = importer_calls(path)
            if read is None:
                continue
            view, calls = read
            for (defined_in, name), sites in calls.imported_sites.items():
                if os.path.abspath(defined_in) == target:
                    found.setdefault(name, []).extend((view, site) for site in sites)
    finally:
        _READING_IMPORTERS.pop()
    return found


_READING_IMPORTERS: list = []


def importer_calls(path: str) -> Optional[tuple]:
    """(the SourceFile, its FileCalls with the calls of the names it imports from the project) of
    the project module at `path`, read for the modules it imports; None where it cannot be read."""
    view = project_file(path)
    if view is None:
        return None
    calls = view.shared.get("importer_calls")
    if calls is None:
        calls = view.shared["importer_calls"] = view.shared["file_calls"] = FileCalls(
            view.tree, identifier_text(view), project_imports(view.tree, path))
    return view, calls


def module_class_of(ctx, func: ast.AST) -> Optional[tuple]:
    """(class, qualname of its module, where it is) for `self.<attr>`, read in a method of the
    class being walked, when every value the class stores in that attribute is a call of one
    class of this file or of a project module it imports (`self.attention = Attention(d)`, `from
    attention import Attention`); `where` is None for this file, else that file's name."""
    cls = ctx.class_
    if (cls is None or not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name)
            or not ctx.functions or not ctx.functions[0].args.args
            or func.value.id != ctx.functions[0].args.args[0].arg):
        return None
    values = [value for _, value in class_attribute_values(ctx, cls, func.attr)]
    if not values or not all(isinstance(v, ast.Call) for v in values):
        return None
    # `MaskedLinear(...)`, or `nn.MaskedLinear(...)` after `nn.MaskedLinear = MaskedLinear`
    names = {v.func.id if isinstance(v.func, ast.Name) else ctx.names.set_on_module(v.func) for v in values}
    if len(names) != 1 or None in names:
        return None
    name = names.pop()
    if not isinstance(values[0].func, ast.Name) or ctx.qualname(values[0].func) is None:
        local = [s for s in ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == name]
        if len(local) == 1:
            return local[0], ctx.qualname, None
    found = imported_class(ctx, values[0].func)
    if found is None:
        return None
    return found[0], found[1].qualname, os.path.basename(found[1].filename)
