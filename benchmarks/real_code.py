"""Run matlint over the sources of real PyTorch libraries and count findings per rule.

The wheels are plain .py files; they are downloaded once (no dependencies, nothing executed)
into a cache outside the repository (default ~/.cache/matlint-corpus, or $MATLINT_CORPUS).

    python benchmarks/real_code.py                       # all rules, main corpus
    python benchmarks/real_code.py --select MAT101 --findings out.txt
    python benchmarks/real_code.py --corpus extra        # libraries with training loops
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CORPORA = {
    "main": ["transformers", "timm", "torchvision", "diffusers", "lightning"],
    # Libraries and reference scripts with hand-written training loops.
    "extra": ["d2l", "skorch", "pytorch-ignite", "torchtune", "trl", "accelerate", "peft", "torchrl"],
}


def corpus_root() -> Path:
    return Path(os.environ.get("MATLINT_CORPUS", Path.home() / ".cache" / "matlint-corpus"))


def fetch(packages, root: Path) -> list:
    """Download (once) and unpack each package's wheel; return the unpacked folders."""
    wheels, sources = root / "wheels", root / "sources"
    wheels.mkdir(parents=True, exist_ok=True)
    folders = []
    for package in packages:
        dest = sources / package
        if not dest.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            "-d", str(wheels), package], check=True, stdout=subprocess.DEVNULL)
            prefix = package.replace("-", "_").lower()
            wheel = max((w for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix + "-")),
                        key=lambda w: w.stat().st_mtime)
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(dest)
        folders.append(dest)
    return folders


def _lint(args):
    path, codes = args
    from matlint.engine import lint_bytes
    from matlint.registry import all_rules

    rules = [r for r in all_rules() if not codes or any(r.code.startswith(c) for c in codes)]
    try:
        return lint_bytes(Path(path).read_bytes(), path, rules)
    except OSError:
        return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=sorted(CORPORA) + ["all"], default="main")
    parser.add_argument("--select", default="", help="comma-separated codes or prefixes (default: all rules)")
    parser.add_argument("--findings", help="write every finding, one per line, to this file")
    parser.add_argument("--strict", action="store_true",
                        help="with --findings, also write each finding's end position and fix, so two runs "
                             "compared byte for byte show any change a speed-up made to what the rules report")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)

    names = CORPORA["main"] + CORPORA["extra"] if args.corpus == "all" else CORPORA[args.corpus]
    folders = fetch(names, corpus_root())
    files = sorted(str(p) for folder in folders for p in folder.rglob("*.py"))
    codes = [c.strip().upper() for c in args.select.split(",") if c.strip()]
    lines = sum(1 for f in files for _ in open(f, "rb"))
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_lint, [(f, codes) for f in files], chunksize=16))
    elapsed = time.perf_counter() - start
    findings = [f for batch in results for f in batch]
    counts = collections.Counter(f.code for f in findings)
    per_package = collections.Counter()
    for f in findings:
        rel = Path(f.filename).relative_to(corpus_root() / "sources")
        per_package[(rel.parts[0], f.code)] += 1
    print(f"{len(files)} files, {lines} lines, {len(findings)} findings in {elapsed:.1f}s ({args.jobs} jobs)")
    print("code    count  per package")
    for code in sorted(counts):
        pkgs = ", ".join(f"{p} {n}" for (p, c), n in sorted(per_package.items()) if c == code)
        print(f"{code}  {counts[code]:6d}  {pkgs}")
    if args.findings:
        with open(args.findings, "w") as out:
            for f in sorted(findings, key=lambda f: f.sort_key()):
                rel = Path(f.filename).relative_to(corpus_root() / "sources")
                line = f"{rel}:{f.row}:{f.column}: {f.code} {f.message}"
                if args.strict:
                    fix = json.dumps(f.fix.to_json(), sort_keys=True) if f.fix else "-"
                    line += f" | end {f.end_row}:{f.end_column} | fix {fix}"
                out.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
