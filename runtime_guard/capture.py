"""Capture: a dispatch mode that records ops on real tensors, aggregated: every forward op, and of
the backward aten ops the GEMMs (all of them when kernels are attributed to ops).

By default the mode is off while autograd runs a backward pass: each dispatched op costs torch
~15-20 µs of Python on a GPU host, and a backward pass is half a step's ops. The backward GEMMs
(the only backward ops a check reads) are derived from the forward GEMMs whose operands required
grad, with autograd's own formulas, when the backward pass returns (see `derive_backward_gemms`).

Per op it costs a dict hit: the key is (op, call site, module path, fwd/bwd, argument
signature) and the value a counter. A few ops also carry dataflow tags (GEMM outputs, copies,
softmax inputs) so that chains such as hand-written attention can be recognised.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
from sys import _getframe
import threading
import weakref
from weakref import ref as _weakref
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch
from torch._C._autograd import _get_sequence_nr
from torch import Tensor
from torch._C import _current_autograd_node, is_grad_enabled as _is_grad_enabled
from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode
from .cells import short_path

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_WRAPPERS = {contextlib.__file__, threading.__file__}

GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm"})
LOSS_OPS = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                      "binary_cross_entropy_with_logits", "soft_margin_loss"})
# Ops whose checks read strides and dtypes; the others are keyed by shapes alone (cheaper).
FULL_SIG_OPS = GEMM_OPS | LOSS_OPS
BATCHED_GEMM_OPS = frozenset({"bmm", "baddbmm"})
_BIAS_FIRST_GEMMS = frozenset({"addmm", "baddbmm", "addbmm"})
# Ops whose output is (a view or copy of) their first argument: dataflow tags follow them.
PASS_THROUGH_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "transpose", "t", "permute", "clone",
    "contiguous", "_to_copy", "alias", "detach", "unsqueeze", "squeeze", "_reshape_alias",
    "as_strided", "slice", "select", "type_as", "to",
})
PERMUTE_OPS = frozenset({"permute", "transpose"})
# Pass-through ops that only make a view: no kernel, nothing to aggregate, tags follow them.
VIEW_OPS = PASS_THROUGH_OPS - {"clone", "contiguous", "_to_copy", "type_as", "to"}
SCALE_OPS = frozenset({"mul", "div", "mul_", "div_"})
MASK_OPS = frozenset({"add", "sub", "masked_fill", "where", "add_", "sub_", "masked_fill_"})
SOFTMAX_OPS = frozenset({"_softmax", "softmax", "_safe_softmax"})
DROPOUT_OPS = frozenset({"native_dropout", "dropout"})
COPY_OPS = frozenset({"_to_copy", "copy_"})
ZERO_OPS = frozenset({"zeros", "zeros_like", "new_zeros", "zero_"})  # make a tensor of zeros (not a mask)
# The arithmetic of the tanh approximation of GELU, followed as polynomials of one tensor
# (Recorder._gelu_step), and its constants: tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)).
POLYNOMIAL_OPS = frozenset({"pow", "mul", "mul_", "add", "add_", "sub", "sub_", "rsub", "div", "div_", "neg",
                            "tanh", "tanh_"})
_HALF_DTYPES = (torch.bfloat16, torch.float16)
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715
# Ops that read only their input's shape (F.dropout's mask on CPU is empty_like(P)): not a use of it
# Ops that hand a tensor's value to the host (`.item()`, `int(t)`, a slice bound `x[i:i + n]`); a copy
# from the device to the host is one too.
HOST_READ_OPS = frozenset({"_local_scalar_dense", "item"})
# A tensor made from Python data (`torch.tensor(values)`): what the host computed enters here.
FROM_HOST_DATA_OPS = frozenset({"lift_fresh"})
HOST_DATA = "data"         # host origin of a tensor made from Python values (Recorder._host)
MAX_COMPARED_VALUES = 4096  # an upload of Python values up to this size is compared with the step before
SHAPE_ONLY_OPS = frozenset({"empty_like", "ones_like", "full_like", "rand_like", "randn_like", "new_empty",
                            "new_ones", "new_full"})
_SCALE_OR_MASK_OPS = SCALE_OPS | MASK_OPS
MASK_FILL_MIN = -1e4       # a fill at or below this zeroes its softmax weight, as -inf does

MAX_KEYS = 50_000          # distinct aggregated op keys kept; more are counted as dropped
MAX_TAGS = 200_000         # dataflow tags kept within one step
MAX_SEQ_SITES = 200_000    # forward sequence numbers remembered for backward attribution
MAX_SEQUENCE = 500_000     # CUDA op order kept for kernel attribution
MAX_ERRORS = 10


@dataclass(frozen=True)
class Site:
    filename: str
    lineno: int
    function: str

    # Hashed on every OpKey lookup: the generated __hash__ builds and hashes a tuple each time; the
    # value is computed once (sites are interned by _site_of, so each is made once per line).
    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.filename, self.lineno, self.function)))

    def __hash__(self):
        return self._hash

    def __str__(self) -> str:
        return f"{short_path(self.filename)}:{self.lineno}"


UNKNOWN_SITE = Site("<unknown>", 0, "")


# torch.distributed's wrappers and collectives (DDP, FSDP, comm hooks, c10d): an op they issue on
# the model's behalf (a buffer broadcast, an all-gather of the parameters, a bucket copy) is not the
# user's code, and is not recorded.
_DISTRIBUTED_DIRS = tuple(os.path.join(_TORCH_DIR, *parts) + os.sep for parts in (("distributed",), ("nn", "parallel")))
# How a module or an optimizer is called (its hooks too): below one of these frames runs the model's
# or the optimizer's own code, also when a distributed wrapper called it.
_CALL_MACHINERY = frozenset(os.path.join(_TORCH_DIR, *parts) for parts in (("nn", "modules", "module.py"),
                                                                         ("optim", "optimizer.py")))

USER, INTERNAL, COMPILED, DISTRIBUTED, CALL = 0, 1, 2, 3, 4
_internal_code: dict = {}  # code -> USER, INTERNAL, COMPILED (torchinductor), DISTRIBUTED or CALL
_site_cache: dict = {}


def _code_kind(code) -> int:
    kind = _internal_code.get(code)
    if kind is None:
        fn = code.co_filename
        if "torchinductor" in fn:
            kind = COMPILED
        elif fn in _CALL_MACHINERY:
            kind = CALL
        elif fn.startswith(_DISTRIBUTED_DIRS):
            kind = DISTRIBUTED
        elif (
            fn.startswith(_TORCH_DIR)
            or fn.startswith(_OWN_DIR)
            or fn in _STDLIB_WRAPPERS
            or fn.startswith("<eval_with_key")
            or fn.startswith("<frozen")
        ):
            kind = INTERNAL
        else:
            kind = USER
        _internal_code[code] = kind
        if kind == USER:
            _user_codes.add(id(code))
        elif kind == INTERNAL:
            _internal_codes.add(id(code))
        elif kind == DISTRIBUTED:
            _distributed_codes.add(id(code))
        elif kind == CALL:
            _call_codes.add(id(code))
    return kind


# For the inlined walk in Recorder.record, by id(code): hashing a code object rehashes its
# bytecode and constants on every call. The code objects stay alive as keys of _internal_code.
_user_codes: set = set()         # ids of code objects of kind USER
_internal_codes: set = set()     # ... INTERNAL
_distributed_codes: set = set()  # ... DISTRIBUTED
_call_codes: set = set()         # ... CALL
_lasti_cache: dict = {}       # (id(code), f_lasti) -> Site: f_lineno costs more than a dict hit


def _site_of(code, lineno: int) -> Site:
    key = (code, lineno)
    site = _site_cache.get(key)
    if site is None:
        site = _site_cache[key] = Site(code.co_filename, lineno, code.co_name)
    return site


def user_site(frame) -> Optional[Site]:
    """The first frame of the user's code at or above `frame`, through torch's code and the
    guard's dispatch mode (which runs the user's ops); None where other code of the guard's own is
    on the way (a sync the guard makes itself, timing a step), or where torch.distributed's code
    issued it on the model's behalf (see `Recorder.record`)."""
    called = False
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_OWN_DIR):
            if code.co_name != "__torch_dispatch__":
                return None
        else:
            kind = _code_kind(code)
            if kind == USER:
                return _site_of(code, frame.f_lineno)
            if kind == CALL:
                called = True
            elif kind == DISTRIBUTED and not called:
                return None
        frame = frame.f_back
    return UNKNOWN_SITE


def _called_from_user_code() -> bool:
    """Whether the op being dispatched was called by the user's code itself (the first frame above
    the guard's and torch's dispatch wrappers is the user's), not by torch's code on its behalf."""
    frame = _getframe(1)
    while frame is not None:
        code = frame.f_code
        if not (code.co_filename.startswith(_OWN_DIR) or code.co_filename in _DISPATCH_WRAPPERS):
            return _code_kind(code) == USER
        frame = frame.f_back
    return False


_DISPATCH_WRAPPERS = (os.path.join(_TORCH_DIR, "_compile.py"), os.path.join(_TORCH_DIR, "_dynamo", "eval_frame.py"))


_wrapper_code: dict = {}  # id(code) -> (is a dispatch wrapper, code kept alive)


def tensor_sig(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype)


def _picked(a: Tensor) -> bool:
    """An item picked out of a larger tensor by an index: an element or a row (`x[i]`, `x[i, j]`,
    `x[:, t]`: a view with fewer dims and fewer elements than its base, or one element of it)."""
    base = a._base
    return base is not None and a.numel() < base.numel() and (
        a.dim() < base.dim() or (a.dim() <= 1 and a.numel() == 1))


