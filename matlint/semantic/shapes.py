"""Symbolic tensor shapes, inferred intra-procedurally without importing torch.

A shape is a tuple of dims; a dim is a literal int, a named symbol (`Sym`: `B`, `self.n_embd`, a
parameter, `B * T`) or None (unknown). A shape may also say that an unknown number of unknown
dims precede its known trailing dims (`Shape.leading`: `nn.Linear(d, 1)` maps anything to
`(..., 1)`). A whole value the analysis cannot read is None: unknown is a first-class answer and
the analysis never guesses. Two symbols are equal only when they are written the same way in the
same scope; different symbols may still be equal at run time, so rules never treat them as
different.

Each function is analysed once, lazily, the first time a rule asks about an expression in it
(`shape_of(ctx, expr)`), walking its statements in order with an environment of names and
recording the value of every expression it evaluates. Branches are merged (a name whose value
differs between branches becomes unknown); names assigned in a loop are unknown inside and after
it. `self.<attr>` modules, sizes and numbers come from the class's `__init__`.

`Shape.explicit` remembers the axes (counted from the end) whose size 1 the author asked for on
purpose (`x[:, None]`, `unsqueeze`, `keepdim=True`, a literal 1 in `view`/`reshape`):
broadcasting against them is intended, and the MAT2xx rules stay quiet. A slice that happens to
keep one element (`boxes[:, 2:3]`) states no such intent, nor does a 1 made for `gather`'s
index (the result has the index's shape, but the 1 was asked for to pick one element per row),
nor one that meets a singleton nobody asked for in an element-wise op (`r.view(-1, 1) -
critic(s)`): it was asked for to line the two up.

Where shapes come from: constructors (`randn/zeros/ones/empty/full/rand/randint/arange/linspace/
eye`, `*_like`, `new_*`, `torch.tensor` of literal nests); jaxtyping/torchtyping annotations;
`assert x.shape == (B, T)` / `x.ndim == 3` / `x.shape[0] == B` (one dim of a tensor of known rank,
or the last dims: `x.shape[-1] == D` gives `(..., D)`); `B, T, C = x.shape` (which also tells x's rank);
`view`/`reshape` with explicit sizes; modules built in `__init__` or locally (`nn.Linear`,
`nn.Embedding`, `nn.Conv1d/2d/3d` channels, `nn.Sequential` chains, shape-keeping layers; an item
of an `nn.ModuleList`/`nn.ModuleDict` taken by a fixed key, `self.heads[0]`, where `__init__` builds
that item in the call, or builds every item with one comprehension expression that reads none of
its own names, and the class never changes the container in place).
Python numbers keep a tensor's shape: literals, `math.*` calls, sizes, parameters annotated `float`
or given a float default, and any arithmetic among them (`1.0 / math.sqrt(D)`, `D ** -0.5`).
A module-level name bound once to an int literal (`BATCH_SIZE = 128`) and never declared
`global` is that size in every function; `deepcopy(self.critic)` in `__init__` holds the critic's
class (a target network). What a method stores in `self.<attr>` it reads back further down, where
no other method but `__init__` stores that attribute. A size the analysis cannot read still
counts as a dim: `x.view(-1, 64 * (s // 2) ** 2)` is `(?, ?)` and `nn.Linear(d, self.n + self.k)`
maps to `(..., ?)`.

Left unknown on purpose: unannotated parameters and values returned by user functions (no
inter-procedural analysis); `squeeze()` / `squeeze(d)` over a symbolic size (it may be 1); a
`-1` in `view` unless the input's sizes are all known; advanced and boolean indexing;
`chunk`/`split`/`unbind`; `F.pad`/`interpolate`; convolution spatial sizes; `view(dtype)`; a
single name passed as a size (`zeros(shape)`: it may be a tuple); `nn.ModuleList` and layers
indexed by a variable or looped over; any operand that may be a tensor of unknown shape (`x * self.scale`, unless
`__init__` sets it to a number).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType, SimpleNamespace
from typing import Callable, Optional

from .calls import argument_for, file_calls
from .flow import flow_of, has_word
from .kinds import (class_attribute_values, fixed_key, identifier_text, imported_class, int_const, may_mention, module_container,
                    mutated_attributes, names_used_as_counts)
from .loops import scope_statements
from .project import import_table, in_script_project
from .tree import child_nodes, function_text, walk

# -- dims -----------------------------------------------------------------------------------


class Sym:
    """A named size. `scope` keeps apart equally spelled names from different namespaces
    (a jaxtyping axis name, a local of `__init__`) that need not be the same size."""

    __slots__ = ("text", "scope", "factors")

    def __init__(self, text: str, scope: str = "", factors: tuple = ()):
        self.text = text
        self.scope = scope
        self.factors = factors  # for products: the atomic symbols multiplied

    def __eq__(self, other):
        return isinstance(other, Sym) and self.text == other.text and self.scope == other.scope

    def __hash__(self):
        return hash((self.text, self.scope))

    def __repr__(self):
        return self.text


def fmt_dim(d) -> str:
    return "?" if d is None else str(d)


def dim_eq(a, b) -> bool:
    """Known to be the same size."""
    return a is not None and b is not None and type(a) is type(b) and a == b


def _atom(d) -> str:
    text = fmt_dim(d)
    return f"({text})" if " " in text else text


def _scope_of(*dims) -> str:
    return "|".join(sorted({d.scope for d in dims if isinstance(d, Sym) and d.scope}))


def dim_product(dims):
    """Product of dims in one canonical spelling (`B * T` whichever order it was written in)."""
    coef, syms = 1, []
    for d in dims:
        if d is None:
            return None
        if isinstance(d, int):
            coef *= d
        elif d.factors:
            syms.extend(d.factors)
        else:
            syms.append(d)
    if not syms:
        return coef
    if coef == 0:
        return 0
    syms.sort(key=lambda s: (s.text, s.scope))
    parts = ([str(coef)] if coef != 1 else []) + [_atom(s) for s in syms]
    if len(parts) == 1:
        return syms[0]
    return Sym(" * ".join(parts), _scope_of(*syms), tuple(syms) + ((coef,) if coef != 1 else ()))


def _factors(d):
    """(int coefficient, list of atomic symbols) of a dim, or None if unknown."""
    if d is None:
        return None
    if isinstance(d, int):
        return d, []
    if d.factors:
        coef = 1
        syms = []
        for f in d.factors:
            if isinstance(f, int):
                coef *= f
            else:
                syms.append(f)
        return coef, syms
    return 1, [d]


def dim_quotient(total: list, known: list):
    """prod(total) / prod(known) when it divides exactly, symbol by symbol; else None."""
    coef, syms = 1, []
    for d in total:
        f = _factors(d)
        if f is None:
            return None
        coef *= f[0]
        syms.extend(f[1])
    for d in known:
        f = _factors(d)
        if f is None or f[0] == 0 or coef % f[0]:
            return None
        coef //= f[0]
        for s in f[1]:
            if s not in syms:
                return None
            syms.remove(s)
    return dim_product([coef] + syms)


_DIM_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def dim_binop(op: ast.operator, a, b):
    sign = _DIM_OPS.get(type(op))
    if sign is None or a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        if sign in ("//", "%") and b == 0:
            return None
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else None, "%": a % b if b else None}[sign]
    if sign == "*":
        return dim_product([a, b])
    if sign == "//" and isinstance(b, int) and b == 1:
        return a
    if sign in ("+", "-") and isinstance(b, int) and b == 0:
        return a
    return Sym(f"{_atom(a)} {sign} {_atom(b)}", _scope_of(a, b))


# -- shapes ---------------------------------------------------------------------------------

# The values below are never changed once made, but they are not `frozen` dataclasses: a frozen
# dataclass's __init__ sets each field through object.__setattr__, twice the cost, and the
# analysis makes one value per expression it reads. `unsafe_hash` hashes them as frozen ones are.
_value_class = dataclass(unsafe_hash=True)


@_value_class
class Shape:
    dims: tuple
    leading: bool = False          # unknown dims (any number, maybe none) before `dims`
    explicit: frozenset = frozenset()  # negative axes whose size 1 was asked for on purpose

    @property
    def rank(self) -> Optional[int]:
        return None if self.leading else len(self.dims)

    @property
    def known(self) -> bool:
        """Exact rank and every dim known."""
        return not self.leading and all(d is not None for d in self.dims)

    def at(self, axis: int):
        """Dim at `axis` (negative counts from the end), None when not known."""
        n = len(self.dims)
        if axis < 0:
            return self.dims[axis] if -axis <= n else None
        return self.dims[axis] if not self.leading and axis < n else None

    def __str__(self) -> str:
        parts = (["..."] if self.leading else []) + [fmt_dim(d) for d in self.dims]
        if len(parts) == 1 and not self.leading:
            return f"({parts[0]},)"
        return "(" + ", ".join(parts) + ")"


def make_shape(dims, leading=False, explicit=()) -> Shape:
    dims = tuple(dims)
    kept = frozenset(a for a in explicit if -len(dims) <= a < 0 and dims[a] == 1)
    return Shape(dims, leading, kept)


def _normalize_axis(axis, rank):
    if not isinstance(axis, int) or rank is None:
        return None
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None


def broadcast_dim(a, b):
    """The broadcast of two aligned dims in every run where broadcasting succeeds."""
    if a == "absent":
        return b
    if b == "absent":
        return a
    if dim_eq(a, b):
        return a
    if a == 1 and isinstance(a, int):
        return b
    if b == 1 and isinstance(b, int):
        return a
    if isinstance(a, int) and a > 1 and (b is None or isinstance(b, Sym)):
        return a
    if isinstance(b, int) and b > 1 and (a is None or isinstance(a, Sym)):
        return b
    return None


def aligned_pairs(a: Shape, b: Shape):
    """Pairs of dims aligned from the right; "absent" where a shape of known rank has run out,
    None where an unknown leading dim stands."""
    n = max(len(a.dims), len(b.dims))
    pairs = []
    for i in range(-n, 0):
        pairs.append((_dim_or_pad(a, i), _dim_or_pad(b, i)))
    return pairs


def _dim_or_pad(s: Shape, i: int):
    if -i <= len(s.dims):
        return s.dims[i]
    return None if s.leading else "absent"


def broadcast(a: Optional[Shape], b: Optional[Shape]) -> Optional[Shape]:
    if a is None or b is None:
        return None
    dims = [broadcast_dim(x, y) for x, y in aligned_pairs(a, b)]
    # A singleton asked for on one side meets a singleton of the other that was not: the 1 was
    # asked for to line the two up (`r.view(-1, 1) - critic(s)`), no broadcast is meant from here.
    unasked = {axis for axis in a.explicit ^ b.explicit
               if _dim_or_pad(a, axis) == 1 and _dim_or_pad(b, axis) == 1}
    explicit = (a.explicit | b.explicit) - unasked
    return make_shape(dims, a.leading or b.leading, explicit)


def broadcast_is_valid(a: Shape, b: Shape) -> bool:
    """Broadcasting succeeds whatever the symbols stand for (each aligned pair is equal, or one
    side is a literal 1 or absent). Both shapes need an exact rank."""
    if a.leading or b.leading:
        return False
    for x, y in aligned_pairs(a, b):
        if x == "absent" or y == "absent" or dim_eq(x, y) or x == 1 or y == 1:
            continue
        return False
    return True


# -- values the analysis tracks ---------------------------------------------------------------


@_value_class
class IntVal:
    """A Python int (a size, an axis, a count); `dim` is its value as a dim."""
    dim: object = None


@_value_class
class Opaque:
    """Something the analysis cannot read; if it is used as a size, it is the symbol `sym`."""
    sym: Optional[Sym] = None


@_value_class
class Scalar:
    """A Python float or other number that is not a tensor."""


SCALAR = Scalar()


@_value_class
class Seq:
    """A tuple or list literal (or a tuple result such as `x.max(dim)`), item by item."""
    items: tuple


@_value_class
class SizeVal:
    """`x.shape` / `x.size()`: a tuple of dims."""
    shape: Shape


@dataclass(eq=False)
class Module:
    """An nn.Module whose effect on shapes is known (`apply(shape) -> shape`)."""
    name: str
    apply: Callable = field(repr=False)


@dataclass(eq=False)
class ModuleItems:
    """An `nn.ModuleList` / `nn.ModuleDict` whose items are known layers: `items` maps fixed keys
    (positions, names) to them; `every` is the layer each item is, where one expression builds
    them all (`[nn.Linear(d, 1) for _ in range(n)]`)."""
    items: dict
    every: Optional[Module] = None


@dataclass(eq=False)
class Instance:
    """An instance of a class of this file or of a project module it imports (`self.critic =
    Critic(d)`, `memory = ReplayBuffer()`, `net = Net()` after `from model import Net`): calling
    it, or one of its methods, gives what that method returns for these arguments, read in
    `source`, the file that defines the class. Instances of one class are alike: what its
    methods return depends on the arguments only."""
    cls: ast.ClassDef
    source: object = field(default=None, repr=False)
    # The sizes the constructor was given, as `(parameter, IntVal)` pairs: a literal int passed
    # (`Critic(d, 1)`) or a parameter's int default left in place. Each sets what `__init__`
    # builds from that parameter (`nn.Linear(hidden, output_size)`).
    sizes: tuple = ()

    def __eq__(self, other):
        return isinstance(other, Instance) and other.cls is self.cls and other.sizes == self.sizes

    def __hash__(self):
        return hash((id(self.cls), self.sizes))


@_value_class
class Loss:
    """A loss module instance (`nn.MSELoss()`, named by its class) or a loss function held as
    a value (`self.criterion = F.mse_loss`, named by the function)."""
    name: str
    reduction_given: bool = False


def as_shape(value) -> Optional[Shape]:
    return value if isinstance(value, Shape) else None


def as_dim(value):
    if isinstance(value, IntVal):
        return value.dim
    if isinstance(value, Opaque):
        return value.sym
    return None


def as_dims(value):
    """A size given as a tuple/list/`x.shape`: (dims, leading) or None."""
    if isinstance(value, SizeVal):
        return value.shape.dims, value.shape.leading
    if isinstance(value, Seq):
        dims = []
        for item in value.items:
            if not isinstance(item, (IntVal, Opaque)):
                return None
            dims.append(as_dim(item))
        return tuple(dims), False
    return None


def _is_scalar(value) -> bool:
    return isinstance(value, (IntVal, Scalar))


def _int_const(value) -> Optional[int]:
    if isinstance(value, IntVal) and isinstance(value.dim, int):
        return value.dim
    return None


# -- operations on shapes ----------------------------------------------------------------------


def op_unsqueeze(s: Shape, axis) -> Optional[Shape]:
    if not isinstance(axis, int):
        return None
    if axis < 0:
        pos = len(s.dims) + 1 + axis
        if pos < 0:
            return None
        dims = s.dims[:pos] + (1,) + s.dims[pos:]
        explicit = _shift_explicit(s, pos) | {pos - len(dims)}
        return make_shape(dims, s.leading, explicit)
    if s.leading or axis > len(s.dims):
        return None
    dims = s.dims[:axis] + (1,) + s.dims[axis:]
    return make_shape(dims, False, _shift_explicit(s, axis) | {axis - len(dims)})


def _shift_explicit(s: Shape, pos: int) -> set:
    """Explicit axes after inserting one dim at position `pos` of s.dims."""
    out = set()
    for a in s.explicit:
        index = len(s.dims) + a
        out.add(a if index >= pos else a - 1)
    return out


def op_squeeze(s: Shape, axes) -> Optional[Shape]:
    if axes is None:
        if s.leading or any(not isinstance(d, int) for d in s.dims):
            return None  # a symbol may be 1 at run time
        return make_shape([d for d in s.dims if d != 1])
    positions = set()
    for axis in axes:
        if not isinstance(axis, int):
            return None
        pos = axis + len(s.dims) if axis < 0 else axis
        if pos < 0 or pos >= len(s.dims) or (axis >= 0 and s.leading):
            return None
        d = s.dims[pos]
        if d == 1 and isinstance(d, int):
            positions.add(pos)
        elif not (isinstance(d, int) and d != 1):
            return None  # unknown whether that dim is 1
    dims = [d for i, d in enumerate(s.dims) if i not in positions]
    explicit = set()
    for a in s.explicit:
        index = len(s.dims) + a
        if index in positions:
            continue
        explicit.add(a + sum(1 for p in positions if p > index))
    return make_shape(dims, s.leading, explicit)


def op_flatten(s: Shape, start=0, end=-1) -> Optional[Shape]:
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    if s.leading:
        if start >= 0:
            if start == 0 and end == -1:
                return make_shape([None])
            if end == -1:
                return make_shape([None] * start + [None]) if start > 0 else None
            return None
        if end >= 0 or -start > len(s.dims):
            return None
        a, b = len(s.dims) + start, len(s.dims) + end
        return make_shape(s.dims[:a] + (dim_product(s.dims[a:b + 1]),) + s.dims[b + 1:], True)
    if not s.dims:
        return make_shape([1])
    a, b = _normalize_axis(start, len(s.dims)), _normalize_axis(end, len(s.dims))
    if a is None or b is None or a > b:
        return None
    return make_shape(s.dims[:a] + (dim_product(s.dims[a:b + 1]),) + s.dims[b + 1:])


def op_view(s: Optional[Shape], target, literal_ones=()) -> Optional[Shape]:
    """`view`/`reshape` to `target` dims (-1 for the one to infer). `literal_ones` are the
    positions where the author wrote a literal 1."""
    dims = list(target)
    holes = [i for i, d in enumerate(dims) if d == -1 and isinstance(d, int)]
    if len(holes) > 1:
        return None
    if holes:
        rest = [d for i, d in enumerate(dims) if i != holes[0]]
        dims[holes[0]] = (dim_quotient(list(s.dims), rest)
                          if s is not None and s.known else None)
    explicit = {i - len(dims) for i in literal_ones}
    return make_shape(dims, False, explicit)


def op_permute(s: Shape, order) -> Optional[Shape]:
    if s.leading or len(order) != len(s.dims):
        return None
    norm = [_normalize_axis(a, len(s.dims)) for a in order]
    if None in norm or sorted(norm) != list(range(len(s.dims))):
        return None
    n = len(s.dims)
    explicit = {norm.index(n + a) - n for a in s.explicit}
    return make_shape([s.dims[i] for i in norm], False, explicit)


def op_transpose(s: Shape, a, b) -> Optional[Shape]:
    if not isinstance(a, int) or not isinstance(b, int):
        return None
    n = len(s.dims)
    if s.leading:
        if a >= 0 or b >= 0 or -a > n or -b > n:
            return None
        a, b = a + n, b + n
    else:
        a, b = _normalize_axis(a, n), _normalize_axis(b, n)
        if a is None or b is None:
            return None
    dims = list(s.dims)
    dims[a], dims[b] = dims[b], dims[a]
    swap = {a - n: b - n, b - n: a - n}
    return make_shape(dims, s.leading, {swap.get(x, x) for x in s.explicit})


def op_reduce(s: Shape, axes, keepdim: bool) -> Optional[Shape]:
    """Reduce over `axes` (None: all of them)."""
    if axes is None:
        if keepdim:
            return None if s.leading else make_shape([1] * len(s.dims), False, range(-len(s.dims), 0))
        return make_shape([])
    n = len(s.dims)
    positions = set()
    for axis in axes:
        if not isinstance(axis, int):
            return None
        if s.leading:
            if axis >= 0 or -axis > n:
                return None
            positions.add(axis + n)
        else:
            pos = _normalize_axis(axis, n)
            if pos is None:
                return None
            positions.add(pos)
    if keepdim:
        dims = [1 if i in positions else d for i, d in enumerate(s.dims)]
        return make_shape(dims, s.leading, s.explicit | {p - n for p in positions})
    dims = [d for i, d in enumerate(s.dims) if i not in positions]
    explicit = set()
    for a in s.explicit:
        index = n + a
        if index not in positions:
            explicit.add(a + sum(1 for p in positions if p > index))
    return make_shape(dims, s.leading, explicit)


def op_matmul(a: Shape, b: Shape) -> Optional[Shape]:
    if a.rank == 1 and b.rank == 1:
        return make_shape([])
    if a.rank == 1:
        if len(b.dims) < 2:
            return None
        return make_shape(b.dims[:-2] + b.dims[-1:], b.leading)
    if b.rank == 1:
        if len(a.dims) < 2:
            return None
        return make_shape(a.dims[:-1], a.leading)
    if len(a.dims) < 2 or len(b.dims) < 2:
        return None
    batch = broadcast(make_shape(a.dims[:-2], a.leading), make_shape(b.dims[:-2], b.leading))
    if batch is None:
        return None
    return make_shape(batch.dims + (a.dims[-2], b.dims[-1]), batch.leading)


def op_cat(shapes, axis) -> Optional[Shape]:
    if not shapes or not isinstance(axis, int):
        return None
    ranked = [s for s in shapes if s is not None and not s.leading]
    if ranked and len(ranked) < len(shapes):
        # cat takes tensors of one rank: an operand of unknown shape has the others' rank
        shapes = [s if s is not None else make_shape([None] * len(ranked[0].dims)) for s in shapes]
    if any(s is None for s in shapes):
        return None
    first = shapes[0]
    if any(s.leading != first.leading or len(s.dims) != len(first.dims) for s in shapes):
        return None
    n = len(first.dims)
    pos = axis + n if axis < 0 else (None if first.leading else axis)
    if pos is None or not 0 <= pos < n:
        return None
    dims = []
    for i in range(n):
        column = [s.dims[i] for s in shapes]
        if i == pos:
            total = column[0]
            for d in column[1:]:
                total = dim_binop(ast.Add(), total, d)
            dims.append(total)
        else:
            dims.append(column[0] if all(dim_eq(column[0], d) for d in column[1:]) else None)
    return make_shape(dims, first.leading)


def op_stack(shapes, axis) -> Optional[Shape]:
    if not shapes or any(s is None for s in shapes) or not isinstance(axis, int):
        return None
    first = replace(shapes[0], explicit=frozenset())
    if any(replace(s, explicit=frozenset()) != first for s in shapes[1:]):
        return None
    n = len(first.dims)
    if axis < 0:
        pos = n + 1 + axis
        if pos < 0:
            return None
    elif first.leading or axis > n:
        return None
    else:
        pos = axis
    return make_shape(first.dims[:pos] + (len(shapes),) + first.dims[pos:], first.leading)


_EINSUM_LETTERS = re.compile(r"^[a-zA-Z.]*$")


def op_einsum(equation: str, shapes) -> Optional[Shape]:
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    terms = lhs.split(",")
    if len(terms) != len(shapes) or any(s is None for s in shapes):
        return None
    if not all(_EINSUM_LETTERS.match(t) for t in terms + ([out] if out is not None else [])):
        return None
    sizes: dict = {}
    ellipsis = []
    for term, s in zip(terms, shapes):
        has_ellipsis = "..." in term
        letters = term.replace("...", "")
        if "." in letters:
            return None
        n = len(letters)
        if has_ellipsis:
            head, _, tail = term.partition("...")
            if len(s.dims) < n:
                return None
            before = s.dims[:len(head)] if not s.leading else None
            if s.leading and head:
                return None
            after = s.dims[len(s.dims) - len(tail):] if tail else ()
            middle = s.dims[len(head):len(s.dims) - len(tail)]
            ellipsis.append(make_shape(middle, s.leading))
            dims = (tuple(before) if before else ()) + tuple(after)
        else:
            if s.leading:
                if len(s.dims) < n:
                    return None
                dims = s.dims[len(s.dims) - n:]
            elif len(s.dims) != n:
                return None
            else:
                dims = s.dims
        for letter, d in zip(letters, dims):
            prev = sizes.get(letter, "absent")
            sizes[letter] = broadcast_dim(prev, d)
    if out is None:
        counts = {}
        for t in terms:
            for c in t.replace("...", ""):
                counts[c] = counts.get(c, 0) + 1
        out = ("..." if ellipsis else "") + "".join(sorted(c for c, k in counts.items() if k == 1))
    prefix = None
    if ellipsis:
        prefix = ellipsis[0]
        for e in ellipsis[1:]:
            prefix = broadcast(prefix, e)
        if prefix is None:
            return None
    if "..." in out:
        head, _, tail = out.partition("...")
        if head or prefix is None:
            return None if head else make_shape([sizes.get(c) for c in tail])
        return make_shape(prefix.dims + tuple(sizes.get(c) for c in tail), prefix.leading)
    if any(c not in sizes for c in out):
        return None
    return make_shape([sizes[c] for c in out])


def op_linear(s: Optional[Shape], out_dim) -> Shape:
    if s is None or not s.dims:
        return make_shape([out_dim], True)
    return make_shape(s.dims[:-1] + (out_dim,), s.leading)


# -- what torch's names do ----------------------------------------------------------------------

_CONSTRUCTORS = {"zeros", "ones", "empty", "rand", "randn", "full"}
_LIKE = {"zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "full_like", "randint_like"}
_SAME_SHAPE_METHODS = {
    "float", "double", "half", "bfloat16", "int", "long", "bool", "short", "byte", "char", "to",
    "type_as", "contiguous", "detach", "detach_", "clone", "cpu", "cuda", "abs", "neg",
    "negative", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid",
    "tanh", "relu", "sin", "cos", "tan", "sign", "sgn", "round", "floor", "ceil", "trunc", "frac",
    "square", "reciprocal", "softmax", "log_softmax", "cumsum", "cumprod", "flip", "fliplr", "roll",
    "requires_grad_", "pin_memory", "masked_fill_", "fill_", "zero_", "normal_", "uniform_",
    "nan_to_num", "erf", "erfinv", "sigmoid_", "relu_", "clamp_", "clamp_min_", "abs_", "exp_",
    "log_", "sqrt_", "neg_", "tril", "triu", "tril_", "triu_", "logical_not", "bitwise_not", "isnan",
    "isinf", "isfinite", "share_memory_", "retain_grad", "sinh", "cosh", "asin", "acos", "atan",
    "digamma", "lgamma", "logit", "mish", "silu", "gelu", "add_", "sub_", "mul_", "div_", "pow_",
    "copy_", "index_fill", "index_fill_", "scatter", "scatter_", "scatter_add", "scatter_add_",
    "argsort",
}
# Element-wise with operands that may be tensors: the result broadcasts over all of them.
_BROADCASTING_METHODS = {"clamp": ("min", "max"), "clip": ("min", "max"), "clamp_min": ("min",),
                         "clamp_max": ("max",), "masked_fill": ("mask", "value")}
_BINARY = {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
           "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum", "fmax", "fmin", "eq",
           "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal", "less_equal",
           "not_equal", "logical_and", "logical_or", "logical_xor", "atan2", "hypot", "rsub",
           "bitwise_and", "bitwise_or", "bitwise_xor", "xlogy", "copysign"}
_REDUCTIONS = {"sum", "mean", "prod", "amax", "amin", "logsumexp", "nansum", "nanmean", "all",
               "any", "argmax", "argmin", "count_nonzero", "std", "var"}
_PAIR_REDUCTIONS = {"max", "min", "median", "mode", "nanmedian"}


def reduces_every_element(expr: ast.AST) -> bool:
    """`R.mean()`, `(a - b).pow(2).sum()`, `x.max()`: a reduction method called with no argument,
    which the analysis gives the shape `()` (one value of all the elements)."""
    return (expr.__class__ is ast.Call and expr.func.__class__ is ast.Attribute and not expr.args
            and not expr.keywords and (expr.func.attr in _REDUCTIONS or expr.func.attr in _PAIR_REDUCTIONS
                                       or expr.func.attr == "norm"))
_FUNCTIONAL_SAME = {
    "relu", "relu6", "gelu", "silu", "elu", "selu", "celu", "leaky_relu", "softplus", "mish",
    "hardswish", "hardsigmoid", "hardtanh", "sigmoid", "tanh", "logsigmoid", "softsign",
    "tanhshrink", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "normalize",
    "layer_norm", "group_norm", "batch_norm", "instance_norm", "local_response_norm", "rms_norm",
    "softmax", "log_softmax", "softmin", "gumbel_softmax", "threshold", "prelu", "rrelu",
}
_SAME_MODULES = {
    "ReLU", "ReLU6", "GELU", "SiLU", "ELU", "SELU", "CELU", "LeakyReLU", "Softplus", "Mish",
    "Hardswish", "Hardsigmoid", "Hardtanh", "Sigmoid", "Tanh", "LogSigmoid", "Softsign", "PReLU",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "LayerNorm", "RMSNorm",
    "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "Identity", "Softmax", "LogSoftmax", "Softmin", "Tanhshrink", "Threshold",
}
LOSS_FUNCTIONS = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                  "binary_cross_entropy_with_logits", "soft_margin_loss"}
LOSS_MODULES = {"MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss",
                "HuberLoss": "huber_loss", "BCELoss": "binary_cross_entropy",
                "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
                "SoftMarginLoss": "soft_margin_loss"}
_OTHER_LOSS_MODULES = {"CrossEntropyLoss", "NLLLoss", "KLDivLoss", "CosineEmbeddingLoss",
                       "MarginRankingLoss", "TripletMarginLoss", "CTCLoss", "PoissonNLLLoss",
                       "GaussianNLLLoss", "MultiLabelSoftMarginLoss", "HingeEmbeddingLoss"}
_JAXTYPING_MODULES = ("jaxtyping.", "torchtyping.")
_NUMBER_CONSTANTS = {"torch.inf", "torch.nan", "torch.pi", "torch.e", "math.inf", "math.nan", "math.pi",
                     "math.e", "math.tau", "numpy.inf", "numpy.nan", "numpy.pi"}


# nn.Module's methods that return the module itself.
_MODULE_RETURNS_SELF = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "double", "bfloat16",
                                  "requires_grad_", "to_empty", "type", "apply", "share_memory"})

# Calls that return their one argument unchanged.
# Calls whose result is their one argument's value: `Variable(x)` is x itself since torch 0.4, and
# `deepcopy(self.critic)` is a module of the same class (a target network).
_IDENTITY_WRAPPERS = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable", "copy.deepcopy",
                                "copy.copy"})


def _torch_name(qual: Optional[str]):
    """('torch', 'zeros') / ('F', 'relu') / ('nn', 'Linear') / ('linalg', 'norm') or None."""
    if not qual:
        return None
    for prefix, space in (("torch.nn.functional.", "F"), ("torch.nn.modules.", "nn"), ("torch.nn.", "nn"),
                          ("torch.linalg.", "linalg"), ("torch.special.", "special"), ("torch.", "torch")):
        if qual.startswith(prefix):
            rest = qual[len(prefix):]
            if space == "nn" and "." in rest:
                rest = rest.rsplit(".", 1)[1]
            if "." in rest:
                return None
            return space, rest
    return None


# -- the analysis of one function -------------------------------------------------------------------


def _target_names(target) -> list:
    """The names a target binds; `self.x` counts as the name `"self.x"` (see `_stored_attr_key`)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return [f"{target.value.id}.{target.attr}"]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


