"""Guard overhead on six models x {bf16 autocast, fp32}, in one run on one GPU (issue 26, item 6).

    python benchmarks/guard_overhead_six.py --out DIR              # full sizes, on CUDA
    python benchmarks/guard_overhead_six.py --quick --out DIR      # tiny sizes (CPU smoke test)
    python benchmarks/guard_overhead_six.py --baseline PKG ...     # also time another copy of the guard
                                                                   # (a package dir, e.g. the code before a change)

Models (random weights, AdamW, one training step = zero_grad + forward + loss + backward + step):
GPT-2 124M (transformers, SDPA; batch 4 x 512), a Llama-style decoder with grouped-query attention
(transformers LlamaConfig: 8 layers, hidden 1024, 16 query heads on 4 KV heads; batch 4 x 512),
BERT-base masked LM with a padding mask (8 x 256), ResNet-50 (torchvision, channels_last, 32 x
224px), ViT-B/16 (torchvision, 16 x 224px) and a small MLP (256-256-10, batch 64); each with bf16
autocast and in fp32 (TF32 off for matmuls, torch's default).

Per model and precision, RUNS runs (5 by default), alternating which goes first:
  - plain: AMORT steps (100), each timed (the device synchronised after each step, as a loop that
    reads its loss does);
  - guarded: the same AMORT steps under a default `matlint.guard()` (report, JSON and savings
    estimates off: they run once at exit, outside the steps; timed separately as `exit ms`).
  observed x = median of the observed steps after the warm-up step / median plain step;
  warm-up x = the first (provisional, cold) observed step / median plain step;
  amortized x = guarded run total / plain run total;
  guard cost x = 1 + the observed steps' excess over the median step after the window of the same
    guarded run, over the run's steps: the amortized cost without the drift of the host between
    the two runs (after-window x, that median against the plain run's, is shown beside it).
Medians over the runs are reported with their spread (min-max). Findings: the number of
findings of the last run (the same in every run, else flagged).
Also, once per model: what each observation mechanism costs alone (an empty dispatch mode,
global module hooks, the profiler recording shapes, the profiler with Python stacks), and bitwise
identity of losses and parameters after 3 training steps, plain vs plain and plain vs guarded.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the bitwise check

import torch
import torch.nn as nn
import torch.nn.functional as F

import matlint.runtime_guard as rg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guard_overhead  # noqa: E402  (the first benchmark's helpers)
from guard_overhead import DEVICE, EmptyMode, med, sync  # noqa: E402


@contextlib.contextmanager
def module_hooks():
    """Global forward pre/post hooks that do nothing: what the guard's module paths cost at least."""
    from torch.nn.modules import module as nn_module

    hs = [nn_module.register_module_forward_pre_hook(lambda m, a: None),
          nn_module.register_module_forward_hook(lambda m, a, o: None, always_call=True)]
    try:
        yield
    finally:
        for h in hs:
            h.remove()


def profiler_ctx(stacks):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    return profile(activities=acts, record_shapes=True, with_stack=stacks)


# -- models --------------------------------------------------------------------------------------
# Every model's batch is multiplied by this (the names in MODELS give the batch at 1).
BATCH_SCALE = 1


