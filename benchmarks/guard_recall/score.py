"""Recall and precision of the runtime guard on small realistic programs (benchmarks/guard_recall/).

Each program runs in a subprocess under `matlint.guard(json_path=None, report=False,
estimate_savings=False)`, as `matlint run` runs a script, on the current device (`--device cpu`
hides the GPU). Its findings (code, file, line) are matched to labels.csv: same program, same
code, line within 2. Only labels observable on the device count (`device` cpu everywhere, cuda
only on a GPU).

- recall: positive labels that are some finding's nearest matching label / positive labels;
- precision: finding sites (program, code, line) whose nearest matching label is positive / all
  finding sites (one that matches no label, or lands outside the program, counts against it);
  also over findings, where the guard reports one site several times (once per module).

Printed per family and overall, and again for the codes that have a runtime check. Deterministic
(seeded programs, one thread), no network.

    python benchmarks/guard_recall/score.py [--device cpu] [--programs tiny_gpt,vae_mnist] [--json out.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
LABELS = HERE / "labels.csv"
LINE_SLACK = 2
FAMILIES = {"1": "loops", "2": "broadcasting", "3": "layout", "4": "precision", "5": "launches", "6": "fused"}

# Runs in the subprocess: the program under the guard, then its findings as JSON into argv[2].
RUNNER = r"""
import json, os, runpy, sys, traceback
program, out_path = sys.argv[1], sys.argv[2]
import torch
torch.set_num_threads(1)
import matlint
from matlint.runtime_guard import registry
registry.load()
sys.argv = [program]
sys.path.insert(0, os.path.dirname(program))
g = matlint.guard(json_path=None, report=False, estimate_savings=os.environ.get("SCORE_ESTIMATES") == "1")
failure = None
try:
    with g:
        runpy.run_path(program, run_name="__main__")
except BaseException:
    failure = traceback.format_exc(limit=5)
result = {
    "findings": [{"code": f.code, "file": os.path.abspath(f.filename), "line": f.row, "message": f.message,
                  "evidence": f.evidence} for f in g.findings],
    "guard_errors": [str(e) for e in g.errors],
    "failure": failure,
    "device": "cuda" if torch.cuda.is_available() else "cpu",
    "runtime_codes": sorted(registry.checks()),
}
with open(out_path, "w") as fh:
    json.dump(result, fh)