def args_sig(args, full: bool = True, items=None) -> tuple:
    """Per tensor argument (shape, stride, dtype), (shape, None, None) unless `full`, and for an
    item picked out of a larger tensor (`x[i]`, see _picked), or a value computed only from such
    items (tagged in `items`), (shape, None, None, True); per tensor list, (its length,)."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if full:
                sig.append((a.shape, a.stride(), a.dtype))
            elif _picked(a) or (items is not None and items.get(a) is not None):
                sig.append((a.shape, None, None, True))
            else:
                sig.append((a.shape, None, None))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            sig.append((len(a),))  # a tensor list (foreach ops): its length; no check reads more
    return tuple(sig)


def host_origin(tags: dict, t) -> Optional[str]:
    """How `t`, or the base it is a view of, was made on the host in this step (its tag in `tags`,
    Recorder._host's dict: the factory's op name, or HOST_DATA), None where it was not."""
    e = tags.get(id(t))
    if e is not None and e[0]() is t:
        return e[1]
    base = t._base
    if base is None:
        return None
    e = tags.get(id(base))
    return e[1] if e is not None and e[0]() is base else None


def _computed_origin(tags: dict, args) -> str:
    """The host origin of what an op computes from tensors all made on the host (see host_origin):
    HOST_DATA where one of them holds Python values, else the first one's factory."""
    origins = [host_origin(tags, t) for a in args
               for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, Tensor)]
    return HOST_DATA if HOST_DATA in origins else origins[0]


def _without_unit_dims(t: Tensor) -> tuple:
    return tuple((n, st) for n, st in zip(t.shape, t.stride()) if n != 1)


def same_values(a, b) -> bool:
    """Whether two tensors of different ranks view the same elements in the same order (one is the
    other with size-1 dims added or dropped: `s.unsqueeze(1)` and `s`, `y[:, None]` and `y`)."""
    return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.dim() != b.dim() and a.numel() == b.numel() > 1
            and a.device == b.device and a.storage_offset() == b.storage_offset()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and _without_unit_dims(a) == _without_unit_dims(b))


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                return v
    return None


class OpKey(NamedTuple):
    op: str                 # overload packet name, e.g. "mm"
    qualname: str           # e.g. "aten::mm"
    site: Site
    direct: bool            # issued by user code itself, not by a torch Python function
    module: str             # nn.Module path, "" outside modules
    backward: bool
    device: str             # "cuda", "cpu", ...
    sig: tuple              # per tensor argument (shape, stride, dtype)
    out: tuple              # (shape, dtype, "d2h" for device-to-host copies) of the first output, or ()
    amp: str = ""           # GEMMs: "region" when run inside an autocast region (on or off), "" outside any
    host: bool = False      # on the CPU, every tensor argument was made on the host in this step (see
                            # Recorder._host): data the program prepares there, not the model's values
    same_values: bool = False  # its first two arguments are one tensor's elements, one of them with a
                               # size-1 dim more (`s.unsqueeze(1) - s`), as first seen for the key


@dataclass
class Upload:
    count: int
    values: Optional[tuple]   # the first one's values (small tensors of Python values), else None
    same_values: bool         # every one carried those values

    def merge(self, other: "Upload") -> None:
        self.count += other.count
        self.same_values = self.same_values and other.same_values and self.values == other.values


@dataclass
class OpStat:
    count: int = 0
    compiled: int = 0       # calls issued from inside a torch.compile'd region
    launches: int = 0       # CUDA kernels attributed to this key (profiler)
    kernel_us: float = 0.0


class MaskFact(NamedTuple):
    """One mask applied to attention scores, and how SDPA takes it."""
    kind: str        # "masked_fill" (attn_mask=~mask), "where" (attn_mask=cond), "where_inv" (~cond),
                     # "additive" (attn_mask=mask), "subtractive" (attn_mask=-mask),
                     # "fill" (masked_fill/where with a value that is not a mask: SDPA has none)
    causal: bool     # exactly lower-triangular (top-left) over the observed scores
    fill: float = float("-inf")
    factor: float | None = 1.0  # added masks: SDPA's attn_mask is the user's tensor times this (baddbmm's beta,
                                # scales applied after it); None: scaled by a tensor after it was added


@dataclass(eq=False)
class AttentionChain:
    """Hand-written attention followed on one call, QK^T → scale → mask → softmax → dropout → @V.
    A transformation makes a new chain (a scores tensor may be used twice); the probabilities and
    their views share one, so that a later use of the weights is seen."""
    phase: str                 # "S": scores (before softmax), "P": probabilities
    qk_site: Site
    qk_sig: tuple
    qk_module: str = ""        # the module path that computed QK^T
    training: bool | None = None  # that module's .training (None: outside any module)
    k_repeat: tuple = None     # (n, interleaved) when K's heads were repeated (GQA), else None
    scale: float = 1.0         # product of the numbers the scores were multiplied by (divisions inverted)
    scale_tensors: tuple = ()  # "mul" / "div" per tensor factor, in order (its value is not read)
    masks: tuple = ()          # MaskFact per mask applied
    softmax_dtype: object = None
    in_sdpa: bool = False      # the softmax was SDPA's own (_safe_softmax): its math backend ran
    dropout_p: float = 0.0
    weights_used: bool = False  # the probabilities were read by something other than @V (or returned)
    key_dim: int | None = -1   # where the keys' dim is now (negative), as the QK GEMM laid it out last
    # where the QK GEMM's rows are now, while the scores are scores: the keys' dim when the GEMM was
    # K @ q of one query (Luong's `bmm(keys, h.unsqueeze(2))`, its size-1 column squeezed away), which
    # the softmax's dim tells
    row_dim: int | None = -2
    keys_in_rows: bool = False  # the softmax found the keys in the rows (qk_sig then holds q and K^T)
    stat: "AttentionStat" = None  # where the call was counted, once it was


class AttentionKey(NamedTuple):
    qk_site: Site
    pv_site: Site
    module: str
    module_type: str
    qk_sig: tuple
    v_sig: tuple
    scale: float               # the numeric factor
    scale_tensors: tuple       # and the tensor factors, "mul" / "div" each
    masks: tuple
    dropout_p: float
    k_repeat: tuple | None
    v_repeat: tuple | None
    grad: bool
    softmax_dtype: object
    in_sdpa: bool
    training: bool | None      # the module's .training when QK^T was computed (None: no module)
    keys_in_rows: bool = False  # the scores GEMM was K @ q of one query (qk_sig holds q and K^T as SDPA takes them)


@dataclass
class AttentionStat:
    count: int = 0
    weights_used: bool = False


@dataclass
class OperandUse:
    """How one GEMM line's operands varied within a step (the most distinct tensors any observed
    step passed as each operand): 1 means every call of the step used the same tensor."""
    first: int = 0
    second: int = 0

    def merge(self, first: int, second: int) -> None:
        self.first, self.second = max(self.first, first), max(self.second, second)


MAX_OPERANDS = 64  # distinct operand tensors told apart per GEMM line and step


@dataclass
class Recording:
    """Everything one guard saw, aggregated. Bounded in size however long it runs."""

    ops: dict = field(default_factory=dict)          # OpKey -> OpStat
    attention: dict = field(default_factory=dict)    # AttentionKey -> AttentionStat
    # (site, module, shape, stride, dtype, GEMM op) -> count: matmul's (or linear's) copy of an operand whose
    # batch dims do not fold
    layout_copies: dict = field(default_factory=dict)
    # (copy's site, module, shape, stride, dtype, GEMM's site) -> count: a copy the user made of a
    # non-contiguous tensor (`.contiguous()`, `.clone()`) on one line, read by a GEMM on another
    explicit_copies: dict = field(default_factory=dict)
    # (tanh's site, module, shape, x's dtype, autograd records it, in an autocast region) -> count: a tanh of
    # `c * (x + 0.044715 * x ** 3)`, the tanh approximation of GELU written out (Recorder._gelu_step)
    tanh_gelu: dict = field(default_factory=dict)
    chained_gemm_sites: set = field(default_factory=set)
    # (site, module, host origin, shape, dtype, device type) -> Upload: a tensor the step made on the
    # host (Recorder._host) copied to a device by `.to()` or `.cuda()`
    uploads: dict = field(default_factory=dict)
    # line of the user's host reads -> reads there whose value may have come back in (a tensor made from
    # Python data after the read reached a GEMM in the same step): each a round trip through the host,
    # as a rollout's
    host_round_trips: dict = field(default_factory=dict)
    # lines whose ops read values that came from the host after one of the user's reads in the same
    # step (a rollout's forward on `torch.tensor(state)` after `env.step(action.item())`)
    after_host_read_sites: set = field(default_factory=set)
    gemm_operands: dict = field(default_factory=dict)  # (op, site, sig) -> OperandUse
    steps: int = 0
    dropped_keys: int = 0
    errors: list = field(default_factory=list)
    error_count: int = 0
    device_types: set = field(default_factory=set)
    syncs: dict = field(default_factory=dict)        # Site -> host syncs torch's sync detector saw there
    compile_events: Optional[object] = None          # compiles.CompileEvents of the window, set at the report
    kernels_total: int = 0
    kernels_unattributed: int = 0
    triton_kernels: int = 0
    kernel_us_total: float = 0.0
    profiled: bool = False

    def absorb(self, other: "Recording") -> None:
        """Add another recording's counts to this one (the same code observed for more steps)."""
        for key, stat in other.ops.items():
            mine = self.ops.get(key)
            if mine is None:
                self.ops[key] = dataclasses.replace(stat)  # its own: the other's counts stay as they are
            else:
                mine.count += stat.count
                mine.compiled += stat.compiled
                mine.launches += stat.launches
                mine.kernel_us += stat.kernel_us
        for key, n in other.layout_copies.items():
            self.layout_copies[key] = self.layout_copies.get(key, 0) + n
        for key, n in other.explicit_copies.items():
            self.explicit_copies[key] = self.explicit_copies.get(key, 0) + n
        for key, n in other.tanh_gelu.items():
            self.tanh_gelu[key] = self.tanh_gelu.get(key, 0) + n
        for key, upload in other.uploads.items():
            mine = self.uploads.get(key)
            if mine is None:
                self.uploads[key] = dataclasses.replace(upload)
            else:
                mine.merge(upload)
        for key, stat in other.attention.items():
            mine = self.attention.setdefault(key, AttentionStat())
            mine.count += stat.count
            mine.weights_used |= stat.weights_used
        self.chained_gemm_sites |= other.chained_gemm_sites
        for site, n in other.host_round_trips.items():
            self.host_round_trips[site] = self.host_round_trips.get(site, 0) + n
        self.after_host_read_sites |= other.after_host_read_sites
        for key, use in other.gemm_operands.items():
            self.gemm_operands.setdefault(key, OperandUse()).merge(use.first, use.second)
        self.device_types |= other.device_types
        for site, n in other.syncs.items():
            self.syncs[site] = self.syncs.get(site, 0) + n
        self.steps += other.steps
        self.dropped_keys += other.dropped_keys

    def scale(self, factor: int) -> None:
        """Multiply every count by `factor`: a stretch of a step observed once, weighed against
        stretches observed `factor` times as often (slices.py)."""
        if factor == 1:
            return
        for stat in self.ops.values():
            stat.count *= factor
            stat.compiled *= factor
            stat.launches *= factor
            stat.kernel_us *= factor
        for counts in (self.layout_copies, self.explicit_copies, self.tanh_gelu, self.host_round_trips, self.syncs):
            for key in counts:
                counts[key] *= factor
        for stat in self.attention.values():
            stat.count *= factor
        for upload in self.uploads.values():
            upload.count *= factor
        self.dropped_keys *= factor


