"""Run every rule (default-off ones too) over thousands of real Python files and count the
engine's codes: an internal error (MAT000) anywhere is a failure (exit 1).

The files: the cached corpus of PyTorch libraries (see real_code.py; ~/.cache/matlint-corpus or
$MATLINT_CORPUS) and the standard library of the Python running this script, test files with
deliberately broken syntax included (they must give MAT001/MAT002, never MAT000). The torch
pre-filter is off, so every file is parsed and walked by every rule.

    python benchmarks/crash_free.py                     # corpus + stdlib
    python benchmarks/crash_free.py --no-corpus         # stdlib only (always present)
    python benchmarks/crash_free.py PATH ...            # these files / directories
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_code import corpus_root  # noqa: E402

# Slower than this and the file is named in the report.
SLOW_FILE_SECONDS = 5.0


def stdlib_files() -> list:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(str(p) for p in root.rglob("*.py") if "site-packages" not in p.parts)


def corpus_files() -> list:
    sources = corpus_root() / "sources"
    return sorted(str(p) for p in sources.rglob("*.py")) if sources.is_dir() else []


def python_files(paths) -> list:
    found = []
    for path in map(Path, paths):
        found += sorted(str(p) for p in path.rglob("*.py")) if path.is_dir() else [str(path)]
    return found


def lint_everything(path: str):
    """(path, lines, seconds, [(code, row, message)]) with every rule and no pre-filter."""
    from matlint import engine
    from matlint.registry import all_rules
    from matlint.source import decode

    start = time.perf_counter()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return path, 0, 0.0, [("MAT003", 1, str(exc))]
    source, problem = decode(data, path)
    try:
        findings = [problem] if problem else engine.lint_source(source, path, all_rules(), prefilter=False)
    except Exception as exc:  # the engine itself must never raise: count it as an internal error
        return path, data.count(b"\n"), time.perf_counter() - start, [
            ("MAT000", 1, f"engine raised {type(exc).__name__}: {exc}")]
    return path, data.count(b"\n"), time.perf_counter() - start, [(f.code, f.row, f.message) for f in findings]


def run(files, jobs: int):
    """Per-code counts, internal errors, slow files, total lines, wall seconds."""
    codes: collections.Counter = collections.Counter()
    internal, slow, lines = [], [], 0
    start = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        for path, n, seconds, findings in pool.map(lint_everything, files, chunksize=8):
            lines += n
            if seconds > SLOW_FILE_SECONDS:
                slow.append((seconds, path))
            for code, row, message in findings:
                codes[code] += 1
                if code == "MAT000":
                    internal.append(f"{path}:{row}: {message}")
    return codes, internal, sorted(slow, reverse=True), lines, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="lint these instead of the corpus and the standard library")
    parser.add_argument("--no-corpus", action="store_true", help="the standard library only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)

    if args.paths:
        groups = {"given paths": python_files(args.paths)}
    else:
        groups = {"stdlib": stdlib_files()}
        if not args.no_corpus:
            groups["corpus"] = corpus_files()
    files = [f for group in groups.values() for f in group]
    codes, internal, slow, lines, seconds = run(files, args.jobs)

    from matlint.registry import all_rules

    print(f"{len(files):,} files ({', '.join(f'{k}: {len(v):,}' for k, v in groups.items())}), "
          f"{lines:,} lines, {len(all_rules())} rules, {seconds:.1f} s with {args.jobs} jobs")
    engine_codes = {c: n for c, n in sorted(codes.items()) if c.startswith("MAT0")}
    print("engine codes:", ", ".join(f"{c} {n}" for c, n in engine_codes.items()) or "none")
    print("rule findings:", sum(n for c, n in codes.items() if not c.startswith("MAT0")))
    for seconds_taken, path in slow[:10]:
        print(f"slow: {seconds_taken:.1f} s {path}")
    for line in internal:
        print("INTERNAL ERROR", line)
    print(f"internal errors (MAT000): {len(internal)}")
    return 1 if internal else 0


if __name__ == "__main__":
    sys.exit(main())
