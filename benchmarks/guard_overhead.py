"""Guard overhead and savings-estimate accuracy, in one run (meant for one GPU).

    python benchmarks/guard_overhead.py --out DIR            # full sizes, on CUDA
    python benchmarks/guard_overhead.py --quick --out DIR    # tiny sizes (CPU smoke test)

1. Overhead: step time (forward + backward + AdamW) of GPT-2 124M (transformers, random init;
   eager and SDPA attention, bf16 autocast), ResNet-50 (torchvision, random init) and a tiny MLP:
   plain, under an empty dispatch mode, under the guard (observed steps, and amortized over 100
   steps with the default window), FlopCounterMode, DebugMode, and the profiler with shapes+stacks.
2. Safety: outputs and parameters after training steps, plain vs under the guard (bitwise).
3. Findings: GPT-2 with eager attention in fp32 (MAT601 and MAT401 must fire, with estimates);
   GPT-2 with SDPA under bf16 autocast (neither may fire).
4. Savings: the guard's estimate against the real gain once the fix is applied (attention→SDPA,
   fp32→bf16 autocast, a loop of 64 matmuls→one bmm, a per-parameter loop→foreach).
5. torch.compile under the guard: compiled (no eager fallback), Triton launches counted.
Transformers/torchvision parts are skipped when those packages are missing.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import matlint.runtime_guard as rg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RESULTS: dict = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                 "torch": torch.__version__, "overhead": {}, "safety": {}, "findings": {}, "savings": {},
                 "compile": {}}


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class EmptyMode(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


# -- models ------------------------------------------------------------------------------------
class TinyMLP(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 10))

    def forward(self, x):
        return self.net(x)


def make_gpt2(attn: str, quick: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128) if quick else GPT2Config()
    try:
        model = GPT2LMHeadModel._from_config(cfg, attn_implementation=attn)
    except Exception:
        cfg._attn_implementation = attn
        model = GPT2LMHeadModel(cfg)
    return model.to(DEVICE)


def gpt2_task(attn, quick, bf16, batch=None, seq=None):
    batch = batch or (2 if quick else 8)
    seq = seq or (32 if quick else 1024)
    torch.manual_seed(0)
    model = make_gpt2(attn, quick)
    vocab = model.config.vocab_size
    data = torch.randint(0, vocab, (batch, seq), device=DEVICE, generator=None)

    def loss_fn(m):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=bf16):
            out = m(input_ids=data, labels=data)
        return out.loss

    return model, loss_fn


def resnet_task(quick):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(DEVICE).to(memory_format=torch.channels_last)
    x = torch.randn(4 if quick else 64, 3, 64 if quick else 224, 64 if quick else 224, device=DEVICE)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (x.shape[0],), device=DEVICE)

    def loss_fn(m):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            return F.cross_entropy(m(x), y)

    return model, loss_fn


def mlp_task(quick):
    torch.manual_seed(0)
    model = TinyMLP().to(DEVICE)
    x = torch.randn(64, 256, device=DEVICE)
    y = torch.randint(0, 10, (64,), device=DEVICE)
    return model, lambda m: F.cross_entropy(m(x), y)


def trainer(model, loss_fn, lr=1e-4, foreach=None):
    """One AdamW training step of `model` on `loss_fn(model)`, as a function of no arguments."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=foreach)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        return loss

    return step


def timed_steps(step, n, ctx=None):
    times = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def med(xs):
    return statistics.median(xs)