class _Tags:
    """id(tensor) -> (weakref, value): tags that die with the step; cheap to look up."""

    __slots__ = ("d",)

    def __init__(self):
        self.d = {}

    def get(self, t):
        e = self.d.get(id(t))
        if e is not None and e[0]() is t:
            return e[1]
        return None

    def set(self, t, value):
        if len(self.d) >= MAX_TAGS:
            self.d.clear()
        self.d[id(t)] = (weakref.ref(t), value)

    def clear(self):
        self.d.clear()


class ModulePaths:
    """nn.Module path of the code running now, from global forward hooks (one stack per thread)."""

    def __init__(self, on_error=None):
        self._local = threading.local()
        self._child_names: dict = {}
        self._paths: dict = {}  # (parent path, id(parent), id(child)) -> the child's path: one string per module
        self._handles = []
        self.on_error = on_error  # called with (exception, where) when a hook fails
        self.on_output = None     # called with each module's output and path, when set
        self.on_top_call = None   # called before a top-level module call that follows one run without grad
        self.on_call = None       # called with (module, depth) as each module call begins, when set
        self.on_return = None     # called as each module call ends, when set

    def install(self):
        from torch.nn.modules import module as nn_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter),
            nn_module.register_module_forward_hook(self._leave, always_call=True),
        ]

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._local.stack = []  # (this thread's) calls now running will not be seen to return

    def _stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> str:
        stack = getattr(self._local, "stack", None)
        return stack[-1][1] if stack else ""

    def current_training(self):
        """The running module's .training, or None outside modules."""
        stack = getattr(self._local, "stack", None)
        return stack[-1][0].training if stack else None

    def current_type(self) -> str:
        stack = getattr(self._local, "stack", None)
        return type(stack[-1][0]).__name__ if stack else ""

    def clear_pending(self) -> None:
        self._local.ended_without_grad = False

    def _enter(self, module, args):
        if torch.compiler.is_compiling():  # dynamo traces global hooks: give it nothing to trace
            return
        try:
            stack = self._stack()
            if not stack and getattr(self._local, "ended_without_grad", False):
                self._local.ended_without_grad = False
                if self.on_top_call is not None:
                    self.on_top_call()
                if not self._handles:  # that ended the guard's window
                    return
            if not stack:
                path = type(module).__name__
            else:
                parent, parent_path = stack[-1]
                pkey = (parent_path, id(parent), id(module))
                path = self._paths.get(pkey)
                if path is None:
                    path = f"{parent_path}.{self._child_name(parent, module)}"
                    if len(self._paths) > 100_000:
                        self._paths.clear()
                    self._paths[pkey] = path
            stack.append((module, path))
            if self.on_call is not None:
                self.on_call(module, len(stack) - 1)
        except Exception as exc:  # a hook must never break the user's forward
            if self.on_error is not None:
                self.on_error(exc, "module paths")

    def _leave(self, module, args, output):
        if torch.compiler.is_compiling():
            return
        try:
            stack = self._stack()
            if self.on_return is not None:
                self.on_return()
            if stack and stack[-1][0] is module:
                path = stack.pop()[1]
                if not stack:
                    self._local.ended_without_grad = not _may_backward(output)
                if self.on_output is not None:
                    self.on_output(output, path)
        except Exception as exc:
            if self.on_error is not None:
                self.on_error(exc, "module paths")

    def _child_name(self, parent, child) -> str:
        key = (id(parent), id(child))
        name = self._child_names.get(key)
        if name is None:
            # the attribute path: `self.layers[i](x)` calls a module held in a container that is
            # never called itself (ModuleList, ModuleDict): its direct children first, then below
            name = next((attr for attr, sub in parent._modules.items() if sub is child), None)
            if name is None:
                name = next((attr for attr, sub in parent.named_modules(remove_duplicate=False)
                             if sub is child and attr), type(child).__name__)
            if len(self._child_names) > 100_000:
                self._child_names.clear()
            self._child_names[key] = name
        return name


_UNSET = object()


