"""Applies fixes as text edits located by ast positions (format-preserving by construction),
and checks that the result still parses; and the text-edit helpers that rules build fixes with
(`call_text`, `line_runs`, `own_lines`: functions of the file's lines, as `ctx.lines` holds them)."""
from __future__ import annotations

import ast
import difflib
from typing import Iterable

from .source import parse_quietly, split_lines


def _offsets(source: str):
    """Start offset (in characters) of each 1-based row."""
    starts = [0]
    lines = split_lines(source)
    pos = 0
    for line in lines[:-1]:
        pos += len(line)
        # the separator that split_lines removed
        if source.startswith("\r\n", pos):
            pos += 2
        else:
            pos += 1
        starts.append(pos)
    return starts


def _to_offset(starts, row: int, column: int) -> int:
    return starts[row - 1] + column - 1


def parses(source: str, parse=parse_quietly) -> bool:
    """Whether `parse` (a file's parser by default; a notebook cell's takes top-level `await`)
    reads `source` without an error."""
    try:
        parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def apply_fixes(source: str, findings: Iterable, unsafe: bool = False):
    """(new_source, applied findings). Overlapping fixes: the first one (by position) wins;
    a fix whose result would not parse is skipped."""
    candidates = [f for f in findings if f.fix is not None and (f.fix.safe or unsafe)]
    candidates.sort(key=lambda f: (f.row, f.column, f.code))
    starts = _offsets(source)
    chosen, taken = [], []
    for finding in candidates:
        spans = [(_to_offset(starts, e.row, e.column), _to_offset(starts, e.end_row, e.end_column), e.content)
                 for e in finding.fix.edits]
        if any(s < te and ts < e or (s == e == ts) for s, e, _ in spans for ts, te in taken):
            continue
        trial = _apply_spans(source, [sp for _, sps in chosen for sp in sps] + spans)
        if not parses(trial):
            continue
        chosen.append((finding, spans))
        taken.extend((s, e) for s, e, _ in spans)
    if not chosen:
        return source, []
    return _apply_spans(source, [sp for _, sps in chosen for sp in sps]), [f for f, _ in chosen]


def _apply_spans(source: str, spans) -> str:
    out = source
    for start, end, content in sorted(spans, key=lambda s: (s[0], s[1]), reverse=True):
        out = out[:start] + content + out[end:]
    return out


def unified_diff(before: str, after: str, filename: str) -> str:
    return "".join(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{filename}", tofile=f"b/{filename}"))


def fix_until_stable(source: str, lint, unsafe: bool = False, max_rounds: int = 10):
    """Lint, fix, re-lint until no fix applies. `lint(source) -> findings`.
    Returns (fixed source, number of fixes applied, remaining findings)."""
    total = 0
    findings = lint(source)
    for _ in range(max_rounds):
        new, applied = apply_fixes(source, findings, unsafe)
        if not applied:
            break
        total += len(applied)
        source = new
        findings = lint(source)
    return source, total, findings


# -- building fixes -------------------------------------------------------------------------------
def call_text(lines: list, node: ast.AST, func: str, args: list, after: str = "") -> str:
    """`func(args)after` to replace `node` with: on one line, or, where that line would pass
    120 columns, with the arguments on lines of their own, as black and ruff format a call."""
    one = f"{func}({', '.join(args)}){after}"
    line = lines[node.lineno - 1]
    if node.lineno != node.end_lineno or len(line) - (node.end_col_offset - node.col_offset) + len(one) <= 120:
        return one
    indent = line[:len(line) - len(line.lstrip())]
    rows = [""]
    for arg in args:
        if rows[-1] and len(indent) + 4 + len(rows[-1]) + len(arg) + 2 > 120:
            rows.append("")
        rows[-1] += f"{' ' if rows[-1] else ''}{arg},"
    inner = "\n".join(f"{indent}    {row}" for row in rows)
    return f"{func}(\n{inner}\n{indent}){after}"


def line_runs(lines: list, deleted: set) -> list:
    """Runs (first, last) of rows to delete: the `deleted` rows, plus a blank row that would
    otherwise follow another blank row once they are gone."""
    blank = lambda row: not lines[row - 1].strip()  # noqa: E731
    rows = set(deleted)
    for row in sorted(deleted):
        before, after = row - 1, row + 1
        while before in rows:
            before -= 1
        while after in rows:
            after += 1
        if before >= 1 and after <= len(lines) and blank(before) and blank(after):
            rows.add(after)
    runs, start = [], None
    for row in sorted(rows):
        if start is None:
            start = prev = row
        elif row == prev + 1:
            prev = row
        else:
            runs.append((start, prev))
            start = prev = row
    if start is not None:
        runs.append((start, prev))
    return runs


def own_lines(lines: list, stmt: ast.stmt) -> bool:
    """The statement has its lines to itself (nothing before it on its first line, at most a
    comment after it on its last) and is not the file's last line: deleting its rows deletes it
    alone."""
    before = lines[stmt.lineno - 1][:stmt.col_offset]
    after = lines[stmt.end_lineno - 1].encode()[stmt.end_col_offset:].decode(errors="replace")
    alone = not before.strip() and (not after.strip() or after.strip().startswith("#"))
    return alone and stmt.end_lineno < len(lines)
