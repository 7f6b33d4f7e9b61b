"""MAT503: what the messages tell the author to write instead, and the text of the `device=` fix:
the fill that makes a constant of one value on the device, torch's sampler for a numpy draw,
`torch.empty` for a legacy constructor given sizes, the factory to create where a sampler draws."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic.flow import flow_of
from matlint.semantic.kinds import TYPED_TENSORS

from .factories import FILLS, LEGACY_CONSTRUCTORS, RANDOM, torch_factory
from .host_data import NUMPY_LIKE_FILLS


def numpy_message(ctx, made: ast.Call, device: str, where: str) -> str:
    """The finding for data that numpy makes on the host (`made`, see `host_data.numpy_made`) and
    that is copied to `device`."""
    module, _, name = ctx.qualname(made.func).rpartition(".")
    drawn = module == "numpy.random"
    if name in NUMPY_LIKE_FILLS:  # `np.ones_like(r)`: torch's fill of its shape
        rest = [ctx.segment(a) for a in made.args[1:]]
        instead = f"torch.{name[:-len('_like')]}({', '.join([ctx.segment(made.args[0]) + '.shape'] + rest)}, " \
                  f"device={device})"
    else:
        instead = _torch_for_numpy(ctx, name, made, device) if drawn else (
            f"torch.{name}({', '.join(ctx.segment(a) for a in made.args)}, device={device})")
    return (f"`{ctx.segment(made.func)}(...)` {'draws' if drawn else 'fills'} an array on the host "
            f"that is copied to the device on every {where}; "
            + (f"make it there: `{instead}`" if instead else
               f"draw it there with torch's sampler and `device={device}`"))


def _torch_for_numpy(ctx, name: str, call: ast.Call, device: str) -> Optional[str]:
    """The torch call that draws what `np.random.<name>(...)` draws, on the device."""
    seg = ctx.segment
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if name in ("randn", "rand"):
        return f"torch.{name}({', '.join([seg(a) for a in call.args] + [f'device={device}'])})"
    parameters = {"normal": ("loc", "scale", "size"), "uniform": ("low", "high", "size"),
                  "random": ("size",), "random_sample": ("size",), "randint": ("low", "high", "size")}.get(name)
    if parameters is None:
        return None
    given = dict(zip(parameters, call.args))
    given.update((k.arg, k.value) for k in call.keywords)
    if set(given) - set(parameters) or "size" not in given:
        return None
    size = seg(given["size"])
    if name == "randint":  # torch's takes the size as a tuple
        size = size if isinstance(given["size"], (ast.Tuple, ast.List)) else f"({size},)"
        bounds = ", ".join(seg(given[p]) for p in ("low", "high") if p in given)
        return f"torch.randint({bounds}, {size}, device={device})"
    low, high = (("loc", "scale") if name == "normal" else ("low", "high"))
    default = {"loc": 0, "scale": 1, "low": 0, "high": 1}
    if all(low_high not in given or isinstance(given[low_high], ast.Constant)
           and given[low_high].value == default[low_high] for low_high in (low, high)):
        return f"torch.{'randn' if name == 'normal' else 'rand'}({size}, device={device})"
    bounds = ", ".join(seg(given[p]) if p in given else str(default[p]) for p in (low, high))
    return f"torch.empty({size}, device={device}).{'normal_' if name == 'normal' else 'uniform_'}({bounds})"


def _legacy_dtype(ctx, factory: ast.Call) -> Optional[str]:
    """The dtype a legacy constructor gives whatever the numbers (`torch.Tensor([1])` float32,
    `torch.LongTensor([0])` int64), or None for another factory."""
    legacy = (ctx.qualname(factory.func) or "").rpartition(".")[2]
    if legacy in TYPED_TENSORS or legacy == "Tensor":
        return TYPED_TENSORS.get(legacy, "torch.float32")
    return None


def fill_message(ctx, factory: ast.Call, value: ast.AST, number, shape: tuple, device: str, where: str) -> str:
    """A constant of one repeated number (`torch.tensor(0.0, device=d)`, `torch.tensor([0, 0],
    device=d)`): a fill on the device makes a new tensor each time, without a copy, so it
    also fits a tensor that is changed in place, returned or kept."""
    keywords = [f"{k.arg}={ctx.segment(k.value)}" for k in factory.keywords if k.arg != "device"]
    dtype = _legacy_dtype(ctx, factory)
    if dtype is not None:
        if not (dtype == "torch.float32" and number in (0, 1) and type(number) is not bool):
            keywords.append(f"dtype={dtype}")
    elif not any(k.arg == "dtype" for k in factory.keywords) and type(number) in (bool, int):
        # `torch.tensor(0)` is int64 and `torch.tensor(True)` bool; `torch.zeros(())` would be float
        keywords.append("dtype=torch.bool" if type(number) is bool else "dtype=torch.long")
    keywords.append(f"device={device}")
    if number in (0, 1):
        size = ", ".join(map(str, shape)) or "()"
        instead = f"torch.{'zeros' if number == 0 else 'ones'}({size}, {', '.join(keywords)})"
    else:
        size = f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"
        text = ctx.segment(value) if not shape or number is None else repr(number)
        instead = f"torch.full({size}, {text}, {', '.join(keywords)})"
    if not shape:
        return (f"this scalar is copied from the host to the device on every {where}; "
                f"`{instead}` fills it on the device without a copy (or pass the Python number "
                "where the op takes one)")
    if number is None:
        return (f"this tensor of a Python number computed on each pass is copied from the host to the device on "
                f"every {where}; `{instead}` fills it on the device without a copy")
    return (f"this constant tensor of one repeated value is copied from the host to the device on "
            f"every {where}; `{instead}` fills it on the device without a copy")


def repeated_message(ctx, factory: ast.Call, number: ast.AST, shape: tuple, device: str, where: str) -> str:
    """`torch.tensor([i] * n, device=d)`, `torch.LongTensor([[sos] * b])`: a nest of lists of one
    Python number, built and copied on every pass; `torch.full` makes the same values (and dtype)
    on the device."""
    keywords = [f"{k.arg}={ctx.segment(k.value)}" for k in factory.keywords if k.arg != "device"]
    dtype = _legacy_dtype(ctx, factory)
    if dtype is not None:
        keywords.append(f"dtype={dtype}")
    keywords.append(f"device={device}")
    sizes = [str(d) if isinstance(d, int) else ctx.segment(d) for d in shape]
    size = f"({sizes[0]},)" if len(sizes) == 1 else f"({', '.join(sizes)})"
    instead = f"torch.full({size}, {ctx.segment(number)}, {', '.join(keywords)})"
    return (f"this list of one repeated number is built on the host and copied to the device on every {where}; "
            f"`{instead}` fills it on the device without a copy")


def sampler_input(ctx, call: ast.Call) -> Optional[ast.Call]:
    """`torch.bernoulli(p * torch.ones(shape))`: the one factory in the sampler's input made
    without `device=` (the sampler draws where its input is, so that factory is the one to make
    on the device); None for an input of unknown place (`torch.bernoulli(probs)`)."""
    inputs = [sub for arg in call.args for sub in ast.walk(arg) if isinstance(sub, ast.Call)
              and (torch_factory(ctx, sub) or ("",))[0] in FILLS | RANDOM
              and not any(k.arg == "device" for k in sub.keywords)]
    return inputs[0] if len(inputs) == 1 else None


def sampler_message(ctx, call: ast.Call, made: ast.Call, device: str, where: str) -> str:
    func = ctx.segment(call.func)
    return (f"`{func}(...)` samples on the host and its result is copied to the device on every "
            f"{where}; `{func}` takes no `device=` (it samples where its input is): create "
            f"`{ctx.segment(made)}` there with `device={device}`")


def sizes_message(ctx, name: str, call: ast.Call, device: str, where: str, moved_on=None) -> str:
    sizes = ", ".join(ctx.segment(a) for a in call.args)
    copied = f"copies it to the device on line {moved_on}" if moved_on else "copies it to the device"
    return (f"`{ctx.segment(call)}` allocates an uninitialised tensor on the host and {copied} "
            f"on every {where}; allocate it there: "
            f"`torch.empty({sizes}, {LEGACY_CONSTRUCTORS[name]}device={device})`")


def created_on_device(ctx, move: ast.Call, factory: ast.Call, device: str) -> Optional[str]:
    """The text that replaces `move` (`torch.zeros(n).to(d)`) in the `device=` fix:
    `torch.zeros(n, device=d)`, with the ops between the factory and the move kept; None where
    the fix could not keep the code's comments."""
    text = ctx.segment(factory)
    if not text.endswith(")"):
        return None
    arguments = factory.args + factory.keywords
    if "#" in text and arguments:
        # A comment after the last argument would swallow a `device=...)` put before the `)`:
        # put it right after the last argument instead.
        last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))
        span = ast.AST(lineno=factory.lineno, col_offset=factory.col_offset,
                       end_lineno=last.end_lineno, end_col_offset=last.end_col_offset)
        head = ctx.segment(span)
        if not text.startswith(head):
            return None
        created = f"{head}, device={device}{text[len(head):]}"
    else:
        head = text[:-1].rstrip()
        separator = "" if head.endswith(("(", ",")) else ", "
        if head.endswith(","):
            separator = " "
        created = f"{head}{separator}device={device})"
    moved = ctx.segment(move.func.value)
    if moved != text:  # ops between the factory and the move: they now run on the device
        if moved.count(text) != 1:
            return None
        created = moved.replace(text, created)
    if "#" in ctx.segment(move).replace(text, ""):
        return None  # a comment between the factory and the end of the move would be dropped
    return created


