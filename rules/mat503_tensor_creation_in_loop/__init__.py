"""MAT503 tensor-creation-in-loop: tensors built on the host and copied to the device on every
iteration or every forward call.

The rule's metadata, docs and visitor are here; what it reads is in its modules: `factories`
(the tensor a call makes and the device it goes to), `host_data` (arrays numpy makes per pass),
`stays_quiet` (where a tensor per pass is needed or runs once) and `advice` (what to write
instead, and the `device=` fix). Whether the call runs on every step is the semantic model's
`per_step`, narrowed for first- and last-iteration branches by `stays_quiet.repeated_step`."""
from __future__ import annotations

import ast
import os
from typing import Optional

from matlint.diagnostics import Fix
from matlint.rule import Only, Rule

from matlint.semantic.kinds import (JOINS, MODULE_CLASS, TENSOR, TYPED_TENSORS, class_attribute_values, cuda_tensor_type, kind_of,
                                    module_output)
from matlint.semantic.project import moves_work_to_cuda
from matlint.semantic.names import TESTS
from matlint.semantic.steps import derives_from_module, step_functions

from .advice import (created_on_device, fill_message, numpy_message, range_message, repeated_message, sample_message,
                     sampler_input, sampler_message, sizes_message)
from .factories import (FILLS, FROM_DATA, RANDOM, carried_from_branches, carried_from_helper, carried_through_join, carried_to_move, constant_values, host_attribute, computed_number, device_target, exact_on_device,
                        has_mover_helpers, helper_made, host_made, index_binding, INDEX_FACTORIES, NUMPY_INDEX_FACTORIES, NUMPY_INDEX_TRICKS, indexed_tensors, is_constant_data, moved_expression,
                        is_device, is_false, legacy_sizes, numpy_literal, one_value, range_data, repeated_number, round_trip_source, set_once_attribute,
                        same_values_on_device, takes_device,
                        torch_factory, unwrapped)
from .host_data import numpy_made, same_data_every_iteration
from .stays_quiet import (fills_a_cache, in_value_checked_branch, kept_apart, repeated_step,
                          sized_by_loop_item, varies_per_iteration)


# Factories whose list of one repeated number `torch.full` makes on the device (the legacy typed
# constructors with their dtype).
_REPEATABLE = frozenset({"tensor", "as_tensor", "Tensor"} | set(TYPED_TENSORS))


def _shown(ctx, expr: ast.AST) -> str:
    """`expr` quoted and followed by a comma, where it is short enough to read in a message."""
    text = ctx.segment(expr)
    return f"`{text}`, " if len(text) <= 40 and "\n" not in text else ""


def _names_numpy_index_maker(ctx) -> bool:
    return "r_[" in ctx.source or "c_[" in ctx.source


