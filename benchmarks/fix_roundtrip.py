"""Apply every fix (`--fix --unsafe-fixes --select ALL`) to a copy of real code, then check that
every changed file still parses and that a second run changes nothing. Exit 1 on any failure.

    python benchmarks/fix_roundtrip.py                 # a copy of the cached corpus (see real_code.py)
    python benchmarks/fix_roundtrip.py PATH ...        # a copy of these directories
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_code import corpus_root  # noqa: E402

FIXED_RE = re.compile(r"Fixed (\d+) findings?")


def snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*.py"))}


def run_fix(root: Path, jobs: int):
    """(number of fixes the summary reports, seconds)."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "matlint", "check", "--fix", "--unsafe-fixes", "--select", "ALL",
                             "--no-cache", "--exit-zero", "--jobs", str(jobs), "--statistics", "."],
                            cwd=root, capture_output=True, text=True)
    if result.returncode != 0 or "Traceback" in result.stderr:
        raise SystemExit(f"matlint failed ({result.returncode}): {result.stderr[-2000:]}")
    match = FIXED_RE.search(result.stdout + result.stderr)
    return (int(match.group(1)) if match else 0), time.perf_counter() - start


def roundtrip(sources, jobs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="matlint-fix-") as tmp:
        root = Path(tmp)
        for source in sources:
            shutil.copytree(source, root / Path(source).name, symlinks=True)
        before = snapshot(root)
        fixes, seconds = run_fix(root, jobs)
        after = snapshot(root)
        changed = [p for p in before if after[p] != before[p]]
        broken = []
        for path in changed:
            try:
                ast.parse(after[path])
            except (SyntaxError, ValueError) as exc:
                broken.append(f"{path.relative_to(root)}: {exc}")
        second_fixes, _ = run_fix(root, jobs)
        again = snapshot(root)
        unstable = [str(p.relative_to(root)) for p in after if again[p] != after[p]]
        return {"files": len(before), "lines": sum(b.count(b"\n") for b in before.values()),
                "changed": len(changed), "fixes": fixes, "seconds": seconds, "broken": broken,
                "second_run_fixes": second_fixes, "unstable": unstable}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="directories to copy and fix (default: the cached corpus)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    sources = args.paths or sorted(str(p) for p in (corpus_root() / "sources").iterdir() if p.is_dir())
    report = roundtrip(sources, args.jobs)
    print(f"{report['files']:,} files, {report['lines']:,} lines; first run: {report['fixes']} fixes in "
          f"{report['changed']} files ({report['seconds']:.1f} s); second run: {report['second_run_fixes']} fixes, "
          f"{len(report['unstable'])} files changed")
    for line in report["broken"]:
        print("DOES NOT PARSE", line)
    for line in report["unstable"]:
        print("CHANGED AGAIN", line)
    print(f"failures: {len(report['broken']) + len(report['unstable'])}")
    return 1 if report["broken"] or report["unstable"] or report["second_run_fixes"] else 0


if __name__ == "__main__":
    sys.exit(main())