"""


@dataclass
class Label:
    program: str
    line: int
    code: str
    label: str
    device: str
    why: str


@dataclass
class Finding:
    program: str
    code: str
    file: str
    line: int
    message: str
    evidence: dict = field(default_factory=dict)
    verdict: str = "unlabelled"    # "pos", "neg", "unlabelled" or "outside" (not in the program)
    label: Label | None = None


@dataclass
class Run:
    program: str
    findings: list = field(default_factory=list)
    guard_errors: list = field(default_factory=list)
    failure: str | None = None
    device: str = "cpu"
    runtime_codes: list = field(default_factory=list)


def family(code: str) -> str:
    return FAMILIES.get(code[3:4], "other")


def read_labels(path: Path = LABELS) -> list:
    with open(path, newline="") as fh:
        return [Label(r["program"], int(r["line"]), r["code"], r["label"], r["device"], r["why"])
                for r in csv.DictReader(fh)]


def run_program(name: str, device: str, timeout: float = 300, estimates: bool = False) -> Run:
    """One program under the guard in a fresh interpreter, in an empty working directory (no
    project's [tool.matlint] applies: the default selection)."""
    program = PROGRAMS / name
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
               SCORE_ESTIMATES="1" if estimates else "0")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        try:
            proc = subprocess.run([sys.executable, "-c", RUNNER, str(program), str(out)], cwd=tmp, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Run(name, failure=f"timed out after {timeout:g} s")
        if not out.exists():
            return Run(name, failure=f"exit {proc.returncode}: {proc.stderr[-2000:]}")
        data = json.loads(out.read_text())
    findings = [Finding(name, f["code"], f["file"], f["line"], f["message"], f.get("evidence") or {})
                for f in data["findings"]]
    return Run(name, findings, data["guard_errors"], data["failure"], data["device"], data["runtime_codes"])


def match(findings: list, labels: list) -> set:
    """Sets each finding's verdict from its nearest label of the same program and code within
    LINE_SLACK lines (a positive one on a tie); returns the ids of the positive labels that are
    some finding's nearest (a finding on the line of one label does not also find its neighbour)."""
    found = set()
    for f in findings:
        if Path(f.file).resolve() != (PROGRAMS / f.program).resolve():
            f.verdict = "outside"
            continue
        near = [lab for lab in labels if lab.program == f.program and lab.code == f.code
                and abs(lab.line - f.line) <= LINE_SLACK]
        if near:
            f.label = min(near, key=lambda lab: (abs(lab.line - f.line), lab.label != "pos"))
            f.verdict = f.label.label
            if f.verdict == "pos":
                found.add(id(f.label))
    return found


def ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "  - "


def table(labels: list, findings: list, found: set, codes=None) -> list:
    """Per family and overall: positives, found, recall; findings and the distinct sites they are
    at (program, code, line), correct sites, precision over sites and over findings; negatives hit."""
    rows = []
    fams = sorted({family(lab.code) for lab in labels} | {family(f.code) for f in findings})
    for fam in fams + ["overall"]:
        def keep(code):
            return (fam == "overall" or family(code) == fam) and (codes is None or code in codes)
        pos = [lab for lab in labels if lab.label == "pos" and keep(lab.code)]
        neg = [lab for lab in labels if lab.label == "neg" and keep(lab.code)]
        fs = [f for f in findings if keep(f.code)]
        sites = {(f.program, f.code, f.file, f.line): f.verdict for f in fs}
        hit = sum(id(lab) in found for lab in pos)
        good = sum(f.verdict == "pos" for f in fs)
        good_sites = sum(v == "pos" for v in sites.values())
        neg_hit = len({id(f.label) for f in fs if f.verdict == "neg"})
        rows.append(f"| {fam} | {len(pos)} | {hit} | {ratio(hit, len(pos))} | {len(fs)} | {len(sites)} | "
                    f"{good_sites} | {ratio(good_sites, len(sites))} | {ratio(good, len(fs))} | {neg_hit}/{len(neg)} |")
    head = ["| family | positives | found | recall | findings | sites | correct sites | precision (sites) | "
            "precision (findings) | negatives hit |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    return head + rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cpu hides the GPU; default: the current device")
    p.add_argument("--programs", default=None, help="comma-separated program names (without .py); default all")
    p.add_argument("--labels", default=str(LABELS))
    p.add_argument("--json", default=None, help="write the findings and verdicts here")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--estimate-savings", action="store_true",
                   help="run the guard as `matlint run` does by default, timing the fixes (it then drops a "
                        "finding whose measured saving is negligible)")
    opts = p.parse_args(argv)

    names = sorted(q.name for q in PROGRAMS.glob("*.py"))
    if opts.programs:
        wanted = [w.strip() + ("" if w.strip().endswith(".py") else ".py") for w in opts.programs.split(",")]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            p.error(f"no such program: {', '.join(unknown)}")
        names = wanted
    if opts.device is None:
        import importlib.util
        opts.device = "cpu"
        if importlib.util.find_spec("torch") is not None:
            import torch
            opts.device = "cuda" if torch.cuda.is_available() else "cpu"

    runs = [run_program(n, opts.device, opts.timeout, opts.estimate_savings) for n in names]
    device = next((r.device for r in runs if r.failure is None), opts.device)
    runtime_codes = set(next((r.runtime_codes for r in runs if r.runtime_codes), []))
    labels = [lab for lab in read_labels(Path(opts.labels)) if lab.program in names]
    observable = [lab for lab in labels if lab.device == "cpu" or device == "cuda"]
    unseen = [lab for lab in labels if lab not in observable]
    findings = [f for r in runs for f in r.findings]
    found = match(findings, observable)

    print(f"device: {device}; {len(runs)} programs; {len(observable)} labels observable here "
          f"({sum(lab.label == 'pos' for lab in observable)} positive), {len(unseen)} only on cuda; "
          f"{len(findings)} findings")
    for r in runs:
        if r.failure:
            print(f"FAILED {r.program}: {r.failure.strip().splitlines()[-1]}")
        for e in r.guard_errors:
            print(f"guard error in {r.program}: {e}")
    print("\nall labelled codes:")
    print("\n".join(table(observable, findings, found)))
    print(f"\ncodes with a runtime check ({', '.join(sorted(runtime_codes))}):")
    print("\n".join(table(observable, findings, found, runtime_codes)))

    missed = [lab for lab in observable if lab.label == "pos" and id(lab) not in found]
    print(f"\nmissed positives ({len(missed)}):")
    for lab in missed:
        note = "" if lab.code in runtime_codes else "  [no runtime check for this code]"
        print(f"  {lab.program}:{lab.line} {lab.code} ({lab.why}){note}")
    false = [f for f in findings if f.verdict != "pos"]
    print(f"\nfalse findings ({len(false)}):")
    for f in false:
        where = f"{f.program}:{f.line}" if f.verdict != "outside" else f"{f.program} -> {f.file}:{f.line}"
        why = f" [labelled neg: {f.label.why}]" if f.verdict == "neg" else f" [{f.verdict}]"
        print(f"  {where} {f.code}{why}: {f.message[:220]}")
    if opts.json:
        Path(opts.json).write_text(json.dumps({
            "device": device,
            "findings": [{"program": f.program, "code": f.code, "file": f.file, "line": f.line, "verdict": f.verdict,
                          "message": f.message, "evidence": f.evidence} for f in findings],
            "missed": [lab.__dict__ for lab in missed],
            "failures": {r.program: r.failure for r in runs if r.failure},
        }, indent=1))
    return 1 if any(r.failure for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