# Methods that change their receiver's shape in place (`y.unsqueeze_(1)`): the name's old shape is gone.
_RESHAPES_IN_PLACE = frozenset({"unsqueeze_", "squeeze_", "resize_", "resize_as_", "t_", "transpose_",
                                "swapdims_", "swapaxes_", "as_strided_", "set_"})


def _reshaped_in_place(node) -> Optional[str]:
    """The name `node` (`y.unsqueeze_(1)`) changes the shape of in place, if any."""
    if node.__class__ is ast.Call:
        func = node.func
        if func.__class__ is ast.Attribute and func.attr in _RESHAPES_IN_PLACE and func.value.__class__ is ast.Name:
            return func.value.id
    return None


# Statements that bind no name (their expressions are read for `:=` and in-place reshapes apart).
_BIND_NOTHING = frozenset({ast.Expr, ast.Return, ast.Pass, ast.Raise, ast.Assert, ast.Break, ast.Continue,
                           ast.Global, ast.Nonlocal})
_NOTHING_BOUND = frozenset()


class _Bindings:
    """Names bound in a function body, found statement by statement (expressions are not
    walked, except for `:=` and in-place reshapes like `y.unsqueeze_(1)`, which rebind `y`):
    how often each is bound (a loop target, augmented assignment or other binding inside a loop
    counts as many), and which names each loop or try statement binds."""

    def __init__(self, body, walrus: bool, reshapes_in_place: bool):
        self.counts: dict = {}
        self.stored: dict = {}  # id(statement) -> names bound inside it
        self._block(body, False)
        if walrus or reshapes_in_place:
            for stmt in body:
                for sub in walk(stmt):
                    if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                        name = sub.target.id
                    else:
                        name = _reshaped_in_place(sub)
                    if name is not None:  # bound many times, and in every loop and try
                        self.counts[name] = self.counts.get(name, 0) + 2
                        for key in self.stored:
                            self.stored[key].add(name)

    def _bump(self, names, in_loop, out: set) -> None:
        for name in names:
            self.counts[name] = self.counts.get(name, 0) + (2 if in_loop else 1)
            out.add(name)

    def _block(self, stmts, in_loop) -> set:
        out: set = set()
        for stmt in stmts:
            out |= self._statement(stmt, in_loop)
        return out

    def _statement(self, stmt, in_loop) -> set:
        # An assignment inside a loop counts once: each pass through the body binds the name anew,
        # and the analysis forgets every name a loop binds where the loop starts and ends, so a
        # symbol for it never meets the value of another iteration.
        if stmt.__class__ in _BIND_NOTHING:
            return _NOTHING_BOUND
        out: set = set()
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                self._bump(_target_names(target), False, out)
        elif isinstance(stmt, ast.AugAssign):
            self._bump(_target_names(stmt.target), True, out)
        elif isinstance(stmt, ast.AnnAssign):
            self._bump(_target_names(stmt.target), False, out)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._bump([stmt.name], in_loop, out)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._bump([(a.asname or a.name).split(".")[0] for a in stmt.names], in_loop, out)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                self._bump(_target_names(target), in_loop, out)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._bump(_target_names(stmt.target), True, out)
            out |= self._block(stmt.body, True) | self._block(stmt.orelse, True)
            self.stored[id(stmt)] = out
        elif isinstance(stmt, ast.While):
            out |= self._block(stmt.body, True) | self._block(stmt.orelse, True)
            self.stored[id(stmt)] = out
        elif isinstance(stmt, ast.If):
            out |= self._block(stmt.body, in_loop) | self._block(stmt.orelse, in_loop)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._bump(_target_names(item.optional_vars), in_loop, out)
            out |= self._block(stmt.body, in_loop)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            body = self._block(stmt.body, in_loop)
            self.stored[id(stmt)] = body
            out |= body
            for handler in stmt.handlers:
                if handler.name:
                    self._bump([handler.name], in_loop, out)
                out |= self._block(handler.body, in_loop)
            out |= self._block(stmt.orelse, in_loop) | self._block(stmt.finalbody, in_loop)
        elif type(stmt).__name__ == "Match":
            for case in stmt.cases:
                names = _pattern_names(case.pattern)
                self._bump(names, in_loop, out)
                out |= self._block(case.body, in_loop)
        return out