class Recorder:
    """Turns dispatched ops into a Recording. Thread-safe enough under the GIL."""

    def __init__(self, profile_cuda: bool = True):
        self.rec = Recording()
        self.modules = ModulePaths(on_error=self.fail)
        self.profile_cuda = profile_cuda
        self.sequence: list = []          # OpKeys of CUDA ops in order, for kernel attribution
        self._seq_sites: dict = {}        # forward autograd sequence nr -> (Site, module)
        self._seq_sites_before_step = 0   # how many of them were recorded before the current step
        self._deps = _Tags()              # tensor -> frozenset of GEMM sites it depends on
        self._attn = _Tags()              # tensor -> attention chain state
        self._copies = _Tags()            # tensor -> (site, module, shape, stride, dtype) of a layout copy
        # tensor -> how it was made on the CPU in this step: by a factory (`torch.randint`, `torch.ones`:
        # the factory's op name), from Python values (`torch.tensor(values)`: HOST_DATA), or computed only
        # from such tensors (HOST_DATA where one of them is, else the first one's factory): data the
        # program prepares on the host (batch indices, slice bounds, labels). A tensor that met a
        # parameter, a module's output or a tensor from before the step is not one (a program moves
        # those to its device). A view is its base's: looked up there (`host_origin`), not followed
        # through every view op.
        self._host = _Tags()
        # tensor -> True: the output of a permute or transpose (of 3+ dims) that the user's own line wrote,
        # not one torch made inside a layer (a batch_first RNN's)
        self._user_permuted = _Tags()
        # tensor -> True: a value computed only from items picked out of a larger tensor, elements or rows
        # (`ix1 = torch.max(pred[i, 0], target[i, 0])`, `probs[row].max()`): an item's value too
        self._items = _Tags()
        # tensor -> (x, (c0, c1, c2, c3)): a polynomial of the tensor x of degree at most 3 that the step
        # computed (`x + 0.044715 * torch.pow(x, 3)`), from a power or a square of x on
        self._polynomials = _Tags()
        # float32 copy -> weakref of the half-precision tensor it was made from (autocast runs `torch.pow`
        # in float32: the power of x is a power of its copy)
        self._upcasts = _Tags()
        # this step's reads by the user's code (`.item()`, a copy to the host): line -> reads not yet seen
        # coming back
        self._host_reads: dict = {}
        # what a tensor made from Python data after those reads may depend on: the GEMM sites the read
        # values depended on, and ("read", line) per read line
        self._host_read_deps = None
        self._mask_facts = _Tags()        # mask tensor -> (version, (how, L, S), causal)
        self._operands: dict = {}         # (op, site, sig) -> ({id: weakref} first, {id: weakref} second), this step
        self.modules.on_output = self._module_output
        self._fast: dict = {}             # cheap key -> (OpStat, OpKey), for the Recording in _fast_rec
        self._fast_rec = None
        # cheap key -> OpKey, for every recording of this recorder: the steps after the warm-up step
        # are recorded into a fresh Recording, and building each OpKey again cost that step ~5 µs an op
        self._keys: dict = {}
        self._modules_local = self.modules._local
        self.enabled = True
        self.dispatched = 0               # ops the mode saw (the slices of a step are cut by it)
        self.paused = False               # the mode is off for part of an observed step (slices.py)
        # Backward GEMMs derived instead of observed (see the module docstring); not when kernels
        # are attributed (that needs every op in order) or compiled code ran (its forward GEMMs
        # do not require grad: their backward would be missed).
        self.derive_backward = not profile_cuda
        self.saw_compiled = False
        self._grad_gemms: dict = {}       # (forward GEMM OpKey, operand grads) -> calls since the last backward
        self._set_aside: list = []        # (recording, such a dict) of the parts of a step recorded before this one
        self._backward_keys: dict = {}    # (forward GEMM OpKey, operand grads) -> the OpKeys of its backward GEMMs

    # -- errors --------------------------------------------------------------------------
    def fail(self, exc: BaseException, where: str = "capture") -> None:
        rec = self.rec
        rec.error_count += 1
        if len(rec.errors) < MAX_ERRORS:
            rec.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        if rec.error_count >= MAX_ERRORS:
            self.enabled = False

    def end_step_operands(self) -> None:
        """Fold this step's operand identities into the recording."""
        uses = self.rec.gemm_operands
        for key, (first, second) in self._operands.items():
            uses.setdefault(key, OperandUse()).merge(len(first), len(second))
        self._operands = {}

    def new_step(self) -> None:
        self.end_step_operands()
        self._deps.clear()
        self._attn.clear()
        self._copies.clear()
        self._host.clear()
        self._user_permuted.clear()
        self._items.clear()
        self._polynomials.clear()
        self._upcasts.clear()
        self._host_reads = {}
        self._host_read_deps = None
        self._mask_facts.clear()
        # Backward ops find their forward's site here; a backward runs in its forward's step or
        # the next one, so the sites of the steps before that are dropped (insertion order is
        # chronological). Without this the dict grows with every observed step.
        sites = self._seq_sites
        for seq in list(itertools.islice(sites, self._seq_sites_before_step)):
            sites.pop(seq, None)
        self._seq_sites_before_step = len(sites)
        self.forget_pending_backward()  # forwards that no backward followed (evaluation with grad on)

    def forget_pending_backward(self) -> None:
        self._grad_gemms.clear()
        self._set_aside = []

    def begin_scratch(self) -> dict:
        """The ops from now on are recorded only for their dataflow tags (a slice's preamble,
        slices.py): this step's operand identities so far are folded in, and the pending backward
        GEMMs returned, for `end_scratch` to put back."""
        self.end_step_operands()
        return dict(self._grad_gemms)

    def end_scratch(self, pending: dict) -> None:
        """Drop what the scratch ops left for the step's end: their operands and backward GEMMs."""
        self._grad_gemms = pending
        self._operands = {}

    def set_aside_pending(self) -> None:
        """The recording is about to change (a part of a step recorded apart, slices.py): the
        backward GEMMs of the forward GEMMs seen so far go into the recording now current."""
        if self._grad_gemms:
            self._set_aside.append((self.rec, self._grad_gemms))
            self._grad_gemms = {}

    def backward_ran(self) -> None:
        """A backward pass ran with the mode off: record the GEMMs it ran for the forward GEMMs
        seen since the last one, each into the recording its forward GEMM went to."""
        pending, self._grad_gemms = self._grad_gemms, {}
        aside, self._set_aside = self._set_aside, []
        if not self.enabled:
            return
        for rec, gemms in aside:
            self._derive_backward(rec, gemms)
        self._derive_backward(self.rec, pending)

    def _derive_backward(self, rec, pending) -> None:
        ops = rec.ops
        derived = self._backward_keys
        for pkey, n in pending.items():
            bkeys = derived.get(pkey)
            if bkeys is None:
                key, grads = pkey
                bkeys = [OpKey(op, qualname, key.site, False, key.module, True, key.device, sig, out, key.amp)
                         for op, qualname, sig, out in derive_backward_gemms(key.op, key.sig, grads)]
                if len(derived) < MAX_KEYS:
                    derived[pkey] = bkeys
            for bkey in bkeys:
                stat = ops.get(bkey)
                if stat is None:
                    if len(ops) >= MAX_KEYS:
                        rec.dropped_keys += n
                        continue
                    stat = ops[bkey] = OpStat()
                stat.count += n

    # -- per op ----------------------------------------------------------------------------
    # The hot path. Everything here runs once per dispatched op while the window is open, so
    # it avoids Python-level hashing (OpOverload and Site hash in Python: ids are used, both
    # are interned and kept alive), per-op tuples it can skip, and method calls.
    def _info(self, func):
        return _OP_INFO.get(id(func)) or _op_info(func)

    def _upload(self, site, module, src, out) -> None:
        """A copy to a device (`.to(device)`, `.cuda()`) of `src`, which this step made on the host."""
        origin = host_origin(self._host.d, src)
        values = None
        if origin == HOST_DATA and src.numel() <= MAX_COMPARED_VALUES:
            values = tuple(src.flatten().tolist())
        uploads = self.rec.uploads
        key = (site, module, origin, tuple(src.shape), src.dtype, out.device.type)
        upload = uploads.get(key)
        if upload is None:
            if len(uploads) < MAX_KEYS:
                uploads[key] = Upload(1, values, values is not None)
        else:
            upload.count += 1
            upload.same_values = upload.same_values and values == upload.values

    def _follow_view(self, name, args, src, out) -> None:
        i = id(src)
        for tags in (self._deps, self._attn, self._copies, self._items):
            d = tags.d
            if d:
                e = d.get(i)
                if e is not None and e[0]() is src:
                    value = e[1]
                    if tags is self._attn and type(value) is tuple and value[0] == "R":
                        value = _merged_repeat(value, out.shape)
                        if value is None:
                            continue
                    elif tags is self._attn and type(value) is AttentionChain:
                        key_dim = None if value.key_dim is None else _dim_after(name, args, src, out, value.key_dim)
                        row_dim = None if value.row_dim is None else _dim_after(name, args, src, out, value.row_dim)
                        if key_dim is None and row_dim is None:
                            continue  # the keys' dim merged, split or dropped: not attention any more
                        if (key_dim, row_dim) != (value.key_dim, value.row_dim):
                            value = dataclasses.replace(value, key_dim=key_dim, row_dim=row_dim)
                    tags.set(out, value)

    def _view(self, name, args, out) -> None:
        """A view op: dataflow tags follow it; an expand of a new size-1 dim of a 5-d tensor may be
        the start of a head repeat (K/V for grouped-query attention)."""
        if _current_autograd_node() is not None:
            return
        src = args[0]
        if self._deps.d or self._attn.d or self._copies.d or self._items.d:
            self._follow_view(name, args, src, out)
        if name in PERMUTE_OPS and out.dim() >= 3 and _called_from_user_code():
            self._user_permuted.set(out, True)
        if name == "expand" and out.dim() == 5:
            grown = [i for i, (a, b) in enumerate(zip(src.shape, out.shape)) if a == 1 and b > 1]
            if len(grown) == 1:
                self._attn.set(out, ("R", grown[0], out.shape[grown[0]], tuple(out.shape)))

    def _module_output(self, output, path) -> None:
        """The attention weights returned from the module that computed QK^T, or from one above it, are
        weights used (a submodule of it that returns them, nn.Dropout or nn.Identity, hands them back)."""
        attn = self._attn
        if not attn.d:
            return
        items = output if isinstance(output, (tuple, list)) else (output,)
        for t in items:
            if isinstance(t, Tensor):
                state = attn.get(t)
                if type(state) is AttentionChain and state.phase == "P" and (
                        state.qk_module == path or state.qk_module.startswith(path + ".")):
                    _weights_used(state)

    def record(self, func, args, kwargs, out, frame, info=None, node=_UNSET,
               Tensor=Tensor, isinstance=isinstance, id=id, tuple=tuple) -> None:  # locals: faster
        if info is None:
            info = _OP_INFO.get(id(func)) or _op_info(func)
        if info.unrecorded:  # a view: the cheap path; views launch nothing, only dataflow tags follow them
            if args and isinstance(args[0], Tensor) and isinstance(out, Tensor):
                self._view(info.name, args, out)
            return
        (name, qualname, _, full_sig, is_copy, is_gemm, is_bgemm, _, _, unread_in_backward, reads_to_host,
         from_host_data) = info
        if node is _UNSET:
            node = _current_autograd_node()
        backward = node is not None
        if backward and unread_in_backward and not self.profile_cuda:
            return  # kernel attribution needs every op; the checks do not
        if frame is None and not backward:
            # Issued by C++ on a thread that runs no Python, outside any backward node: no line of
            # the user's code (DDP's reducer copying the reduced buckets into .grad at the end of
            # a backward pass on autograd's device thread). Its kernels stay unattributed.
            return
        site = None
        compiled = False
        if backward:
            hit = self._seq_sites.get(node._sequence_nr())
            if hit is not None:
                site, module, _ = hit
        # The call site: the first frame outside torch and matlint (inlined: this runs per op).
        # An op that torch.distributed's code issued itself (a frame of it comes before any module
        # or optimizer call on the way up: DDP's buffer broadcast, FSDP's all-gathers, a comm hook)
        # is the wrapper's work, not the user's code: it is not recorded. The model's own ops, which
        # a wrapper calls through the module's __call__, are.
        direct = False
        if frame is not None:
            code = frame.f_code
            if id(code) in _user_codes:
                direct = True
                f = frame
            elif site is None:
                f = frame
                called = False
                while True:
                    i = id(code)
                    if i in _internal_codes:
                        pass
                    elif i in _user_codes:
                        break
                    elif i in _call_codes:
                        called = True
                    elif i in _distributed_codes:
                        if not called:
                            return
                    else:
                        kind = _code_kind(code)
                        if kind == USER:
                            break
                        if kind == COMPILED:
                            compiled = True
                        elif kind == CALL:
                            called = True
                        elif kind == DISTRIBUTED and not called:
                            return
                    f = f.f_back
                    if f is None:
                        break
                    code = f.f_code
                direct = f is frame
            else:
                i = id(code)
                direct = i in _user_codes or (i not in _internal_codes and _code_kind(code) == 0)
            if site is None:
                if f is None:
                    site = UNKNOWN_SITE
                else:
                    lkey = (id(code), f.f_lasti)
                    site = _lasti_cache.get(lkey)
                    if site is None:
                        site = _site_of(code, f.f_lineno)
                        if len(_lasti_cache) < MAX_KEYS:
                            _lasti_cache[lkey] = site
        elif site is None:
            site = UNKNOWN_SITE
        if not backward or hit is None:
            stack = getattr(self._modules_local, "stack", None)
            module = stack[-1][1] if stack else ""

        # A cheap signature for the fast key: shapes (and strides, dtypes for full-signature
        # ops); it determines args_sig(args, full_sig), which is built only for a new key.
        first = None
        sig = []
        hd = self._host.d
        host = bool(hd)      # every tensor argument made on the host in this step (see _host)
        first_host = False   # the first one is
        tensors = False
        items = True         # every tensor argument is an item picked out of a larger tensor (_picked), a
                             # value computed only from such items (_items), or one element ...
        picked = False       # ... and one of them is picked or so computed
        ed = bool(self._items.d)
        for a in args:
            if isinstance(a, Tensor):
                if first is None:
                    first = a
                    if host:
                        e = hd.get(id(a))
                        host = first_host = (e is not None and e[0]() is a) or (
                            a._base is not None and host_origin(hd, a._base) is not None)
                elif host:
                    host = host_origin(hd, a) is not None
                tensors = True
                sig.append((a.shape, a.stride(), a.dtype) if full_sig else a.shape)
                if items:
                    shape = a.shape
                    one = not shape or (len(shape) == 1 and shape[0] == 1)  # one element, at most one dim
                    if not picked or not one:
                        base = a._base  # _picked(a), inlined
                        if base is not None and a.numel() < base.numel() and (
                                a.dim() < base.dim() or (one and a.dim() <= 1)):
                            picked = True
                        elif ed and self._items.get(a) is not None:
                            picked = True
                        elif not one:
                            items = False
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], Tensor):
                tensors = True
                items = False
                sig.append((len(a),))
                if host:
                    host = all(host_origin(hd, t) is not None for t in a)
        host = host and tensors
        picked = picked and items
        if isinstance(out, Tensor):
            out_t = out
        elif isinstance(out, (list, tuple)):
            out_t = _first_tensor(out)
        else:
            out_t = None
        t = first if first is not None else out_t
        if t is None:
            device = ""
        elif t.is_cuda:
            device = "cuda"
        else:
            device = "cpu" if t.is_cpu else t.device.type
        amp = ""
        if is_gemm:
            if not backward:
                amp = autocast_state()
            elif hit is not None:
                amp = hit[2]
        if not backward and (is_gemm or self.profile_cuda):  # the backward ops recorded
            seq = _get_sequence_nr() - 1
            sites = self._seq_sites
            if seq not in sites:
                if len(sites) >= MAX_SEQ_SITES:
                    for k in list(itertools.islice(sites, MAX_SEQ_SITES // 2)):
                        del sites[k]
                sites[seq] = (site, module, amp)
        transfer = ""
        if is_copy:
            src = args[1] if name == "copy_" else first
            dst = args[0] if name == "copy_" else out_t
            if isinstance(src, Tensor) and dst is not None and src.device.type == "cuda" and dst.device.type == "cpu":
                transfer = "d2h"
        rec = self.rec
        fast = self._fast
        if self._fast_rec is not rec:
            fast.clear()
            self._fast_rec = rec
        if out_t is not None:
            fkey = (id(func), id(site), direct, module, backward, device, tuple(sig), out_t.shape, out_t.dtype, transfer,
                    amp, host, picked)
        else:
            fkey = (id(func), id(site), direct, module, backward, device, tuple(sig), amp, host, picked)
        hit = fast.get(fkey)
        if hit is not None:
            stat, key = hit
        else:
            keys = self._keys
            key = keys.get(fkey)
            if key is None:
                key = OpKey(name, qualname, site, direct, module, backward, device,
                            args_sig(args, full_sig, self._items if picked else None),
                            (out_t.shape, out_t.dtype, transfer) if out_t is not None else (), amp, host,
                            len(args) > 1 and same_values(args[0], args[1]))
                if len(keys) < 2 * MAX_KEYS:
                    keys[fkey] = key
            ops = rec.ops
            stat = ops.get(key)
            if stat is None:
                if len(ops) >= MAX_KEYS:
                    rec.dropped_keys += 1
                    return
                stat = ops[key] = OpStat()
                rec.device_types.add(device)
            if len(fast) < 2 * MAX_KEYS:
                fast[fkey] = (stat, key)
        stat.count += 1
        if compiled:
            stat.compiled += 1
            self.saw_compiled = True
        if is_gemm and not backward:
            self._note_operands(key, args, name)
        if is_gemm and not backward and self.derive_backward and _is_grad_enabled():
            a, b = (args[1], args[2]) if name in _BIAS_FIRST_GEMMS else (args[0], args[1])
            grads = (a.requires_grad, b.requires_grad)
            if grads[0] or grads[1]:
                pending = self._grad_gemms
                pkey = (key, grads)
                pending[pkey] = pending.get(pkey, 0) + 1
        if device == "cuda" and self.profile_cuda and len(self.sequence) < MAX_SEQUENCE:
            self.sequence.append(key)
        if backward:  # the dataflow patterns are all forward ones
            return
        dd = self._deps.d
        if direct and (transfer or reads_to_host) and not host:  # the user's own reads
            self._host_read(site, first)
        if out_t is None:
            return

        # -- dataflow (forward ops with a tensor output) --
        if picked and not is_gemm:
            self._items.set(out_t, True)
        # Host-side data: what factories make on the CPU, and what is computed only from it.
        if (host or not tensors or from_host_data) and out_t.is_cpu:
            origin = HOST_DATA if from_host_data else name if not tensors else _computed_origin(hd, args)
            for t in out if isinstance(out, (list, tuple)) else (out_t,):  # unbind: each row
                if isinstance(t, Tensor):
                    self._host.set(t, origin)
        elif first_host and name[-1] == "_":  # written in place with other values
            for t in (first, first._base):
                if t is not None and hd.get(id(t)) is not None:
                    del hd[id(t)]
        # GEMM dependency chains: a GEMM fed (through any ops) by an earlier GEMM of the same
        # site is a recurrence (an RNN), not a loop that one bmm could replace. A tensor made from
        # Python data after the host read values computed by GEMMs may be made from those values
        # (a rollout: the action read, the environment's next state made into the next input): it
        # depends on what they depended on.
        if from_host_data and self._host_read_deps is not None:
            dd[id(out_t)] = (_weakref(out_t), self._host_read_deps)
        deps = None
        if dd:
            for a in args:
                for t in a if isinstance(a, (list, tuple)) else (a,):  # torch.cat([tokens, next_token])
                    if isinstance(t, Tensor):
                        e = dd.get(id(t))
                        if e is not None and e[0]() is t:
                            d = e[1]
                            deps = d if deps is None else deps | d
        if deps is not None and self._host_read_deps is not None and site not in rec.after_host_read_sites \
                and any(type(d) is tuple for d in deps):
            rec.after_host_read_sites.add(site)
        if is_gemm:
            if deps is not None and self._host_reads:
                self._came_back(deps)
            # A site once chained stays chained: it is no longer tracked, and in a model whose
            # GEMM lines all feed each other (a transformer) the tags soon stop being made.
            chained = rec.chained_gemm_sites
            if site in chained:
                pass
            elif deps is not None and site in deps:
                chained.add(site)
            else:
                deps = frozenset((site,)) if deps is None else deps | {site}
        if deps is not None and not deps <= rec.chained_gemm_sites:  # only chained sites: moot
            if len(dd) >= MAX_TAGS:
                dd.clear()
            dd[id(out_t)] = (_weakref(out_t), deps)

        if first_host and name == "_to_copy" and not out_t.is_cpu:
            self._upload(site, module, first, out_t)
        arg0 = args[0] if args and isinstance(args[0], Tensor) else None
        # Copies forced by layout: matmul's clone of a non-contiguous operand before bmm.
        copies = self._copies
        if name == "clone" and arg0 is not None and not arg0.is_contiguous():
            copies.set(out_t, (site, module, tuple(arg0.shape), arg0.stride(), arg0.dtype,
                               self._user_permuted.get(arg0) is not None))
        elif copies.d:
            if name in PASS_THROUGH_OPS and arg0 is not None:
                c = copies.get(arg0)
                if c is not None:
                    copies.set(out_t, c)
            if is_gemm:
                for a in args:
                    if isinstance(a, Tensor):
                        c = copies.get(a)
                        if c is None:
                            continue
                        # A copy on the GEMM's own line that the GEMM reads folded into fewer dims is
                        # matmul's (or linear's) own, made to fold the batch dims: before a bmm, or
                        # before an mm where only the batch dims were out of order (the last one is
                        # unit-stride: the GEMM applied before the permute needs none). A copy that
                        # the GEMM reads as it is is the user's (`q @ k.T.contiguous()`).
                        if c[0] == site and (a._base is not None or tuple(a.shape) != c[2]):
                            if is_bgemm or (c[5] and c[3][-1] == 1 and a.shape[-1] == c[2][-1]
                                            and a.numel() == math.prod(c[2])):
                                lc = c[:5] + (name,)
                                rec.layout_copies[lc] = rec.layout_copies.get(lc, 0) + 1
                        else:
                            e = c[:5] + (site,)
                            rec.explicit_copies[e] = rec.explicit_copies.get(e, 0) + 1
        if is_bgemm or self._attn.d or name == "repeat" or name in ZERO_OPS:
            self._attention_step(name, args, kwargs, arg0, out_t, site, module, direct)
        if name == "_to_copy" and arg0 is not None and out_t.dtype == torch.float32 and arg0.dtype in _HALF_DTYPES:
            self._upcasts.set(out_t, _weakref(arg0))
        if name in POLYNOMIAL_OPS and (self._polynomials.d or name == "pow" or (
                name == "mul" and arg0 is not None and len(args) > 1 and args[1] is arg0)):
            self._gelu_step(name, args, kwargs, arg0, out_t, site, module)

    def _gelu_step(self, name, args, kwargs, arg0, out, site, module) -> None:
        """Follow the arithmetic of `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))` as
        polynomials of x, from `x ** 3`, `torch.pow(x, 3)` or `x * x` on; a tanh of exactly
        sqrt(2 / pi) * (x + 0.044715 * x ** 3) is the tanh GELU written out (Recording.tanh_gelu)."""
        polys = self._polynomials
        if arg0 is None:
            return
        if name == "pow" or (name == "mul" and args[1] is arg0):
            exponent = 2 if name == "mul" else args[1] if len(args) > 1 else None
            if type(exponent) in (int, float) and exponent in (2, 3) and arg0.is_floating_point():
                source = self._upcasts.get(arg0) if self._upcasts.d else None
                x = source() if source is not None else None
                polys.set(out, (_weakref(arg0 if x is None else x),
                                (0.0, 0.0, 1.0, 0.0) if exponent == 2 else (0.0, 0.0, 0.0, 1.0)))
            return
        x = None
        for a in args[:2]:
            tag = polys.get(a) if isinstance(a, Tensor) else None
            if tag is not None:
                x = tag[0]()
                break
        if x is None:
            return
        terms = [_polynomial_of(a, x, polys) for a in args[:2]]
        base = name.rstrip("_")
        if base == "tanh":
            c = terms[0]
            if c is not None and _is_gelu_tanh_argument(c):
                key = (site, module, tuple(out.shape), x.dtype, arg0.requires_grad and _is_grad_enabled(),
                       autocast_state() == "region")
                self.rec.tanh_gelu[key] = self.rec.tanh_gelu.get(key, 0) + 1
            return
        if base == "neg":
            result = None if terms[0] is None else tuple(-v for v in terms[0])
        elif len(args) < 2 or terms[0] is None or terms[1] is None:
            return
        elif base == "mul":
            p, q = terms
            if any(p[i] and q[j] for i in range(4) for j in range(4) if i + j > 3):
                return  # above the third degree: not the formula
            result = tuple(sum(p[i] * q[k - i] for i in range(k + 1)) for k in range(4))
        elif base == "div":
            if not isinstance(args[1], (int, float)) or not args[1]:
                return
            result = tuple(v / args[1] for v in terms[0])
        else:
            alpha = (kwargs or {}).get("alpha", 1)
            if not isinstance(alpha, (int, float)):
                return
            p, q = terms
            if base == "rsub":  # rsub(x, c) = c - alpha * x
                p, q = q, p
            sign = alpha if base == "add" else -alpha
            result = tuple(a + sign * b for a, b in zip(p, q))
        polys.set(out, (_weakref(x), result))

    def _host_read(self, site, tensor) -> None:
        """The user's code read `tensor`'s value at `site` (`.item()`, a copy to the host): a tensor made
        from Python data from now on in this step may hold it, and depends on the GEMMs the value did.
        (torch's own reads, an optimizer's step count, hand nothing to the user's host code.)"""
        if not isinstance(tensor, Tensor):
            return
        self._host_reads[site] = self._host_reads.get(site, 0) + 1
        e = self._deps.d.get(id(tensor))
        read = e[1] if e is not None and e[0]() is tensor else frozenset()
        mark = ("read", site)
        deps = self._host_read_deps
        if deps is None or mark not in deps or not read <= deps:
            self._host_read_deps = (deps or frozenset()) | read | {mark}

    def _came_back(self, deps) -> None:
        """A GEMM's input may hold host-read values (see _host_read): those reads made a round trip
        through the host, each counted once."""
        reads = self._host_reads
        trips = self.rec.host_round_trips
        for d in deps:
            if type(d) is tuple:
                n = reads.get(d[1])
                if n:
                    reads[d[1]] = 0
                    trips[d[1]] = trips.get(d[1], 0) + n

    def _note_operands(self, key, args, name) -> None:
        """Which tensors this GEMM line was given in this step: a view is its base and offset (a
        weight's transposed view is the weight; x[i] is a part of x) and the version (a tensor
        updated in place holds a new value); weak references tell a freed tensor from a new one at
        its address."""
        okey = (key.op, key.site, key.sig)
        seen = self._operands.get(okey)
        if seen is None:
            seen = self._operands[okey] = ({}, {})
        pair = (args[1], args[2]) if name in _BIAS_FIRST_GEMMS else (args[0], args[1])
        for t, ids in zip(pair, seen):
            if len(ids) >= MAX_OPERANDS or not isinstance(t, Tensor):
                continue
            base = t._base if t._base is not None else t
            ident = (id(base), t.storage_offset(), t._version)  # a view shares its base's version counter
            e = ids.get(ident)
            if e is None:
                ids[ident] = _weakref(base)
            elif e() is not base:
                ids[ident + (len(ids),)] = _weakref(base)

    def _attention_step(self, name, args, kwargs, arg0, out, site, module, direct) -> None:
        """Follow bmm -> scale -> (mask) -> softmax -> (dropout) -> bmm on the same tensors, with
        what SDPA needs to compute the same: scale, masks, dropout, repeated K/V heads, and whether
        the weights are used elsewhere."""
        attn = self._attn
        if name in BATCHED_GEMM_OPS:
            bias, (a, b) = (args[0], args[1:3]) if name == "baddbmm" else (None, args[:2])
            state = attn.get(a)
            if type(state) is AttentionChain and state.phase == "P" and state.key_dim == -1:
                v_repeat = attn.get(b)
                key = AttentionKey(
                    state.qk_site, site, module, self.modules.current_type(), state.qk_sig, tensor_sig(b),
                    state.scale, state.scale_tensors, state.masks, state.dropout_p, state.k_repeat,
                    v_repeat[1:] if type(v_repeat) is tuple and v_repeat[0] == "K" else None,
                    a.requires_grad, state.softmax_dtype, state.in_sdpa, state.training, state.keys_in_rows)
                stat = self.rec.attention.get(key)
                if stat is None:
                    stat = self.rec.attention[key] = AttentionStat()
                stat.count += 1
                stat.weights_used |= state.weights_used
                state.stat = stat
            k_repeat = attn.get(b)
            if type(k_repeat) is AttentionChain and k_repeat.phase == "P":
                _weights_used(k_repeat)
            masks, scale = (), 1.0
            if bias is not None:  # baddbmm(input, q, k^T, beta=, alpha=): beta * input + alpha * (q @ k^T)
                kwargs = kwargs or {}
                beta, scale = _number(kwargs.get("beta", 1)), _number(kwargs.get("alpha", 1))
                if beta is None or scale is None:
                    return  # read only on the device: not followed
                zero = attn.get(bias)
                if beta != 0 and not (type(zero) is tuple and zero[0] == "Z" and zero[1] == bias._version):
                    causal = beta > 0 and self._causal(bias, "additive", out.shape)
                    masks = (MaskFact("additive", causal, factor=beta),)
            attn.set(out, AttentionChain("S", site, (tensor_sig(a), tensor_sig(b)), module,
                                         self.modules.current_training(), masks=masks, scale=scale,
                                         k_repeat=k_repeat[1:] if type(k_repeat) is tuple and k_repeat[0] == "K" else None))
            return
        if name in ZERO_OPS:  # zeros made here: a baddbmm input that is not a mask (GPT-NeoX)
            attn.set(out, ("Z", out._version))
            return
        if name == "repeat" and arg0 is not None and len(args) > 1:
            grown = [n for n in args[1] if n > 1]
            if len(grown) == 1:  # tiled: head h reads K/V head h % n_kv (not what enable_gqa does)
                attn.set(out, ("K", grown[0], False))
            return
        if name == "scalar_tensor" and args and isinstance(args[0], (int, float)):
            attn.set(out, ("V", float(args[0])))  # where(mask, scores, -inf)'s -inf, on the device: read it here
            return
        if arg0 is None or name in SHAPE_ONLY_OPS:
            return
        if name == "bernoulli_":  # a dropout mask on CPU (mul by it then div_; native_dropout elsewhere)
            p_keep = args[1] if len(args) > 1 and isinstance(args[1], (int, float)) else None
            if p_keep is not None:
                attn.set(out, ("D", 1.0 - p_keep))
            return
        state = attn.get(arg0)
        which = 0
        if type(state) is not AttentionChain and name in _SCALE_OR_MASK_OPS:
            for i in (1, 2) if name == "where" else (1,):
                other = attn.get(args[i]) if len(args) > i and isinstance(args[i], Tensor) else None
                if type(other) is AttentionChain:
                    state, which = other, i
                    break
        if type(state) is not AttentionChain:
            if type(state) is tuple and (name in PASS_THROUGH_OPS or state[0] == "K" and name in ("mul", "div")
                                         and (len(args) < 2 or not isinstance(args[1], Tensor) or args[1].dim() == 0)):
                attn.set(out, state)  # a dropout mask or repeated heads (also scaled, as SDPA's math backend scales k)
            return
        if name in PASS_THROUGH_OPS:
            attn.set(out, state)
        elif state.phase == "S":
            new = self._scores_step(name, args, which, state, out)
            if new is not None:
                attn.set(out, new)
        elif name in DROPOUT_OPS and which == 0:
            train = args[2] if len(args) > 2 else True
            p = args[1] if len(args) > 1 and isinstance(args[1], (int, float)) and train is not False else 0.0
            state.dropout_p = p  # the same weights, dropped out: one chain, so that a use of either is seen
            attn.set(out, state)
        elif name == "mul" and len(args) > 1 and isinstance(args[1 - which], Tensor) \
                and type(attn.get(args[1 - which])) is tuple and attn.get(args[1 - which])[0] == "D":
            state.dropout_p = attn.get(args[1 - which])[1]
            attn.set(out, state)
        else:
            _weights_used(state)  # the weights feed something SDPA does not return them for

    def _scores_step(self, name, args, which, state, out):
        """The chain after one op on the scores, or None where the op is not one SDPA has."""
        base = name.rstrip("_")
        other = args[1 - which] if which < 2 and len(args) > 1 else None
        if name in SOFTMAX_OPS:
            dim = args[1] if len(args) > 1 and isinstance(args[1], int) else None
            if dim is None:
                return None
            dim = dim % out.dim() - out.dim()
            if dim == state.key_dim:
                return dataclasses.replace(state, phase="P", row_dim=None, softmax_dtype=out.dtype,
                                           in_sdpa=name == "_safe_softmax")
            if dim == state.row_dim and state.key_dim is None and not state.masks and not state.scale_tensors:
                # over the GEMM's rows, its one column gone: K @ q of one query, the scores q @ K^T
                # would give (a mask or a tensor scale laid out for them is not followed)
                k_rows, q_col = state.qk_sig
                return dataclasses.replace(state, phase="P", key_dim=dim, row_dim=None, softmax_dtype=out.dtype,
                                           qk_sig=(_transposed(q_col), _transposed(k_rows)), keys_in_rows=True,
                                           in_sdpa=name == "_safe_softmax")
            return None  # not over the keys: not attention's softmax
        if base in ("mul", "div"):
            if base == "div" and which != 0:
                return None  # x / scores: not a scale
            if isinstance(other, Tensor) and other.dim() and other.shape[-1] != 1:
                return None  # varies along the keys: not a scale (a multiplicative mask SDPA lacks)
            if isinstance(other, Tensor):  # a learned temperature, or a value read only on the device
                return dataclasses.replace(state, scale_tensors=state.scale_tensors + (base,),
                                           masks=_masks_scaled(state.masks, None))
            value = _number(other)
            if value is None:
                return None
            if value == 0:
                return None
            factor = value if base == "mul" else 1.0 / value
            return dataclasses.replace(state, scale=state.scale * factor, masks=_masks_scaled(state.masks, factor))
        if base == "masked_fill" and which == 0 and len(args) > 2:
            fill = self._fill_value(args[2])
            if fill is None or fill > MASK_FILL_MIN:
                mask = MaskFact("fill", False, fill if fill is not None else float("nan"))
            else:
                mask = MaskFact("masked_fill", self._causal(args[1], "masked_fill", out.shape))
            return dataclasses.replace(state, masks=state.masks + (mask,))
        if base == "where" and which in (1, 2):
            fill = self._fill_value(args[3 - which])
            kind = "where" if which == 1 else "where_inv"
            if fill is None or fill > MASK_FILL_MIN:
                mask = MaskFact("fill", False, fill if fill is not None else float("nan"))
            else:
                mask = MaskFact(kind, self._causal(args[0], kind, out.shape))
            return dataclasses.replace(state, masks=state.masks + (mask,))
        if base in ("add", "sub") and isinstance(other, Tensor):
            if base == "sub" and which != 0:
                return None  # mask - scores: not a mask
            kind = "additive" if base == "add" else "subtractive"
            causal = kind == "additive" and self._causal(other, kind, out.shape)
            mask = MaskFact(kind, causal, factor=1.0 if kind == "additive" else -1.0)
            return dataclasses.replace(state, masks=state.masks + (mask,))
        return None

    def _fill_value(self, value):
        """The number a mask fills with: a Python number, a CPU scalar, or a scalar tensor made on
        the device by scalar_tensor (its value read when it was made, without a sync)."""
        number = _number(value)
        if number is None and isinstance(value, Tensor):
            tag = self._attn.get(value)
            if type(tag) is tuple and tag[0] == "V":
                return tag[1]
        return number

    def _causal(self, mask, how, scores_shape) -> bool:
        """Whether the mask lets exactly the causal (top-left lower-triangular) positions through,
        in every batch and head. Computed once per mask tensor and version within a step."""
        seq = tuple(scores_shape[-2:])
        fact = self._mask_facts.get(mask)
        if fact is not None and fact[0] == mask._version and fact[1] == (how, seq):
            return fact[2]
        causal = False
        if mask.dim() >= 2 and tuple(mask.shape[-2:]) == seq:
            tril = torch.ones(seq, dtype=torch.bool, device=mask.device).tril()
            if how == "additive":
                if mask.is_floating_point():
                    causal = bool((mask == torch.zeros(seq, dtype=mask.dtype, device=mask.device)
                                   .masked_fill(~tril, float("-inf"))).all())
            elif mask.dtype == torch.bool:
                allowed = mask if how == "where" else ~mask
                causal = bool((allowed == tril).all())
        self._mask_facts.set(mask, (mask._version, (how, seq), causal))
        return causal


def _polynomial_of(value, x, polys):
    """`value` as (c0, c1, c2, c3), the coefficients of a polynomial of the tensor `x`: x itself, a
    Python number, or a tensor tagged in `polys` as a polynomial of x; else None."""
    if value is x:
        return (0.0, 1.0, 0.0, 0.0)
    if isinstance(value, Tensor):
        tag = polys.get(value)
        return tag[1] if tag is not None and tag[0]() is x else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value), 0.0, 0.0, 0.0)
    return None