class TensorCreationInLoop(Rule):
    code = "MAT503"
    name = "tensor-creation-in-loop"
    quiet_in = (TESTS,)
    summary = "A tensor created on the host and copied to the device on every loop iteration or forward call."
    runtime_docs = """
    The guard reports tensors a step makes on the host and copies to the device from one line,
    at least twice in the window and once every four steps: a factory's fill or draw moved with
    `.to()` (make it on the device), and the same Python values uploaded every time (make it
    once). Quiet on values that change from step to step (an environment's state, a batch or
    replay sample assembled on the host), on tensors made on the device, and on copies into a
    buffer the program keeps. On a GPU the estimate times the upload between queued GEMMs.
    """
    docs = """
    ## What it does
    Inside a loop, in an `nn.Module`'s `forward`, or in a function that runs every step (a
    training step, a method of a module that runs its `forward`, like an RL policy's
    `get_action(state)`, or a helper that `forward`, a step or a training/batch loop calls on
    every pass, in this file or in a project file that imports it: `create_mask(...)` in
    train.py's loop over batches, `agent.choose_action(obs)` in main.py's loop that calls
    `agent.learn()` each pass, or a class of the file made in another module's `forward`,
    which runs its `__init__` on every call; a module's method named for the loss,
    `loss_function`, counts as a step; not under an `if` other than one on the run's configuration
    (`if args.use_mask:`, `if scaler is None:`, also a default made under it: `if mask is None: mask =
    CausalMask(...)`), or on the module's mode, `if self.training:` /
    `else:`, or on its settings, `if self.bidirectional and self.nlayers > 1:` / `else:`
    (attributes only its set-up assigns; not a debug or logging switch); a function an epoch
    loop calls after its training loop runs once per epoch), flags:
    - a tensor created on the host and then moved (`torch.zeros(n).to(device)`,
      `torch.arange(n).cuda()`, `torch.randn(b, d).to(x.device)`): it can be created on the
      device directly. The evidence is the factory (no `device=`) and the move of what it
      made: through ops that leave it where it is (`torch.arange(L).unsqueeze(0).repeat(b,
      1).cuda()`, `torch.empty(1, 1).type_as(x).fill_(v)`, `.clamp(...)`, arithmetic with
      numbers, `torch.exp(...)`, `torch.cat` of fills, a comparison of one with itself, a
      `masked_fill` of numbers by a mask of its own values: `mask.float().masked_fill(mask == 0,
      float("-inf"))`);
      through the names that carry it to the copy, over several assignments (`alpha =
      torch.rand(n, 1)`, `alpha = alpha.expand_as(x).to(d)`), past the CPU path of a
      conditional move (`z = torch.zeros(n)`, `if x.is_cuda: z = z.cuda()`, also `x, z = x.cuda(),
      z.cuda()`, then `z` read on either path), from either arm of an `if` (`if done: bit =
      torch.Tensor([0])` / `else: bit = torch.Tensor([1])`, then `bit.cuda()`: each arm is
      reported), through a join of tensors made on the host that go nowhere else (`ones =
      torch.ones(b, n)`, `zeros = torch.zeros(b, n)`, `lbl = torch.cat((ones, zeros), 1)`, then
      `lbl.cuda()`: each part is reported), and past calls that fill an uninitialised allocation (`conf_t =
      torch.LongTensor(num, priors)`, `match(..., conf_t)`, `conf_t = conf_t.cuda()`); or
      made and returned by a function of the file, also over several assignments there
      (`self._square_mask(len(src)).to(device)`, `self.label2onehot(torch.zeros(n),
      2).to(d)`, `diffusion.sample_timesteps(n).to(d)` on an instance of a class of the file)
      or of a project module it imports (`causal_mask(n).to(d)` after `from dataset import
      causal_mask`), also through a name that only carries its result to the move (`src_mask =
      square_mask(n)`, then `model(x, src_mask.cuda())`).
      Also Python data of the same values made on a device tensor's device with `x.new([...])`
      or `x.new_tensor([...])` (numbers, or attributes the set-up assigns once; `x` a tensor, or
      the new one used as a tensor: `sos = ys[0].new([sos_id])`, then `torch.cat([sos, y])`).
      A move is `.to(device)`, `.cuda()`, `.type(<a CUDA tensor type or a name bound to
      one>)`, `.type_as(t)` of a tensor `t` not known to be on the CPU (it goes to `t`'s
      device), or a helper of the file or of a project module it imports that returns its one
      argument (its other parameters have defaults) moved on some path and as it is on the
      others (`get_torch_variable(x)`; `tensor2var(z)` after `from utils import *`, whose body
      is `x = x.cuda()` then `return Variable(x)`). A draw from a distribution given Python
      numbers (`Normal(0, 1).sample(shape)`) is made on the host too, and so are random values
      drawn in place over a tensor made from host data (`torch.FloatTensor(a).data.normal_(0,
      s)`: the data gives only the shape); a sample drawn on the
      host from a host-made input
      (`torch.bernoulli(p * torch.ones(shape)).to(d)`): `torch.bernoulli` and `torch.normal(mean,
      std)` take no `device=` and sample where their input is, so that input is what to make on
      the device;
    - a constant copied from the host (`torch.tensor([0.5, 2.0], device=x.device)`,
      `torch.tensor(1.0).cuda()`, or an attribute of the module that only its set-up
      assigns and nothing changes in place: `torch.tensor(self.max_action).to(self.device)`,
      also in a list, `torch.Tensor([self.gamma]).cuda()`, or counted,
      `torch.IntTensor([len(self.anchor_mask)]).to(self.device)`, or
      a name the module binds once at its top level to numbers or numpy of numbers, which no
      code of the file rebinds or changes: `torch.FloatTensor(QUANTS).cuda()` after `QUANTS =
      np.linspace(0, 1, N)`):
      the same values are uploaded again each time. A constant of
      one repeated value (a scalar `torch.tensor(0.0, device=d)`, often an accumulator updated in
      place, or `torch.tensor([0, 0], device=d)`) gets the fill that makes it on the device
      (`torch.zeros((), device=d)`, `torch.zeros(2, dtype=torch.long, device=d)`: same dtype),
      not a buffer: a fill is a new tensor each time, so it also fits a tensor that is kept,
      returned or changed in place; so does a Python number computed on each pass
      (`torch.tensor(i / n_T).to(d)`: `torch.full((), i / n_T, device=d)`; `torch.tensor([i /
      n_T])`: `torch.full((1,), ...)`; a divisor the function passes to `range` is a whole
      number; so is the counter of a loop over `range(...)`: `torch.as_tensor(i).to(d)`), a list of one
      repeated Python number (`torch.tensor([i] * n, device=d)` for a step `i` over a range:
      `torch.full((n,), i, device=d)`; also nested or written as a comprehension, through a
      legacy typed constructor: `torch.LongTensor([[SOS for _ in range(b)]]).to(d)` is
      `torch.full((1, b), SOS, dtype=torch.long, device=d)`, where `SOS` may be a number a
      project module binds once: `from load import SOS`, or an attribute repeated by a count,
      `[self.vocab.SOS] * batch_size`), and a range
      (`torch.LongTensor(range(n)).to(d)`: `torch.arange(n, dtype=torch.long, device=d)`);
    - a tensor an `nn.Module`'s set-up keeps on the host as a plain attribute (not a buffer or
      parameter, never changed later: `self.pe = positional_encoding(d, n)` of a function of the
      file or project that returns a host factory's tensor, `self.pe = pe.unsqueeze(0)` after
      `pe = torch.zeros(n, d)`, `self.t = torch.zeros(...)`, or `self.pe = pe` of a tensor handed
      to the constructor, which the move says is not on the device) moved in `forward` (also a slice:
      `self.pe[:, :n].to(device)`): `model.to(device)` leaves it on the host, so every call
      copies it; register it as a buffer (`persistent=False` keeps the checkpoint as it is) and
      the model's move puts it on the device once. The same holds of another class's set-up
      (a noise scheduler's `self.betas = torch.linspace(...)`, also computed from another such
      attribute: `self.alphas = 1. - self.betas`) moved in a method that runs every step
      (`self.sqrt_alphas.to(x.device)[t]` in `add_noise`): move it to the device once. A move
      stored back into the attribute (`self.pe = self.pe.to(x.device)`, a cache) and a tensor
      moved in the set-up stay quiet. An attribute that a method run every step fills on the
      host (`self.hidden = torch.zeros(n, h)` in `init_hidden`, called from the training step)
      and another such method copies to the device is made and copied on every step: reported
      at the fill;
    - an index made on the host (`torch.arange`, `torch.randint`, `torch.randperm` without
      `device=`, or numpy's `np.arange`, `np.random.randint`, `np.random.permutation`; as it
      is, reshaped: `q[torch.arange(b)[:, None], idx]`, or through a name read only as an
      index) for an activation in a module's `forward` (or what it runs), or, elsewhere in a
      training step, for what a module computes (`indices = np.arange(n)`, then
      `self.q_eval.forward(states)[indices, actions]` and `q_next[indices, best]` after `v, a =
      self.q_next(s)`), in a file that moves work to a device (names CUDA, moves to a `device`,
      reads `x.device`): indexing copies it to the device on every call; so does numpy's index
      trick (`output[..., np.r_[:2, 4:n]]`). One finding per subscript; the fix gives each
      torch index `device=<the indexed>.device` (unsafe for random ones); a numpy index gets the
      torch call to write instead. A file that never
      leaves the CPU, tensors made on the host, and batches indexed in a training loop (they
      may not be moved yet: only a model's output is known to be on its device) stay quiet;
    - in a module's `forward` (or what it runs), a tensor rebuilt on the host from a tensor's
      values copied off the device, with nothing computed on the way, and moved back
      (`torch.ByteTensor(mask.data.cpu().numpy().astype(np.int32).tolist()).cuda()`): a round
      trip that a conversion on the device (`mask.to(torch.uint8)`) replaces;
    - host data that a name holds from before a loop, copied to the device inside it
      (`grid_x = np.linspace(0, W - 1, W)`, then `torch.tensor(grid_x, device=d)` in `for i in
      range(num_anchors):`; nothing changes it in place in the function): the same values are
      copied on every iteration; copy them once before the loop;
    - a comprehension that makes a host tensor of each item of its data and moves it alone, whose
      copies `torch.stack` or `torch.cat` joins (`torch.stack([torch.Tensor(s).float().to(d) for
      s in states])`): one small copy per item; the message gives the join on the host with one
      copy of the batch (`torch.stack([torch.Tensor(s).float() for s in states]).to(d)`);
    - an uninitialised tensor allocated on the host and moved (`torch.Tensor(2, 4).to(d)`: the
      arguments are sizes; so is a tensor's `x.shape`, a `torch.Size`, but not a numpy
      array's, and one argument spelled as a whole number, `len(batch)`, `x.size(0)`, `int(n)`;
      one name, `torch.LongTensor(ids)`, is data): `torch.empty(2, 4, device=d)`;
    - an array that numpy draws or fills on the host on every pass and that is copied to the
      device: `torch.from_numpy(np.random.randn(b, d)).cuda()`, `torch.tensor(np.zeros(n),
      device=d)`, `w = np.ones_like(r)` (also unpacked: `w, idx = np.ones_like(r), None`) then
      `torch.Tensor(w).cuda()` (`torch.ones(r.shape, device=d)`), or a legacy CUDA tensor type called on it (`torch.cuda.FloatTensor(...)`, or a
      module-level name bound to one, also under a condition: `Tensor = torch.cuda.FloatTensor
      if cuda else torch.FloatTensor`, then `Tensor(np.random.normal(0, 1, (b, d)))`, as GAN
      scripts write it), directly or through a name assigned in the same loop. The message gives
      the torch call that makes it on the device (`torch.randn((b, d), device=device)`,
      `torch.empty(size, device=d).uniform_(low, high)`, `torch.randint(low, high, size,
      device=d)`, `torch.zeros(...)`).

    ## Why is this bad?
    Creating on the host and copying costs a host allocation, a fill on the CPU and a
    host-to-device copy from pageable memory, which blocks the CPU until the copy is done,
    every iteration. `device=` makes it one fill kernel on the GPU. A constant uploaded per
    step is a copy that never had to happen: create it once, or fill a scalar on the device.

    ## Example
    ```python
    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1]).to(x.device).tril()
        scale = torch.tensor([0.5, 2.0], device=x.device)
        total = torch.tensor(0.0, device=x.device)
        ...
    ```

    ## Use instead
    ```python
    def __init__(self):
        ...
        self.register_buffer("scale", torch.tensor([0.5, 2.0]), persistent=False)

    def forward(self, x):
        mask = torch.ones(x.shape[1], x.shape[1], device=x.device).tril()
        total = torch.zeros((), device=x.device)
        ...
    ```

    ## Stays quiet on
    - Tensors created directly on the device from shapes (`torch.zeros(b, d, device=x.device)`):
      a fill kernel, no copy.
    - Data that changes per iteration (`torch.tensor(batch_ids).to(device)`,
      `torch.from_numpy(states).cuda()` of a loader's batch or an environment's state): it has
      to be copied anyway. numpy draws that stay on the host (`torch.tensor(np.random.normal(0,
      0.2))` added as a scalar), are made once outside the loop, or are filled in afterwards
      (`adv = np.zeros(n)`, then `adv[t] = ...` or `mask[i][j] = ...`: computed data), and legacy types called
      with sizes (`Tensor(b, 1).fill_(1.0)` allocates on the device).
    - Functions under a caching decorator (`@functools.lru_cache`, `@cache`, a project's
      `@lru_cache_unless_export`): their body runs once per device or size, not on every call;
      and what a function does after it returns a cached attribute on a hit (`if n ==
      self.cached_n and self.cached is not None: return self.cached`, with `self.cached` stored
      later in the function): it runs when the cache misses. So does what runs under an `if`
      that reads an attribute and stores it (`if self.src_mask is None or
      self.src_mask.size(0) != n:`, then `mask = ...to(device)`, `self.src_mask = mask`).
    - Attributes a method other than the set-up assigns or changes (`self.scale = scale` in
      `set_scale`): data of the call, not a constant.
    - Tensors computed from data on the host before the copy (`torch.arange(n) +
      torch.repeat_interleave(ids, counts)`, a fill read on the host before its move, a helper
      that may return its input): the values are data, which has to be copied.
    - `.to(x)` / `.to(dtype)` and other `.to` calls whose argument may not be a device, and
      `.to("cpu")`; random tensors drawn from an explicit `generator=` (it lives on the host),
      or sampled from an input whose place is unknown (`torch.bernoulli(probs).to(d)`: `probs`
      may be on the device already);
      factories with `requires_grad=True` (the moved copy is a non-leaf, so `device=` would
      change which tensor gets the gradient; a constant leaf must be a new one each call) or
      `pin_memory=True` (`requires_grad=False` and `pin_memory=False` are the defaults: reported).
    - Constant tensors of several values that each pass needs a tensor of its own for, where
      "create it once" would be wrong: returned or yielded, added to a collection
      (`history.append(stats)`), items of a comprehension (`[torch.tensor([1.0, 2.0], device=d)
      for _ in range(world)]`, an `all_gather` receive list), stored in another object
      (`data.edge_index = torch.tensor(...)`: every result would share it), or changed in place
      later (`offsets[1] += n`, `buf.copy_(x)`, `out=buf`), directly or through the name they
      are assigned to. A constant of one repeated value is still reported, with its fill (see
      above), and so is a factory moved to the device whatever becomes of it: with `device=` it
      is a new tensor each time too.
    - Items of data copied one by one in a comprehension that nothing joins (`[torch.tensor(s).to(d)
      for s in states]` handed on as a list: each item is a tensor of its own).
    - A device that changes with the loop variable (`torch.tensor(0, device=torch.device("cuda",
      i))` to initialize each GPU; the GPU index of a tensor of the iteration, `device =
      g_norm.get_device()`, is where its data is, and is reported), and branches that run on one iteration only (`if i ==
      len(steps) - 1:`, `if state is None:`, `if len(state) == 0:`; their `else:` is reported;
      a test of the run's configuration, `if self.adv_loss == "wgan-gp":`, is no such branch;
      in a loop of a function that runs on every step, a module's `forward` decoding token by
      token, `if i == 0:` runs once per call, every step, and is reported).
    - Blocks that leave the loop right after the creation: a branch ending in `return` or
      `raise` runs at most once per call (`if too_close: return torch.tensor(True, device=d)`),
      one ending in `break` once per run of its loop (still reported when an outer loop runs
      it again, and in a module's `forward`, once per forward call). A `continue` in the rest
      of the block, or a `raise` that a `try` in the loop may catch, keeps it reported.
    - Branches that the data chooses, under a test that reads tensor values on the host (`if
      not torch.any(mask): return torch.tensor(0.0, device=d)`, `if loss.item() > 1.0:`, `if
      total == 0:` for a tensor `total`, a reduction compared: `if mask.sum() > 0:`, `if (z <
      -1).sum() == 0:`): an empty batch or an out-of-range value, not the work of every call.
      `if position_ids is None:` reads no values (the argument was not passed, which is the
      usual call): the default built under it is reported. So is the body of a guard against an
      empty selection (`if pos.sum() > 0:` around work on `x[pos]`): the usual path, whose
      `else` (no match at all) is the branch the data chooses.
    - Branches taken only while the model is traced, scripted or exported (`if
      torch.jit.is_tracing():`, `if torch.onnx.is_in_onnx_export():`): no step of eager
      training or inference runs them. `if not torch.jit.is_scripting():` is the eager path:
      reported.
    - Loops in functions whose name starts with the word `init` (`__init__`, `init_weights`,
      `initialize`), `build`, `setup`, `load` (`load`, `load_model`; not `loader_step`) or is
      `reset_parameters` (run once), unless the name also says `train` or `fit`
      (`load_and_train`) or the loop calls `.backward()` or an optimizer's `.step()`; loops that
      make one tensor per listed shape (`torch.randn(1, *shape).to(device) for shape in
      input_shapes`: dummy inputs; the loop item is a size, not the fill value of
      `torch.full((b,), t)` for `t in timesteps`), code outside loops, `forward` and the functions that run every step, the
      `forward` of a class known not to be an `nn.Module` (no base, `object`, `ABC`).
    - Caches filled on the first call: `self._mask = ...` under an `if` that tests `self._mask`
      (`if self._mask is None or self._mask.size(0) < T:`, `if not hasattr(self, "_mask"):`).

    ## Fix safety
    Host-created-then-moved fills (`zeros`, `ones`, `full`, `empty`, `eye`, and `arange` with
    a whole-number step) have a safe fix: pass `device=` to the factory and drop the move; the
    values are identical. `linspace`, `logspace` and `arange` with a fractional step compute
    their values with rounding that differs between CPU and GPU kernels (the last bit of a
    float, or a whole step after a cast to an integer dtype), so their fix is unsafe; so is the
    fix for random factories (`randn`, `rand`, `randint`, `randperm`): the device's generator
    draws different numbers from the CPU's. `device=` goes before the closing parenthesis, or
    right after the last argument when a comment ends the argument list; there is no fix when a
    comment sits between the factory and the end of the move (it would be dropped). Constants
    and `torch.Tensor(sizes)` have no fix: hoisting them (a buffer, a module-level tensor) is
    the author's call. Nor do numpy arrays made per pass: torch's sampler draws other numbers,
    and in float32 where numpy draws float64. Neither do samplers without `device=` (`torch.bernoulli`, `torch.normal`
    of tensors): the message names the factory in their input to create on the device.
    Through ops that may give other values on the device (a random fill such as
    `.uniform_(0, 1)`, `torch.exp`) or put the result on another device than the move's
    (`.type_as(y)` goes to y's), the fix is unsafe; moves spelled `.type(...)` or as a helper's
    call, and tensors a helper makes, have no fix (the helper is where to pass the device).
    """

    # A move (`.to(...)`, `.cuda()`), or a tensor made from data (`torch.tensor(...)`, `tensor(...)`).
    # In a file with a helper that moves its argument (`get_torch_variable(x)`), every call.
    only = {"visit_Call": Only(attrs=frozenset({"to", "cuda", "type", "type_as", "new", "new_tensor"} | FROM_DATA | TYPED_TENSORS.keys()
                                               | INDEX_FACTORIES
                                               | {qual.rpartition(".")[2] for qual in NUMPY_INDEX_FACTORIES}),
                               every_call_if=has_mover_helpers),
            "visit_Subscript": Only(if_file=_names_numpy_index_maker)}

    def __init__(self, ctx, options: Optional[dict] = None):
        super().__init__(ctx, options)
        self.remade: set = set()  # ids of the factories `_remade_every_step` reported

    def visit_Call(self, node: ast.Call) -> None:
        ctx = self.ctx
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("new_tensor", "new"):
            self._new_from_data(node)
            return
        moved = moved_expression(ctx, node)
        moves = moved is not None
        # The call's own shape first: it rules out almost every call, and costs less than the place.
        factory = host_made(ctx, moved) if moves else torch_factory(ctx, node)
        if moves and factory is not None and self._moved_again(node):
            return  # `torch.empty(1).type_as(x).fill_(3).to(d)`: the last move reports the factory
        made_at = node  # where the finding goes: the move, or the creation a name carries to it
        carrier = unwrapped(ctx, moved, making=True) if moves and factory is None else None
        helper = helper_path = None  # the function that makes the tensor and returns it, and its module's path
        attribute = None  # `self.pe` that the module's set-up made on the host
        if isinstance(carrier, ast.Name):
            carried = carried_to_move(ctx, carrier)
            call = carried_from_helper(ctx, carrier) if carried is None else None
            made = helper_made(ctx, call) if call is not None else None
            parts = carried_through_join(ctx, carrier) if carried is not None and carried[0][0] in JOINS else ()
            if parts:  # `lbl = torch.cat((ones, zeros), 1)`, then `lbl.cuda()`: each part was made on the host
                for made, made_at in parts:
                    self._check_made(node, moved, made, made_at)
                return
            if carried is not None:
                factory, made_at = carried
            elif made is not None:  # `mask = causal_mask(n)`, then `mask.cuda()`
                helper, factory, helper_path = made
            else:  # `if done: bit = torch.Tensor([0])` / `else: bit = torch.Tensor([1])`, then `bit.cuda()`
                for made, made_at in carried_from_branches(ctx, carrier):
                    self._check_made(node, moved, made, made_at)
                return
        elif isinstance(carrier, ast.Call):
            made = helper_made(ctx, carrier)
            if made is not None:
                helper, factory, helper_path = made
        elif isinstance(carrier, (ast.Attribute, ast.Subscript)):
            held = host_attribute(ctx, carrier, moved)
            if held is not None:
                attribute, factory = held
            elif isinstance(func, ast.Attribute) and func.attr in ("cuda", "to") and moved is func.value:
                self._remade_every_step(node, carrier)
        self._check_made(node, moved, factory, made_at, helper, helper_path, attribute)

    def _moved_again(self, node: ast.Call) -> bool:
        """A move around `node` in its statement takes what `node` moved further, from the same
        host factory."""
        ctx = self.ctx
        for outer in reversed(ctx.parents):
            if isinstance(outer, ast.stmt):
                return False
            if isinstance(outer, ast.Call):
                moved = moved_expression(ctx, outer)
                if moved is not None and any(sub is node for sub in ast.walk(moved)) and host_made(ctx, moved):
                    return True
        return False

    def _check_made(self, node: ast.Call, moved, factory, made_at: ast.AST, helper=None, helper_path=None,
                    attribute=None) -> None:
        """`node` moves (`moved`: what it moves, or None) or makes a tensor that `factory` made
        on the host, at `made_at`, in a helper of the file or the project (`helper`), or in the
        set-up as an attribute (`attribute`)."""
        ctx, func, moves = self.ctx, node.func, moved is not None
        cuda_type = None if moves or factory is not None or not node.args else cuda_tensor_type(ctx, func)
        if factory is None and cuda_type is None:
            if not moves and ctx.qualname(func) in NUMPY_INDEX_FACTORIES:
                self._check_index(node, NUMPY_INDEX_FACTORIES[ctx.qualname(func)])
            return
        if not moves and factory is not None and factory[0] in INDEX_FACTORIES:
            self._check_index(node, factory[0])
            return
        self._step = repeated_step(ctx)
        if self._step is None or fills_a_cache(ctx):
            return
        if cuda_type is not None:  # `Tensor(np.random.normal(...))` with `Tensor = torch.cuda.FloatTensor`
            self._check_numpy_data(node, node.args[0], '"cuda"' if ctx.qualname(func) else "device")
            return
        if moves:
            method = func.attr if isinstance(func, ast.Attribute) and moved is func.value else None
            target = device_target(ctx, node, method) if method in ("to", "cuda") \
                else f"{ctx.segment(node.args[0])}.device" if method == "type_as" \
                else '"cuda"'
            if target is None or (isinstance(target, ast.AST) and varies_per_iteration(ctx, target)):
                return
            device = target if isinstance(target, str) else ctx.segment(target)
            name, call = factory
            if attribute is not None:
                self._report_attribute(node, attribute, device)
                return
            if helper is not None:
                self._report_helper(node, helper, helper_path, name, call)
                return
            if name == "from_numpy" and call.args and numpy_literal(ctx, call.args[0]):
                self._constant(node, call, device, made_at=made_at)  # `torch.from_numpy(np.array([1, 0, 0]))`
                return
            if name in FROM_DATA | {"from_numpy"} and call.args and self._check_numpy_data(made_at, call.args[0], device):
                return
            source = round_trip_source(ctx, call.args[0]) if (name in FROM_DATA or name in TYPED_TENSORS) \
                and len(call.args) == 1 else None
            if source is not None:
                if self._step_in_forward():
                    self.report(made_at, f"this tensor is rebuilt on the host from the values of `{ctx.segment(source)}`, "
                                         f"copied off the device, and copied back on every {self._step.where}; "
                                         f"convert it on the device (`{ctx.segment(source)}.to(dtype)`, torch ops)")
                return
            if name in FROM_DATA:
                if legacy_sizes(ctx, name, call):
                    self.report(made_at, sizes_message(ctx, name, call, device, self._step.where,
                                                       None if made_at is node else node.lineno))
                elif call.args and constant_values(ctx, call.args[0]):
                    self._constant(node, call, device, made_at=made_at)
                elif len(call.args) == 1 and name in ("tensor", "as_tensor") and computed_number(ctx, call.args[0]):
                    self._constant(node, call, device, number=True, made_at=made_at)
                elif len(call.args) == 1 and name in _REPEATABLE and repeated_number(ctx, call.args[0]):
                    self._repeated(made_at, call, device)
                elif len(call.args) == 1 and range_data(ctx, call.args[0]) and not any(
                        k.arg in ("requires_grad", None) for k in call.keywords):
                    self.report(node, range_message(ctx, name, call, device, self._step.where))
                elif call.args and made_at is node and same_data_every_iteration(ctx, self._step.loops, call.args[0]):
                    self._report_invariant(node, call.args[0])
                elif call.args and made_at is node and method is not None:
                    self._report_item_uploads(node, moved, call)
                return
            if name not in FILLS and name not in RANDOM and name not in ("sample", "random_fill"):
                return
            if any(k.arg in ("device", None, "out", "generator") or k.arg in ("requires_grad", "pin_memory")
                   and not is_false(k.value) for k in call.keywords):
                return  # already placed, unknown keywords, host-only options, or a leaf whose copy is what is used
            if sized_by_loop_item(ctx, name, call) or in_value_checked_branch(ctx):
                return
            if name == "sample":
                self.report(made_at, sample_message(ctx, call, device, self._step.where,
                                                    None if made_at is node else node.lineno))
                return
            if name == "random_fill":
                copied = f" on line {node.lineno}" if made_at is not node else ""
                arguments = ", ".join(ctx.segment(a) for a in call.args + call.keywords)
                self.report(made_at, f"`{ctx.segment(call)}` draws random values into a tensor made on the host, "
                                     f"copied to the device{copied} on every {self._step.where}; draw them there: "
                                     f"`torch.empty(<its shape>, device={device}).{call.func.attr}({arguments})`")
                return
            if not takes_device(name, call):
                if made_at is node:
                    self._report_sampler(node, call, device)
                return
            if made_at is not node:
                self.report(made_at, f"`{ctx.segment(call.func)}(...)` is created on the host and copied to the "
                                     f"device on line {node.lineno}, on every {self._step.where}; create it there "
                                     f"with `device={device}` and drop the copy")
                return
            if method is None:  # a helper that moves its argument: no fix, the helper is the author's
                self.report(node, f"`{ctx.segment(call.func)}(...)` is created on the host and copied to the device "
                                  f"by `{ctx.segment(func)}()` on every {self._step.where}; create it there with "
                                  f"`device=`")
                return
            self.report(node, f"`{ctx.segment(call.func)}(...)` is created on the host and copied to the device "
                              f"on every {self._step.where}; create it there with `device=`",
                        fix=self._device_fix(node, call, device, safe=same_values_on_device(name, call)
                                                                     and exact_on_device(ctx, func.value, call)))
            return
        if factory[0] not in FROM_DATA or not node.args:
            return
        device = next((k.value for k in node.keywords if k.arg == "device"), None)
        if device is None or not is_device(ctx, device) or varies_per_iteration(ctx, device):
            return
        if len(node.args) == 1 and factory[0] in ("tensor", "as_tensor") and computed_number(ctx, node.args[0]):
            self._constant(node, node, ctx.segment(device), number=True)
        elif len(node.args) == 1 and factory[0] in _REPEATABLE and repeated_number(ctx, node.args[0]):
            self._repeated(node, node, ctx.segment(device))
        elif set_once_attribute(ctx, node.args[0]):
            self._constant(node, node, ctx.segment(device))
        elif not is_constant_data(node.args[0]):
            if not self._check_numpy_data(node, node.args[0], ctx.segment(device)) \
                    and same_data_every_iteration(ctx, self._step.loops, node.args[0]):
                self._report_invariant(node, node.args[0])
        elif not legacy_sizes(ctx, factory[0], node):  # `torch.FloatTensor(2, 4, device=...)`: sizes
            self._constant(node, node, ctx.segment(device))

    def _remade_every_step(self, node: ast.Call, carrier: ast.AST) -> None:
        """`self.hidden.cuda()` (`node`) in a method that runs every step, where a method of the
        class that runs every step too (`init_hidden`, called from the training step) assigns the
        attribute a fill or a draw made on the host (`self.hidden = torch.zeros(n, h)`): made on
        the host and copied on every step. Reported at the factory, once."""
        ctx = self.ctx
        cls = ctx.class_
        if not (isinstance(carrier, ast.Attribute) and isinstance(carrier.value, ast.Name) and carrier.value.id == "self"
                and cls is not None and ctx.function is not None and len(ctx.functions) == 1):
            return
        steps = step_functions(ctx)
        if id(ctx.function) not in steps:
            return
        for method, value in class_attribute_values(ctx, cls, carrier.attr):
            made = torch_factory(ctx, value) if isinstance(value, ast.Call) else None
            if made is None or id(method) not in steps or id(value) in self.remade:
                continue
            name, call = made
            if name not in FILLS and name not in RANDOM or not takes_device(name, call) or any(
                    k.arg in ("device", None, "out", "generator") for k in call.keywords):
                continue
            self.remade.add(id(value))
            self.report(value, f"`{ctx.segment(call.func)}(...)` is created on the host every time `{method.name}` "
                               f"runs, which {steps[id(method)].why}, and `{ctx.function.name}` copies "
                               f"`self.{carrier.attr}` to the device on line {node.lineno}; create it there with "
                               f"`device=`")

    def _new_from_data(self, node: ast.Call) -> None:
        """`ys.new([eos_id])`, `x.new_tensor([0.5, 2.0])` of a tensor on the device: Python data of the
        same values on every pass, copied to that device (as `torch.tensor(data, device=...)`)."""
        ctx, func = self.ctx, node.func
        if len(node.args) != 1 or node.keywords:
            return
        receiver = kind_of(ctx, func.value)
        if receiver != TENSOR and not (receiver is None and self._bound_to_tensor(node)):
            return
        data = node.args[0]
        if func.attr == "new" and not isinstance(data, (ast.List, ast.Tuple)):
            return  # `x.new(n, d)`: sizes, an allocation on the device
        items = data.elts if isinstance(data, (ast.List, ast.Tuple)) else [data]
        if not items or not all(is_constant_data(item) or set_once_attribute(ctx, item) for item in items):
            return
        self._step = repeated_step(ctx)
        if self._step is None or fills_a_cache(ctx):
            return
        self._constant(node, node, f"{ctx.segment(func.value)}.device")

    def _bound_to_tensor(self, node: ast.Call) -> bool:
        """`sos = ys[0].new([sos_id])` where the code uses `sos` as a tensor (`torch.cat([sos, y])`):
        the receiver of what made it is a tensor too."""
        statement = self.ctx.statement()
        return (isinstance(statement, ast.Assign) and statement.value is node and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name) and kind_of(self.ctx, statement.targets[0]) == TENSOR)

    def _report_helper(self, node: ast.Call, helper: ast.AST, path, name: str, call: ast.Call) -> None:
        """`self.label2onehot(...).to(d)`, `causal_mask(n).to(d)`: the helper (of this file, or of
        the module at `path`) returns what a fill or a random factory made on the host."""
        if name not in FILLS and name not in RANDOM or not takes_device(name, call) or any(
                k.arg in ("device", None, "out", "generator") or k.arg in ("requires_grad", "pin_memory")
                and not is_false(k.value) for k in call.keywords) or in_value_checked_branch(self.ctx):
            return
        where = f"line {call.lineno}" + (f" of {os.path.basename(path)}" if path else "")
        self.report(node, f"`{helper.name}` makes its result on the host (`{ast.unparse(call.func)}(...)` on "
                          f"{where}) and it is copied to the device here, on every {self._step.where}; pass the "
                          f"device to `{helper.name}` and create it there with `device=`")

    def _report_attribute(self, node: ast.Call, attribute: ast.Attribute, device: str) -> None:
        name = attribute.attr
        cls = self.ctx.class_
        if cls is not None and kind_of(self.ctx, ast.Name(id=cls.name, ctx=ast.Load())) == MODULE_CLASS:
            self.report(node, f"`self.{name}` is a plain attribute, not a buffer: `model.to(device)` leaves it on the "
                              f"host, and this copies it to {device} on every {self._step.where}; "
                              f"register it in `__init__` with `self.register_buffer(\"{name}\", ..., persistent=False)` "
                              f"and drop the copy")
            return
        self.report(node, f"`self.{name}` is made on the host once and copied to {device} on every "
                          f"{self._step.where}: the same values each time; move it to the device once (make it "
                          f"there in `__init__`, given the device, or keep the moved copy) and drop the copy")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """`output[..., np.r_[:2, 4:n]]`: numpy's index trick builds an index array on the host."""
        if self.ctx.qualname(node.value) in NUMPY_INDEX_TRICKS and isinstance(node.ctx, ast.Load):
            self._check_index(node, None)

    def _check_index(self, node: ast.AST, name: Optional[str]) -> None:
        """`q[torch.arange(b)[:, None], idx]` in a file that runs on the GPU: the index is made on
        the host and copied to the device of what it indexes at every subscript, on every call;
        make it there. A name that holds the index is reported at each subscript it is read in.
        `name`: the torch factory that makes it on the device (None for numpy's `np.r_[...]`)."""
        ctx = self.ctx
        if any(k.arg in ("device", None, "out", "generator") for k in getattr(node, "keywords", ())):
            return
        found = indexed_tensors(ctx, node)
        if not found or not moves_work_to_cuda(ctx):
            return
        binding = index_binding(ctx, node)  # `index = torch.randint(...)`, read as an index
        others = [] if binding is not None else [
            sub for sub in ast.walk(found[0][1].slice) if isinstance(sub, ast.Call) and sub is not node
            and (torch_factory(ctx, sub) or ("",))[0] in INDEX_FACTORIES and not any(k.arg == "device" for k in sub.keywords)]
        if any((o.lineno, o.col_offset) < (node.lineno, node.col_offset) for o in others):
            return  # one finding for the subscript, at its first index made on the host
        self._step = repeated_step(ctx)
        if self._step is None or fills_a_cache(ctx) or in_value_checked_branch(ctx):
            return
        # In a module's forward (or what it runs) the tensors are activations, on the model's
        # device; elsewhere in a step, what a module computes is on its device too, but a batch
        # may still be on the host.
        forward = self._step.step.forward if self._step.step is not None else (
            getattr(self._step.function, "name", "") == "forward")
        if not all(forward or module_output(ctx, indexed) for indexed, _ in found):
            return
        numpy = name is None or ctx.qualname(node.func) in NUMPY_INDEX_FACTORIES
        maker = f"{ctx.segment(node.value)}[...]" if name is None else f"{ctx.segment(node.func)}(...)"
        indexed = found[0][0]
        plain = isinstance(indexed, (ast.Name, ast.Attribute))
        device = f"{ctx.segment(indexed)}.device" if plain else "<that tensor>.device"
        fix = None
        made = [node] + others
        texts = [ctx.segment(call) for call in made]
        if not numpy and plain and all("#" not in text and text.endswith(")") for text in texts):
            edits = []
            for call, text in zip(made, texts):
                head = text[:-1].rstrip()
                edits.append(ctx.edit(call, f"{head}{'' if head.endswith(('(', ',')) else ', '}device={device})"))
            fix = Fix("Create the index on the device with `device=`", tuple(edits), all(
                same_values_on_device(torch_factory(ctx, call)[0], call) for call in made))
        instead = ("use slices, or make the index once on the device (a buffer)" if name is None
                   else f"create it with `torch.{name}(..., device={device})`" if numpy
                   else f"create it with `device={device}`")
        also = f" (and {len(others)} more in this subscript)" if others else ""
        if binding is None:
            self.report(node, f"`{maker}` makes an index on the host{also} for "
                              f"{_shown(ctx, indexed)}a tensor of the device when the model runs there, so it is "
                              f"copied there on every {self._step.where}; {instead}", fix=fix)
            return
        index = binding.targets[0].id
        for number, (indexed, subscript) in enumerate(found):
            self.report(subscript, f"`{index}`, made on the host by `{maker}` on line "
                                   f"{node.lineno}, indexes {_shown(ctx, indexed)}a tensor of the device when "
                                   f"the model runs there, so it is copied there at this subscript on every "
                                   f"{self._step.where}; {instead}", fix=fix if number == 0 else None)

    # -- reports --------------------------------------------------------------------
    def _check_numpy_data(self, node: ast.Call, data: ast.AST, device: str) -> bool:
        """Reports `node`, which copies `data` to the device, when numpy makes that data on this
        pass (a draw of `np.random`, a fill such as `np.zeros`): torch makes the same on the
        device. Data from elsewhere (a loader's batch, an environment's state) has to be copied."""
        made = numpy_made(self.ctx, data)
        if made is None:
            return False
        self.report(node, numpy_message(self.ctx, made, device, self._step.where))
        return True

    def _constant(self, node: ast.Call, factory: ast.Call, device: str, number: bool = False,
                  made_at: ast.AST = None) -> None:
        """`node` uploads the constant `factory` builds (`node` is the factory itself or its move);
        `number`: a Python number computed on this pass (`torch.tensor(i / n_T)`), a fill too;
        `made_at`: where a name that carries it to the move is made (the finding goes there)."""
        if any(k.arg is None or k.arg == "requires_grad" and not is_false(k.value) for k in factory.keywords):
            return  # a fresh leaf for autograd each time: one shared tensor would not do
        if in_value_checked_branch(self.ctx):
            return
        value = factory.args[0]
        filled = one_value(value)
        if number:  # `i / n_T`, or a list of it: `[i / n_T]`
            filled = (None, (1,)) if isinstance(value, (ast.List, ast.Tuple)) else (None, ())
            value = value.elts[0] if isinstance(value, (ast.List, ast.Tuple)) else value
        if filled is not None:
            self.report(made_at or node, fill_message(self.ctx, factory, value, *filled, device, self._step.where))
            return
        if kept_apart(self.ctx, node):
            return  # one tensor made once would be shared by every result, or changed by every call
        copied = "" if made_at in (None, node) else f" (on line {node.lineno})"
        cls = self.ctx.class_
        once = ("`self.register_buffer(..., persistent=False)` or outside the loop"
                if cls is None or derives_from_module(self.ctx, cls) else
                "on the device in `__init__`, or outside the loop")
        self.report(made_at or node, f"this constant tensor is copied from the host to the device{copied} on every "
                                     f"{self._step.where}; create it once ({once})")

    def _report_invariant(self, node: ast.Call, data: ast.Name) -> None:
        """`torch.tensor(grid_x, device=d)` in a loop, `grid_x` bound before it: the same values
        are copied on every iteration."""
        if in_value_checked_branch(self.ctx) or kept_apart(self.ctx, node):
            return
        loop = self._step.loops[-1].node
        self.report(node, f"`{data.id}` holds the same host data on every iteration of the loop on line "
                          f"{loop.lineno}, and it is copied to the device again each time; copy it once before "
                          f"the loop (or make it on the device)")

    def _report_item_uploads(self, node: ast.Call, moved: ast.AST, call: ast.Call) -> None:
        """`torch.stack([torch.Tensor(s).to(d) for s in states])`: the comprehension makes a host
        tensor of each item of its data and copies it to the device alone, and `torch.stack` or
        `torch.cat` joins the copies: one small copy per item where one copy of the joined batch
        does."""
        loop = self.ctx.loops[-1] if self.ctx.loops else None
        if loop is None or loop.node.__class__ not in (ast.ListComp, ast.GeneratorExp) or loop.node.elt is not node \
                or not loop.depends_on_iteration(call.args[0]) or len(self.ctx.parents) < 2:
            return
        join = self.ctx.parents[-2] if self.ctx.parents[-1] is loop.node else None
        if not (isinstance(join, ast.Call) and join.args and join.args[0] is loop.node
                and self.ctx.qualname(join.func) in ("torch.stack", "torch.cat")):
            return
        seg = self.ctx.segment
        comprehension = seg(loop.node)
        on_host = comprehension.replace(seg(node), seg(moved), 1)
        joined = seg(join).replace(comprehension, on_host, 1)
        self.report(node, f"`{seg(call)}` makes a host tensor of one item and copies it to the device alone, "
                          f"on every iteration of the comprehension on line {loop.node.lineno}, and "
                          f"`{seg(join.func)}` joins the copies: one small copy per item; join them on the host "
                          f"and copy the batch once (`{joined}.{node.func.attr}"
                          f"({', '.join(seg(a) for a in node.args + node.keywords)})`)")

    def _step_in_forward(self) -> bool:
        """The pass is a module's `forward` (or what it runs), whose tensors are activations on the
        model's device."""
        step = self._step
        return step.step.forward if step.step is not None else getattr(step.function, "name", "") == "forward"

    def _repeated(self, node: ast.AST, factory: ast.Call, device: str) -> None:
        """`torch.tensor([i] * n, device=d)`: one Python number repeated, a fill on the device."""
        if any(k.arg is None or k.arg == "requires_grad" and not is_false(k.value) for k in factory.keywords) \
                or in_value_checked_branch(self.ctx):
            return
        number, shape = repeated_number(self.ctx, factory.args[0])
        self.report(node, repeated_message(self.ctx, factory, number, shape, device, self._step.where))

    def _report_sampler(self, node: ast.Call, call: ast.Call, device: str) -> None:
        """`torch.bernoulli(p * torch.ones(shape)).to(d)`: the sampler has no `device=`; it draws
        where its input is, so the factory in its input is the one to make on the device. An
        input of unknown place (`torch.bernoulli(probs)`) may be on the device already: quiet."""
        made = sampler_input(self.ctx, call)
        if made is not None:
            self.report(node, sampler_message(self.ctx, call, made, device, self._step.where))

    def _device_fix(self, move: ast.Call, factory: ast.Call, device: str, safe: bool):
        if not (isinstance(move.func, ast.Attribute) and move.func.attr in ("to", "cuda")):
            return None  # a move spelled `.type(...)` or `.type_as(...)`: the author's rewrite
        created = created_on_device(self.ctx, move, factory, device)
        if created is None:
            return None
        return self.replace(move, created, "Create the tensor on the device with `device=`", safe=safe)
