"""Runs the MAT2xx rules over the real-code corpus and prints every finding, one a line.

    python benchmarks/triage/run_mat2.py [CORPUS_ROOT]

Also reports internal errors (MAT000) and the time taken, so a crash or a slowdown in the
shape analysis shows up here too."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from matlint.engine import lint_bytes
from matlint.registry import rules_by_code

DEFAULT_ROOT = Path("/root/.cache/matlint-corpus/src")


def main(root: Path) -> int:
    rules = [cls for code, cls in rules_by_code().items() if code.startswith("MAT2")]
    files = sorted(root.rglob("*.py"))
    counts: dict = {}
    start = time.perf_counter()
    for path in files:
        for f in lint_bytes(path.read_bytes(), str(path.relative_to(root)), rules):
            if f.code.startswith(("MAT2", "MAT000")):
                counts[f.code] = counts.get(f.code, 0) + 1
                print(f"{f.filename}:{f.row}:{f.column}: {f.code} {f.message}")
    elapsed = time.perf_counter() - start
    print(f"# {len(files)} files, {elapsed:.1f} s, findings: {dict(sorted(counts.items()))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROOT))