# -- 1. overhead ---------------------------------------------------------------------------------
def overhead(name, make, steps_amortized):
    model, loss_fn = make()
    step = trainer(model, loss_fn)
    timed_steps(step, 3)  # warm-up: allocator, cuBLAS handles, autotuning
    row = {}
    plain = timed_steps(step, 20)
    row["plain_ms"] = med(plain)
    row["empty_mode"] = med(timed_steps(step, 8, EmptyMode())[1:]) / row["plain_ms"]

    # a longer window than the default, to have enough observed steps for a stable median
    g = rg.guard(window=7, warmup=1, json_path=None, report=False, estimate_savings=False)
    guarded = timed_steps(step, 12, g)
    # steps 0..7 are observed (0 is the provisional warm-up); the end of step 7 closes the window
    row["guard_observed"] = med(guarded[1:7]) / row["plain_ms"]
    row["guard_window_close_ms"] = guarded[7] - row["plain_ms"]
    row["guard_after_window"] = med(guarded[8:]) / row["plain_ms"]
    row["guard_findings"] = sorted({f.code for f in g.findings})
    row["guard_errors"] = g.errors
    if DEVICE == "cuda":
        gk = rg.guard(window=3, warmup=1, json_path=None, report=False, estimate_savings=False, kernels=True)
        with_kernels = timed_steps(step, 5, gk)
        row["guard_kernels_observed"] = med(with_kernels[1:3]) / row["plain_ms"]
        row["guard_kernels_window_close_ms"] = with_kernels[3] - row["plain_ms"]
        rec = gk.recorder.rec
        row["kernels_per_step"] = rec.kernels_total / max(rec.steps, 1)
        row["kernels_attributed"] = 1 - rec.kernels_unattributed / max(rec.kernels_total, 1)

    from torch.utils.flop_counter import FlopCounterMode

    row["flop_counter"] = med(timed_steps(step, 3, FlopCounterMode(display=False))[1:]) / row["plain_ms"]
    try:
        from torch.utils._debug_mode import DebugMode

        row["debug_mode"] = med(timed_steps(step, 3, DebugMode())[1:]) / row["plain_ms"]
    except ImportError:
        row["debug_mode"] = None
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    prof = profile(activities=acts, record_shapes=True, with_stack=True)
    row["profiler_shapes_stacks"] = med(timed_steps(step, 4, prof)[1:]) / row["plain_ms"]

    # amortized: the same number of steps, plain vs under a default guard (report and JSON at exit
    # excluded from the timing; the estimates are timed separately below)
    # A full garbage collection due in a timed run (the earlier parts leave much garbage) would
    # land in whichever run crosses the threshold: start each with none pending.
    def plain_run():
        gc.collect()
        sync()
        t0 = time.perf_counter()
        for _ in range(steps_amortized):
            step()
        sync()
        return time.perf_counter() - t0

    # plain runs before and after the guarded one, so that drift of the machine cancels
    t_before = plain_run()
    g2 = rg.guard(json_path=None, report=False, estimate_savings=False)
    gc.collect()
    sync()
    t0 = time.perf_counter()
    with g2:
        for _ in range(steps_amortized):
            step()
        sync()
        t_guard = time.perf_counter() - t0
    t_after = plain_run()
    row["guard_amortized"] = t_guard / ((t_before + t_after) / 2)
    row["plain_run_spread"] = abs(t_before - t_after) / min(t_before, t_after)
    row["amortized_steps"] = steps_amortized
    t0 = time.perf_counter()
    from matlint.runtime_guard.savings import estimate

    estimate(g2.findings)
    row["estimate_s"] = time.perf_counter() - t0
    RESULTS["overhead"][name] = row
    print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


# -- 2. safety -----------------------------------------------------------------------------------
def bitwise(name, make, n_steps=2):
    def run(under_guard):
        torch.manual_seed(1)
        model, loss_fn = make()
        step = trainer(model, loss_fn)
        g = rg.guard(window=2, warmup=0, json_path=None, report=False, estimate_savings=False)
        losses = []
        with g if under_guard else contextlib.nullcontext():
            for _ in range(n_steps):
                torch.manual_seed(2)
                losses.append(step().detach().clone())
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()], g

    la, pa, _ = run(False)
    lb, pb, _ = run(False)
    lc, pc, g = run(True)
    same = lambda l1, p1, l2, p2: bool(torch.equal(l1, l2) and all(torch.equal(x, y) for x, y in zip(p1, p2)))
    RESULTS["safety"][name] = {"plain_vs_plain": same(la, pa, lb, pb), "plain_vs_guard": same(la, pa, lc, pc),
                               "guard_errors": g.errors}
    print("bitwise", name, RESULTS["safety"][name], flush=True)