def _pattern_names(pattern) -> list:
    return [name for p in ast.walk(pattern) for name in (getattr(p, "name", None), getattr(p, "rest", None))
            if isinstance(name, str)]


def _stored_names(nodes) -> set:
    names = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                names.add(sub.id)
    return names


def _merge(a, b):
    return a if a == b else None


_MISSING = object()


class FunctionShapes:
    """Values of the expressions of one function (or module body, or lambda)."""

    def __init__(self, ctx, owner, class_attrs: Optional[dict] = None, self_name: Optional[str] = None,
                 scope: str = "", init_mode: bool = False, lazy: bool = False, cls: Optional[ast.ClassDef] = None,
                 arguments: Optional[dict] = None, depth: int = 0):
        self.ctx = ctx
        self.owner = owner
        self.cls = cls  # the class `owner` is a method of, whose other methods `self.m(...)` calls
        self.arguments = arguments or {}  # parameter -> the value a caller passes (a call's return, read for it)
        self.depth = depth  # how many calls deep this analysis runs, for a call's return
        self.values: dict = {}
        self.class_attrs = class_attrs or {}
        self.self_name = self_name
        self.scope = scope
        self.init_mode = init_mode
        self.stored_attrs: dict = {}  # init mode: self.<attr> -> value
        self.param_aliases: dict = {}  # init mode: param name -> "self.attr" it is stored to
        self.module_layers: dict = {}  # free name -> the layer or loss the module binds it to (or None)
        body = owner.body if isinstance(owner.body, list) else [owner.body]
        text = _owner_text(ctx, owner)
        self.reshapes_in_place = _RESHAPE_IN_PLACE_TEXT.search(text) is not None
        walrus = ":=" in text
        # `__init__` read for the attributes it stores: its expression statements change nothing
        # it keeps (no value of theirs is asked for), unless one binds a name (`:=`, `x.squeeze_()`).
        self.skips_expressions = init_mode and not walrus and not self.reshapes_in_place
        bindings = _Bindings(body, walrus, self.reshapes_in_place)
        self.counts = bindings.counts
        self.stored_in = bindings.stored
        env: dict = {}
        if init_mode:
            self._find_param_aliases(body)
        if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            env = self._parameters(owner)
        self.env = env
        self._pending, self._next = [], 0
        if isinstance(owner, ast.Lambda):
            self.infer(owner.body)
        elif lazy:
            self._pending = body  # analysed by `value`, as far as the statements it is asked about
        else:
            self.block(body)

    def value(self, expr):
        """What the analysis knows about `expr`. A lazy analysis first reads the top-level
        statements up to the one holding `expr`: the analysis runs forward only, so the value is
        the one a whole analysis gives, and statements after the last one a rule asks about (often
        most of a function) are never read."""
        pending = self._pending
        if self._next < len(pending):
            row = getattr(expr, "lineno", None)
            position = (row, expr.col_offset) if row is not None else None
            while self._next < len(pending):
                stmt = pending[self._next]
                if position is not None and (stmt.lineno, stmt.col_offset) > position:
                    break
                self._next += 1
                self.statement(stmt)
        return self.values.get(expr)

    # -- symbols -------------------------------------------------------------------------------
    def sym(self, text: str) -> Sym:
        if self.init_mode:
            head = text.split(".")[0]
            if head in self.param_aliases:
                return Sym(self.param_aliases[head] + text[len(head):])
        return Sym(text, self.scope)

    def _find_param_aliases(self, body):
        for stmt in body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.value, ast.Name) and self._is_self_attr(stmt.targets[0])):
                self.param_aliases.setdefault(stmt.value.id, f"self.{stmt.targets[0].attr}")

    def _is_self_attr(self, node) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and self.self_name is not None and node.value.id == self.self_name)

    def _parameters(self, fn) -> dict:
        env = {}
        args = fn.args
        every = args.posonlyargs + args.args + args.kwonlyargs
        positional = args.posonlyargs + args.args
        defaults = [(a.arg, d) for a, d in zip(positional[len(positional) - len(args.defaults):] + args.kwonlyargs,
                                               args.defaults + args.kw_defaults) if d is not None]
        float_defaults = {name for name, d in defaults if _float_constant(d)}
        int_defaults = {name for name, d in defaults if int_const(d) is not None}
        passed = may_be_passed_instances(self.ctx, fn)
        for a in every:
            if a.arg in self.arguments:
                env[a.arg] = self.arguments[a.arg]
                continue
            shape = self.annotation_shape(a.annotation) if getattr(a, "annotation", None) else None
            single = self.counts.get(a.arg, 0) == 0
            if shape is None and single and a.annotation is None and passed and self._calls_through(a.arg):
                passed = passed_instance(self.ctx, fn, a.arg)
                if passed is not None:
                    env[a.arg] = passed  # `def train(model, ...)` called as `train(ActorCritic(), ...)`
                    continue
            sym = self.sym(a.arg) if single else None
            if shape is not None:
                env[a.arg] = shape
            elif isinstance(a.annotation, ast.Name) and a.annotation.id == "int":
                env[a.arg] = IntVal(sym)
            elif (a.annotation.id == "float" if isinstance(a.annotation, ast.Name)
                  else a.annotation is None and a.arg in float_defaults):
                env[a.arg] = SCALAR  # `gamma: float`, `gamma=0.99`: a number, not a tensor
            elif a.annotation is None and single and a.arg in int_defaults:
                env[a.arg] = IntVal(sym)  # `batch_size=32`: a count
            else:
                env[a.arg] = Opaque(sym)
        for a in (args.vararg, args.kwarg):
            if a is not None:
                env[a.arg] = None
        if self.self_name and every:
            env[self.self_name] = None
        return env

    def _used_as_count(self, name: str) -> bool:
        """The function binds `name` once at most (a parameter, or one assignment) and uses it as
        only an int can be used (`names_used_as_counts`): it holds a count, not a size tuple."""
        if self.counts.get(name, 0) > 1 or not isinstance(self.owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        used = self.ctx.shared.get(("shapes.counts", id(self.owner)))
        if used is None:
            used = self.ctx.shared[("shapes.counts", id(self.owner))] = names_used_as_counts(self.owner)
        return name in used

    def _calls_through(self, name: str) -> bool:
        """The function's text calls `name` (`model(s)`) or a method of it that a class of the
        file defines and that can return a shape (`model.q(s)`)."""
        text = _owner_text(self.ctx, self.owner)
        if f"{name}(" not in text and f"{name}." not in text:
            return False
        calls = _calls_in_text(self.ctx, self.owner)
        return any(receiver == name and (method is None or _may_shape(self.ctx, method)) for receiver, method in calls)

    # -- annotations -------------------------------------------------------------------------------
    def annotation_shape(self, ann) -> Optional[Shape]:
        """Shapes written as jaxtyping (`Float[Tensor, "B T"]`) or torchtyping
        (`TensorType["B", "T"]`) annotations."""
        if not isinstance(ann, ast.Subscript):
            return None
        qual = self.ctx.qualname(ann.value) or ""
        if not qual.startswith(_JAXTYPING_MODULES):
            return None
        items = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if qual.startswith("jaxtyping."):
            if len(items) != 2 or not isinstance(items[1], ast.Constant) or not isinstance(items[1].value, str):
                return None
            tokens = re.findall(r"\([^)]*\)|\S+", items[1].value)
        else:
            tokens = []
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, (str, int)) and not isinstance(item.value, bool):
                    tokens.append(str(item.value))
                elif isinstance(item, ast.Constant) and item.value is Ellipsis:
                    tokens.append("...")
                elif isinstance(item, ast.Slice):
                    tokens.append("_")  # "name": size, keep unknown
                else:
                    break  # dtype, layout and other details
        leading = False
        dims = []
        for i, tok in enumerate(tokens):
            if tok == "..." or tok.startswith("*"):
                if i != 0:
                    return None
                leading = True
            elif re.fullmatch(r"\d+", tok):
                dims.append(int(tok))
            elif re.fullmatch(r"[A-Za-z_]\w*", tok) and tok != "_":
                dims.append(Sym(tok, "annotation"))
            else:
                dims.append(None)
        return make_shape(dims, leading)

    # -- statements --------------------------------------------------------------------------------
    def block(self, stmts) -> None:
        for stmt in stmts:
            self.statement(stmt)

    def statement(self, stmt) -> None:
        if isinstance(stmt, ast.Assign):
            value = self.infer(stmt.value)
            for target in stmt.targets:
                self.bind(target, value, stmt.value)
        elif isinstance(stmt, ast.AnnAssign):
            shape = self.annotation_shape(stmt.annotation)
            value = self.infer(stmt.value) if stmt.value is not None else None
            if stmt.value is not None or shape is not None:
                self.bind(stmt.target, shape if shape is not None else value, stmt.value)
        elif isinstance(stmt, ast.AugAssign):
            value = self.infer(stmt.value)
            self.infer(stmt.target) if not isinstance(stmt.target, ast.Name) else None
            if isinstance(stmt.target, ast.Name):
                old = self.env.get(stmt.target.id)
                self.values[stmt.target] = old
                if isinstance(old, Shape):
                    new = old  # in-place ops keep the tensor's shape (or raise)
                elif isinstance(old, IntVal) and isinstance(value, IntVal):
                    new = IntVal(dim_binop(stmt.op, old.dim, value.dim))
                else:
                    new = None
                self.env[stmt.target.id] = new
        elif isinstance(stmt, (ast.Expr, ast.Return)):
            if stmt.value is not None and not self.skips_expressions:
                self.infer(stmt.value)
        elif isinstance(stmt, ast.Assert):
            self.infer(stmt.test)
            self.assume(stmt.test)
        elif isinstance(stmt, ast.If):
            self.infer(stmt.test)
            self.branches([stmt.body, stmt.orelse])
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            self.loop(stmt)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self.infer(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, None)
            self.block(stmt.body)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            before = dict(self.env)
            self.block(stmt.body)
            for name in self.stored_in.get(id(stmt), ()):
                before[name] = None
            after_body = self.env
            ends = [after_body]
            for handler in stmt.handlers:
                self.env = dict(before)
                if handler.name:
                    self.env[handler.name] = None
                self.block(handler.body)
                ends.append(self.env)
            self.env = self._merge_envs(ends)
            self.block(stmt.orelse)
            self.block(stmt.finalbody)
        elif type(stmt).__name__ == "Match":
            self.infer(stmt.subject)
            self.branches([case.body for case in stmt.cases] + [[]],
                          extra=[n for case in stmt.cases for n in _pattern_names(case.pattern)])
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.env[stmt.name] = None
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    self.env[target.id] = None
                else:
                    self.infer(target)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                self.env[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(stmt, ast.Raise):
            if stmt.exc is not None:
                self.infer(stmt.exc)

    def branches(self, bodies, extra=()) -> None:
        before = self.env
        ends = []
        for body in bodies:
            self.env = dict(before)
            for name in extra:
                self.env[name] = None
            self.block(body)
            if not _terminates(body):
                ends.append(self.env)
        self.env = self._merge_envs(ends) if ends else dict(before)

    @staticmethod
    def _merge_envs(envs) -> dict:
        """Names bound to the same value on every path keep it; the others become unknown."""
        merged = dict(envs[0])
        for env in envs[1:]:
            for name, value in env.items():
                old = merged.get(name, _MISSING)
                if old is not value and old != value:  # most names pass the branches untouched
                    merged[name] = None
            for name in merged.keys() - env.keys():
                merged[name] = None
        return merged

    def loop(self, stmt) -> None:
        changed = set(self.stored_in.get(id(stmt), ()))
        if isinstance(stmt, ast.While):
            for name in changed:
                self.env[name] = None
            self.infer(stmt.test)
        else:
            self.infer(stmt.iter)
            for name in changed:
                self.env[name] = None
            if self._is_range(stmt.iter):
                self.bind(stmt.target, IntVal(None), None)
        self.block(stmt.body)
        for name in changed:
            self.env[name] = None
        self.block(stmt.orelse)

    def _is_range(self, node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "range" and "range" not in self.env)

    # -- binding ------------------------------------------------------------------------------
    def bind(self, target, value, value_node) -> None:
        if isinstance(target, ast.Name):
            name = target.id
            single = self.counts.get(name, 0) <= 1 and name != "_"
            if single:
                if value is None or (isinstance(value, Opaque) and value.sym is None):
                    value = Opaque(self.sym(name))
                elif isinstance(value, IntVal) and value.dim is None:
                    value = IntVal(self.sym(name))
                    self._refine_from_size(value_node, value.dim)
            self.env[name] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            self._bind_unpacked(target, value, value_node)
        elif isinstance(target, ast.Attribute):
            self.infer(target.value)
            if self.init_mode and self._is_self_attr(target):
                attr = target.attr
                if attr in self.stored_attrs and self.stored_attrs[attr] != value:
                    self.stored_attrs[attr] = None
                else:
                    self.stored_attrs[attr] = value
            elif self._is_self_attr(target):
                key = self._stored_attr_key(target)
                if key is not None:
                    self.env[key] = value
        elif isinstance(target, ast.Subscript):
            self.infer(target.value)
            self.infer(target.slice)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, None, None)

    def _bind_unpacked(self, target, value, value_node) -> None:
        elts = target.elts
        starred = [i for i, e in enumerate(elts) if isinstance(e, ast.Starred)]
        if isinstance(value, SizeVal) and len(starred) <= 1:
            self._bind_size_unpack(elts, starred, value.shape, value_node)
            return
        items = value.items if isinstance(value, Seq) else None
        if items is not None and not starred and len(items) == len(elts):
            for elt, item in zip(elts, items):
                self.bind(elt, item, None)
            return
        for elt in elts:
            self.bind(elt, None, None)

    def _bind_size_unpack(self, elts, starred, shape: Shape, value_node) -> None:
        """`B, T, C = x.shape`: names the dims, and tells the analysis x's rank."""
        n = len(elts)
        if starred:
            k = starred[0]
            head, tail = elts[:k], elts[k + 1:]
            if shape.leading and head:
                for elt in elts:
                    self.bind(elt, None, None)
                return
            dims = list(shape.dims)
            head_dims = dims[:len(head)] if not shape.leading else []
            tail_dims = dims[len(dims) - len(tail):] if tail and len(dims) >= len(tail) else [None] * len(tail)
            pairs = list(zip(head, head_dims)) + list(zip(tail, tail_dims))
            for elt, d in pairs:
                self.bind(elt, IntVal(d), None)
            self.bind(elts[k].value, None, None)
            names = [self._name_dim(e) for e in tail]
            self._refine(value_node, names, leading=True, at_end=True)
            return
        if not shape.leading and len(shape.dims) != n:
            for elt in elts:
                self.bind(elt, None, None)
            return
        dims = list(shape.dims)
        if shape.leading:  # the known trailing dims name the last targets
            dims = [None] * (n - len(dims)) + dims if len(dims) < n else dims[-n:]
        for elt, d in zip(elts, dims):
            self.bind(elt, IntVal(d), None)
        self._refine(value_node, [self._name_dim(e) for e in elts], leading=False, at_end=False)

    def _name_dim(self, elt):
        if isinstance(elt, ast.Name):
            value = self.env.get(elt.id)
            return as_dim(value)
        return None

    def _refine(self, value_node, dims, leading: bool, at_end: bool) -> None:
        name = _size_receiver(value_node)
        if name is None:
            return
        current = self.env.get(name)
        if isinstance(current, Shape):
            if current.leading and not leading and len(current.dims) <= len(dims):
                known = list(dims)
                for i in range(1, len(current.dims) + 1):
                    known[-i] = current.dims[-i] if current.dims[-i] is not None else known[-i]
                self.env[name] = make_shape(known, False, current.explicit)
            elif not current.leading or leading:
                merged = list(current.dims)
                for i in range(1, min(len(merged), len(dims)) + 1):
                    if merged[-i] is None:
                        merged[-i] = dims[-i]
                self.env[name] = make_shape(merged, current.leading, current.explicit)
        elif current is None or isinstance(current, Opaque):
            self.env[name] = make_shape(dims, leading)

    def _refine_from_size(self, value_node, sym, stated: bool = False) -> bool:
        """`B = x.size(0)` / `B = x.shape[0]` names dim 0 of a known-rank x, and so does `assert
        x.shape[0] == B` (`stated`), which also gives an x of unknown rank its trailing dims
        (`x.shape[-1] == D`: `(..., D)`). True when `value_node` is such a size."""
        name, axis = None, None
        if isinstance(value_node, ast.Call) and isinstance(value_node.func, ast.Attribute) \
                and value_node.func.attr == "size" and len(value_node.args) == 1 \
                and isinstance(value_node.func.value, ast.Name):
            name, axis = value_node.func.value.id, int_const(value_node.args[0])
        elif isinstance(value_node, ast.Subscript) and _size_receiver(value_node.value):
            name, axis = _size_receiver(value_node.value), int_const(value_node.slice)
        if name is None or axis is None:
            return False
        current = self.env.get(name)
        if not isinstance(current, Shape):
            if stated and axis < 0 and sym is not None and (current is None or isinstance(current, Opaque)):
                self.env[name] = make_shape([sym] + [None] * (-axis - 1), True)
            return True
        n = len(current.dims)
        if axis < 0 and -axis <= n:
            pos = n + axis
        elif axis >= 0 and not current.leading and axis < n:
            pos = axis
        else:
            return True
        if current.dims[pos] is None:
            dims = list(current.dims)
            dims[pos] = sym
            self.env[name] = make_shape(dims, current.leading, current.explicit)
        return True

    def assume(self, test) -> None:
        """Shapes stated by `assert x.shape == (B, T)`, `assert x.ndim == 3`."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            for value in test.values:
                self.assume(value)
            return
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return
        for lhs, rhs in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
            if self._refine_from_size(lhs, as_dim(self.values.get(rhs)), stated=True):  # `assert y.shape[0] == B`
                return
            name = _size_receiver(_unwrap_tuple_call(lhs))
            if name is not None:
                stated = as_dims(self.values.get(rhs))
                if stated is not None:
                    current = self.env.get(name)
                    explicit = current.explicit if isinstance(current, Shape) else ()
                    self.env[name] = make_shape(stated[0], stated[1], explicit)
                return
            if (isinstance(lhs, ast.Attribute) and lhs.attr == "ndim" and isinstance(lhs.value, ast.Name)) or \
                    (isinstance(lhs, ast.Call) and isinstance(lhs.func, ast.Attribute) and lhs.func.attr == "dim"
                     and not lhs.args and isinstance(lhs.func.value, ast.Name)):
                name = lhs.value.id if isinstance(lhs, ast.Attribute) else lhs.func.value.id
                rank = int_const(rhs)
                current = self.env.get(name)
                if rank is not None and rank >= 0 and not (isinstance(current, Shape) and not current.leading):
                    dims = [None] * rank
                    if isinstance(current, Shape) and len(current.dims) <= rank:
                        dims[rank - len(current.dims):] = current.dims
                    self.env[name] = make_shape(dims, False, current.explicit if isinstance(current, Shape) else ())
                return

    # -- expressions -----------------------------------------------------------------------------
    def infer(self, node):
        if node is None:
            return None
        if node.__class__ is ast.Name:  # a third of the nodes: no second call for them
            value = self._name(node)
        else:
            try:
                value = self._infer(node)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError):
                value = None
        self.values[node] = value
        return value

    def _name(self, node: ast.Name):
        value = self.env.get(node.id, _MISSING)
        if value is not _MISSING:
            return value
        qual = self.ctx.qualname(node)
        if self.counts.get(node.id, 0) == 0 and qual is None:
            layer = self._module_level_layer(node.id)
            if layer is None and self.owner is not self.ctx.tree:
                layer = module_level_value(self.ctx, node.id)
            return layer if layer is not None else Opaque(self.sym(node.id))
        return _loss_function(qual)

    def may_hold_loss(self, expr) -> bool:
        """False when `value(expr)` cannot be a Loss, read off the function's bindings without
        reading its statements. Mirrors `_name` and `_attribute`: change them together. A name the
        function never binds (nor takes as a parameter) is a loss only when the module builds one
        under it or it names a loss function; an attribute only as `self.<attr>` of a loss stored
        in `__init__`, as a loss function (`F.mse_loss`), or as an item of a pair (`.values`)."""
        cls = expr.__class__
        if cls is ast.Name:
            name = expr.id
            if name in self.counts:
                return True
            if name in self.env:  # a parameter, bound to no loss
                return False
            return (_module_constructors(self.ctx).get(name) is not None
                    or _loss_function(self.ctx.qualname(expr)) is not None)
        if cls is ast.Attribute:
            if self._is_self_attr(expr) and not self.init_mode:
                return isinstance(self.class_attrs.get(expr.attr), Loss)
            return expr.attr in ("values", "indices") or _loss_function(self.ctx.qualname(expr)) is not None
        return True

    def _module_level_layer(self, name: str):
        """The layer or loss a free name holds when the module binds it once, to a `torch.nn`
        constructor (`criterion = nn.MSELoss()` above the function that calls it)."""
        if self.owner is self.ctx.tree:
            return None
        value = self.module_layers.get(name, _MISSING)
        if value is _MISSING:
            value = None
            call = _module_constructors(self.ctx).get(name)
            if call is not None:
                self.module_layers[name] = None  # while it is read: `a = nn.Sequential(b)`, `b = ...(a)`
                # Read at module level: the function's own names (a local `d`) are not the module's.
                saved, self.env = self.env, {}
                try:
                    value = self.infer(call)
                finally:
                    self.env = saved
            value = self.module_layers[name] = value if isinstance(value, (Module, Loss)) else None
        return value

    def _infer(self, node):
        cls = node.__class__
        if cls is ast.Call:
            return self._call(node)
        if cls is ast.Attribute:
            return self._attribute(node)
        if cls is ast.Constant:
            if isinstance(node.value, bool):
                return IntVal(int(node.value))
            if node.value is None or isinstance(node.value, (str, bytes)):
                return None
            if isinstance(node.value, int):
                return IntVal(node.value)
            if isinstance(node.value, float):
                return SCALAR
            return None
        if cls is ast.BinOp:
            return self._binop(node)
        if cls is ast.Subscript:
            return self._subscript(node)
        if isinstance(node, ast.UnaryOp):
            value = self.infer(node.operand)
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                if isinstance(value, IntVal):
                    d = value.dim
                    if isinstance(node.op, ast.UAdd):
                        return value
                    return IntVal(-d if isinstance(d, int) else (Sym(f"-{_atom(d)}", _scope_of(d)) if d is not None else None))
                if isinstance(value, (Shape, Scalar)):
                    return value
            if isinstance(node.op, (ast.Invert, ast.Not)) and isinstance(value, Shape):
                return value if isinstance(node.op, ast.Invert) else None
            return None
        if isinstance(node, ast.Compare):
            values = [self.infer(node.left)] + [self.infer(c) for c in node.comparators]
            if len(values) == 2:
                return self._broadcast_values(values[0], values[1], explicit_kept=False)
            return None
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            items = []
            starred = False
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.infer(elt.value)
                    self.values[elt] = inner
                    spread = as_dims(inner)
                    if spread is None or spread[1]:
                        starred = True
                    else:
                        items.extend(IntVal(d) for d in spread[0])
                else:
                    items.append(self.infer(elt))
            return None if starred else Seq(tuple(items))
        if isinstance(node, ast.IfExp):
            self.infer(node.test)
            return _merge(self.infer(node.body), self.infer(node.orelse))
        if isinstance(node, ast.NamedExpr):
            value = self.infer(node.value)
            self.bind(node.target, value, node.value)
            return value
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            saved = self.env
            self.env = dict(saved)
            for gen in node.generators:
                self.infer(gen.iter)
                for name in _stored_names([gen.target]):
                    self.env[name] = None
                for cond in gen.ifs:
                    self.infer(cond)
            if isinstance(node, ast.DictComp):
                self.infer(node.key)
                self.infer(node.value)
            else:
                self.infer(node.elt)
            self.env = saved
            return None
        if isinstance(node, ast.Lambda):
            return None
        for child in child_nodes(node):
            if isinstance(child, ast.expr):
                self.infer(child)
        return None

    def _binop(self, node):
        left, right = self.infer(node.left), self.infer(node.right)
        if isinstance(node.op, ast.MatMult):
            a, b = as_shape(left), as_shape(right)
            return op_matmul(a, b) if a is not None and b is not None else None
        if isinstance(left, IntVal) and isinstance(right, IntVal):
            return IntVal(dim_binop(node.op, left.dim, right.dim))
        if _is_scalar(left) and _is_scalar(right):  # `1.0 / math.sqrt(D)`, `D ** -0.5`: a number
            return SCALAR
        if isinstance(left, (Opaque, IntVal)) and isinstance(right, (Opaque, IntVal)):
            # `n_embd * 4`: still opaque (it may be a tensor), but a size if it is used as one
            return Opaque(dim_binop(node.op, as_dim(left), as_dim(right))) if isinstance(node.op, tuple(_DIM_OPS)) else None
        if isinstance(node.op, ast.Add):
            a, b = as_dims(left), as_dims(right)
            if a is not None and b is not None and not b[1]:
                return SizeVal(make_shape(a[0] + b[0], a[1])) if isinstance(left, SizeVal) or a[1] else Seq(
                    tuple(IntVal(d) for d in a[0] + b[0]))
        return self._broadcast_values(left, right, explicit_kept=True)

    def _broadcast_values(self, left, right, explicit_kept: bool):
        if isinstance(left, Shape) and _is_scalar(right):
            return left
        if isinstance(right, Shape) and _is_scalar(left):
            return right
        if isinstance(left, Shape) and isinstance(right, Shape):
            result = broadcast(left, right)
            return result if explicit_kept or result is None else replace(result, explicit=frozenset())
        return None

    def _stored_attr_key(self, node) -> Optional[str]:
        """The key under which the environment holds what this function stored in `self.<attr>`
        (`self.y_real = torch.ones(n, 1)`, read further down): `"self.y_real"`, a key no
        identifier can be, forgotten like a name where a loop or branch binds it. Only for an
        attribute no other method of the class but `__init__` stores: a call in between
        cannot have changed it."""
        cls = self.cls
        if cls is None or self.owner not in cls.body:
            return None
        if any(method is not self.owner and method.name != "__init__"
               for method, _ in class_attribute_values(self.ctx, cls, node.attr)):
            return None
        return f"{self.self_name}.{node.attr}"

    def _attribute(self, node):
        if self._is_self_attr(node):
            if not self.init_mode:
                key = f"{self.self_name}.{node.attr}"
                if key in self.env and self._stored_attr_key(node) is not None:
                    return self.env[key]
                if node.attr in self.class_attrs:
                    return self.class_attrs[node.attr]
                return Opaque(self.sym(f"{self.self_name}.{node.attr}"))
            if isinstance(self.stored_attrs.get(node.attr), Instance):
                return self.stored_attrs[node.attr]  # `deepcopy(self.critic)` further down `__init__`
        base = self.infer(node.value)
        attr = node.attr
        qual = self.ctx.qualname(node)
        if qual in _NUMBER_CONSTANTS:
            return SCALAR
        if _loss_function(qual) is not None:
            return _loss_function(qual)
        if isinstance(node.value, ast.Call) and self.ctx.qualname(node.value.func) in ("torch.finfo", "torch.iinfo"):
            return SCALAR if attr in ("min", "max", "eps", "tiny", "smallest_normal") else None
        if attr == "shape" and not isinstance(base, Shape) and not isinstance(node.value, ast.Call):
            return SizeVal(make_shape([], True))  # rank unknown; `B, T = x.shape` tells it
        if isinstance(base, Shape):
            if attr == "shape":
                return SizeVal(replace(base, explicit=frozenset()))
            if attr == "ndim":
                return IntVal(base.rank) if base.rank is not None else IntVal(None)
            if attr in ("T",):
                return (make_shape(tuple(reversed(base.dims)), False,
                                   {-len(base.dims) - 1 - a for a in base.explicit})
                        if not base.leading and len(base.dims) <= 2 else None)
            if attr in ("mT", "mH"):
                return op_transpose(base, -2, -1) if len(base.dims) >= 2 else None
            if attr in ("data", "real", "imag", "grad"):
                return base
            return None
        if isinstance(base, Seq) and attr in ("values", "indices") and len(base.items) == 2:
            return base.items[0 if attr == "values" else 1]
        if isinstance(base, Opaque) and base.sym is not None and self.ctx.qualname(node) is None:
            return Opaque(self.sym(f"{base.sym.text}.{attr}") if not base.sym.scope or base.sym.scope == self.scope
                          else Sym(f"{base.sym.text}.{attr}", base.sym.scope))
        return None

    def _subscript(self, node):
        base = self.infer(node.value)
        index = node.slice
        items = index.elts if isinstance(index, ast.Tuple) else [index]
        item_values = [self._index_item(i) for i in items]
        self.values[index] = None if isinstance(index, ast.Tuple) else item_values[0]
        if isinstance(base, ModuleItems):
            key = fixed_key(index)
            return None if key is None else base.items.get(key, base.every)
        if isinstance(base, (SizeVal, Seq)):
            if len(items) != 1:
                return None
            dims = as_dims(base)
            if isinstance(items[0], ast.Slice):
                if dims is None:
                    return None
                lo, hi, step = (int_const(items[0].lower), int_const(items[0].upper), int_const(items[0].step))
                if any(b is None and e is not None for b, e in ((lo, items[0].lower), (hi, items[0].upper), (step, items[0].step))):
                    return None
                if dims[1] and (lo is None or lo >= 0):
                    if lo is not None and lo < 0 and hi is None:
                        return SizeVal(make_shape(dims[0][lo:])) if -lo <= len(dims[0]) else None
                    if hi is not None and hi < 0 and lo is None:
                        return SizeVal(make_shape(dims[0][:hi], True)) if -hi <= len(dims[0]) else None
                    return None
                if dims[1]:
                    return SizeVal(make_shape(dims[0][lo:hi:step])) if hi is None and -lo <= len(dims[0]) else None
                picked = dims[0][lo:hi:step]
                return SizeVal(make_shape(picked)) if isinstance(base, SizeVal) else Seq(tuple(IntVal(d) for d in picked))
            i = int_const(items[0])
            if i is None:
                return None
            if isinstance(base, Seq):
                return base.items[i] if -len(base.items) <= i < len(base.items) else None
            shape = base.shape
            d = shape.at(i)
            return IntVal(d)
        if not isinstance(base, Shape):
            return None
        return self._index_shape(base, items, item_values)

    def _index_item(self, item):
        if isinstance(item, ast.Slice):
            for part in (item.lower, item.upper, item.step):
                if part is not None:
                    self.infer(part)
            return "slice"
        value = self.infer(item)
        return value

    def _index_shape(self, base: Shape, items, values) -> Optional[Shape]:
        kinds = []
        for item, value in zip(items, values):
            if isinstance(item, ast.Constant) and item.value is None:
                kinds.append("new")
            elif isinstance(item, ast.Constant) and item.value is Ellipsis:
                kinds.append("ellipsis")
            elif isinstance(item, ast.Slice):
                kinds.append("slice")
            elif isinstance(value, IntVal):
                kinds.append("int")
            else:
                return None  # advanced (tensor, list, bool) indexing
        if kinds.count("ellipsis") > 1:
            return None
        consuming = sum(1 for k in kinds if k in ("int", "slice"))
        if "ellipsis" not in kinds:
            kinds.append("ellipsis")
            items = list(items) + [None]
        e = kinds.index("ellipsis")
        before, after = list(zip(kinds[:e], items[:e])), list(zip(kinds[e + 1:], items[e + 1:]))
        n = len(base.dims)
        n_before = sum(1 for k, _ in before if k != "new")
        n_after = sum(1 for k, _ in after if k != "new")
        if base.leading:
            if n_before:
                return None
            if n_after > n:
                return None
            middle = base.dims[:n - n_after]
        else:
            if consuming > n:
                return None
            middle = base.dims[n_before:n - n_after]
        out_dims, explicit_pos = [], []

        def apply(parts, first):
            """Index `parts` against base.dims[first:]; a full slice keeps a stated 1."""
            source = first
            for kind, item in parts:
                if kind == "new":
                    explicit_pos.append(len(out_dims))
                    out_dims.append(1)
                    continue
                if kind == "slice":
                    if _is_full_slice(item) and source - n in base.explicit:
                        explicit_pos.append(len(out_dims))
                    out_dims.append(_slice_size(item, base.dims[source]))
                source += 1

        apply(before, 0)
        middle_start = len(out_dims)
        out_dims.extend(middle)
        apply(after, n - n_after)
        total = len(out_dims)
        explicit = {p - total for p in explicit_pos}
        for a in base.explicit:
            index = n + a
            if n_before <= index < n - n_after:
                explicit.add(middle_start + (index - n_before) - total)
        return make_shape(out_dims, base.leading, explicit)

    def _call(self, node):
        func = node.func
        reshaped = _reshaped_in_place(node) if self.reshapes_in_place else None
        if reshaped is not None:
            for arg in node.args:
                self.infer(arg)
            self.infer(func.value)
            self.env[reshaped] = None
            return None
        qual = self.ctx.qualname(func)
        if qual in _IDENTITY_WRAPPERS and len(node.args) == 1 and not node.keywords:
            return self.infer(node.args[0])
        named = _torch_name(qual)
        callee = receiver = None
        if func.__class__ is not ast.Attribute:
            callee = self.infer(func)
        elif named is None:  # the receiver of `torch.nn.functional.relu` is a module path: no value
            receiver = self.infer(func.value)
            if self._is_self_attr(func) and not self.init_mode:
                callee = self.class_attrs.get(func.attr)
                self.values[func] = callee
        args = [self.infer(a.value) if a.__class__ is ast.Starred else self.infer(a) for a in node.args]
        kwargs = {k.arg: self.infer(k.value) for k in node.keywords}
        if None in kwargs or any(a.__class__ is ast.Starred for a in node.args):
            if not (func.__class__ is ast.Attribute and func.attr in ("view", "reshape", "permute", "expand")):
                return None
        if named is not None:
            return self._torch_call(named, node, args, kwargs)
        if isinstance(callee, Instance):  # `self.critic(x)`, `model(x)`: its forward
            return self._returned(callee, forward_of(callee.cls), args, kwargs, node)
        if func.__class__ is ast.Name and (callee is None or callee.__class__ is Opaque) \
                and (func.id not in self.env or self.owner is self.ctx.tree):
            # `Critic(d)`: a class of this file (at module level its `class` statement binds it),
            # or of a project module (`Net()` after `from model import Net`)
            made = class_named(self.ctx, func)
            if made is not None:
                return _constructed(made, args, kwargs)
        if (func.__class__ is ast.Attribute and self.cls is not None and self._is_self_attr(func)
                and not self.init_mode and func.attr not in self.class_attrs):
            # `self.v(s)`: another method
            return self._returned(Instance(self.cls, self.ctx), func.attr, args, kwargs, node)
        if func.__class__ is ast.Attribute and isinstance(receiver, (Module, Loss)) and func.attr in _MODULE_RETURNS_SELF:
            return receiver  # `nn.BCELoss().cuda()`: the module itself
        if func.__class__ is ast.Attribute and isinstance(receiver, Instance):
            if func.attr in _MODULE_RETURNS_SELF and receiver.cls.bases and method_of(receiver.cls, func.attr) is None:
                return receiver  # `D = D.cuda()`: nn.Module's own method gives the module back
            return self._returned(receiver, func.attr, args, kwargs, node)  # `self.critic.value(s)`
        if func.__class__ is ast.Attribute and receiver is None and (qual is not None or self.ctx.names.set_on_module(func)):
            made = class_named(self.ctx, func)  # `models.Net()` after `import models`
            if made is not None:
                return _constructed(made, args, kwargs)
        if isinstance(callee, Module):
            return callee.apply(as_shape(args[0])) if len(args) == 1 and not kwargs else None
        if isinstance(callee, Loss):
            return None if callee.reduction_given or "reduction" in kwargs else make_shape([])
        if isinstance(func, ast.Name):
            if func.id == "len" and len(args) == 1 and func.id not in self.env:
                s = as_shape(args[0])
                if s is not None:
                    return IntVal(s.at(0))
                d = as_dims(args[0])
                return IntVal(len(d[0]) if d and not d[1] else None)
            if func.id in ("int", "tuple", "list") and len(args) == 1 and func.id not in self.env:
                value = args[0]
                if func.id == "int":
                    return value if isinstance(value, IntVal) else IntVal(as_dim(value))
                if isinstance(value, SizeVal):
                    return value
                return value if isinstance(value, Seq) else None
            if func.id == "float" and func.id not in self.env:
                return SCALAR
            if func.id in ("abs", "round", "min", "max", "sum") and func.id not in self.env:
                if all(_is_scalar(a) for a in args):
                    return SCALAR
            return None
        if qual and qual.startswith("math."):
            return SCALAR
        if isinstance(func, ast.Attribute):
            if isinstance(receiver, Shape):
                return self._tensor_method(func.attr, receiver, node, args, kwargs)
            if func.attr in ("view", "reshape") and (receiver is None or isinstance(receiver, Opaque)):
                return self._view(None, node, args)  # the target size alone gives the shape
            if func.attr == "repeat" and len(args) >= 3 and not kwargs and (receiver is None or isinstance(receiver, Opaque)):
                # `h.repeat(T, 1, 1)`: one size per axis of the result (numpy's `repeat` takes two at most)
                reps = self._int_list(node, args, "repeats")
                return make_shape([None] * len(reps)) if reps is not None else None
            if (func.attr == "gather" and qual is None and len(args) == 2 and not kwargs
                    and isinstance(args[0], IntVal) and (receiver is None or isinstance(receiver, Opaque))):
                return _gathered(args[1])  # `net(s).gather(1, a)`: the index's shape whatever the input
            if func.attr == "size" and not kwargs and len(args) <= 1 and not self._is_self_attr(func.value):
                return SizeVal(make_shape([], True)) if not args else IntVal(None)
            if isinstance(receiver, Module) and func.attr == "forward":
                return receiver.apply(as_shape(args[0])) if len(args) == 1 else None
        return None

    def _returned(self, instance: Instance, name: str, args, kwargs, node):
        """What method `name` of the instance's class returns when called with these argument
        values (all its `return`s agree), read off an analysis of the method, in the file that
        defines it, with its parameters bound to them; None past a few calls deep, for recursion,
        or where any argument is spread (`*a`)."""
        cls, source = instance.cls, instance.source
        fn = method_of(cls, name) if name is not None else None
        if fn is None or self.depth >= _CALL_DEPTH or any(a.__class__ is ast.Starred for a in node.args):
            return None
        if not any(isinstance(a, Shape) for a in [*args, *kwargs.values()]) and not _method_may_shape(source, cls, fn):
            return None  # nothing in the method, nor in what it is given, has a shape
        params = fn.args.posonlyargs + fn.args.args
        if not params or len(args) > len(params) - 1 or fn.args.vararg is not None:
            return None
        bound = dict(zip((p.arg for p in params[1:]), args))
        names = {p.arg for p in params[1:]} | {p.arg for p in fn.args.kwonlyargs}
        if not set(kwargs) <= names:
            return None
        bound.update(kwargs)
        try:
            key = ("shapes.returned", id(fn), instance.sizes, tuple(sorted(bound.items())))
            hash(key)
        except TypeError:
            key = None
        shared = self.ctx.shared
        if key is not None and key in shared:
            return shared[key]
        active = shared.setdefault("shapes.returning", set())
        if id(fn) in active:
            return None  # a method reached again through its own calls
        active.add(id(fn))
        try:
            analysis = FunctionShapes(source, fn, _class_attrs(source, cls, instance.sizes), params[0].arg,
                                      scope=f"{cls.name}.{fn.name}", cls=cls, arguments=bound, depth=self.depth + 1)
            returns = [analysis.values.get(r.value) if r.value is not None else None for r in returns_of(fn)]
        finally:
            active.discard(id(fn))
        value = returns[0] if returns else None
        for other in returns[1:]:
            value = _merge(value, other)
        if key is not None:
            shared[key] = value
        return value

    # -- torch API --------------------------------------------------------------------------------
    def _torch_call(self, named, node, args, kwargs):
        space, name = named
        if space == "nn":
            return self._module(name, node, args, kwargs)
        if space == "F":
            return self._functional(name, args, kwargs)
        if space == "linalg":
            if name in ("norm", "vector_norm") and args:
                s = as_shape(args[0])
                if s is None or len(args) > 3:
                    return None
                dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
                return self._reduction(s, dim, kwargs.get("keepdim"), "dim" in kwargs or len(args) > 2)
            if name == "matmul" and len(args) == 2:
                return self._matmul(args[0], args[1])
            return None
        if space == "special":
            return self._functional(name, args, kwargs) if name in ("expit", "logit") else None
        return self._torch_function(name, node, args, kwargs)

    def _torch_function(self, name, node, args, kwargs):
        if name in _CONSTRUCTORS or name in ("randint",):
            if (len(args) == 1 and isinstance(args[0], Opaque) and not kwargs and isinstance(node.args[0], ast.Name)
                    and self._used_as_count(node.args[0].id)):
                args = [IntVal(args[0].sym)]  # `if len(memory) < batch_size: ...` then `torch.zeros(batch_size)`
            return self._constructor(name, args, kwargs)
        if name in _LIKE:
            s = as_shape(args[0]) if args else None
            return replace(s, explicit=frozenset()) if s is not None else None
        if name == "tensor":
            return _literal_shape(node.args[0]) if node.args else None
        if name == "Size":
            dims = as_dims(args[0]) if len(args) == 1 else None
            return SizeVal(make_shape(dims[0], dims[1])) if dims else None
        if name == "arange":
            return self._arange(args, kwargs)
        if name in ("linspace", "logspace"):
            steps = kwargs.get("steps", args[2] if len(args) > 2 else None)
            return make_shape([as_dim(steps)]) if steps is not None else None
        if name == "eye":
            n = as_dim(args[0]) if args else as_dim(kwargs.get("n"))
            m = as_dim(args[1]) if len(args) > 1 else as_dim(kwargs.get("m", args[0] if args else None))
            return make_shape([n, m])
        if name in ("cat", "concat", "concatenate", "stack"):
            seq = args[0] if args else kwargs.get("tensors")
            axis = _int_const(kwargs.get("dim", args[1] if len(args) > 1 else IntVal(0)))
            if not isinstance(seq, Seq):
                return None
            shapes = [as_shape(v) for v in seq.items]
            return op_stack(shapes, axis) if name == "stack" else op_cat(shapes, axis)
        if name in ("matmul", "mm", "bmm"):
            if len(args) != 2:
                return None
            a, b = as_shape(args[0]), as_shape(args[1])
            if name == "mm" and not (a and b and a.rank == 2 and b.rank == 2):
                return None
            if name == "bmm" and not (a and b and a.rank == 3 and b.rank == 3):
                return None
            return self._matmul(args[0], args[1])
        if name == "einsum":
            eq = node.args[0] if node.args else None
            if not (isinstance(eq, ast.Constant) and isinstance(eq.value, str)):
                return None
            operands = args[1:]
            if len(operands) == 1 and isinstance(operands[0], Seq):
                operands = list(operands[0].items)
            return op_einsum(eq.value, [as_shape(v) for v in operands])
        if name in ("outer", "ger") and len(args) == 2:
            a, b = as_shape(args[0]), as_shape(args[1])
            if a and b and a.rank == 1 and b.rank == 1:
                return make_shape([a.dims[0], b.dims[0]])
            return None
        if name == "where" and len(args) == 3:
            out = args[0] if isinstance(args[0], Shape) else None
            for v in args[1:]:
                out = self._broadcast_values(out, v, True) if out is not None else (v if isinstance(v, Shape) else None)
            return out if all(isinstance(v, Shape) or _is_scalar(v) for v in args) else None
        if name == "cdist" and len(args) >= 2:
            a, b = as_shape(args[0]), as_shape(args[1])
            if a and b and len(a.dims) >= 2 and len(b.dims) >= 2:
                batch = broadcast(make_shape(a.dims[:-2], a.leading), make_shape(b.dims[:-2], b.leading))
                return make_shape(batch.dims + (a.dims[-2], b.dims[-2]), batch.leading) if batch else None
            return None
        if name == "gather" and len(args) >= 3:
            return _gathered(args[2])
        if name in _BINARY and len(args) >= 2:
            return self._broadcast_values(args[0], args[1], True)
        # torch.<method>(x, ...) mirrors x.<method>(...)
        if args and isinstance(args[0], Shape):
            return self._tensor_method(name, args[0], _drop_first_arg(node), args[1:], kwargs)
        return None

    def _matmul(self, a, b):
        a, b = as_shape(a), as_shape(b)
        return op_matmul(a, b) if a is not None and b is not None else None

    def _constructor(self, name, args, kwargs):
        if name == "randint":
            size = kwargs.get("size", args[-1] if args and not isinstance(args[-1], (IntVal, Opaque)) else None)
        elif name == "full":
            size = kwargs.get("size", args[0] if args else None)
        else:
            size = kwargs.get("size")
            if size is None:
                if len(args) == 1 and isinstance(args[0], Opaque):
                    return None  # a name that may hold a whole size tuple
                if len(args) == 1 and not isinstance(args[0], IntVal):
                    size = args[0]
                else:
                    if not all(isinstance(a, (IntVal, Opaque)) for a in args):
                        return None
                    size = Seq(tuple(args))
        dims = as_dims(size)
        if dims is None:
            return None
        return make_shape(dims[0], dims[1])

    def _arange(self, args, kwargs):
        if kwargs.keys() - {"dtype", "device", "requires_grad", "end", "start", "step", "layout", "out"}:
            return None
        start, end, step = IntVal(0), None, IntVal(1)
        if len(args) == 1:
            end = args[0]
        elif len(args) == 2:
            start, end = args
        elif len(args) == 3:
            start, end, step = args
        start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
        a, b, c = _int_const(start), _int_const(end), _int_const(step)
        if a is not None and b is not None and c:
            return make_shape([max(0, -((a - b) // c))])
        if a == 0 and c == 1 and isinstance(end, (IntVal, Opaque)):
            return make_shape([as_dim(end)])
        return make_shape([None])

    def _functional(self, name, args, kwargs):
        first = as_shape(args[0]) if args else as_shape(kwargs.get("input"))
        if name in _FUNCTIONAL_SAME or name in ("expit", "logit"):
            return first
        if name == "linear":
            weight = as_shape(args[1]) if len(args) > 1 else as_shape(kwargs.get("weight"))
            if weight is None or weight.rank != 2:
                return None
            return op_linear(first, weight.dims[0]) if first is not None else None
        if name == "embedding":
            weight = as_shape(args[1]) if len(args) > 1 else as_shape(kwargs.get("weight"))
            if first is None or weight is None or weight.rank != 2:
                return None
            return make_shape(first.dims + (weight.dims[1],), first.leading)
        if name == "one_hot":
            n = args[1] if len(args) > 1 else kwargs.get("num_classes")
            if first is None or _int_const(n) == -1 or n is None:
                return None
            return make_shape(first.dims + (as_dim(n),), first.leading)
        if name == "scaled_dot_product_attention" and len(args) >= 3:
            q, v = as_shape(args[0]), as_shape(args[2])
            if q is None or v is None or not q.dims or not v.dims:
                return None
            return make_shape(q.dims[:-1] + (v.dims[-1],), q.leading)
        if name in LOSS_FUNCTIONS or name in ("cross_entropy", "nll_loss", "kl_div"):
            return None if "reduction" in kwargs else make_shape([])
        return None

    def _module(self, name, node, args, kwargs):
        """nn.<Name>(...) constructors: a Module (shape map) or a Loss."""
        if name in LOSS_MODULES or name in _OTHER_LOSS_MODULES:
            return Loss(name, "reduction" in kwargs)
        if name in ("Parameter", "Buffer"):
            data = args[0] if args else kwargs.get("data")
            return replace(data, explicit=frozenset()) if isinstance(data, Shape) else None
        if name in ("Linear", "LazyLinear"):
            given = "out_features" in kwargs or len(args) > (0 if name == "LazyLinear" else 1)
            if not given or any(a.__class__ is ast.Starred for a in node.args):
                return None
            out = kwargs["out_features"] if "out_features" in kwargs else args[-1] if name == "LazyLinear" else args[1]
            out_dim = as_dim(out)  # None: a size the analysis cannot read (`self.n + self.k`)
            return Module(name, lambda s: op_linear(s, out_dim))
        if name == "Embedding":
            d = kwargs.get("embedding_dim", args[1] if len(args) > 1 else None)
            if d is None:
                return None
            d = as_dim(d)
            return Module(name, lambda s: make_shape(s.dims + (d,), s.leading) if s is not None else make_shape([d], True))
        if name in ("Conv1d", "Conv2d", "Conv3d"):
            spatial = int(name[4])
            out = kwargs.get("out_channels", args[1] if len(args) > 1 else None)
            if out is None:
                return None
            out_dim = as_dim(out)
            return Module(name, lambda s: _conv(s, out_dim, spatial))
        if name in _SAME_MODULES:  # like their functional forms, they keep a singleton axis asked for
            return Module(name, lambda s: s)
        if name == "Flatten":
            start = _int_const(kwargs.get("start_dim", args[0] if args else IntVal(1)))
            end = _int_const(kwargs.get("end_dim", args[1] if len(args) > 1 else IntVal(-1)))
            return Module(name, lambda s: op_flatten(s, start, end) if s is not None else None)
        if name in ("ModuleList", "ModuleDict"):
            return self._module_items(node)
        if name == "Sequential":
            if kwargs or not args or not all(isinstance(a, Module) for a in args):
                return None
            layers = list(args)

            def chain(s):
                for layer in layers:
                    s = layer.apply(s)
                return s
            return Module(name, chain)
        return None

    def _module_items(self, node):
        built = module_container(self.ctx, node)
        if built is None:
            return None
        layers = {id(expr): self.infer(expr) for expr in set(built.by_key.values())}
        items = {key: layers[id(expr)] for key, expr in built.by_key.items() if isinstance(layers[id(expr)], Module)}
        # The comprehension's own names are not bound here: only an item that reads none of them.
        every = self.infer(built.every) if built.every is not None and not built.every_varies else None
        every = every if isinstance(every, Module) else None
        return ModuleItems(items, every) if items or every is not None else None

    def _reduction(self, s: Shape, dim_value, keepdim_value, has_dim: bool):
        if not has_dim or dim_value is None:
            axes = None
        elif isinstance(dim_value, IntVal):
            axes = [dim_value.dim]
        elif isinstance(dim_value, Seq):
            axes = [as_dim(v) if isinstance(v, IntVal) else None for v in dim_value.items]
        else:
            return None
        keepdim = False
        if keepdim_value is not None:
            k = _bool_value(keepdim_value)
            if k is None:
                return None
            keepdim = k
        return op_reduce(s, axes, keepdim)

    def _tensor_method(self, name, s: Shape, node, args, kwargs):
        plain = replace(s, explicit=frozenset())
        if name in _SAME_SHAPE_METHODS:
            return s
        if name == "type":
            return s if args or kwargs else None  # x.type() is a string
        if name in _BROADCASTING_METHODS:
            operands = list(args) + [kwargs[k] for k in _BROADCASTING_METHODS[name] if k in kwargs]
            out = s
            for operand in operands:
                if operand is None and not isinstance(operand, Shape):
                    return None
                out = self._broadcast_values(out, operand, True)
                if out is None:
                    return None
            return out
        if name in _BINARY:
            other = args[0] if args else kwargs.get("other")
            return self._broadcast_values(s, other, True) if other is not None else None
        if name in ("view", "reshape"):
            return self._view(s, node, args)
        if name in ("view_as", "reshape_as", "expand_as"):
            return replace(args[0], explicit=frozenset()) if args and isinstance(args[0], Shape) else None
        if name == "size":
            if not args and not kwargs:
                return SizeVal(plain)
            axis = _int_const(args[0] if args else kwargs.get("dim"))
            return IntVal(s.at(axis)) if axis is not None else IntVal(None)
        if name == "dim":
            return IntVal(s.rank)
        if name in ("numel", "nelement"):
            return IntVal(dim_product(s.dims) if not s.leading else None)
        if name in ("item",):
            return SCALAR
        if name in ("unsqueeze", "unsqueeze_"):
            axis = _int_const(args[0] if args else kwargs.get("dim"))
            return op_unsqueeze(s, axis) if axis is not None else None
        if name in ("squeeze", "squeeze_"):
            dim = args[0] if args else kwargs.get("dim")
            if dim is None:
                return op_squeeze(s, None)
            if isinstance(dim, Seq):
                return op_squeeze(s, [_int_const(v) for v in dim.items])
            return op_squeeze(s, [_int_const(dim)])
        if name == "flatten":
            start = _int_const(kwargs.get("start_dim", args[0] if args else IntVal(0)))
            end = _int_const(kwargs.get("end_dim", args[1] if len(args) > 1 else IntVal(-1)))
            return op_flatten(s, start, end)
        if name == "permute":
            order = self._int_list(node, args, "dims")
            return op_permute(s, order) if order is not None else None
        if name in ("transpose", "swapaxes", "swapdims", "transpose_"):
            if len(args) != 2:
                return None
            return op_transpose(s, _int_const(args[0]), _int_const(args[1]))
        if name == "t":
            return op_permute(s, list(reversed(range(len(s.dims))))) if not s.leading and len(s.dims) <= 2 else None
        if name in ("matmul", "mm", "bmm"):
            return self._matmul(s, args[0]) if args else None
        if name in _REDUCTIONS or name == "norm":
            if name == "norm":
                if len(args) > 3:
                    return None
                dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                keep = kwargs.get("keepdim", args[2] if len(args) > 2 else None)
                return self._reduction(s, dim, keep, dim is not None)
            if name in ("std", "var") and len(args) > 1:
                return None
            dim = kwargs.get("dim", kwargs.get("axis", args[0] if args else None))
            keep = kwargs.get("keepdim", args[1] if len(args) > 1 else None)
            return self._reduction(s, dim, keep, dim is not None)
        if name in _PAIR_REDUCTIONS:
            if args and isinstance(args[0], Shape):
                return self._broadcast_values(s, args[0], True)
            dim = kwargs.get("dim", args[0] if args else None)
            keep = kwargs.get("keepdim", args[1] if len(args) > 1 else None)
            if dim is None:
                return make_shape([])
            reduced = self._reduction(s, dim, keep, True)
            return Seq((reduced, reduced)) if reduced is not None else None
        if name in ("topk",):
            k = args[0] if args else kwargs.get("k")
            axis = _int_const(kwargs.get("dim", args[1] if len(args) > 1 else IntVal(-1)))
            pos = _normalize_axis(axis, s.rank) if axis is not None and axis >= 0 else axis
            if k is None or pos is None or (pos < 0 and -pos > len(s.dims)):
                return None
            dims = list(s.dims)
            dims[pos] = as_dim(k)
            out = make_shape(dims, s.leading)
            return Seq((out, out))
        if name == "sort":
            return Seq((plain, plain))
        if name in ("expand", "broadcast_to"):
            return self._expand(s, node, args)
        if name == "repeat":
            reps = self._int_list(node, args, "repeats")
            if reps is None or s.leading or len(reps) < len(s.dims):
                return None
            dims = (1,) * (len(reps) - len(s.dims)) + s.dims
            return make_shape([dim_product([r, d]) if r is not None else None for r, d in zip(reps, dims)])
        if name == "gather":
            return _gathered(args[1] if len(args) > 1 else kwargs.get("index"))
        if name == "where":
            if not args:
                return None
            out = self._broadcast_values(args[0], s, True) if isinstance(args[0], Shape) else None
            return self._broadcast_values(out, args[1], True) if out is not None and len(args) > 1 else None
        if name in ("new_zeros", "new_ones", "new_empty", "new_full"):
            size = args[0] if args else kwargs.get("size")
            if isinstance(size, (IntVal, Opaque)) and name != "new_full" and len(args) > 1:
                size = Seq(tuple(args))
            if isinstance(size, Opaque):
                return None  # a name that may hold a whole size tuple
            dims = as_dims(size) if not isinstance(size, IntVal) else ((size.dim,), False)
            return make_shape(dims[0], dims[1]) if dims else None
        if name in ("softmax", "log_softmax", "cumsum"):
            return s
        return None

    def _int_list(self, node, args, kw):
        if len(args) == 1 and isinstance(args[0], Seq):
            values = args[0].items
        elif args and any(isinstance(a, ast.Starred) for a in node.args):
            return None
        else:
            values = args
        out = []
        for v in values:
            if not isinstance(v, IntVal):
                return None
            out.append(v.dim)
        return out

    def _view(self, s: Shape, node, args):
        if len(node.args) == 1 and not isinstance(node.args[0], ast.Starred):
            only = args[0]
            if isinstance(only, (Seq, SizeVal)):
                dims = as_dims(only)
                if dims is None or dims[1]:
                    return None
                literal_ones = [i for i, e in enumerate(node.args[0].elts) if int_const(e) == 1] \
                    if isinstance(node.args[0], (ast.Tuple, ast.List)) else []
                return op_view(s, dims[0], literal_ones)
            if isinstance(only, Opaque):
                return None  # a name that may hold a whole size tuple
            if not isinstance(only, IntVal):
                return None  # view(dtype) rescales the last dim by the element sizes
        dims, literal_ones = [], []
        for arg_node, value in zip(node.args, args):
            if isinstance(arg_node, ast.Starred):
                spread = as_dims(value)
                if spread is None or spread[1]:
                    return None
                dims.extend(spread[0])
                continue
            if value is not None and not isinstance(value, (IntVal, Opaque)):
                return None  # an unknown value is a size of its own (`128 * (s // 4) * (s // 4)`)
            if int_const(arg_node) == 1:
                literal_ones.append(len(dims))
            dims.append(as_dim(value))
        return op_view(s, dims, literal_ones)

    def _expand(self, s: Shape, node, args):
        if len(args) == 1 and isinstance(args[0], (Seq, SizeVal)):
            dims = as_dims(args[0])
            if dims is None or dims[1]:
                return None
            sizes = list(dims[0])
        else:
            if any(isinstance(a, ast.Starred) for a in node.args) or (len(args) == 1 and not isinstance(args[0], IntVal)):
                return None
            sizes = [as_dim(a) if isinstance(a, (IntVal, Opaque)) else None for a in args]
        if s.leading or len(sizes) < len(s.dims):
            return None
        pad = len(sizes) - len(s.dims)
        out = []
        for i, size in enumerate(sizes):
            if size == -1 and isinstance(size, int):
                out.append(s.dims[i - pad] if i >= pad else None)
            else:
                out.append(size)
        return make_shape(out, False, s.explicit)  # `x[:, None].expand(n, 1)` keeps the 1 asked for


def _gathered(index) -> Optional[Shape]:
    """`gather`'s result has its index's shape; a 1 made for the index (`actions.unsqueeze(1)`)
    is no broadcast the author asked for."""
    s = as_shape(index)
    return replace(s, explicit=frozenset()) if s is not None and s.explicit else s


def _float_constant(node) -> bool:
    if node.__class__ is ast.UnaryOp and node.op.__class__ in (ast.USub, ast.UAdd):
        node = node.operand
    return node.__class__ is ast.Constant and node.value.__class__ is float


def _loss_function(qual: Optional[str]) -> Optional[Loss]:
    """`F.mse_loss` used as a value (`criterion = F.mse_loss`)."""
    if qual and qual.startswith("torch.nn.functional.") and qual.rsplit(".", 1)[1] in LOSS_FUNCTIONS:
        return Loss(qual.rsplit(".", 1)[1])
    return None


def _conv(s: Optional[Shape], out_dim, spatial: int) -> Optional[Shape]:
    if s is None:
        return make_shape([out_dim] + [None] * spatial, True)
    if len(s.dims) < spatial + 1:
        return None if not s.leading else make_shape([out_dim] + [None] * spatial, True)
    head = s.dims[:len(s.dims) - spatial - 1]
    return make_shape(head + (out_dim,) + (None,) * spatial, s.leading)


def _slice_size(item, d):
    if _is_full_slice(item):
        return d
    lo, hi, step = int_const(item.lower), int_const(item.upper), int_const(item.step)
    if any(v is None and part is not None for v, part in ((lo, item.lower), (hi, item.upper), (step, item.step))):
        return None
    if isinstance(d, int):
        return len(range(d)[slice(lo, hi, step)])
    if step in (None, 1):
        if lo is not None and hi is not None and 0 <= lo < hi and hi - lo == 1:
            return 1
        if lo == -1 and hi is None:
            return 1
    return None


def _is_full_slice(item) -> bool:
    return isinstance(item, ast.Slice) and item.lower is None and item.upper is None and item.step is None


def _bool_value(value) -> Optional[bool]:
    if isinstance(value, IntVal) and isinstance(value.dim, int):
        return bool(value.dim)
    return None


def _literal_shape(node) -> Optional[Shape]:
    """Shape of a literal nest passed to torch.tensor."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return make_shape([])
    if isinstance(node, (ast.List, ast.Tuple)):
        inner = [_literal_shape(e) for e in node.elts]
        if not inner:
            return make_shape([0])
        if any(s is None for s in inner) or any(s != inner[0] for s in inner):
            return None
        return make_shape((len(inner),) + inner[0].dims)
    return None