def _is_gelu_tanh_argument(c) -> bool:
    """Whether c0 + c1 x + c2 x^2 + c3 x^3 is sqrt(2 / pi) * (x + 0.044715 * x^3)."""
    return (not c[0] and not c[2] and math.isclose(c[1], GELU_TANH_SCALE, rel_tol=1e-3)
            and math.isclose(c[3], GELU_TANH_SCALE * GELU_TANH_CUBIC, rel_tol=1e-3))


def _number(value):
    """A Python number, or a one-element CPU tensor's value; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and value.device.type == "cpu":
        return float(value.item())
    return None


def _masks_scaled(masks: tuple, factor) -> tuple:
    """The masks after the scores were scaled by `factor` (None: by a tensor): SDPA adds attn_mask after
    scaling, so a float mask added before is attn_mask times the factor; a filled mask stays one."""
    out = []
    for m in masks:
        if m.kind in ("additive", "subtractive"):
            new = None if factor is None or m.factor is None else m.factor * factor
            m = m._replace(factor=new, causal=m.causal and new is not None and new > 0)
        out.append(m)
    return tuple(out)


def autocast_state() -> str:
    """Whether an op runs inside an autocast region: "region" or "". Inside the dispatch mode
    `torch.is_autocast_enabled` reads False (autocast has already run and excludes itself), so the
    region's own count is read; an fp32 GEMM inside a region is one autocast was told to leave
    alone (`torch.autocast(..., enabled=False)`): autocast itself would have run it in low precision.
    (The count is one for all devices: a region for another device counts too.)"""
    depth = torch.autocast_increment_nesting()  # the regions entered, plus this one
    torch.autocast_decrement_nesting()
    return "region" if depth > 1 else ""


def _may_backward(output) -> bool:
    """Whether a backward pass may follow from this module output."""
    if not torch.is_grad_enabled():
        return False
    items = output if isinstance(output, (tuple, list)) else (output,)
    tensors = [t for t in items if isinstance(t, Tensor)]
    return not tensors or any(t.requires_grad for t in tensors)


def _weights_used(chain: AttentionChain) -> None:
    chain.weights_used = True
    if chain.stat is not None:
        chain.stat.weights_used = True


def _dim_after(name, args, src, out, dim):
    """Where `dim` (negative) of a view op's input is in its output, or None when the view merged,
    split or dropped it."""
    n = src.dim()
    if n < 2:
        return None
    if name == "transpose":
        a, b = args[1] % n - n, args[2] % n - n
        return b if dim == a else a if dim == b else dim
    if name == "t":
        return -1 - (dim + 2) if dim >= -2 else dim
    if name == "permute":
        perm = [p % n for p in args[1]]
        return perm.index(dim % n) - n
    if tuple(src.shape[dim:]) == tuple(out.shape[dim:]):
        return dim
    # size-1 dims added or dropped (squeeze, unsqueeze, a view that does only that): the dims of other
    # sizes keep their order
    kept = [i for i in range(n) if src.shape[i] != 1]
    now = [i for i in range(out.dim()) if out.shape[i] != 1]
    if src.shape[dim] == 1 or [src.shape[i] for i in kept] != [out.shape[i] for i in now]:
        return None
    return now[kept.index(dim % n)] - out.dim()


def _merged_repeat(tag, shape):
    """An expanded 5-d tensor ("R", dim, n, shape) viewed as 4-d (batch, heads, seq, head dim) with
    the expanded dim merged into the heads dim: merged with the dim before it is repeat_interleave
    order (head h reads K/V head h // n), with the one after, tiled order. Anything else (a repeat
    along the sequence, ...) is not a head repeat."""
    _, i, n, src = tag
    shape = tuple(shape)
    if i == 2 and shape == src[:1] + (src[1] * n,) + src[3:]:
        return ("K", n, True)
    if i == 1 and shape == src[:1] + (n * src[2],) + src[3:]:
        return ("K", n, False)
    return None


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _transposed(operand) -> tuple:
    shape, stride, dtype = operand
    return (torch.Size(shape[:-2] + (shape[-1], shape[-2])), stride[:-2] + (stride[-1], stride[-2]), dtype)


def _column_major(operand) -> bool:
    shape, stride, _ = operand
    return stride[0] == 1 and stride[1] == shape[0]


def derive_backward_gemms(op: str, sig: tuple, grads: tuple) -> list:
    """The GEMMs autograd runs in the backward of one forward GEMM whose two matrix operands
    required grad as `grads` says: (op, qualname, sig, out) each, as torch's formulas issue them
    (mm_mat1_backward / mm_mat2_backward for mm and addmm, which keep a column-major operand's
    gradient column-major; grad.bmm(b^T) and a^T.bmm(grad) for bmm and baddbmm). The incoming
    gradient is taken as contiguous; ops without a GEMM backward give none."""
    if op in ("mm", "addmm"):
        name, batched = "mm", False
    elif op in ("bmm", "baddbmm"):
        name, batched = "bmm", True
    else:
        return []
    a, b = (sig[1], sig[2]) if op in _BIAS_FIRST_GEMMS else (sig[0], sig[1])
    dtype = a[2]
    out_shape = tuple(a[0][:-1]) + (b[0][-1],)
    grad = (torch.Size(out_shape), _contiguous_strides(out_shape), dtype)
    qualname = "aten::" + name

    def gemm(x, y):
        return (name, qualname, (x, y), (torch.Size(tuple(x[0][:-1]) + (y[0][-1],)), dtype, ""))

    gemms = []
    if grads[0]:
        gemms.append(gemm(b, _transposed(grad)) if not batched and _column_major(a) else gemm(grad, _transposed(b)))
    if grads[1]:
        gemms.append(gemm(_transposed(grad), a) if not batched and _column_major(b) else gemm(_transposed(a), grad))
    return gemms


def _mark_handler_skipped() -> bool:
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        return False
    set_code_exec_strategy(_handler_code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    return True


# id(OpOverload) -> (name, qualname, unrecorded (a view, ...), full_sig, is_copy, is_gemm, is_batched_gemm,
#                    the OpOverload (kept alive, so that its id stays its own), what to call,
#                    not recorded in backward)
_OP_INFO: dict = {}


class OpInfo(NamedTuple):
    """What the guard needs to know of an aten op, worked out once per op overload."""
    name: str                  # the overload packet's name: "mm", "clone"
    qualname: str              # "aten::mm"
    unrecorded: bool           # a view or a profiler marker: no key, no count
    full_sig: bool             # its key keeps strides and dtypes too
    is_copy: bool
    is_gemm: bool
    is_bgemm: bool             # a batched GEMM (bmm, baddbmm)
    func: object               # the OpOverload
    op: object                 # what to call: the overload's C++ op, one Python frame less
    unread_in_backward: bool   # in backward, no check reads it: not recorded there
    reads_to_host: bool        # hands a value to the host (HOST_READ_OPS)
    from_host_data: bool       # makes a tensor from Python data (FROM_HOST_DATA_OPS)


def _op_info(func) -> OpInfo:
    info = _OP_INFO.get(id(func))
    if info is None:
        name = func.overloadpacket.__name__
        # OpOverload.__call__ is `return self._op(*args, **kwargs)`: call _op directly and save
        # a Python frame per op. Subclasses (TorchBindOpOverload, ...) keep their own __call__.
        op = func._op if type(func) is torch._ops.OpOverload else func
        # Backward aten ops other than GEMMs are not recorded: no check reads them (collectives
        # and other namespaces are kept).
        namespace = getattr(func, "namespace", "")
        unread_in_backward = namespace == "aten" and name not in GEMM_OPS
        # Not recorded: views (only dataflow tags follow them) and profiler markers (the exit of
        # optimizer.step()'s record_function falls after its step hook, in the next step).
        unrecorded = name in VIEW_OPS or namespace == "profiler"
        info = OpInfo(name, func.name(), unrecorded, name in FULL_SIG_OPS, name in COPY_OPS,
                      name in GEMM_OPS, name in BATCHED_GEMM_OPS, func, op, unread_in_backward,
                      name in HOST_READ_OPS, name in FROM_HOST_DATA_OPS)
        _OP_INFO[id(func)] = info
    return info


def _torch_dispatch(self, func, types, args=(), kwargs=None):
    info = _OP_INFO.get(id(func))
    if info is None:
        try:
            info = _op_info(func)
        except Exception as exc:  # never raised into the user's step: the op runs unrecorded
            self.recorder.fail(exc)
            return func(*args, **(kwargs or {}))
    op = info.op
    out = op(*args, **kwargs) if kwargs else op(*args)
    recorder = self.recorder
    recorder.dispatched += 1
    if recorder.enabled:
        try:
            if info.unrecorded:  # a view: no site, no key; only forward dataflow tags follow it
                if args and isinstance(out, Tensor) and (
                        recorder._deps.d or recorder._attn.d or recorder._copies.d or recorder._items.d
                        or info.name == "expand" or info.name in PERMUTE_OPS):
                    recorder._view(info.name, args, out)
                return out
            node = _current_autograd_node()
            if node is not None and info.unread_in_backward and not recorder.profile_cuda:
                return out  # a backward op no check reads (see _op_info)
            # f_back, not _getframe(1): on autograd's device threads no Python frame called us
            frame = _getframe(0).f_back
            # past the wrappers torch puts around __torch_dispatch__ (inlined: this runs per op)
            while frame is not None:
                code = frame.f_code
                wrapper = _wrapper_code.get(id(code))
                if wrapper is None:
                    wrapper = _wrapper_code[id(code)] = (code.co_filename in _DISPATCH_WRAPPERS, code)
                if not wrapper[0]:
                    break
                frame = frame.f_back
            recorder.record(func, args, kwargs, out, frame, info, node)
        except Exception as exc:  # never raised into the user's step
            recorder.fail(exc)
    return out


_handler_code = _torch_dispatch.__code__


class CaptureMode(TorchDispatchMode):
    """The dispatch mode. It never changes what an op computes: it runs the op, then records."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, an active mode makes torch.compile fall back to eager.
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Dynamo must never trace the handler. torch's default wraps it in torch._dynamo.disable,
        # which costs more per op than the recording itself; marking its code object SKIP
        # (recursively) does the same for free where this torch has the hook.
        return not _mark_handler_skipped()

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    # It never changes what an op computes: it runs the op, then records.
    __torch_dispatch__ = _torch_dispatch