# -- 3/4. findings and savings -------------------------------------------------------------------
def guard_findings(make, window=2, plain_steps=8):
    model, loss_fn = make()
    step = trainer(model, loss_fn)
    timed_steps(step, 2)
    g = rg.guard(window=window, warmup=1, json_path=None, report=False, savings_budget_s=20.0)
    with g:
        for _ in range(window + 2):
            step()
    sync()
    plain = med(timed_steps(step, plain_steps))
    del model, step
    return g, plain


def step_ms(make, n=8):
    model, loss_fn = make()
    step = trainer(model, loss_fn)
    timed_steps(step, 3)
    t = med(timed_steps(step, n))
    del model, step
    return t


def summarize(g):
    return [{"code": f.code, "where": f"{os.path.basename(f.filename)}:{f.row}", "per_step": f.evidence.get("per_step"),
             "estimated_savings_ms": f.estimated_savings_ms, "method": f.evidence.get("estimate_method"),
             "message": f.message} for f in g.findings]


def compare(name, estimate_ms, before_ms, after_ms):
    real = before_ms - after_ms
    ratio = estimate_ms / real if real > 0 and estimate_ms is not None else None
    RESULTS["savings"][name] = {"estimate_ms": estimate_ms, "real_ms": real, "before_ms": before_ms,
                                "after_ms": after_ms, "estimate_over_real": ratio}
    print("savings", name, RESULTS["savings"][name], flush=True)


def est(g, code):
    vals = [f.estimated_savings_ms for f in g.findings if f.code == code and f.estimated_savings_ms is not None]
    return sum(vals) if vals else None


class LoopHeads(nn.Module):
    """64 per-head 256x256 matmuls from a Python loop (the fix: one bmm)."""

    def __init__(self, heads=64, d=256, batched=False):
        super().__init__()
        self.w = nn.Parameter(torch.randn(heads, d, d) / math.sqrt(d))
        self.batched = batched

    def forward(self, x):  # x: (heads, n, d)
        if self.batched:
            return torch.bmm(x, self.w)
        return torch.stack([x[h] @ self.w[h] for h in range(x.shape[0])])


def loop_task(batched, quick):
    heads, d = (8, 32) if quick else (64, 256)
    torch.manual_seed(0)
    model = LoopHeads(heads, d, batched).to(DEVICE)
    x = torch.randn(heads, d, d, device=DEVICE)
    return model, lambda m: m(x).square().mean()


class ManyParams(nn.Module):
    def __init__(self, n=200, size=1000):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(size)) for _ in range(n)])


def sgd_loop_ms(foreach, quick, n_steps=20):
    """A hand-written per-parameter SGD update (MAT504) against its foreach twin."""
    model = ManyParams(50 if quick else 200).to(DEVICE)
    params = list(model.parameters())
    grads = [torch.randn_like(p) for p in params]

    def update():
        with torch.no_grad():
            if foreach:
                torch._foreach_add_(params, grads, alpha=-1e-3)
            else:
                for p, gr in zip(params, grads):
                    p.add_(gr, alpha=-1e-3)

    return update


