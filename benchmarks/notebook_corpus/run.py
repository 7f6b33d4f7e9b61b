"""matlint on real notebooks: public PyTorch notebooks from public GitHub repositories
(notebooks.csv: repo, commit, path), linted, fixed on a copy, and timed against ruff.

    python benchmarks/notebook_corpus/run.py                # extract, lint, round-trip, speed
    python benchmarks/notebook_corpus/run.py lint           # one step: extract, lint, roundtrip, speed
    python benchmarks/notebook_corpus/run.py list           # rebuild notebooks.csv from the mirrors
    python benchmarks/notebook_corpus/run.py sample         # the stratified sample to label
    python benchmarks/notebook_corpus/run.py ipython        # each cell as IPython reads it (needs IPython)

The notebooks are read from git mirrors of their repositories (MIRRORS, default /work/.mirror,
one `owner+name/repo` git directory each, as the workplace's `fetch` makes them) at the commit
the list names, and copied into a cache outside the repository (~/.cache/matlint-notebook-corpus,
or $MATLINT_NOTEBOOK_CORPUS); once that cache is filled, no mirror is needed. Nothing of the
notebooks is committed here, only the list.

`lint` runs `matlint check --format json` over the whole corpus (default rules, one process per
core) and reports: notebooks, code cells, the Python lines checked, findings per rule, every
MAT000 (must be none) and every MAT001 with its message (a notebook or cell matlint cannot read).
`roundtrip` runs `matlint check --fix --unsafe-fixes` on a copy and checks each notebook: still
valid JSON, json-equal to the original except code cells' `source`, every changed cell still
parses (IPython syntax turned into placeholders as matlint does), a notebook without a fix
byte-identical, and a second run fixes nothing. `speed` times matlint (`--jobs 1 --no-cache`)
against `ruff check --isolated --no-cache` (default rules, and `--select ALL`) pinned to one core,
median of --repeat runs.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
sys.path.insert(0, str(REPO_ROOT))
from matlint import notebook as nb  # noqa: E402

LIST = HERE / "notebooks.csv"
MIRRORS = Path(os.environ.get("MATLINT_MIRRORS", "/work/.mirror"))
CACHE = Path(os.environ.get("MATLINT_NOTEBOOK_CORPUS", Path.home() / ".cache" / "matlint-notebook-corpus"))
RESERVED = REPO_ROOT.parent / "shared" / "reserved-repos.txt"

# Course, tutorial and reimplementation repositories with many PyTorch notebooks. Left out: the
# repositories reserved for independent evaluation, and those of benchmarks/user_corpus (their
# .py files were labelled while matlint's rules were tuned).
REPOS = [
    "rasbt/deeplearning-models",
    "udacity/deep-learning-v2-pytorch",
    "dsgiitr/d2l-pytorch",
    "Atcold/NYU-DLSP20",
    "bentrevett/pytorch-seq2seq",
    "bentrevett/pytorch-sentiment-analysis",
    "higgsfield/RL-Adventure",
    "higgsfield/RL-Adventure-2",
    "rasbt/LLMs-from-scratch",
    "mrdbourke/pytorch-deep-learning",
    "L1aoXingyu/pytorch-beginner",
    "emadRad/lstm-gru-pytorch",
]


def git_dir(repo: str) -> Path:
    return MIRRORS / repo.replace("/", "+") / "repo"


def git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(git_dir(repo)), *args], check=True, capture_output=True).stdout


def reserved() -> set:
    if not RESERVED.exists():
        return set()
    return {line.strip().lower() for line in RESERVED.read_text().splitlines() if line.strip() and not line.startswith("#")}


def user_corpus() -> set:
    with open(REPO_ROOT / "benchmarks" / "user_corpus" / "repos.csv") as f:
        return {row["repo"].lower() for row in csv.DictReader(f)}


# -- the list ---------------------------------------------------------------------------------

def build_list() -> None:
    excluded = reserved() | user_corpus()
    rows = []
    for repo in REPOS:
        if repo.lower() in excluded:
            raise SystemExit(f"{repo} is reserved or in the user corpus")
        commit = git(repo, "rev-parse", "HEAD").decode().strip()
        paths = [p for p in git(repo, "ls-tree", "-r", "--name-only", "-z", commit).decode().split("\0")
                 if p.endswith(".ipynb")]
        for path in sorted(paths):
            try:
                data = git(repo, "show", f"{commit}:{path}")
            except subprocess.CalledProcessError:  # files of 4 MiB and more are missing from the mirrors
                continue
            if b"torch" in data:
                rows.append((repo, commit, path))
    with open(LIST, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["repo", "commit", "path"])
        writer.writerows(rows)
    print(f"{len(rows)} notebooks from {len({r[0] for r in rows})} repositories -> {LIST}")


def corpus() -> list:
    with open(LIST) as f:
        return [(r["repo"], r["commit"], r["path"]) for r in csv.DictReader(f)]


def local(repo: str, path: str) -> Path:
    return CACHE / "notebooks" / repo.replace("/", "+") / path


def extract() -> Path:
    """The cache folder holding every notebook of the list (filled from the mirrors if needed)."""
    for repo, commit, path in corpus():
        target = local(repo, path)
        if not target.exists():
            if not git_dir(repo).exists():
                raise SystemExit(f"no mirror of {repo} at {git_dir(repo)} and {target} is not cached")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(git(repo, "show", f"{commit}:{path}"))
    return CACHE / "notebooks"


def matlint(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "matlint", "check", *args], cwd=cwd, capture_output=True, text=True)


# -- lint -------------------------------------------------------------------------------------

def python_cells(data: str):
    """(code cells, cells linted as Python, their non-blank lines) of one notebook text."""
    book = nb.read(data)
    codes = [nb.cell_code(c.number, c.source) for c in book.cells]
    linted = [c for c in codes if c is not None and c.text.strip()]
    lines = sum(1 for c in linted for line in c.text.splitlines() if line.strip())
    return len(book.cells), len(linted), lines


def lint(args) -> dict:
    root = extract()
    paths = [local(r, p) for r, _, p in corpus()]
    cells = linted = lines = unreadable = 0
    for path in paths:
        try:
            c, pc, n = python_cells(path.read_text(encoding="utf-8-sig"))
        except (nb.NotebookError, UnicodeDecodeError):
            unreadable += 1
            continue
        cells, linted, lines = cells + c, linted + pc, lines + n
    start = time.perf_counter()
    result = matlint("--format", "json", "--no-cache", "--exit-zero", "--quiet", ".", cwd=root)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"matlint failed ({result.returncode}): {result.stderr[-3000:]}")
    findings = json.loads(result.stdout)
    (CACHE / "findings.json").write_text(json.dumps(findings, indent=1))
    counts = collections.Counter(f["code"] for f in findings)
    per_repo = collections.Counter(Path(f["filename"]).parts[0] for f in findings)
    print(f"{len(paths)} notebooks from {len({r for r, _, _ in corpus()})} repositories; {cells} code cells, "
          f"{linted} linted as Python ({cells - linted} empty or not Python), {lines} non-blank lines of code; "
          f"{unreadable} notebooks matlint's reader rejects")
    print(f"matlint (default rules, --jobs {os.cpu_count()}): {len(findings)} findings in {seconds:.1f} s; "
          f"{len({f['filename'] for f in findings})} notebooks with a finding")
    for code, n in sorted(counts.items()):
        print(f"  {code} {n}")
    print("per repository:", dict(sorted(per_repo.items())))
    for f in findings:
        if f["code"] in ("MAT000", "MAT001"):
            print(f"  {f['code']} {f['filename']} cell {f.get('cell')} {f['location']['row']}: {f['message']}")
    return {"findings": findings}


# -- round trip -------------------------------------------------------------------------------

def _python_of(source: str):
    code = nb.cell_code(0, source)
    return None if code is None else code.text


def check_roundtrip(before: bytes, after: bytes) -> list:
    """What is wrong with `after`, the fixed copy of the notebook `before` ([] when nothing)."""
    if before == after:
        return []
    problems = []
    try:
        old, new = json.loads(before), json.loads(after)
    except ValueError as exc:
        return [f"not valid JSON after the fix: {exc}"]
    old_cells = old.get("cells") or []
    new_cells = new.get("cells") or []
    if len(old_cells) != len(new_cells):
        return ["the number of cells changed"]
    stripped = [dict(c, source=None) if c.get("cell_type") == "code" else c for c in old_cells]
    if {**old, "cells": stripped} != {**new, "cells": [dict(c, source=None) if c.get("cell_type") == "code" else c
                                                       for c in new_cells]}:
        problems.append("something besides a code cell's source changed")
    changed = 0
    for number, (a, b) in enumerate(zip(old_cells, new_cells), 1):
        if a.get("source") == b.get("source"):
            continue
        changed += 1
        text = "".join(b["source"]) if isinstance(b["source"], list) else b["source"]
        python = _python_of(text)
        try:
            nb.parse(python if python is not None else text)
        except (SyntaxError, ValueError) as exc:
            problems.append(f"cell {number} does not parse after the fix: {exc}")
        if isinstance(a["source"], list) != isinstance(b["source"], list):
            problems.append(f"cell {number}'s source changed from list to string or back")
    if not changed:
        problems.append("the file changed but no cell's source did")
    return problems


def roundtrip(args) -> dict:
    root = extract()
    with tempfile.TemporaryDirectory(prefix="matlint-nb-fix-") as tmp:
        copy = Path(tmp) / "notebooks"
        shutil.copytree(root, copy)
        files = sorted(copy.rglob("*.ipynb"))
        before = {p: p.read_bytes() for p in files}
        start = time.perf_counter()
        first = matlint("--fix", "--unsafe-fixes", "--no-cache", "--exit-zero", "--statistics", ".", cwd=copy)
        seconds = time.perf_counter() - start
        if first.returncode != 0 or "Traceback" in first.stderr:
            raise SystemExit(f"matlint --fix failed ({first.returncode}): {first.stderr[-3000:]}")
        after = {p: p.read_bytes() for p in files}
        second = matlint("--fix", "--unsafe-fixes", "--no-cache", "--exit-zero", ".", cwd=copy)
        if second.returncode != 0:
            raise SystemExit(f"the second matlint --fix failed ({second.returncode}): {second.stderr[-3000:]}")
        again = {p: p.read_bytes() for p in files}
        changed = [p for p in files if after[p] != before[p]]
        failures = {str(p.relative_to(copy)): check_roundtrip(before[p], after[p]) for p in files}
        failures = {k: v for k, v in failures.items() if v}
        unstable = [str(p.relative_to(copy)) for p in files if again[p] != after[p]]
        # the fixed notebooks are kept for reading
        fixed_dir = CACHE / "fixed"
        shutil.rmtree(fixed_dir, ignore_errors=True)
        for p in changed:
            target = fixed_dir / p.relative_to(copy)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(after[p])
    cells = sum(sum(1 for a, b in zip(json.loads(before[p]).get("cells", []), json.loads(after[p]).get("cells", []))
                    if a.get("source") != b.get("source")) for p in changed)
    fixed = [line for line in (first.stdout + first.stderr).splitlines() if "fixed" in line.lower()]
    print(f"round trip: {len(files)} notebooks; {len(changed)} changed ({cells} cells) in {seconds:.1f} s; "
          f"{len(files) - len(changed)} unchanged byte for byte; {len(failures)} failures; "
          f"second run changed {len(unstable)}")
    print("  " + " | ".join(fixed[-3:]))
    for name, problems in failures.items():
        for problem in problems:
            print(f"  FAIL {name}: {problem}")
    for name in unstable:
        print(f"  CHANGED AGAIN {name}")
    return {"failures": failures, "unstable": unstable}


# -- speed ------------------------------------------------------------------------------------

def timed(command: list, cwd: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command} failed ({result.returncode}): {result.stderr[-2000:]}")
    return seconds


def speed(args) -> dict:
    root = extract()
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    commands = {
        "matlint check --jobs 1 --no-cache": pin + [sys.executable, "-m", "matlint", "check", "--jobs", "1", "--no-cache",
                                                    "--quiet", "."],
        "ruff check --isolated --no-cache (default rules)": pin + [ruff, "check", "--isolated", "--no-cache",
                                                                   "--quiet", "."],
        "ruff check --isolated --no-cache --select ALL": pin + [ruff, "check", "--isolated", "--no-cache",
                                                                "--select", "ALL", "--quiet", "."],
    }
    times = {name: [] for name in commands}
    for _ in range(args.repeat):  # rounds, so that drift in the machine's speed falls on every row
        for name, command in commands.items():
            times[name].append(timed(command, root))
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"speed, one core ({'taskset -c 0' if pin else 'not pinned'}), median of {args.repeat}; {version}")
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["matlint check --jobs 1 --no-cache"]
    for name, t in times.items():
        print(f"  {name}: {medians[name]:.2f} s (runs {', '.join(f'{x:.2f}' for x in t)}); "
              f"matlint / this = {base / medians[name]:.1f}x")
    return medians


# -- IPython's own reading of each cell ---------------------------------------------------------

def ipython(args) -> None:
    """Every code cell read by matlint and by IPython's own input transformer (when IPython is
    installed): a cell matlint cannot parse that IPython runs is a wrong MAT001, and the other
    way round a cell matlint lints that IPython rejects."""
    import warnings
    from IPython.core.inputtransformer2 import TransformerManager
    warnings.simplefilter("ignore")
    manager, cells, skipped, disagree = TransformerManager(), 0, 0, []
    for repo, _, path in corpus():
        book = nb.read(local(repo, path).read_text(encoding="utf-8-sig"))
        for cell in book.cells:
            cells += 1
            code = nb.cell_code(cell.number, cell.source)
            if code is None:
                skipped += 1
                continue
            ours = _ok(nb.parse, code.text)
            theirs = _ok(lambda source: nb.parse(manager.transform_cell(source)), cell.source)
            if ours != theirs:
                disagree.append(f"{repo}/{path} cell {cell.number}: matlint {'parses' if ours else 'rejects'}")
    print(f"IPython cross-check: {cells} code cells, {skipped} skipped as other languages (cell magics), "
          f"{len(disagree)} read differently")
    for line in disagree:
        print("  " + line)


def _ok(parse, source: str) -> bool:
    try:
        parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


# -- the sample to label ----------------------------------------------------------------------

def sample(args) -> None:
    """At most --per-rule findings of each rule, chosen at random (seeded), spread over
    repositories, each with its cell's code: blind.jsonl holds the code only, key.jsonl the
    findings (matlint's message), for a blind labelling pass and the comparison after it."""
    findings = json.loads((CACHE / "findings.json").read_text())
    rng = random.Random(args.seed)
    chosen = []
    by_rule = collections.defaultdict(list)
    for f in findings:
        if f["code"] not in ("MAT000", "MAT001"):
            by_rule[f["code"]].append(f)
    for code, group in sorted(by_rule.items()):
        rng.shuffle(group)
        # round robin over repositories, so that one repository's template does not fill the sample
        by_repo = collections.defaultdict(list)
        for f in group:
            by_repo[Path(f["filename"]).parts[0]].append(f)
        picked = []
        while len(picked) < min(args.per_rule, len(group)):
            for repo in sorted(by_repo):
                if by_repo[repo] and len(picked) < args.per_rule:
                    picked.append(by_repo[repo].pop())
        chosen.extend(picked)
    blind, key = [], []
    for i, f in enumerate(chosen, 1):
        book = nb.read((CACHE / "notebooks" / f["filename"]).read_text(encoding="utf-8-sig"))
        cell = book.cell(f["cell"])
        row = f["location"]["row"]
        blind.append({"id": i, "code": f["code"], "file": f["filename"], "cell": f["cell"], "row": row,
                      "line": cell.source.splitlines()[row - 1] if row <= len(cell.source.splitlines()) else "",
                      "context": context_of(book, f["cell"])})
        key.append({"id": i, **f})
    out = CACHE / "sample"
    out.mkdir(exist_ok=True)
    (out / "blind.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blind))
    (out / "key.jsonl").write_text("".join(json.dumps(k) + "\n" for k in key))
    print(f"{len(chosen)} findings sampled ({dict(collections.Counter(f['code'] for f in chosen))}) -> {out}")


def context_of(book, number: int) -> str:
    """The notebook's code cells up to and including cell `number`, each under a `# cell N` header."""
    parts = []
    for cell in book.cells:
        if cell.number > number:
            break
        parts.append(f"# ---- cell {cell.number} ----\n{cell.source.rstrip()}\n")
    return "".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", nargs="?", default="all", choices=["all", "list", "lint", "roundtrip", "speed", "sample", "ipython"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-rule", type=int, default=15)
    parser.add_argument("--seed", type=int, default=22)
    args = parser.parse_args(argv)
    if args.step == "list":
        build_list()
        return 0
    if args.step == "sample":
        sample(args)
        return 0
    if args.step == "ipython":
        ipython(args)
        return 0
    failed = False
    if args.step in ("all", "lint"):
        findings = lint(args)["findings"]
        failed |= any(f["code"] == "MAT000" for f in findings)
    if args.step in ("all", "roundtrip"):
        report = roundtrip(args)
        failed |= bool(report["failures"] or report["unstable"])
    if args.step in ("all", "speed"):
        speed(args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
