"""Runs the rules' runtime checks over a Recording, and the analyses they share.

Each check lives with its rule (`rules/<rule>/runtime.py`, registered with
`registry.runtime_check`); a check is a function over a Recording that yields Findings. Each
finding carries `evidence` (what was measured) and, in `extra["estimate"]`, a named estimate spec
that says what the estimator registered for its `kind` (`registry.estimator`) should time to
estimate the fix's worth.
"""
from __future__ import annotations

import linecache
import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from matlint.diagnostics import Finding

from . import registry
from .savings import capped_saving
from .capture import GEMM_OPS, VIEW_OPS, Site

ROUND_TRIPS_MIN_PER_STEP = 2  # reads a step that come back as the model's next input: a rollout's
NEGLIGIBLE_MS = 0.01         # a finding registered with drop_negligible: a measured saving below this per
NEGLIGIBLE_STEP_SHARE = 0.01  # step, or below this part of the step, is not reported


def rule_name(code: str) -> str:
    """The rule's name in the catalog (the code itself for a code no rule has)."""
    from matlint.registry import get_rule

    rule = get_rule(code)
    return rule.name if rule is not None else code.lower()


@dataclass(frozen=True)
class DeviceContext:
    device_type: str                  # where the recorded ops ran: "cuda" or "cpu"
    capability: tuple = (0, 0)
    tf32: bool = False

    @classmethod
    def from_recording(cls, rec) -> "DeviceContext":
        if "cuda" in rec.device_types and torch.cuda.is_available():
            return cls("cuda", torch.cuda.get_device_capability(), torch.backends.cuda.matmul.allow_tf32)
        return cls("cpu")

    @property
    def tensor_cores(self) -> bool:
        return self.device_type == "cuda" and self.capability >= (8, 0)


def rollout_steps(rec, steps) -> bool:
    """Whether each step runs its loop through the host: at least ROUND_TRIPS_MIN_PER_STEP of the
    user's reads a step come back as the model's next input (capture.Recorder._host_read), as a
    rollout's actions do (`env.step(action.item())`, then `torch.tensor(state)`) or a decoder's
    tokens read on the host."""
    return sum(rec.host_round_trips.values()) / steps >= ROUND_TRIPS_MIN_PER_STEP


def rollout_sites(rec, steps):
    """The lines whose ops work on what came back from the host, in steps that run their loop
    through the host (rollout_steps); empty otherwise. The device waits for the host at every
    iteration anyway, so the launches and syncs of an iteration are the loop's design: the fix is a
    batched loop (vectorised environments), not fewer kernels or syncs on the line."""
    return rec.after_host_read_sites if rollout_steps(rec, steps) else frozenset()


def finding(code: str, site: Site, message: str, evidence: dict, estimate=None) -> Finding:
    """A runtime finding on the line of `site`, spanning its code; `estimate` is the spec of the
    fix's timing (a NamedTuple with a `kind`), kept in `extra["estimate"]`."""
    line = linecache.getline(site.filename, site.lineno) if site.lineno else ""
    stripped = line.rstrip("\n")
    column = len(stripped) - len(stripped.lstrip()) + 1 if stripped.strip() else 1
    f = Finding(
        code=code, message=message, filename=site.filename, row=site.lineno or 1, column=column,
        end_row=site.lineno or 1, end_column=max(len(stripped) + 1, column), noqa_row=site.lineno or 1,
        evidence=evidence,
    )
    if estimate is not None:
        f.extra["estimate"] = estimate
    return f


def is_tensor(entry) -> bool:
    """A signature entry for one tensor (not for a list of tensors)."""
    return isinstance(entry[0], torch.Size)


def shape_str(s) -> str:
    return "(" + ", ".join(str(d) for d in s) + ")"


def dtype_str(d) -> str:
    return str(d).replace("torch.", "")


def gemm_operands(key):
    """(a_sig, b_sig) of a GEMM key: the two matrix operands."""
    if key.op in ("addmm", "baddbmm", "addbmm"):
        return key.sig[1], key.sig[2]
    return key.sig[0], key.sig[1]


def gemm_mnk(key):
    a, b = gemm_operands(key)
    return a[0][-2], b[0][-1], a[0][-1]


def gemm_flops(key) -> float:
    a, b = gemm_operands(key)
    batch = math.prod(a[0][:-2]) if len(a[0]) > 2 else 1
    m, n, k = a[0][-2], b[0][-1], a[0][-1]
    return 2.0 * batch * m * n * k