def findings_and_savings(quick, have_tf):
    if have_tf:
        torch.backends.cuda.matmul.allow_tf32 = False
        g, eager32 = guard_findings(lambda: gpt2_task("eager", quick, bf16=False))
        RESULTS["findings"]["gpt2_eager_fp32"] = summarize(g)
        sdpa32 = step_ms(lambda: gpt2_task("sdpa", quick, bf16=False))
        compare("attention_fp32 (eager→sdpa)", est(g, "MAT601"), eager32, sdpa32)
        g2, _ = guard_findings(lambda: gpt2_task("sdpa", quick, bf16=False))
        sdpa16 = step_ms(lambda: gpt2_task("sdpa", quick, bf16=True))
        RESULTS["findings"]["gpt2_sdpa_fp32"] = summarize(g2)
        compare("bf16 (sdpa fp32→bf16 autocast)", est(g2, "MAT401"), sdpa32, sdpa16)
        g3, eager16 = guard_findings(lambda: gpt2_task("eager", quick, bf16=True))
        RESULTS["findings"]["gpt2_eager_bf16"] = summarize(g3)
        compare("attention_bf16 (eager→sdpa)", est(g3, "MAT601"), eager16, sdpa16)
        g4, _ = guard_findings(lambda: gpt2_task("sdpa", quick, bf16=True))
        RESULTS["findings"]["gpt2_sdpa_bf16"] = summarize(g4)
        codes = {f.code for f in g4.findings}
        RESULTS["findings"]["sdpa_bf16_quiet"] = "MAT601" not in codes and "MAT401" not in codes
        codes32 = {f.code for f in g.findings}
        RESULTS["findings"]["eager_fp32_reports"] = "MAT601" in codes32 and ("MAT401" in codes32 or DEVICE != "cuda")
        print("findings ok:", RESULTS["findings"]["eager_fp32_reports"], RESULTS["findings"]["sdpa_bf16_quiet"])
    # launch-bound steps of ~1-10 ms: the host's speed swings from step to step, so take more
    g5, loop_ms = guard_findings(lambda: loop_task(False, quick), plain_steps=40)
    bmm_ms = step_ms(lambda: loop_task(True, quick), n=40)
    RESULTS["findings"]["loop"] = summarize(g5)
    compare("loop (64 matmuls→bmm)", est(g5, "MAT101"), loop_ms, bmm_ms)

    loop_update, fe_update = sgd_loop_ms(False, quick), sgd_loop_ms(True, quick)
    g6 = rg.guard(window=2, warmup=1, json_path=None, report=False)
    with g6:
        for _ in range(4):
            loop_update()
            g6.step()
    sync()
    t_loop = med(timed_steps(loop_update, 20))
    t_fe = med(timed_steps(fe_update, 20))
    RESULTS["findings"]["sgd_loop"] = summarize(g6)
    compare("tiny ops (per-param loop→foreach)", est(g6, "MAT504"), t_loop, t_fe)


# -- 5. torch.compile ------------------------------------------------------------------------------
def compile_check():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = TinyMLP().to(DEVICE)
    compiled = torch.compile(model)
    x = torch.randn(64, 256, device=DEVICE)
    g = rg.guard(window=2, warmup=1, json_path=None, report=False, estimate_savings=False, kernels=True)
    with g:
        for _ in range(4):
            out = compiled(x)
            g.step()
    ref = model(x)
    rec = g.recorder.rec
    RESULTS["compile"] = {
        "frames_compiled": counters["stats"].get("unique_graphs", 0),
        "ops_from_compiled_regions": sum(s.compiled for s in rec.ops.values()),
        "ops_recorded": sum(s.count for s in rec.ops.values()),
        "triton_kernels": rec.triton_kernels, "kernels": rec.kernels_total,
        "max_abs_diff_vs_eager": float((out - ref).abs().max()), "errors": g.errors,
    }
    print("compile", RESULTS["compile"], flush=True)


