"""MAT401 no-mixed-precision: a training step in a file that never turns on bf16/fp16 autocast,
a half-precision model, or TF32."""
from __future__ import annotations

import ast
import os
import re
from typing import Optional

from matlint.semantic.kinds import looks_like_tensor, may_mention, module_class_of
from matlint.rule import Only, Rule

from matlint.semantic.loops import identifier, is_backward, is_optimizer_step, name_tokens, optimizer_names, walk_no_scopes
from matlint.semantic.names import TESTS, in_test_code
from matlint.semantic.project import importer_texts, moves_work_to_cuda, names_cuda_work
from matlint.semantic.shapes import method_of
from matlint.semantic.torch_api import NO_GRAD_CONTEXTS
from matlint.semantic.tree import is_main_guard

_AUTOCAST = {"torch.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "torch.amp.autocast"}
# Explicit dtypes other than the float32 default: reduced precision, or float64 on purpose.
_CHOSEN_DTYPES = {"torch.float16", "torch.half", "torch.bfloat16", "torch.float64", "torch.double"}
# Frameworks that own the precision setting (a config file, a Trainer argument, a CLI flag).
_FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "deepspeed", "colossalai",
               "composer")
# apex's mixed precision, where the code uses it (`amp.initialize`, `amp.scale_loss`, `FP16_Optimizer`):
# apex is imported for its synchronized BatchNorm and LARS optimizers as often.
_APEX_PRECISION = ("apex.amp", "apex.fp16_utils")
# Identifier and string tokens that name a reduced-precision mode: a setting so named routes precision
# through configuration. Not "half" (`half_res`, `use_half`: a word, and a half model shows as `.half()`)
# nor "precision" alone (a metric); "precision" with "mixed" or "half" (`mixed_precision`).
_PRECISION_TOKENS = {"amp", "autocast", "fp16", "bf16", "bfloat16", "float16", "tf32"}
_PRECISION_PAIRS = {"mixed", "half"}
# Values that leave a precision setting off: `fp16=False`, `use_amp = None`, `mixed_precision="no"`.
_OFF = (False, None, "no", "fp32", "32", "32-true", "float32")
# Objects whose `.backward(loss)` runs the backward pass their own precision setting configures.
_FRAMEWORK_BACKWARD = {"accelerator", "fabric"}
_TOKEN_SPLIT = re.compile(r"[^a-z0-9]+")
_EVAL_FUNCTION = re.compile(r"eval|valid|test|predict|infer|generate|sample|decode", re.IGNORECASE)


# Attributes assigned to turn on reduced-precision GEMMs (checked for what they belong to).
_TF32_SETTINGS = frozenset({"allow_tf32", "allow_bf16_reduced_precision_reduction", "fp32_precision"})


def _tokens(text: str) -> set:
    return set(_TOKEN_SPLIT.split(text.lower()))


def _names_precision(text: str) -> bool:
    tokens = _tokens(text)
    return bool(tokens & _PRECISION_TOKENS) or "precision" in tokens and bool(tokens & _PRECISION_PAIRS)


# A file's text that turns on reduced precision beyond the tokens `_names_precision` reads.
_PRECISION_TEXT = re.compile(r"\.half\(\)|set_float32_matmul_precision|^\s*(?:import|from)\s+(?:%s)\b"
                            % "|".join(_FRAMEWORKS), re.M)


_IMPORT_LINE = re.compile(r"^\s*(?:import|from)\s.*$", re.M)


def _text_enables_precision(text: str) -> bool:
    """Another project file may turn on reduced precision (read off its text, conservatively:
    words in comments and settings count, but not in an import: `from apex import amp` that the
    file never uses turns nothing on)."""
    return _names_precision(_IMPORT_LINE.sub("", text)) or _PRECISION_TEXT.search(text) is not None


def _is_off(value: Optional[ast.AST]) -> bool:
    return isinstance(value, ast.Constant) and any(value.value is off or type(value.value) is type(off)
                                                   and value.value == off for off in _OFF)