def _size_receiver(node) -> Optional[str]:
    """The name x in `x.shape` / `x.size()`, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name):
        return node.value.id
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size"
            and not node.args and not node.keywords and isinstance(node.func.value, ast.Name)):
        return node.func.value.id
    return None


def _unwrap_tuple_call(node):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("tuple", "list") \
            and len(node.args) == 1:
        return node.args[0]
    return node


def _drop_first_arg(node: ast.Call) -> ast.Call:
    return ast.Call(func=node.func, args=node.args[1:], keywords=node.keywords)


def module_assignments(ctx) -> dict:
    """Names the module binds exactly once, by a plain `name = value`, and no function declares
    `global`: name -> the value."""
    found = ctx.shared.get("shapes.module_assignments")
    if found is None:
        found = ctx.shared["shapes.module_assignments"] = {}
        body = ctx.tree.body
        for stmt in scope_statements(body):
            if stmt.__class__ is ast.Assign and len(stmt.targets) == 1 and stmt.targets[0].__class__ is ast.Name:
                found[stmt.targets[0].id] = stmt.value
        if found:
            counts = _Bindings(body, False, False).counts
            rebound = {name for node in walk(ctx.tree) if node.__class__ is ast.Global for name in node.names} \
                if "global" in ctx.source else ()
            for name in [name for name in found if counts.get(name) != 1 or name in rebound]:
                del found[name]
    return found


def _module_constructors(ctx) -> dict:
    """Names the module binds exactly once, by `name = torch.nn.<Class>(...)`: name -> the call."""
    found = ctx.shared.get("shapes.module_constructors")
    if found is None:
        found = ctx.shared["shapes.module_constructors"] = {
            name: value for name, value in module_assignments(ctx).items()
            if value.__class__ is ast.Call and (ctx.qualname(value.func) or "").startswith("torch.nn.")}
    return found


_CALL_DEPTH = 3  # calls followed into the methods they run, one inside another


def file_classes(ctx) -> dict:
    """The classes the module defines once at its top level (and binds no other way), by name."""
    classes = ctx.shared.get("shapes.file_classes")
    if classes is None:
        found: dict = {}
        for stmt in ctx.tree.body:
            if stmt.__class__ is ast.ClassDef:
                found[stmt.name] = stmt if stmt.name not in found else None
        bound = module_assignments(ctx)
        classes = ctx.shared["shapes.file_classes"] = {k: v for k, v in found.items() if v is not None and k not in bound}
    return classes


def file_class(ctx, name: str) -> Optional[ast.ClassDef]:
    """The class the module defines once under `name` at its top level, or None."""
    return file_classes(ctx).get(name)


def instance_made(ctx, expr) -> Optional[Instance]:
    """The instance `expr` makes when it calls a class of the file (`Critic(d)`) or of a project
    module it imports (`Net()` after `from model import Net`, `models.Net()` after `import
    models`), else None."""
    if expr.__class__ is not ast.Call:
        return None
    made = class_named(ctx, expr.func)
    if made is None:
        return None
    args = [IntVal(a.value) if a.__class__ is ast.Constant and type(a.value) is int else None for a in expr.args]
    kwargs = {k.arg: IntVal(k.value.value) if k.value.__class__ is ast.Constant and type(k.value.value) is int else None
              for k in expr.keywords}
    return _constructed(made, args, kwargs, spread=any(a.__class__ is ast.Starred for a in expr.args))


def _constructed(instance: Instance, args, kwargs, spread: bool = False) -> Instance:
    """`instance` with the sizes its constructor call gives (`Critic(d, 1)`): each int argument,
    and each int default of a parameter the call leaves out; none where arguments are spread."""
    init = method_of(instance.cls, "__init__")
    if init is None or spread or None in kwargs or init.args.vararg is not None:
        return instance
    params = (init.args.posonlyargs + init.args.args)[1:]
    if len(args) > len(params):
        return instance
    given = dict(zip((p.arg for p in params), args))
    given.update(kwargs)
    defaults = dict(zip((p.arg for p in params[len(params) - len(init.args.defaults):]), init.args.defaults))
    defaults.update((p.arg, d) for p, d in zip(init.args.kwonlyargs, init.args.kw_defaults) if d is not None)
    sizes = []
    for name in [p.arg for p in params] + [p.arg for p in init.args.kwonlyargs]:
        value = given.get(name, _MISSING)
        if value is _MISSING:
            default = defaults.get(name)
            value = IntVal(default.value) if default.__class__ is ast.Constant and type(default.value) is int else None
        if isinstance(value, IntVal) and isinstance(value.dim, int) and not isinstance(value.dim, bool):
            sizes.append((name, value))
    return replace(instance, sizes=tuple(sizes)) if sizes else instance


def class_named(ctx, func) -> Optional[Instance]:
    """An instance of the class `func` names, of the file or imported from a project module."""
    if func.__class__ is ast.Name:
        if ctx.qualname(func) is None:
            cls = file_class(ctx, func.id)
            return Instance(cls, ctx) if cls is not None else None
        key = func.id
    elif func.__class__ is ast.Attribute and func.value.__class__ is ast.Name:
        key = (func.value.id, func.attr)
        bound = ctx.names.set_on_module(func)  # `nn.MaskedLinear` after `nn.MaskedLinear = MaskedLinear`
        if bound is not None:
            cls = file_class(ctx, bound)
            return Instance(cls, ctx) if cls is not None else None
    else:
        return None
    imported = _imported_classes(ctx)
    if key not in imported:
        if (key if func.__class__ is ast.Name else key[0]) not in import_table(ctx) or not in_script_project(ctx):
            return None  # no import binds the name, or a library's tree: no class of another module read
        found = imported_class(ctx, func)
        imported[key] = Instance(found[0], found[1]) if found is not None else None
    return imported[key]


def _imported_classes(ctx) -> dict:
    """name, or (module alias, name) -> the Instance a call of it makes, for the names of imported
    project classes looked up in the file so far (None: no such class)."""
    found = ctx.shared.get("shapes.imported_classes")
    if found is None:
        found = ctx.shared["shapes.imported_classes"] = {}
    return found


def forward_of(cls: ast.ClassDef) -> Optional[str]:
    """The method a call of an instance runs: `forward`, or `__call__` where the class defines it
    in place of `forward`."""
    if method_of(cls, "forward") is not None:
        return "forward"
    return "__call__" if method_of(cls, "__call__") is not None else None


def module_level_value(ctx, name: str):
    """What a free name of a function holds when the module binds it once: an instance of a
    class of the file (`model = PPO()`), a number (`gamma = 0.98`) or a size (`BATCH_SIZE = 128`);
    else None."""
    value = module_assignments(ctx).get(name)
    if value is None:
        return None
    if value.__class__ is ast.Constant and type(value.value) is float:
        return SCALAR
    if value.__class__ is ast.Constant and type(value.value) is int:
        return IntVal(value.value)
    return instance_made(ctx, value)


def may_be_passed_instances(ctx, fn) -> bool:
    """Whether a call of `fn` in the file may pass it an instance of a class of the file: the
    file has classes, and calls `fn` by name somewhere besides its `def` (a constructor's
    callers are not calls of it)."""
    name = getattr(fn, "name", "__init__")
    return (name != "__init__" and (bool(file_classes(ctx)) or _may_import_classes(ctx))
            and identifier_text(ctx).count(name + "(") >= 2 and fn in ctx.tree.body)


def _may_import_classes(ctx) -> bool:
    """An import of the file can bind a class, or a module that holds one (`from model import
    Net`, `import models`): read off the import statements, without looking the modules up."""
    return any(name is not None and (entry[2] is None or entry[2][:1].isupper())
               for name, entry in import_table(ctx).items())


def passed_instance(ctx, fn, param: str) -> Optional[Instance]:
    """The instance every call of `fn` in the file passes for `param`, when all of them pass
    one of the same class of the file (`train(model, ...)` after `model = ActorCritic()`, or
    `train(ActorCritic(), ...)`); None when any call passes something else or there is none."""
    key = ("shapes.passed_instance", id(fn), param)
    if key in ctx.shared:
        return ctx.shared[key]
    ctx.shared[key] = None
    found = None
    if may_be_passed_instances(ctx, fn):
        sites = file_calls(ctx).call_sites(fn)
        classes = set()
        for site in sites:
            expr = argument_for(site, fn, param)
            made = instance_made(ctx, expr) if expr is not None else None
            if made is None and expr.__class__ is ast.Name:
                if site.functions:
                    assign = flow_of(ctx, site.functions[-1]).reaching(expr)
                    made = instance_made(ctx, assign.value) if assign is not None else None
                if made is None and not (site.functions and flow_of(ctx, site.functions[-1]).stores.get(expr.id)):
                    global_value = module_level_value(ctx, expr.id)  # `net = Net()` at module level
                    made = global_value if isinstance(global_value, Instance) else None
            classes.add(made)
        if len(classes) == 1 and None not in classes:
            found = classes.pop()
    ctx.shared[key] = found
    return found


def method_of(cls: ast.ClassDef, name: str):
    """The method `name` that `cls` itself defines once, taking `self`; None for static and
    class methods, properties and anything defined twice."""
    found = [stmt for stmt in cls.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name]
    if len(found) != 1 or found[0].decorator_list or isinstance(found[0], ast.AsyncFunctionDef):
        return None
    return found[0]


def returns_of(fn) -> list:
    """The `return` statements of `fn` itself (not of functions or classes nested in it); empty
    when a `yield` makes it a generator."""
    found = []
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return []
        if isinstance(node, ast.Return):
            found.append(node)
        stack.extend(child_nodes(node))
    return found


def _terminates(body) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


# -- the entry points rules use --------------------------------------------------------------------


def self_name_of(fn) -> Optional[str]:
    args = fn.args.posonlyargs + fn.args.args
    return args[0].arg if args else None


def _class_attrs(ctx, cls: ast.ClassDef, sizes: tuple = ()) -> dict:
    """`self.<attr>` values set in `__init__` (modules, losses, sizes) and never assigned
    anywhere else in the class; `sizes`: the ints the constructor was given, by parameter."""
    key = ("shapes.class", id(cls), sizes)
    cached = ctx.shared.get(key)
    if cached is not None:
        return cached
    ctx.shared[key] = {}  # guards against recursion through odd code
    attrs: dict = {}
    init = None
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "__init__":
            init = stmt
            analysis = FunctionShapes(ctx, stmt, self_name=self_name_of(stmt), scope="__init__", init_mode=True,
                                      arguments=dict(sizes))
            attrs = {k: v for k, v in analysis.stored_attrs.items()
                     if isinstance(v, (Module, Loss, Scalar)) or (isinstance(v, IntVal) and v.dim is not None)
                     or (isinstance(v, Opaque) and v.sym is not None)
                     or (isinstance(v, ModuleItems) and k not in mutated_attributes(ctx, cls))
                     or isinstance(v, Instance)}
    if attrs:
        # Attributes (of any receiver) stored or deleted outside __init__: erring on the side of
        # forgetting an attribute.
        for method in cls.body:
            if method is not init:
                for node in walk(method):
                    if node.__class__ is ast.Attribute and node.ctx.__class__ is not ast.Load:
                        attrs.pop(node.attr, None)
    ctx.shared[key] = attrs
    return attrs


def _method_around(ctx, owner) -> Optional[ast.AST]:
    """The method of the walker's class that is `owner` or holds it (`def inner(c, q)` in
    `forward`), where no parameter of a function in between rebinds the method's `self`."""
    if owner.__class__ not in (ast.FunctionDef, ast.AsyncFunctionDef):
        return None
    body = ctx.class_.body
    if owner in body:
        return owner
    functions = ctx.functions
    if not functions or functions[0] not in body or owner not in functions:
        return None
    receiver = self_name_of(functions[0])
    for inner in functions[1:functions.index(owner) + 1]:
        args = inner.args
        if receiver in {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}:
            return None
    return functions[0]