def autocast(bf16):
    """bf16 autocast, or no autocast region at all for fp32 (an `autocast(enabled=False)` region
    tells the guard the fp32 is on purpose, and MAT401 stays quiet there)."""
    return torch.autocast(DEVICE, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _hf(model_cls, cfg, attn="sdpa"):
    try:
        return model_cls._from_config(cfg, attn_implementation=attn)
    except Exception:
        cfg._attn_implementation = attn
        return model_cls(cfg)


def gpt2(quick, bf16):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128) if quick else GPT2Config()
    model = _hf(GPT2LMHeadModel, cfg).to(DEVICE)
    b, s = (2, 32) if quick else (4 * BATCH_SCALE, 512)
    data = torch.randint(0, cfg.vocab_size, (b, s), device=DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return m(input_ids=data, labels=data).loss

    return model, loss_fn


def llama_gqa(quick, bf16):
    from transformers import LlamaConfig, LlamaForCausalLM

    if quick:
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    else:
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)
    model = _hf(LlamaForCausalLM, cfg).to(DEVICE)
    b, s = (2, 32) if quick else (4 * BATCH_SCALE, 512)
    data = torch.randint(0, cfg.vocab_size, (b, s), device=DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return m(input_ids=data, labels=data).loss

    return model, loss_fn


def bert(quick, bf16):
    from transformers import BertConfig, BertForMaskedLM

    cfg = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      vocab_size=1000) if quick else BertConfig())
    model = _hf(BertForMaskedLM, cfg).to(DEVICE)
    b, s = (2, 32) if quick else (8 * BATCH_SCALE, 256)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[: b // 2, s - s // 4:] = 0  # padding at the end of half the sequences
    labels = torch.full((b, s), -100)
    picked = torch.rand(b, s, generator=g) < 0.15
    labels[picked] = ids[picked]
    ids, mask, labels = ids.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return m(input_ids=ids, attention_mask=mask, labels=labels).loss

    return model, loss_fn


class SmallResNet(nn.Module):
    """Stands in for ResNet-50 where torchvision is missing (CPU smoke tests only)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000))

    def forward(self, x):
        return self.body(x)


def _torchvision():
    try:
        import torchvision

        return torchvision
    except Exception:
        return None


def resnet50(quick, bf16):
    tv = _torchvision()
    model = SmallResNet() if tv is None else tv.models.resnet50(weights=None)
    model = model.to(DEVICE).to(memory_format=torch.channels_last)
    b, r = (2, 32) if quick else (32 * BATCH_SCALE, 224)
    x = torch.randn(b, 3, r, r, device=DEVICE).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), device=DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return F.cross_entropy(m(x), y)

    return model, loss_fn


def vit(quick, bf16):
    tv = _torchvision()
    if quick:
        if tv is None:
            return resnet50(quick, bf16)
        model = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                            hidden_dim=32, mlp_dim=64)
        b, r = 2, 32
    else:
        model = tv.models.vit_b_16(weights=None)
        b, r = 16 * BATCH_SCALE, 224
    model = model.to(DEVICE)
    x = torch.randn(b, 3, r, r, device=DEVICE)
    y = torch.randint(0, 1000, (b,), device=DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return F.cross_entropy(m(x), y)

    return model, loss_fn


class SmallMLP(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 10))

    def forward(self, x):
        return self.net(x)


def mlp(quick, bf16):
    model = SmallMLP().to(DEVICE)
    x = torch.randn(64 * BATCH_SCALE, 256, device=DEVICE)
    y = torch.randint(0, 10, (64 * BATCH_SCALE,), device=DEVICE)

    def loss_fn(m):
        with autocast(bf16):
            return F.cross_entropy(m(x), y)

    return model, loss_fn


MODELS = {
    "GPT-2 124M (B4 S512)": gpt2,
    "GQA decoder 8L/1024 16q:4kv (B4 S512)": llama_gqa,
    "BERT-base MLM, padded (B8 S256)": bert,
    "ResNet-50 (B32 224px)": resnet50,
    "ViT-B/16 (B16 224px)": vit,
    "small MLP 256-256-10 (B64)": mlp,
}


# -- measurement -----------------------------------------------------------------------------------
def trainer(model, loss_fn):
    return guard_overhead.trainer(model, loss_fn, lr=1e-5)


# What a step is timed with. Wall time by default (the host waits for the device); a CPU-only run
# on a shared host may time the stepping thread's CPU time instead (guard_perop.py does).
STEP_CLOCK = time.perf_counter


def timed(step, n, ctx=None, observed=None, guard=None):
    times = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for _ in range(n):
            if observed is not None:
                observed.append(guard.recording)
            sync()
            t0 = STEP_CLOCK()
            step()
            sync()
            times.append((STEP_CLOCK() - t0) * 1e3)
    return times


def plain_run(step, n):
    gc.collect()
    return timed(step, n)


def guarded_run(step, n, guard_mod):
    gc.collect()
    g = guard_mod.guard(json_path=None, report=False, estimate_savings=False)
    observed = []
    times = []
    g.__enter__()
    try:
        times = timed(step, n, observed=observed, guard=g)
    finally:
        t0 = time.perf_counter()
        g.__exit__(None, None, None)
        exit_ms = (time.perf_counter() - t0) * 1e3
    return times, observed, g, exit_ms


def one_run(step, n, guard_mod, guard_first):
    if guard_first:
        gt, obs, g, exit_ms = guarded_run(step, n, guard_mod)
        pt = plain_run(step, n)
    else:
        pt = plain_run(step, n)
        gt, obs, g, exit_ms = guarded_run(step, n, guard_mod)
    base = med(pt)
    obs_times = [t for t, o in zip(gt, obs) if o]
    return {
        "plain_ms": base,
        "observed_steps": len(obs_times),
        "warmup_x": obs_times[0] / base if obs_times else None,
        "observed_x": med(obs_times[1:]) / base if len(obs_times) > 1 else None,
        "observed_max_x": max(obs_times[1:]) / base if len(obs_times) > 1 else None,
        "after_window_x": med(after) / base if (after := [t for t, o in zip(gt, obs) if not o]) else None,
        "amortized_x": sum(gt) / sum(pt),
        "guard_cost_x": guard_cost(gt, obs),
        "first_steps_x": [round(t / base, 3) for t in gt[:12]],  # the window's steps and a few after
        "exit_ms": exit_ms,
        "findings": sorted(f"{f.code}@{os.path.basename(f.filename)}:{f.row}" for f in g.findings),
        "errors": list(g.errors),
    }


def guard_cost(times, observed):
    """1 + what the observed steps cost beyond the steps after the window of the same run, over all
    the run's steps (each in units of that after-window median)."""
    after = [t for t, o in zip(times, observed) if not o]
    if not after:
        return None
    m = med(after)
    return 1 + sum(t - m for t, o in zip(times, observed) if o) / (len(times) * m)


def mechanisms(step, plain_ms, n=4):
    row = {}
    for name, ctx in (("empty dispatch mode", lambda: EmptyMode()), ("module hooks", module_hooks),
                      ("profiler shapes", lambda: profiler_ctx(False)),
                      ("profiler shapes+stacks", lambda: profiler_ctx(True))):
        gc.collect()
        row[name] = med(timed(step, n, ctx())[1:]) / plain_ms
    return row


def bitwise(make, model, step_fn_state, guard_mod, n_steps=7):
    """Losses and parameters after n_steps from the same initial state, plain twice and guarded (the
    default window: the warm-up step whole, then its slices, then steps unobserved)."""
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loss_fn = step_fn_state

    def run(under_guard):
        model.load_state_dict(init)
        step = trainer(model, loss_fn)
        losses = []
        g = guard_mod.guard(json_path=None, report=False, estimate_savings=False)
        with g if under_guard else contextlib.nullcontext():
            for i in range(n_steps):
                torch.manual_seed(100 + i)
                losses.append(step().detach().clone())
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    # deterministic kernels where torch has them (embedding and index backward use atomics otherwise),
    # so that plain vs plain is a fair reference; where a kernel has none, torch warns and plain runs may differ
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        a, b, c = run(False), run(False), run(True)
    finally:
        torch.use_deterministic_algorithms(False)
    same = lambda x, y: bool(torch.equal(x[0], y[0]) and all(torch.equal(p, q) for p, q in zip(x[1], y[1])))
    model.load_state_dict(init)
    return {"plain_vs_plain": same(a, b), "plain_vs_guard": same(a, c)}


def load_baseline(path):
    """A copy of the guard package at `path` (a directory holding runtime_guard's modules),
    imported under its own name so that both versions can be timed in one process."""
    import importlib.util

    name = "guard_baseline"
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, None
    return med(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=None, help="steps per amortized run (100; 20 with --quick)")
    ap.add_argument("--models", default="", help="comma-separated words: only models whose name holds one")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--baseline", default="", help="directory of another copy of runtime_guard to time too (1 run)")
    ap.add_argument("--no-mechanisms", action="store_true")
    ap.add_argument("--no-bitwise", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    steps = args.steps or (20 if args.quick else 100)
    base_mod = load_baseline(args.baseline) if args.baseline else None
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (torch's default)
    torch.backends.cudnn.allow_tf32 = True          # torch's default for convolutions
    results = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
               "python": sys.version.split()[0], "runs": args.runs, "steps": steps, "rows": {}}
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    t_start = time.perf_counter()
    try:
        for mname, make in MODELS.items():
            if words and not any(w in mname.lower() for w in words):
                continue
            for prec in args.precisions.split(","):
                bf16 = prec == "bf16"
                name = f"{mname}, {prec}"
                torch.manual_seed(0)
                t0 = time.perf_counter()
                try:
                    model, loss_fn = make(args.quick, bf16)
                except ImportError as exc:
                    print("skip", name, exc, flush=True)
                    continue
                step = trainer(model, loss_fn)
                timed(step, 3)  # warm-up: allocator, cuBLAS/cuDNN handles, autotuning
                row = {"build_s": time.perf_counter() - t0}
                runs = [one_run(step, steps, rg, guard_first=bool(i % 2)) for i in range(args.runs)]
                row["runs"] = runs
                for k in ("plain_ms", "observed_x", "observed_max_x", "warmup_x", "after_window_x", "amortized_x",
                          "guard_cost_x", "exit_ms"):
                    row[k] = spread([r[k] for r in runs])
                row["observed_steps"] = [r["observed_steps"] for r in runs]
                row["findings"] = runs[-1]["findings"]
                row["findings_stable"] = all(r["findings"] == runs[-1]["findings"] for r in runs)
                row["errors"] = sorted({e for r in runs for e in r["errors"]})
                if base_mod is not None:
                    b = one_run(step, steps, base_mod, guard_first=False)
                    row["baseline"] = {k: b[k] for k in ("plain_ms", "observed_x", "observed_max_x", "warmup_x", "amortized_x",
                                                         "findings", "observed_steps")}
                    row["baseline_same_findings"] = b["findings"] == row["findings"]
                if not args.no_mechanisms:
                    row["mechanisms"] = mechanisms(step, row["plain_ms"][0])
                if not args.no_bitwise:
                    row["bitwise"] = bitwise(make, model, loss_fn, rg)
                row["wall_s"] = time.perf_counter() - t0
                results["rows"][name] = row
                print(name, json.dumps({k: v for k, v in row.items() if k != "runs"}, default=str), flush=True)
                with open(os.path.join(args.out, "guard_overhead_six.json"), "w") as fh:  # kept if the run is cut off
                    json.dump(results, fh, indent=1, default=str)
                del model, step, loss_fn
                gc.collect()
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    finally:
        results["total_s"] = time.perf_counter() - t_start
        with open(os.path.join(args.out, "guard_overhead_six.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=str)
        md = markdown(results)
        with open(os.path.join(args.out, "guard_overhead_six_table.md"), "w") as fh:
            fh.write(md)
        print(md)


def markdown(res) -> str:
    x = lambda t, d=2: "-" if t is None or t[0] is None else f"{t[0]:.{d}f}× ({t[1]:.{d}f}–{t[2]:.{d}f})"
    lines = [f"{res['device']}, torch {res['torch']}, Python {res['python']}; medians over {res['runs']} runs "
             f"(min–max); amortized over {res['steps']} steps", "",
             "| model, precision | plain ms | observed × | slowest observed × | amortized × | guard cost × | "
             "after-window × | warm-up step × | observed steps | findings | bitwise |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["rows"].items():
        p = r["plain_ms"]
        bw = r.get("bitwise")
        bws = "-" if bw is None else ("yes" if bw["plain_vs_guard"] else
                                      ("NO" if bw["plain_vs_plain"] else "n/a (plain runs differ)"))
        nf = f"{len(r['findings'])}" + ("" if r["findings_stable"] else " (varies)")
        steps_seen = "/".join(str(n) for n in sorted(set(r["observed_steps"])))
        lines.append(f"| {name} | {p[0]:.2f} ({p[1]:.2f}–{p[2]:.2f}) | {x(r['observed_x'])} | "
                     f"{x(r.get('observed_max_x'))} | {x(r['amortized_x'], 3)} | {x(r.get('guard_cost_x'), 3)} | "
                     f"{x(r.get('after_window_x'))} | {x(r['warmup_x'])} | {steps_seen} | "
                     f"{nf} | {bws} |")
    if any("mechanisms" in r for r in res["rows"].values()):
        names = next(r["mechanisms"] for r in res["rows"].values() if "mechanisms" in r).keys()
        lines += ["", "What each observation mechanism costs alone (median step × plain, one run of 3 steps):", "",
                  "| model, precision | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for name, r in res["rows"].items():
            if "mechanisms" in r:
                lines.append(f"| {name} | " + " | ".join(f"{v:.2f}×" for v in r["mechanisms"].values()) + " |")
    if any("baseline" in r for r in res["rows"].values()):
        lines += ["", "Baseline guard (before this change), one run, same process:", "",
                  "| model, precision | observed × | slowest observed × | amortized × | warm-up × | observed steps | "
                  "same findings |", "|---|---|---|---|---|---|---|"]
        for name, r in res["rows"].items():
            b = r.get("baseline")
            if b:
                f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}×"
                lines.append(f"| {name} | {f(b['observed_x'])} | {f(b.get('observed_max_x'))} | "
                             f"{f(b['amortized_x'], 3)} | {f(b['warmup_x'])} | {b['observed_steps']} | "
                             f"{r['baseline_same_findings']} |")
    lines += ["", "Findings per model (last run): "]
    for name, r in res["rows"].items():
        lines.append(f"- {name}: {', '.join(r['findings']) or 'none'}" + (f"; errors {r['errors']}" if r["errors"] else ""))
    lines.append(f"\ntotal {res.get('total_s', 0):.0f} s")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