def gemm_weight(key, stat, steps, rec) -> float:
    """A GEMM key's part of the step: its kernel time when profiled, else its FLOPs."""
    return stat.kernel_us if rec.profiled and rec.kernel_us_total > 0 else gemm_flops(key) * stat.count / steps


def gemm_total(rec, steps) -> float:
    """The step's CUDA GEMM work, in `gemm_weight`'s unit."""
    return sum(gemm_weight(k, s, steps, rec) for k, s in rec.ops.items() if k.op in GEMM_OPS and k.device == "cuda")


def kernel_share(stats, rec) -> float | None:
    """The part of the profiled kernel time these op stats took (None when not profiled)."""
    if not rec.profiled or rec.kernel_us_total <= 0:
        return None
    return sum(s.kernel_us for s in stats) / rec.kernel_us_total


def common_evidence(key, per_step, stats, rec) -> dict:
    ev = {
        "per_step": round(per_step, 2),
        "module": key.module,
        "phase": "backward" if key.backward else "forward",
        "device": key.device,
        "op": key.qualname,
        "shapes": [shape_str(s[0]) for s in key.sig if s and is_tensor(s)],
        "strides": [list(s[1]) for s in key.sig if s and is_tensor(s) and s[1] is not None],
        "dtypes": [dtype_str(s[2]) for s in key.sig if s and is_tensor(s) and s[2] is not None],
    }
    part = kernel_share(stats, rec)
    if part is not None:
        ev["share_of_kernel_time"] = round(part, 4)
    if rec.profiled:
        ev["kernel_launches_per_step"] = round(sum(s.launches for s in stats) / max(rec.steps, 1), 2)
    return ev


def negligible(finding, step_ms: float | None) -> bool:
    """A finding of a check registered with `drop_negligible` (MAT401, MAT403) whose measured
    saving is too small to act on: under 0.01 ms per step, or under 1% of the step (MAT401's where
    the host, not the GPU, bounds the step)."""
    ms = finding.estimated_savings_ms
    check = registry.checks().get(finding.code)
    if check is None or not check.drop_negligible or ms is None:
        return False
    return ms < NEGLIGIBLE_MS or (step_ms is not None and ms < NEGLIGIBLE_STEP_SHARE * step_ms)


def merge_modules(findings, step_ms: float | None = None, gpu_wait_ms: float | None = None) -> list:
    """One finding per line and fix: the same line run in several modules (each layer of a stack
    runs its block's `forward`) gives one finding per module; they are one change of code. The
    first one's message says in how many modules it ran; per step and estimated savings are their
    sums (capped by the step, and a fix that only shortens kernels by the host's wait for the GPU,
    as savings.estimate caps each), and the evidence lists the modules."""
    groups: dict = {}
    for f in findings:
        fix = f.message.partition(": ")[2]
        groups.setdefault((f.code, f.filename, f.row, fix), []).append(f)
    merged = []
    for (_, _, _, fix), group in groups.items():
        first = group[0]
        if len(group) > 1:
            modules = sorted({m for f in group for m in _modules(f)})
            ev = first.evidence
            ev["module"] = modules if len(modules) > 1 else (modules[0] if modules else "")
            per_step = [f.evidence.get("per_step") for f in group]
            if all(isinstance(p, (int, float)) for p in per_step):
                ev["per_step"] = round(sum(per_step), 2)
            head = first.message.partition(": ")[0]
            first.message = f"{head}, in {len(group)} modules" + (f": {fix}" if fix else "")
            saved = [f.estimated_savings_ms for f in group if f.estimated_savings_ms is not None]
            if saved:
                spec = first.extra.get("estimate")
                estimator = registry.estimators().get(spec.kind) if spec is not None else None
                intervals = [f.evidence.get("estimate_interval_ms") for f in group]
                total = sum(saved)
                lo, hi = (sum(i[0] for i in intervals), sum(i[1] for i in intervals)) if all(intervals) else (total, total)
                total, lo, hi, capped, _ = capped_saving(ev, total, lo, hi, step_ms, gpu_wait_ms,
                                                         estimator is not None and estimator.kernel_time_only)
                first.estimated_savings_ms = round(total, 4)
                if all(intervals):
                    ev["estimate_interval_ms"] = [round(lo, 4), round(hi, 4)]
                ev["estimate_reliable"] = not capped and all(f.evidence.get("estimate_reliable") is not False
                                                             for f in group)
        merged.append(first)
    return merged


def _modules(f) -> list:
    module = (f.evidence or {}).get("module")
    return list(module) if isinstance(module, list) else [module] if module else []