def function_shapes(ctx, owner=None):
    """The analysis of the function the walker is in (or of `owner`), computed once: a
    FunctionShapes, or for a function that cannot hold a known shape an empty stand-in (its
    `values` know nothing) that costs no analysis."""
    current = ctx.scope
    if owner is None:
        owner = current
    key = ("shapes", id(owner))
    cached = ctx.shared.get(key)
    if cached is None:
        cls = ctx.class_
        method = _method_around(ctx, owner) if cls is not None else None
        if method is not None:
            decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in method.decorator_list}
            if decorators & {"staticmethod", "classmethod"}:
                cls = None
        else:
            cls = None
        # The gate reads the names in scope where the walker is: only for the function it is in.
        if owner is current and not may_hold_shapes(ctx, owner, cls):
            cached = ctx.shared[key] = _NO_SHAPES
        elif cls is not None:
            cached = ctx.shared[key] = FunctionShapes(ctx, owner, _class_attrs(ctx, cls), self_name_of(method), lazy=True,
                                                      cls=cls)
        else:
            cached = ctx.shared[key] = FunctionShapes(ctx, owner, lazy=True)
    return cached


# -- which functions can hold a shape at all ---------------------------------------------------------
#
# The analysis learns a shape from a few sources only, and computes every other shape from one of
# them: a call of a constructor, `view`/`reshape`, a shape-giving layer (`nn.Linear(...)`, a layer
# stored in `__init__`) or a loss (`nn.MSELoss()(...)`, `F.mse_loss` called or held as a value); a
# jaxtyping/torchtyping annotation; an `assert` (`x.shape == (B, T)`, `x.ndim == 3`); or unpacking
# `B, T = x.shape` / `x.size()`. `may_hold_shapes` looks for these in the function's text and
# statements; a function with none of them is left unanalysed. Any new way `FunctionShapes` learns
# a shape from something that is not a shape must be added here; `tests/test_shapes.py`
# checks the promise on every rule example.

