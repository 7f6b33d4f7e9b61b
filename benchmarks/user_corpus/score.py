"""Recall and precision of matlint on the labelled user-code corpus.

    python benchmarks/user_corpus/score.py                 # bring the sources, lint, score
    python benchmarks/user_corpus/score.py --misses        # also list the positives not reported
    python benchmarks/user_corpus/score.py --unjudged F    # write the findings no label covers to F
    python benchmarks/user_corpus/score.py --repos F       # score only the repositories listed in F
                                                           # (one owner/name a line: holdout.txt)

The corpus is public repositories at pinned commits (`repos.csv`), labelled by reading the code
before linting it (`labels.csv`, see LABELLING.md); findings that no label covers are judged
after (`judged.csv`). Only the labelled files are linted, with the default rules, as a user
who installs matlint gets them. The sources are brought once into a cache outside the
repository (default ~/.cache/matlint-user-corpus-trees, or $MATLINT_USER_CORPUS): from a folder of
bare git mirrors (`--mirrors DIR`, holding `owner+name/repo`, bare or not), else by `git clone`.
"""
from __future__ import annotations

import argparse
import ast
import collections
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = {"1": "loops", "2": "broadcasting", "3": "layout", "4": "precision", "5": "launches", "6": "fused"}
LINE_SLACK = 2
FILE_LEVEL = {"MAT401"}  # reported once per file: a label anywhere in the file matches
LOOP_LEVEL = {"MAT504"}  # reported once per loop, naming its line: a label anywhere in that loop matches
# Reported once per statement (and kind of sync), at its first sync: it matches the labels on every
# line of that statement, one per site.
STATEMENT_LEVEL = {"MAT502"}


def read_csv(name: str) -> list:
    path = HERE / name
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cache_root() -> Path:
    return Path(os.environ.get("MATLINT_USER_CORPUS", Path.home() / ".cache" / "matlint-user-corpus-trees"))


def bring(repos: list, mirrors) -> Path:
    """Every Python file of every repository at its commit, under the cache: the labelled files
    are the ones scored, and the others are there for what they import (a helper module of the
    project), as in a checkout a user lints."""
    root = cache_root()
    for repo in repos:
        dest = root / repo["repo"].replace("/", "+")
        files = [p for p in repo["files"].split(";") if p]
        complete = dest / f".complete-{repo['commit']}"
        if complete.exists() and all((dest / p).exists() for p in files):
            continue
        git_dir = None
        if mirrors:
            candidate = Path(mirrors) / repo["repo"].replace("/", "+") / "repo"
            for git in (candidate / ".git", candidate):
                if (git / "HEAD").exists():
                    git_dir = git
                    break
        if git_dir is None:
            git_dir = root / "_clones" / repo["repo"].replace("/", "+")
            if not git_dir.exists():
                subprocess.run(["git", "clone", "--quiet", "--bare", "--filter=blob:none",
                                f"https://github.com/{repo['repo']}.git", str(git_dir)], check=True)
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", repo["commit"], "--",
                                  ":(glob)**/*.py", *files], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        complete.touch()
    return root


def loop_span(source: bytes, message: str):
    """(first, last) line of the loop a finding's message names (`loop over parameters (line 28)`)."""
    match = re.search(r"\(line (\d+)\)", message)
    if not match:
        return None
    line = int(match.group(1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.lineno == line:
            return node.lineno, node.end_lineno
    return None


def statement_span(source: bytes, row: int):
    """(first, last) line of the innermost statement on line `row`; of a compound statement
    (`if`, `for`, `with`...) whose header holds the row, the header's lines."""
    around = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt) and n.lineno <= row <= n.end_lineno]
    if not around:
        return None
    stmt = max(around, key=lambda n: (n.lineno, -n.end_lineno))
    body = getattr(stmt, "body", None)
    if isinstance(body, list) and body and body[0].lineno > row:
        return stmt.lineno, body[0].lineno - 1
    return stmt.lineno, stmt.end_lineno


def lint(root: Path, repos: list) -> list:
    """(repo, path, row, code, message, span) for every finding in the labelled files; `span`:
    the lines a label may sit on to match it (None: the finding's row, give or take LINE_SLACK)."""
    from matlint.config import Settings
    from matlint.engine import lint_bytes

    rules = Settings().enabled_rules()
    found = []
    for repo in repos:
        base = root / repo["repo"].replace("/", "+")
        for path in (p for p in repo["files"].split(";") if p):
            source = (base / path).read_bytes()
            for f in lint_bytes(source, str(base / path), rules):  # its real path: it may read the modules it imports
                span = loop_span(source, f.message) if f.code in LOOP_LEVEL else \
                    statement_span(source, f.row) if f.code in STATEMENT_LEVEL else None
                found.append((repo["repo"], path, f.row, f.code, f.message, span))
    return found


def family(code: str) -> str:
    return FAMILIES.get(code[3:4], "engine")