class NoMixedPrecision(Rule):
    code = "MAT401"
    name = "no-mixed-precision"
    quiet_in = (TESTS,)
    summary = "A training step (`.backward()` plus an optimizer step) in a file that never enables bf16/fp16 autocast, a half-precision model or TF32."
    default_enabled = True
    runtime_docs = """
    On a GPU with tensor cores and TF32 off, the guard reports fp32 GEMMs run outside any autocast
    region when they are at least 5 % of the step's GEMM work, at the line with the most of it.
    GEMMs kept in fp32 inside `autocast(enabled=False)` are left alone. Quiet where bf16 would not
    shorten the step: GEMM work too small to outweigh the casts autocast adds, or a step whose host
    barely waits for the GPU (the guard then says why it did not report). The estimate times the
    GEMMs in fp32 and bf16, capped by the host's wait for the GPU, less the casts' launches.
    """
    docs = """
    ## What it does
    Flags, once per file, the `.backward()` of a GPU training step (a function, or the module
    level, that calls both `.backward()` and an optimizer's `.step()`, directly or through a
    method of the class an attribute holds, such as `self.optim_schedule.step_and_update_lr()`
    whose body calls `self._optimizer.step()`, in a file that moves work
    to a CUDA device) when nothing in the file turns on reduced-precision matmuls:
    - `torch.autocast`, `torch.cuda.amp.autocast`, `torch.amp.autocast` in any form (`with`,
      decorator, a context stored in a variable, `nullcontext() if ... else autocast(...)`,
      `accelerator.autocast()`), unless it is `enabled=False` or only used for evaluation
      (under `torch.no_grad()` / `inference_mode()`, or in an eval/predict/generate function);
    - a bf16/fp16 model or tensors (`model.half()`, `.bfloat16()`, `.to(torch.bfloat16)`,
      `dtype=torch.bfloat16`, `torch_dtype=torch.float16`), or a dtype taken from a variable
      or a model (`dtype=weight_dtype`, `.to(self.unet.dtype)`): the model's precision is then
      chosen where it is loaded. A numpy dtype (`np.zeros(n, dtype=np.float32)`, a replay
      buffer) and the dtype of a tensor that a comparison is cast to for counting
      (`(pred == y).to(logits.dtype)`) choose nothing;
    - TF32 for matmuls: `torch.backends.cuda.matmul.allow_tf32 = True`,
      `torch.set_float32_matmul_precision("high" | "medium" | a variable)`,
      `torch.backends.cuda.matmul.fp32_precision = "tf32"` or the global
      `torch.backends.fp32_precision = "tf32"` (cuDNN's `torch.backends.cudnn.allow_tf32`, on by
      default, and `torch.backends.cudnn.conv.fp32_precision` change only convolutions, so they
      do not count);
    - a framework that owns precision: Lightning `precision=`, accelerate
      `Accelerator(mixed_precision=...)` (or any `Accelerator`: its config file decides),
      DeepSpeed, an import of lightning, accelerate or deepspeed, apex's `amp` used
      (`amp.initialize`, `amp.scale_loss`; an import of it the code never uses, or apex imported
      for its synchronized BatchNorm, is no sign), a step driven by
      `accelerator.backward(loss)` or `fabric.backward(loss)`;
    - a setting that routes precision through configuration: a name, attribute, keyword or
      string that names a reduced-precision mode (`args.amp`, `use_amp`, `fp16`, `bf16`,
      `mixed_precision`, `"--fp16"`), unless it is set off there (`use_amp = False`,
      `fp16=None`, `mixed_precision="no"`). Evidence, not words: a name with "half" in it
      (`half_res`, `use_half`, `args.half`) or "precision" alone (a metric) is no sign; a half
      model is, where the code makes one (`model.half()`, also under `if args.half:`);
    - float64 chosen on purpose (`.double()`, `torch.float64`): a Gaussian process or a physics
      model that needs it must not be told to use bf16.
    A `GradScaler` alone does not count (it scales fp16 gradients but casts nothing).

    ## Why is this bad?
    In float32 without TF32, every GEMM runs on the GPU's slow path. On an H100 at 8192³ a bf16
    GEMM runs 14× and a TF32 GEMM 7.8× faster than float32, and activations in bf16 halve the
    memory traffic of everything else.

    ## Example
    ```python
    for x, y in loader:
        loss = F.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad()
    ```

    ## Use instead
    ```python
    torch.set_float32_matmul_precision("high")          # TF32 for what stays float32
    for x, y in loader:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad()
    ```

    ## Stays quiet on
    - Files with any of the signs above, including a precision flag it cannot evaluate
      (`if args.amp:`).
    - Files that never mention CUDA or a device (CPU-only code, where bf16 autocast rarely
      pays), unless a project file that imports them does (`trainer.py` with the step, `main.py`
      that imports it and calls `.cuda()`: reported, and quiet when such a file names any
      reduced-precision setting or framework), and a step at module level inside an
      `if __name__ == "__main__":` block that never mentions them (a smoke test of the file's
      model on the CPU). The importers are the project's files that import the file, directly
      or through a package's `__init__.py`, in its folder, the two below, and the two above it.
    - Training steps driven by a framework: `self.manual_backward` (no plain `.backward()` plus
      optimizer `.step()` pair), `accelerator.backward(loss)` (its config sets the precision).

    - Library modules: a file with no training step of its own (the step lives in the user's
      script), and steps that never reach a CUDA device (`.cuda()`, `device="cuda"`, a
      `torch.device` or device string, `.to(device)`).

    ## Fix safety
    No fix: which precision is right (bf16 autocast, fp16 with a `GradScaler`, or TF32) and
    where the autocast region should end depend on the model.
    """

    # No handler can report in a file that never calls `.backward()`: nothing to route there.
    only = {name: Only(if_file=lambda ctx: may_mention(ctx, "backward"))
            for name in ("visit_Call", "visit_Assign", "visit_Import", "visit_ImportFrom", "visit_Name",
                         "visit_Attribute", "visit_keyword", "visit_Constant", "leave_Module")}

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        self.training_backward: Optional[ast.Call] = None
        self.mixed_precision = False
        self.not_a_sign: Optional[ast.AST] = None  # the value of a TF32 setting that leaves matmuls alone

    # -- training steps -------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        if self.mixed_precision:
            return
        if is_backward(node) and self.training_backward is None and not in_test_code(self.ctx):
            if self._step_in_same_function() and not self._in_cpu_demo():
                self.training_backward = node
        if self._enables_reduced_precision(node):
            self.mixed_precision = True

    def _step_in_same_function(self) -> bool:
        owner = self.ctx.function or self.ctx.tree
        key = ("mat401_steps", id(owner))
        if key not in self.ctx.shared:
            body = owner.body if isinstance(owner.body, list) else [owner.body]
            optimizers = optimizer_names(self.ctx)
            self.ctx.shared[key] = any(is_optimizer_step(n, optimizers) or self._steps_through_held_class(n)
                                       for stmt in body for n in walk_no_scopes(stmt))
        return self.ctx.shared[key]

    def _steps_through_held_class(self, node: ast.AST) -> bool:
        """`self.optim_schedule.step_and_update_lr()`: a method of the class the object held in
        that attribute is (of this file or a project module), whose body steps an optimizer."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)):
            return False
        held = module_class_of(self.ctx, node.func.value)
        method = method_of(held[0], node.func.attr) if held is not None else None
        return method is not None and any(is_optimizer_step(n) for n in ast.walk(method))

    def _in_cpu_demo(self) -> bool:
        """At module level inside an `if __name__ == "__main__":` block that never names CUDA or a
        device: a smoke test of the file's model, on the CPU."""
        if self.ctx.function is not None:
            return False
        for parent in self.ctx.parents:
            if isinstance(parent, ast.If) and is_main_guard(parent.test):
                text = self.ctx.segment(parent)
                return "cuda" not in text and "device" not in text
        return False

    # -- signs of mixed precision -------------------------------------------------------
    def _enables_reduced_precision(self, node: ast.Call) -> bool:
        qualname = self.ctx.qualname(node.func) or ""
        name = identifier(node.func)
        if qualname in _AUTOCAST or name == "autocast":
            return self._autocast_counts(node)
        if name in ("half", "bfloat16", "double") and not node.args:
            return True  # half precision, or float64 chosen on purpose (Gaussian processes, physics)
        if name == "backward" and isinstance(node.func, ast.Attribute) and set(
                name_tokens(identifier(node.func.value))) & _FRAMEWORK_BACKWARD:
            return True  # `accelerator.backward(loss)`: accelerate's config sets the precision
        if qualname == "torch.set_float32_matmul_precision":
            arg = node.args[0] if node.args else None
            return not (isinstance(arg, ast.Constant) and arg.value == "highest")
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Compare):
            return False  # `(pred == y).to(logits.dtype)`: a comparison cast to count it, no precision chosen
        if qualname.split(".")[0] == "numpy":
            return False  # `np.ndarray(shape, dtype=float)`: a host array's dtype chooses no matmul precision
        if any(self.ctx.qualname(a) in _CHOSEN_DTYPES or self._routed_dtype(a) for a in node.args):
            return True
        for keyword in node.keywords:
            if self.ctx.qualname(keyword.value) in _CHOSEN_DTYPES:
                return True
            if keyword.arg in ("dtype", "torch_dtype") and self.ctx.qualname(keyword.value) is None and (
                    not isinstance(keyword.value, ast.Attribute) or self._routed_dtype(keyword.value)):
                return True  # a dtype taken from a variable: the precision is chosen elsewhere
        return False

    def _routed_dtype(self, arg: ast.AST) -> bool:
        """`x.to(self.unet.dtype)`: the dtype of a model set up elsewhere. The dtype of a tensor
        (`(pred == y).to(dtype=logits.dtype)`, a cast to match it) chooses nothing."""
        return isinstance(arg, ast.Attribute) and arg.attr == "dtype" and not looks_like_tensor(self.ctx, arg.value)

    def _autocast_counts(self, node: ast.Call) -> bool:
        for keyword in node.keywords:
            if keyword.arg == "enabled" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False:
                return False
            if keyword.arg == "dtype" and self.ctx.qualname(keyword.value) in ("torch.float32", "torch.float"):
                return False
        return not self._in_evaluation()

    def _in_evaluation(self) -> bool:
        for function in self.ctx.functions:
            if _EVAL_FUNCTION.search(getattr(function, "name", "")):
                return True
            for decorator in getattr(function, "decorator_list", ()):
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if self.ctx.qualname(target) in NO_GRAD_CONTEXTS:
                    return True
        for parent in self.ctx.parents:
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                for item in parent.items:
                    expr = item.context_expr
                    if isinstance(expr, ast.Call) and self.ctx.qualname(expr.func) in NO_GRAD_CONTEXTS:
                        return True
        return False

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and target.attr in _TF32_SETTINGS):
                continue
            if not self._sets_matmuls(target):
                # `torch.backends.cudnn.allow_tf32 = True` (already the default) and cuDNN's
                # `fp32_precision = "tf32"` change convolutions, not the matmuls
                self.not_a_sign = node.value
            elif target.attr != "fp32_precision" and not (isinstance(node.value, ast.Constant) and node.value.value is False):
                self.mixed_precision = True  # a "tf32" value of `fp32_precision` counts as a string

    def _sets_matmuls(self, target: ast.Attribute) -> bool:
        path = self.ctx.qualname(target) or ast.unparse(target)
        return not {"cudnn", "mkldnn"} & set(path.split("."))

    def visit_Import(self, node: ast.Import) -> None:
        if any(alias.name.split(".")[0] in _FRAMEWORKS for alias in node.names):
            self.mixed_precision = True

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] in _FRAMEWORKS:
            self.mixed_precision = True

    def visit_Name(self, node: ast.Name) -> None:
        qualname = self.ctx.qualname(node)
        if qualname is None and not self._set_off(node):
            self._precision_setting(node.id)
        elif qualname is not None and qualname.startswith(_APEX_PRECISION):
            self.mixed_precision = True  # `amp.initialize(model, optimizer)` after `from apex import amp`

    def visit_Attribute(self, node: ast.Attribute) -> None:
        qualname = self.ctx.qualname(node) or ""
        if qualname.startswith(_APEX_PRECISION):
            self.mixed_precision = True  # `apex.amp.initialize(...)`
        elif not qualname.startswith("torch") and not self._set_off(node):
            self._precision_setting(node.attr)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg and not _is_off(node.value):
            self._precision_setting(node.arg)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value) < 40 and node is not self.not_a_sign:
            self._precision_setting(node.value)

    def _set_off(self, target: ast.AST) -> bool:
        """`use_amp = False`, `self.fp16 = None`: a setting that names a precision and leaves it off."""
        parent = self.ctx.parent
        return isinstance(target.ctx, ast.Store) and isinstance(parent, ast.Assign) and _is_off(parent.value)

    def _precision_setting(self, text: str) -> None:
        if text != "autocast" and _names_precision(text):
            self.mixed_precision = True

    def leave_Module(self, node: ast.Module) -> None:
        if self.mixed_precision or self.training_backward is None:
            return
        where = "nothing in this file enables mixed precision"
        if not moves_work_to_cuda(self.ctx):
            placing = self._importers_placing_work()
            if not placing:
                return
            verbs = "imports it and moves" if len(placing) == 1 else "import it and move"
            where = (f"neither this file nor {', '.join(f'`{name}`' for name in placing)}, which {verbs} work to a "
                     "CUDA device, enables mixed precision")
        self.report(self.training_backward,
                    f"this training step runs its matmuls in float32 and {where}: wrap the forward and loss in "
                    "`torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16)` (bf16 GEMMs ran 14× faster "
                    "than fp32 on an H100) or at least call `torch.set_float32_matmul_precision(\"high\")` "
                    "(TF32, 7.8×)")

    def _importers_placing_work(self) -> list:
        """For a step in a file that names no device: the names of the project files that import
        it and move work to a CUDA device, when none of its importers enables reduced precision
        (then empty)."""
        texts = {path: text for path, text in importer_texts(self.ctx).items() if text is not None}
        if any(_text_enables_precision(text) for text in texts.values()):
            return []
        return [os.path.basename(path) for path, text in texts.items() if names_cuda_work(text)]