_NO_SHAPES = SimpleNamespace(values=MappingProxyType({}), value=lambda expr: None)

# Torch names (the last part of the qualified name) whose call gives a shape from sizes alone, or
# a layer or loss whose call does.
_SHAPE_SOURCE_NAMES = frozenset(
    _CONSTRUCTORS | {"randint", "tensor", "arange", "linspace", "logspace", "eye", "view", "reshape", "repeat",
                     "Linear", "LazyLinear", "Embedding", "Conv1d", "Conv2d", "Conv3d",
                     "cross_entropy", "nll_loss", "kl_div"}
    | LOSS_FUNCTIONS | set(LOSS_MODULES) | _OTHER_LOSS_MODULES)
# The analysis finds these names through `ctx.qualname` or as a called attribute (`x.view`): so
# in the text they follow a dot (`torch.zeros`, `nn.Linear`, `x.view`), with any space, line
# continuation or comment between, or are a name the file binds to one of them (`from torch
# import zeros as z`), which `NameResolver.names_bound_to` gives.
_DOT = r"\.(?:\s|\\|#[^\n]*\n)*"  # a comment ends at its newline: no two ways to split a row of `#`
_SHAPE_SOURCE = re.compile(_DOT + r"(?:%s)\b" % "|".join(sorted(_SHAPE_SOURCE_NAMES)))
_RESHAPE_IN_PLACE_TEXT = re.compile(_DOT + r"(?:%s)\b" % "|".join(sorted(_RESHAPES_IN_PLACE)))
_ATTRIBUTE_NAME = re.compile(_DOT + r"(\w+)")