def match(findings: list, labels: list, judged: list) -> tuple:
    """(matched positive labels, per-finding verdicts: 'pos' / 'neg' / 'true' / 'false' / None).
    A finding of STATEMENT_LEVEL takes every label of its statement still free ('pos' if one is);
    where another finding of the statement took them all, it gets their verdict without taking
    them; only a statement with no label matches one within LINE_SLACK lines."""
    by_file = collections.defaultdict(list)
    for label in labels:
        by_file[(label["repo"], label["path"])].append(label)
    judged_at = {(j["repo"], j["path"], int(j["line"]), j["code"]): j["verdict"] for j in judged}
    used = set()
    verdicts = []
    for repo, path, row, code, _, span in sorted(findings, key=lambda f: (f[0], f[1], f[2])):
        candidates = [l for l in sorted(by_file[(repo, path)], key=lambda l: abs(int(l["line"]) - row))
                      if code in l["codes"].split("|")]
        in_span = lambda l: span is not None and span[0] <= int(l["line"]) <= span[1]
        statement = [l for l in candidates if in_span(l)] if code in STATEMENT_LEVEL else []
        taken = [l for l in statement if id(l) not in used]
        if not statement:
            taken = next(([l] for l in candidates if id(l) not in used and (
                code in FILE_LEVEL or abs(int(l["line"]) - row) <= LINE_SLACK or in_span(l))), [])
        seen = taken or statement
        used.update(id(l) for l in taken)
        verdict = "pos" if any(l["label"] == "pos" for l in seen) else seen[0]["label"] if seen else None
        if verdict is None:
            verdict = judged_at.get((repo, path, row, code))
        verdicts.append(((repo, path, row, code), verdict))
    matched = [l for l in labels if id(l) in used and l["label"] == "pos"]
    return matched, verdicts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", default=os.environ.get("MATLINT_MIRRORS"),
                        help="folder of bare git mirrors named owner+name/repo")
    parser.add_argument("--misses", action="store_true", help="list the positives that were not reported")
    parser.add_argument("--unjudged", metavar="FILE", help="write the findings no label covers to FILE (CSV)")
    parser.add_argument("--repos", metavar="FILE",
                        help="score only the repositories listed in FILE, one owner/name a line (holdout.txt)")
    args = parser.parse_args(argv)

    repos, labels, judged = read_csv("repos.csv"), read_csv("labels.csv"), read_csv("judged.csv")
    if args.repos:
        with open(args.repos) as f:
            wanted = {line.strip() for line in f if line.strip() and not line.startswith("#")}
        unknown = wanted - {r["repo"] for r in repos}
        if unknown:
            parser.error(f"not in repos.csv: {', '.join(sorted(unknown))}")
        repos, labels, judged = ([row for row in rows if row["repo"] in wanted] for rows in (repos, labels, judged))
    root = bring(repos, args.mirrors)
    findings = lint(root, repos)
    matched, verdicts = match(findings, labels, judged)

    rows = collections.OrderedDict((name, collections.Counter()) for name in FAMILIES.values())
    for label in labels:
        if label["label"] == "pos":
            rows[family(label["codes"].split("|")[0])]["positives"] += 1
    for label in matched:
        rows[family(label["codes"].split("|")[0])]["found"] += 1
    for (_, _, _, code), verdict in verdicts:
        counter = rows.setdefault(family(code), collections.Counter())
        counter["findings"] += 1
        counter["true" if verdict in ("pos", "true") else "false" if verdict in ("neg", "false") else "unjudged"] += 1
    total = collections.Counter()
    print(f"user-code corpus: {len(repos)} repositories, {sum(len(r['files'].split(';')) for r in repos)} files, "
          f"{sum(1 for l in labels if l['label'] == 'pos')} positive and "
          f"{sum(1 for l in labels if l['label'] == 'neg')} negative labels, {len(judged)} judged findings\n")
    print(f"{'family':<14}{'positives':>10}{'found':>7}{'recall':>8}{'findings':>10}{'true':>6}{'false':>7}"
          f"{'unjudged':>10}{'precision':>11}")
    for name, c in list(rows.items()) + [("all", None)]:
        if c is None:
            c = total
        else:
            total.update(c)
        recall = f"{c['found'] / c['positives']:.2f}" if c["positives"] else "-"
        judged_count = c["true"] + c["false"]
        precision = f"{c['true'] / judged_count:.2f}" if judged_count else "-"
        print(f"{name:<14}{c['positives']:>10}{c['found']:>7}{recall:>8}{c['findings']:>10}{c['true']:>6}"
              f"{c['false']:>7}{c['unjudged']:>10}{precision:>11}")
    if args.misses:
        print("\nmissed positives:")
        found_ids = {id(l) for l in matched}
        for label in labels:
            if label["label"] == "pos" and id(label) not in found_ids:
                print(f"  {label['repo']} {label['path']}:{label['line']} {label['codes']}  {label['why']}")
        print("\nfindings on negative labels or judged false:")
        for (repo, path, row, code), verdict in verdicts:
            if verdict in ("neg", "false"):
                print(f"  {repo} {path}:{row} {code}")
    if args.unjudged:
        messages = {(r, p, row, c): m for r, p, row, c, m, _ in findings}
        with open(args.unjudged, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["repo", "path", "line", "code", "message"])
            for key, verdict in verdicts:
                if verdict is None:
                    writer.writerow(list(key) + [messages[key]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