def range_message(ctx, name: str, call: ast.Call, device: str, where: str) -> str:
    """`torch.LongTensor(range(n))`, `torch.tensor(list(range(n)))`: `torch.arange` on the host."""
    data = call.args[0]
    if isinstance(data.func, ast.Name) and data.func.id == "list":
        data = data.args[0]
    bounds = ", ".join(ctx.segment(a) for a in data.args)
    dtype = {"LongTensor": "dtype=torch.long, ", "FloatTensor": "dtype=torch.float32, ",
             "Tensor": "dtype=torch.float32, "}.get(name, "")
    dtype += "".join(f"{k.arg}={ctx.segment(k.value)}, " for k in call.keywords if k.arg == "dtype")
    return (f"`{ctx.segment(call)}` builds a range on the host and copies it to the device on every {where}; "
            f"`torch.arange({bounds}, {dtype}device={device})` makes it there")


def sample_message(ctx, call: ast.Call, device: str, where: str, moved_on=None) -> str:
    """`Normal(0, 1).sample(shape)` copied to the device: torch's sampler draws the same
    distribution there (`torch.randn` for a standard normal, `torch.rand` for a uniform on [0,
    1)); other parameters: a distribution of tensors made on the device."""
    made = call.func.value
    if isinstance(made, ast.Name):  # `normal = Normal(0, 1)`
        assign = flow_of(ctx, ctx.function).reaching(made) if ctx.function is not None else None
        made = assign.value if assign is not None else None
    qualname = (ctx.qualname(made.func) or "") if isinstance(made, ast.Call) else ""
    numbers = [a.value for a in made.args if isinstance(a, ast.Constant)] if isinstance(made, ast.Call) else []
    sampler = {("Normal", (0, 1)): "randn", ("Uniform", (0, 1)): "rand"}.get(
        (qualname.rpartition(".")[2], tuple(numbers)))
    shape = ctx.segment(call.args[0]) if len(call.args) == 1 and not call.keywords else None
    instead = (f"`torch.{sampler}({shape}, device={device})`" if sampler and shape
               else "torch's sampler with `device=`, or a distribution of tensors made on the device")
    copied = f" on line {moved_on}" if moved_on else ""
    return (f"`{ctx.segment(call)}` draws on the host (its distribution holds Python numbers) and is copied to "
            f"the device{copied}, on every {where}; draw it there: {instead}")