def _owner_text(ctx, owner) -> str:
    return function_text(ctx, owner) if hasattr(owner, "lineno") else identifier_text(ctx)


def _names_a_shape_source(ctx, text: str) -> bool:
    if _SHAPE_SOURCE.search(text):
        return True
    # A name bound to a source (`from torch import zeros as z`) or to a layer the module builds
    # (`criterion = nn.MSELoss()` above the function).
    names = ctx.names.names_bound_to(_SHAPE_SOURCE_NAMES) | _module_constructors(ctx).keys()
    return any(has_word(text, name) for name in names)


def _states_shapes(body) -> bool:
    """An `assert` (it may state a shape or a rank) or `B, T = x.shape` among these statements,
    nested functions and classes left out (the analysis does not enter them)."""
    for stmt in scope_statements(body):
        cls = stmt.__class__
        if cls is ast.Assert:
            return True
        if cls is ast.Assign and _size_receiver(stmt.value) is not None and any(
                t.__class__ is ast.Tuple or t.__class__ is ast.List for t in stmt.targets):
            return True
    return False


def _uses_shaping_attribute(ctx, cls: ast.ClassDef, text: str) -> bool:
    """Whether `text` (a method of `cls`) names a layer or loss that `__init__` stores."""
    inits = [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__init__"]
    init_texts = [function_text(ctx, init) for init in inits]
    if not any("import" in init_text or _names_a_shape_source(ctx, init_text) for init_text in init_texts):
        return False  # `__init__` builds no layer or loss (its own imports could hide one: counted)
    stored = [name for name, value in _class_attrs(ctx, cls).items() if isinstance(value, (Module, Loss, ModuleItems))]
    return bool(stored) and not set(_ATTRIBUTE_NAME.findall(text)).isdisjoint(stored)


_RECEIVED_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*(?:\.\s*(\w+)\s*)?\(")


def _calls_in_text(ctx, owner) -> frozenset:
    """(name, method) for each `name(` (method None) and `name.method(` in `owner`'s text."""
    key = ("shapes.calls_in_text", id(owner))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = frozenset((m.group(1), m.group(2) or None)
                                            for m in _RECEIVED_CALL.finditer(_owner_text(ctx, owner)))
    return found


_SELF_CALL = re.compile(r"\bself\s*\.\s*\w+\s*\(")
_CALLED_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _file_callables(ctx) -> dict:
    """Names a call can spell to run code of the file's classes: each method name, with the
    methods so named, and each class name, with its methods."""
    found = ctx.shared.get("shapes.file_callables")
    if found is None:
        found = {}
        for cls in file_classes(ctx).values():
            methods = [fn for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"]
            found.setdefault(cls.name, []).extend((cls, fn) for fn in methods)
            for fn in methods:
                found.setdefault(fn.name, []).append((cls, fn))
        ctx.shared["shapes.file_callables"] = found
    return found


def _method_may_shape(ctx, cls: ast.ClassDef, fn) -> bool:
    """The method can hold a shape itself: it names a shape source, states one, or calls a
    layer its class builds in `__init__` (`self.fc_v(x)`, read off the text)."""
    key = ("shapes.method_may_shape", id(fn))
    found = ctx.shared.get(key)
    if found is None:
        text = function_text(ctx, fn)
        found = _names_a_shape_source(ctx, text) or _states_shapes(fn.body)
        if not found and _SELF_CALL.search(text) is not None:
            found = any(init.name == "__init__" and _names_a_shape_source(ctx, function_text(ctx, init))
                        for init in cls.body if isinstance(init, ast.FunctionDef))
        ctx.shared[key] = found
    return found


def _may_shape(ctx, name: str) -> bool:
    """A call named `name` may return a shape through a class of the file: a method so named,
    or a method of the class so named, can hold one."""
    return any(_method_may_shape(ctx, cls, fn) for cls, fn in _file_callables(ctx).get(name, ()))


def _calls_shaping_code(ctx, text: str, cls: Optional[ast.ClassDef]) -> bool:
    """`text` calls a method or makes an instance of a class of the file that can return a
    shape (`self.v(s)`, `model.q(s)`, `Critic(d)`), makes an instance of a class imported from a
    project module (`Net(d)`, or an instance the module makes, called as `net(x)`), or calls an
    attribute of `cls` holding one (`self.critic(s)`)."""
    imported = import_table(ctx)
    if not file_classes(ctx) and not imported:
        return False
    called = set(_CALLED_NAME.findall(text))
    if not called:
        return False
    callables = _file_callables(ctx)
    if any(_may_shape(ctx, name) for name in called if name in callables):
        return True
    if imported and any(_imported_class_may_shape(ctx, name) for name in called):
        return True
    if cls is None:
        return False
    held = _instance_attributes(ctx, cls)
    return not held.isdisjoint(called) and any(
        isinstance(value, Instance) and attr in called and _may_shape(value.source, value.cls.name)
        for attr, value in _class_attrs(ctx, cls).items())


def _imported_class_may_shape(ctx, name: str) -> bool:
    """A call spelled `name(` can make or run an instance of a class imported from a project
    module whose methods can hold a shape: the class itself (`Net(`), or a module-level name the
    file binds to such an instance (`net = Net(d)`, then `net(`)."""
    if name not in import_table(ctx):
        made = module_assignments(ctx).get(name)
        if made.__class__ is not ast.Call or made.func.__class__ is not ast.Name:
            return False
        name = made.func.id
        if name not in import_table(ctx):
            return False
    made = class_named(ctx, ast.Name(name, ast.Load()))
    return made is not None and made.source is not None and _may_shape(made.source, made.cls.name)


def _instance_attributes(ctx, cls: ast.ClassDef) -> frozenset:
    """Attributes `__init__` of `cls` assigns a call of a class of the file (`self.critic =
    Critic(d)`), or a copy of one (`self.critic_target = deepcopy(self.critic)`), read off the
    syntax."""
    key = ("shapes.instance_attributes", id(cls))
    found = ctx.shared.get(key)
    if found is None:
        classes = file_classes(ctx).keys() | import_table(ctx).keys()
        found = set()
        for fn in cls.body:
            if (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"
                    and any((_may_shape(ctx, name) if name in file_classes(ctx)
                             else _imported_class_may_shape(ctx, name))
                            for name in set(_CALLED_NAME.findall(function_text(ctx, fn))) if name in classes)):
                copies = []
                for node in ast.walk(fn):
                    if node.__class__ is ast.Assign and node.value.__class__ is ast.Call:
                        call = node.value
                        if call.func.__class__ is ast.Name and call.func.id in classes:
                            found.update(t.attr for t in node.targets if t.__class__ is ast.Attribute)
                        elif (len(call.args) == 1 and call.args[0].__class__ is ast.Attribute
                              and ctx.qualname(call.func) in ("copy.deepcopy", "copy.copy")):
                            copies.append((call.args[0].attr, node.targets))
                for copied, targets in copies:
                    if copied in found:
                        found.update(t.attr for t in targets if t.__class__ is ast.Attribute)
        found = ctx.shared[key] = frozenset(found)
    return found


def may_hold_shapes(ctx, owner, cls: Optional[ast.ClassDef] = None) -> bool:
    """False only when the analysis of `owner`, the function (or module) the walker is in, can
    know no shape; `cls` is the class when `owner` is one of its methods."""
    if may_mention(ctx, "jaxtyping") or may_mention(ctx, "torchtyping"):
        return True
    text = _owner_text(ctx, owner)
    if _names_a_shape_source(ctx, text):
        return True
    if _states_shapes(owner.body if isinstance(owner.body, list) else []):
        return True
    if cls is not None and _uses_shaping_attribute(ctx, cls, text):
        return True
    return _calls_shaping_code(ctx, text, cls)


# `.name =`, `.name += ...`, `.name, ... =` (and `.name,` in an argument list: a gate may say too much).
_ATTRIBUTE_STORE = re.compile(r"\.\s*([A-Za-z_]\w*)\s*(?:,|(?:[-+*/@%&|^]|//|\*\*|<<|>>)?=(?!=))")


def _stored_attribute_names(ctx) -> frozenset:
    """The attribute names the file's text may store to, read once."""
    found = ctx.shared.get("shapes.stored_attribute_names")
    if found is None:
        found = ctx.shared["shapes.stored_attribute_names"] = frozenset(_ATTRIBUTE_STORE.findall(identifier_text(ctx)))
    return found


# Attributes whose value can be a tensor of known shape (`x.T`, `x.data`, `x.max(-1).values`);
# the value of any other attribute is a size, a module, a number or unknown (see `_attribute`).
_SHAPED_ATTRS = frozenset({"T", "mT", "mH", "data", "real", "imag", "grad", "values", "indices"})
# Expressions whose value is never a Shape: numbers and strings, tuples and lists (a `Seq`),
# other displays and comprehensions, lambdas and `and`/`or` (see `_infer`).
_NEVER_SHAPED = (ast.Constant, ast.JoinedStr, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.ListComp,
                 ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda, ast.BoolOp)


def never_shaped(expr, ctx) -> bool:
    """True when `shape_of(ctx, expr)` is None whatever the rest of the function says, read off
    `expr`'s syntax alone: numbers, strings, displays, `x.dtype`, `x.shape`, `x.shape[0]`, an
    attribute the file never stores to (`self.scale`: what a method stored in `self.y` it may read
    back)... Rules check this before asking for shapes, so a function whose operands are all like
    that is never analysed. Mirrors `_infer`: change both together."""
    while type(expr) is ast.UnaryOp:
        if type(expr.op) is ast.Not:
            return True
        expr = expr.operand
    if isinstance(expr, _NEVER_SHAPED):
        return True
    if type(expr) is ast.Attribute:
        return expr.attr not in _SHAPED_ATTRS and not (
            expr.value.__class__ is ast.Name and expr.attr in _stored_attribute_names(ctx))
    if type(expr) is ast.Subscript:  # `x.shape[...]`: a size or a dim
        value = expr.value
        return type(value) is ast.Attribute and value.attr == "shape"
    return False


def value_of(ctx, expr):
    """What the analysis knows about `expr` in the function being walked (None: nothing)."""
    return function_shapes(ctx).value(expr)


def shape_of(ctx, expr) -> Optional[Shape]:
    """The shape of tensor expression `expr`, or None when it is not known to be a tensor of a
    known rank."""
    return as_shape(value_of(ctx, expr))


def loss_of(ctx, expr) -> Optional[Loss]:
    """The loss `expr` holds in the function being walked (`criterion`, `self.loss_fn`,
    `nn.MSELoss()`), or None. Asks the analysis, which reads the function up to `expr`, only where
    a loss can be: most called names and attributes are settled by `_may_hold_loss` alone."""
    analysis = function_shapes(ctx)
    if analysis is _NO_SHAPES or not analysis.may_hold_loss(expr):
        return None
    value = analysis.value(expr)
    return value if isinstance(value, Loss) else None


# -- patterns the MAT2xx rules look for ------------------------------------------------------------


def trailing_one_mismatch(a: Optional[Shape], b: Optional[Shape]) -> bool:
    """`a` is (..., N, 1) and `b` is (..., N) with one dim less: the trailing 1 of `a` meets
    N and the result grows an (N, N) block. True only when both N are the same known size,
    broadcasting succeeds whatever the symbols are, and neither operand holds a 1 the author
    asked for (`[:, None]`, `unsqueeze`, `keepdim=True`, `view(-1, 1)`)."""
    if a is None or b is None or b.leading or not b.dims:
        return False
    if len(a.dims) < len(b.dims) + 1 or not (a.dims[-1] == 1 and isinstance(a.dims[-1], int)):
        return False
    if a.explicit or b.explicit:
        return False
    n = b.dims[-1]
    if n == 1 or not dim_eq(a.dims[-2], n):
        return False
    for x, y in aligned_pairs(a, b):
        if not (y == "absent" or dim_eq(x, y) or x == 1 or y == 1):
            return False
    return True


def fmt_shape(s: Optional[Shape]) -> str:
    return "?" if s is None else str(s)