class _EngineRunningBackwardUnobserved:
    """Stands in for autograd's engine (`Variable._execution_engine`) while a guard observes: it
    runs each backward pass with the capture modes on top of this thread's dispatch mode stack
    taken off (autograd's worker threads inherit the stack as it is then), and afterwards lets
    their recorders derive the backward GEMMs. Everything else goes to the real engine."""

    def __init__(self, engine):
        self._engine = engine

    def run_backward(self, *args, **kwargs):
        popped = _pop_capture_modes()
        try:
            return self._engine.run_backward(*args, **kwargs)
        finally:
            for mode in reversed(popped):
                _push_mode(mode)
            # with those of the guards whose mode is off for this part of their step (slices.py)
            recorders = [mode.recorder for mode in popped]
            recorders += [r for r in _engine_holders if r.paused and r not in recorders]
            for recorder in recorders:
                try:
                    recorder.backward_ran()
                except Exception as exc:  # never raised into the user's step
                    recorder.fail(exc, "backward GEMMs")

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _pop_capture_modes() -> list:
    """Take the guards' modes that derive their backward GEMMs off the top of the mode stack."""
    popped = []
    top = None
    try:
        while True:
            depth = _len_torch_dispatch_stack()
            if not depth:
                break
            top = _get_dispatch_stack_at(depth - 1)
            if not (isinstance(top, CaptureMode) and top.recorder.derive_backward and not top.recorder.saw_compiled):
                break
            popped.append(_pop_mode())
    except Exception as exc:  # the backward then runs observed by what is left on the stack
        if isinstance(top, CaptureMode):
            top.recorder.fail(exc, "pausing for backward")
    return popped


