"""What the guard reports on library models it was not developed against: every finding, for a
reader to judge (precision on code nobody here tuned for).

    python benchmarks/guard_model_findings.py [--models swin_t,t5] [--steps 6] [--json out.json]

Models (random weights, AdamW, bf16 autocast on CUDA, a few training steps under a default
`matlint.guard()` with savings estimates off): torchvision's Swin-T, ConvNeXt-T, EfficientNet-B0,
MobileNetV3-L, Faster R-CNN (MobileNetV3-FPN) training with targets and in eval, DeepLabV3
(MobileNetV3); transformers' T5-small, BART-base, Mistral-style decoder, GPT-NeoX-style decoder,
RoBERTa-base, each built from its config. A model whose library is missing is skipped.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import traceback

import torch
import torch.nn.functional as F

import matlint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _vision(name, batch=8, size=224, classes=1000):
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=classes)
    x = torch.randn(batch, 3, size, size, device=DEVICE)
    y = torch.randint(0, classes, (batch,), device=DEVICE)
    return model, lambda m: F.cross_entropy(m(x), y)


def _detection(train):
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(num_classes=91, weights=None,
                                                                           weights_backbone=None)
    images = [torch.rand(3, 320, 320, device=DEVICE) for _ in range(4)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 120.0, 160.0], [50.0, 60.0, 200.0, 220.0]], device=DEVICE),
                "labels": torch.tensor([3, 7], device=DEVICE)} for _ in range(4)]
    if train:
        return model, lambda m: sum(m(images, targets).values())
    return model, None, lambda m: m(images)


def _segmentation():
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(num_classes=21, weights=None,
                                                                          weights_backbone=None)
    x = torch.randn(4, 3, 256, 256, device=DEVICE)
    y = torch.randint(0, 21, (4, 256, 256), device=DEVICE)
    return model, lambda m: F.cross_entropy(m(x)["out"], y)


def _seq2seq(config_name, model_name, **config):
    import transformers

    cfg = getattr(transformers, config_name)(**config)
    model = getattr(transformers, model_name)(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 128), device=DEVICE)
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def _causal(config_name, model_name, **config):
    import transformers

    cfg = getattr(transformers, config_name)(**config)
    model = getattr(transformers, model_name)(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 256), device=DEVICE)
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def _masked_lm():
    import transformers

    cfg = transformers.RobertaConfig()
    model = transformers.RobertaForMaskedLM(cfg)
    ids = torch.randint(5, cfg.vocab_size, (8, 128), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[:, 100:] = 0
    return model, lambda m: m(input_ids=ids, attention_mask=mask, labels=ids).loss


MODELS = {
    "swin_t": lambda: _vision("swin_t"),
    "convnext_tiny": lambda: _vision("convnext_tiny"),
    "efficientnet_b0": lambda: _vision("efficientnet_b0"),
    "mobilenet_v3_large": lambda: _vision("mobilenet_v3_large"),
    "fasterrcnn_train": lambda: _detection(True),
    "fasterrcnn_eval": lambda: _detection(False),
    "deeplabv3": _segmentation,
    "t5_small": lambda: _seq2seq("T5Config", "T5ForConditionalGeneration", d_model=512, num_layers=6,
                                 num_heads=8, d_ff=2048, decoder_start_token_id=0, pad_token_id=0),
    "bart_base": lambda: _seq2seq("BartConfig", "BartForConditionalGeneration"),
    "mistral": lambda: _causal("MistralConfig", "MistralForCausalLM", hidden_size=512, intermediate_size=1536,
                               num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, vocab_size=32000),
    "gpt_neox": lambda: _causal("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=512, intermediate_size=2048,
                                num_hidden_layers=4, num_attention_heads=8, vocab_size=32000),
    "roberta": _masked_lm,
}


def run(name, steps):
    built = MODELS[name]()
    if len(built) == 3:  # inference: (model, None, forward)
        model, _, forward = built
        model = model.to(DEVICE).eval()
        g = matlint.guard(json_path=None, report=False, estimate_savings=False)
        with g, torch.no_grad():
            for _ in range(steps):
                with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
                    forward(model)
                g.step()
        return g
    model, loss_of = built
    model = model.to(DEVICE).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = matlint.guard(json_path=None, report=False, estimate_savings=False)
    with g:
        for _ in range(steps):
            ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if DEVICE == "cuda" else contextlib.nullcontext()
            with ctx:
                loss = loss_of(model)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {}
    for name in args.models.split(","):
        try:
            g = run(name, args.steps)
        except ImportError as exc:
            print(f"== {name}: skipped ({exc})")
            continue
        except Exception:
            print(f"== {name}: failed\n{traceback.format_exc(limit=3)}")
            out[name] = {"failed": traceback.format_exc(limit=3)}
            continue
        rows = [{"code": f.code, "file": f.filename, "line": f.row, "message": f.message, "evidence": f.evidence}
                for f in g.findings]
        out[name] = {"findings": rows, "errors": [str(e) for e in g.errors], "notes": list(g.notes)}
        print(f"== {name}: {len(rows)} findings, {len(g.errors)} guard errors")
        for r in rows:
            print(f"  {r['code']} {os.path.relpath(r['file'])}:{r['line']} {r['message'][:230]}")
        for e in g.errors[:3]:
            print(f"  guard error: {e}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
