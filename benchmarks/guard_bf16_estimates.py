"""The guard's fp32 -> bf16 estimate (MAT401) against the gain of the fix, applied and timed
(issue 26, item 5), on the models of guard_overhead_six.py.

For each model, in one process on one GPU: the fp32 training step (TF32 off, no autocast region)
runs under `matlint.guard()` with savings estimated; then the fp32 step and the fixed step (the
forward and loss under `torch.autocast("cuda", dtype=torch.bfloat16)`) are timed in alternating
rounds, and the real gain is the difference of their medians. Target: the estimate within ±30 %
of the gain; where the step is bound by the host, the fix gains little and the estimate must say
so (or the finding must not be made).

    python benchmarks/guard_bf16_estimates.py --out benchmarks/results   # on a GPU
    python benchmarks/guard_bf16_estimates.py --quick                    # tiny models, any device
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import guard_overhead_six as six  # noqa: E402  (the models and the timing helpers)

from matlint.runtime_guard.session import Guard  # noqa: E402


# Families beyond guard_overhead_six's, for the estimate only: an encoder-decoder with relative
# position bias, a convnet whose pointwise layers are Linear, and a windowed-attention vision model.
def t5(quick, bf16):
    from transformers import T5Config, T5ForConditionalGeneration

    ids = dict(decoder_start_token_id=0, pad_token_id=0)
    cfg = (T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000, **ids) if quick else
           T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12, vocab_size=32128, **ids))
    model = six._hf(T5ForConditionalGeneration, cfg, attn="eager").to(six.DEVICE)
    b, s, t = (2, 32, 8) if quick else (8 * six.BATCH_SCALE, 256, 64)
    src = torch.randint(0, cfg.vocab_size, (b, s), device=six.DEVICE)
    tgt = torch.randint(0, cfg.vocab_size, (b, t), device=six.DEVICE)

    def loss_fn(m):
        with six.autocast(bf16):
            return m(input_ids=src, labels=tgt).loss

    return model, loss_fn


def _vision(builder_name, quick, bf16):
    tv = six._torchvision()
    if tv is None or quick:
        return six.resnet50(quick, bf16)
    model = getattr(tv.models, builder_name)(weights=None).to(six.DEVICE)
    b = 32 * six.BATCH_SCALE
    x = torch.randn(b, 3, 224, 224, device=six.DEVICE)
    y = torch.randint(0, 1000, (b,), device=six.DEVICE)

    def loss_fn(m):
        with six.autocast(bf16):
            return torch.nn.functional.cross_entropy(m(x), y)

    return model, loss_fn


EXTRA_MODELS = {
    "T5-base encoder-decoder (B8 S256 T64)": t5,
    "ConvNeXt-T (B32 224px)": lambda quick, bf16: _vision("convnext_tiny", quick, bf16),
    "Swin-T (B32 224px)": lambda quick, bf16: _vision("swin_t", quick, bf16),
}


def gain_ms(fp32_step, bf16_step, rounds: int, per_round: int) -> tuple:
    """(fp32 median ms, bf16 median ms) over alternating rounds of each."""
    fp32, bf16 = [], []
    for i in range(rounds):
        for step, out in ((fp32_step, fp32), (bf16_step, bf16))[:: 1 if i % 2 == 0 else -1]:
            out.extend(six.timed(step, per_round))
    return statistics.median(fp32), statistics.median(bf16)


def one_model(name: str, make, quick: bool, rounds: int, per_round: int) -> dict:
    torch.manual_seed(0)
    model, loss_fp32 = make(quick, False)
    step_fp32 = six.trainer(model, loss_fp32)
    six.timed(step_fp32, 3)
    guard = Guard(json_path=None, report=False, estimate_savings=True)
    with guard:
        for _ in range(12):  # the warm-up, the window, then the plain steps it times
            step_fp32()
    found = [f for f in guard.findings if f.code == "MAT401"]
    estimate = found[0].estimated_savings_ms if found else None
    reliable = (found[0].evidence or {}).get("estimate_reliable") if found else None
    torch.manual_seed(0)
    model_b, loss_bf16 = make(quick, True)
    model_b.load_state_dict(model.state_dict())
    step_bf16 = six.trainer(model_b, loss_bf16)
    six.timed(step_bf16, 3)
    fp32_ms, bf16_ms = gain_ms(step_fp32, step_bf16, rounds, per_round)
    real = fp32_ms - bf16_ms
    row = {"model": name, "fp32_ms": round(fp32_ms, 3), "bf16_ms": round(bf16_ms, 3), "real_gain_ms": round(real, 3),
           "mat401": bool(found), "estimate_ms": None if estimate is None else round(estimate, 3),
           "estimate_reliable": reliable, "guard_step_ms": guard.step_ms[0], "gpu_wait_ms": guard.gpu_wait_ms,
           "notes": [n for n in guard.notes if n.startswith("MAT401 not reported")],
           "ratio": round(estimate / real, 3) if estimate is not None and real > 0 else None,
           "codes": sorted({f.code for f in guard.findings})}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="", help="comma-separated words: only models whose name holds one")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--out", default="", help="folder for guard_bf16_estimates.json/.md")
    ap.add_argument("--batch-scale", type=int, default=1,
                    help="multiply every model's batch (a larger batch moves a host-bound step onto the GPU)")
    args = ap.parse_args(argv)
    six.BATCH_SCALE = args.batch_scale
    torch.backends.cuda.matmul.allow_tf32 = False
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    rows = []
    for name, make in {**six.MODELS, **EXTRA_MODELS}.items():
        if words and not any(w in name.lower() for w in words):
            continue
        try:
            shown = name if args.batch_scale == 1 else f"{name}, batch ×{args.batch_scale}"
            rows.append(one_model(shown, make, args.quick, args.rounds, args.per_round))
        except Exception as exc:  # a model this transformers/torchvision cannot build: the others still run
            print("skip", name, type(exc).__name__, exc, flush=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [f"# fp32 -> bf16: the guard's MAT401 estimate against the applied fix ({device}, torch {torch.__version__})",
             "", "| model | fp32 ms | bf16 ms | real gain ms | host waited for the GPU, ms | MAT401 | estimate ms | "
             "estimate / real |", "|---|--:|--:|--:|--:|---|--:|--:|"]
    for r in rows:
        est = "–" if r["estimate_ms"] is None else f"{r['estimate_ms']:.2f}" + ("" if r["estimate_reliable"] else " (unsure)")
        wait = "–" if r["gpu_wait_ms"] is None else f"{r['gpu_wait_ms']:.2f}"
        lines.append(f"| {r['model']} | {r['fp32_ms']:.2f} | {r['bf16_ms']:.2f} | {r['real_gain_ms']:.2f} | {wait} | "
                     f"{'yes' if r['mat401'] else 'no (host-bound)' if r['notes'] else 'no'} | {est} | "
                     f"{r['ratio'] if r['ratio'] is not None else '–'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "guard_bf16_estimates.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
        Path(args.out, "guard_bf16_estimates.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