_engine_lock = threading.Lock()
_engine_holders: list = []  # the recorders of the guards holding the engine (those paused derive too)


def hold_backward_engine(recorder: Recorder) -> None:
    """While held (by any guard that is observing), backward passes run without capture modes."""
    from torch.autograd.variable import Variable

    with _engine_lock:
        if not _engine_holders and not isinstance(Variable._execution_engine, _EngineRunningBackwardUnobserved):
            Variable._execution_engine = _EngineRunningBackwardUnobserved(Variable._execution_engine)
        _engine_holders.append(recorder)


def release_backward_engine(recorder: Recorder) -> None:
    from torch.autograd.variable import Variable

    with _engine_lock:
        if recorder in _engine_holders:
            _engine_holders.remove(recorder)
        engine = Variable._execution_engine
        # Someone who wrapped the engine after us keeps theirs (ours underneath passes through).
        if not _engine_holders and isinstance(engine, _EngineRunningBackwardUnobserved):
            Variable._execution_engine = engine._engine


def attribute_kernels(recorder: Recorder, prof) -> None:
    """Attach the profiler's CUDA kernels to recorded op keys by aligning op names in order."""
    rec = recorder.rec
    rec.profiled = True
    events = [e for e in prof.events() if getattr(e, "kernels", None)]
    events.sort(key=lambda e: e.time_range.start)
    sequence = recorder.sequence
    pos = 0
    lookahead = 64
    for e in events:
        n = len(e.kernels)
        us = sum(k.duration for k in e.kernels)
        rec.kernels_total += n
        rec.kernel_us_total += us
        rec.triton_kernels += sum(1 for k in e.kernels if k.name.startswith("triton"))
        match = None
        for i in range(pos, min(pos + lookahead, len(sequence))):
            if sequence[i].qualname == e.name:
                match = i
                break
        if match is None:
            rec.kernels_unattributed += n
            continue
        stat = rec.ops.get(sequence[match])
        if stat is not None:
            stat.launches += n
            stat.kernel_us += us
        pos = match + 1
    recorder.sequence = []