def run_checks(rec, guard=None, ctx: DeviceContext | None = None) -> list:
    ctx = ctx or DeviceContext.from_recording(rec)
    steps = max(rec.steps, 1)
    findings = []
    registered = registry.checks()
    for code in sorted(registered):
        check = registered[code]
        if guard is not None and not guard.selects(code):
            continue
        if check.needs_gpu and not ctx.tensor_cores and guard is not None:
            guard.notes.append(f"{code} ({rule_name(code)}) needs a CUDA GPU with tensor cores; "
                               f"not evaluated on {ctx.device_type}")
        try:
            findings.extend(check.fn(rec, steps, ctx))
        except Exception as exc:
            if guard is not None:
                guard.recorder.fail(exc, f"check {code}")
            else:
                raise
    findings.sort(key=lambda f: (f.code, f.filename, f.row))
    return findings


def stays_on_host(key, ctx: DeviceContext) -> bool:
    """Whether an op's tensors are on the host when the program runs on a GPU, where reading them waits
    for nothing and an op on them launches no kernel: on a GPU, the ops on CPU tensors; on the CPU,
    the ops on data the program made on the host within the step and kept from the model (batch
    indices drawn with `torch.randint`, slice bounds computed from them: `OpKey.host`). The CPU
    cannot tell where a program would put a tensor it made with `device=` or moved with `.to()` (torch
    fills in the device either way, and a move to the CPU is no op): the model's values, and tensors
    from before the step, are taken as on the device."""
    return key.device == "cpu" and (key.host or ctx.device_type == "cuda")


PER_ITEM_MIN_PER_STEP = 32  # ops on picked items per step from one line: a loop over a tensor's items
TINY_NUMEL = 1 << 16  # elements of a tensor whose kernel's time is its launch (MAT504), or of a row a loop may pick


def per_item_sites(rec, steps, ctx: DeviceContext) -> dict:
    """(site, module) -> [(OpKey, OpStat)] of the forward ops on items picked out of a larger tensor
    (elements `x[i, j]` or rows `x[i]` of at most TINY_NUMEL elements), or on values computed only
    from such items, that one line issues at least PER_ITEM_MIN_PER_STEP times a step: a Python loop
    over a tensor's elements or rows. Single elements of their own (a sum of per-layer losses,
    per-parameter norms) are counted with them only on a line that also picks items. GEMMs on picked
    rows are MAT101's (a loop of matmuls); ops whose other inputs are whole tensors (a recurrence's
    state, a weight) are not a loop over items. Ops on data that stays on the host (`stays_on_host`:
    index arithmetic while assembling a batch) launch nothing on a GPU: not counted."""
    picked, ops = set(), defaultdict(list)
    for key, stat in rec.ops.items():
        if key.backward or stat.compiled or not key.out or key.op in VIEW_OPS or key.op in GEMM_OPS:
            continue
        if math.prod(key.out[0]) > TINY_NUMEL or stays_on_host(key, ctx) or not key.sig:
            continue
        marked = False
        for s in key.sig:
            if not is_tensor(s) or math.prod(s[0]) > TINY_NUMEL:
                break
            if len(s) > 3 and s[3]:
                marked = True
            elif math.prod(s[0]) > 1:
                break  # a whole tensor among the inputs
        else:
            where = (key.site, key.module)
            ops[where].append((key, stat))
            if marked:
                picked.add(where)
    return {where: items for where, items in ops.items()
            if where in picked and sum(s.count for _, s in items) / steps >= PER_ITEM_MIN_PER_STEP}


def attention_sites(rec) -> set:
    """The lines of attention's two GEMMs: a real `scaled_dot_product_attention` call that ran its
    math backend (the GEMMs and copies there are SDPA's own), or attention written by hand (the
    SDPA call MAT601 writes takes q, k and v as the layer made them, with no copy). MAT601 says
    what to change there; a copy's own finding would point at the wrong fix."""
    return {site for key in rec.attention for site in (key.qk_site, key.pv_site)}


def cublas_copies(shape, stride) -> bool:
    """Whether cuBLAS copies this operand first (aten's prepare_matrix_for_cublas rules)."""
    if len(shape) < 2:
        return False
    rows, cols = shape[-2], shape[-1]
    s0, s1 = stride[-2], stride[-1]
    if rows <= 1 or cols <= 1:
        return False
    if len(shape) > 2 and (s0 == 0 or s1 == 0):
        return True
    return not ((s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)))