def markdown() -> str:
    lines = [f"# Guard overhead and savings ({RESULTS['device']}, torch {RESULTS['torch']})", "",
             "## Step time relative to plain (median)", "",
             "| model | plain ms | empty dispatch mode | guard, observed step | guard, after window | "
             "guard amortized (100 steps) | FlopCounterMode | DebugMode | profiler shapes+stacks |",
             "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}×"
    for name, r in RESULTS["overhead"].items():
        lines.append(f"| {name} | {r['plain_ms']:.2f} | {fmt(r['empty_mode'])} | {fmt(r['guard_observed'])} | "
                     f"{fmt(r['guard_after_window'])} | {r['guard_amortized']:.3f}× (plain runs differ by "
                     f"{r['plain_run_spread']:.1%}) | {fmt(r['flop_counter'])} | "
                     f"{fmt(r['debug_mode'])} | {fmt(r['profiler_shapes_stacks'])} |")
    lines += ["", "With kernels=True (profiler CUDA activity inside the window):", "",
              "| model | observed step | window close ms | kernels/step | kernels attributed to a line |",
              "|---|---|---|---|---|"]
    for name, r in RESULTS["overhead"].items():
        if "guard_kernels_observed" in r:
            lines.append(f"| {name} | {r['guard_kernels_observed']:.2f}× | {r['guard_kernels_window_close_ms']:.0f} | "
                         f"{r['kernels_per_step']:.0f} | {r['kernels_attributed']:.1%} |")
    lines += ["", "## Savings: estimate vs real gain after the fix (ms per step)", "",
              "| case | estimate | real | estimate/real | before | after |", "|---|---|---|---|---|---|"]
    for name, s in RESULTS["savings"].items():
        e = "-" if s["estimate_ms"] is None else f"{s['estimate_ms']:.2f}"
        ratio = "-" if s["estimate_over_real"] is None else f"{s['estimate_over_real']:.2f}"
        lines.append(f"| {name} | {e} | {s['real_ms']:.2f} | {ratio} | {s['before_ms']:.2f} | {s['after_ms']:.2f} |")
    lines += ["", "## Bitwise identity (losses and parameters after training steps)", "",
              "| model | plain vs plain | plain vs guard |", "|---|---|---|"]
    for name, s in RESULTS["safety"].items():
        lines.append(f"| {name} | {s['plain_vs_plain']} | {s['plain_vs_guard']} |")
    lines += ["", "## Findings", ""]
    for name, fs in RESULTS["findings"].items():
        if isinstance(fs, bool):
            lines.append(f"- {name}: {fs}")
            continue
        lines.append(f"- {name}: " + ("none" if not fs else ", ".join(
            f"{f['code']} at {f['where']} (saves {f['estimated_savings_ms']} ms/step)" for f in fs)))
    lines += ["", "## torch.compile under the guard", "", "```", json.dumps(RESULTS["compile"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--only", default="overhead,safety,findings,compile")
    ap.add_argument("--models", default="",
                    help="overhead part: only the models whose name contains one of these comma-separated "
                         "words (e.g. 'gpt2' or 'sdpa'); all by default")
    args = ap.parse_args()
    parts = args.only.split(",")
    os.makedirs(args.out, exist_ok=True)
    import importlib.util

    have_tf = importlib.util.find_spec("transformers") is not None
    have_tv = importlib.util.find_spec("torchvision") is not None
    q = args.quick
    amort = 20 if q else 100
    tasks = {}
    if have_tf:
        tasks["gpt2-124M eager attn, bf16"] = lambda: gpt2_task("eager", q, bf16=DEVICE == "cuda")
        tasks["gpt2-124M sdpa, bf16"] = lambda: gpt2_task("sdpa", q, bf16=DEVICE == "cuda")
    if have_tv:
        tasks["resnet50, bf16"] = lambda: resnet_task(q)
    tasks["tiny MLP"] = lambda: mlp_task(q)
    if args.models:
        words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
        tasks = {n: m for n, m in tasks.items() if any(w in n.lower() for w in words)}
    try:
        if "overhead" in parts:
            for name, make in tasks.items():
                overhead(name, make, amort)
        if "safety" in parts:
            if have_tf:
                bitwise("gpt2 sdpa fp32", lambda: gpt2_task("sdpa", q, bf16=False, batch=2, seq=128 if not q else 32))
            if have_tv:
                bitwise("resnet50 bf16", lambda: resnet_task(True))
            bitwise("tiny MLP", lambda: mlp_task(q))
        if "findings" in parts:
            findings_and_savings(q, have_tf)
        if "compile" in parts:
            compile_check()
    finally:
        with open(os.path.join(args.out, "guard_overhead.json"), "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
        with open(os.path.join(args.out, "guard_overhead.md"), "w") as fh:
            fh.write(markdown())
    print(markdown())


if __name__ == "__main__":
    main()
