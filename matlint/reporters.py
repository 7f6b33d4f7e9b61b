"""Output formats: full (ruff-like, with source and markers), concise, json (ruff's fields),
sarif (2.1.0), github (workflow annotations), and the --statistics table."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from .diagnostics import Finding

FORMATS = ("full", "concise", "json", "sarif", "github")
INFORMATION_URI = "https://github.com/matlint/matlint"
CONTEXT_LINES = 2
# A longer range shows its first and last lines only.
MAX_RANGE_LINES = 8
TAB_WIDTH = 4


def plural(count: int, word: str = "finding") -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _level(finding: Finding) -> str:
    from .registry import severity_of

    return severity_of(finding.code)


def found_line(findings: list) -> str:
    """`Found 2 warnings.` or `Found 3 findings: 1 error, 2 warnings.`: errors are wrong results
    or files not checked, warnings slow code (`Rule.level`)."""
    from .registry import severity_of

    levels = Counter(severity_of(f.code) for f in findings)
    parts = [plural(levels[level], level) for level in ("error", "warning") if levels[level]]
    if len(parts) == 1:
        return f"Found {parts[0]}."
    return f"Found {plural(len(findings))}: {', '.join(parts)}."


def _fix_marker(finding: Finding, unsafe_fixes: bool) -> str:
    if finding.fix and (finding.fix.safe or unsafe_fixes):
        return "[*] "
    return ""


# -- full --------------------------------------------------------------------------

class SourceLines:
    """Reads each file's lines once, for the source excerpts of the full format; a notebook's
    lines are those of a cell."""

    def __init__(self, sources=None):
        self.sources = dict(sources or {})
        self.lines: dict = {}
        self.notebooks: dict = {}

    def _text(self, filename: str):
        from .engine import decode

        text = self.sources.get(filename)
        if text is None:
            try:
                with open(filename, "rb") as handle:
                    text, _ = decode(handle.read(), filename)
            except OSError:
                text = None
        return text

    def notebook(self, filename: str):
        """The notebook in `filename`, or None where it cannot be read back."""
        from . import notebook

        if filename not in self.notebooks:
            text = self._text(filename)
            try:
                self.notebooks[filename] = notebook.read(text) if text is not None else None
            except notebook.NotebookError:
                self.notebooks[filename] = None
        return self.notebooks[filename]

    def get(self, filename: str, cell=None) -> list:
        from .source import split_lines

        if (filename, cell) not in self.lines:
            if cell is None:
                text = self._text(filename)
            else:
                book = self.notebook(filename)
                found = book.cell(cell) if book is not None else None
                text = found.source if found is not None else None
            self.lines[filename, cell] = split_lines(text) if text is not None else []
        return self.lines[filename, cell]


def _cells(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text.expandtabs(TAB_WIDTH))


def _full_lines(finding: Finding, source_lines: list, unsafe_fixes: bool):
    """Lines of (text, style) segments for one finding."""
    yield [(finding.location, "bold"), (": ", ""), (finding.code, "bold red"), (" ", ""), (_fix_marker(finding, unsafe_fixes), "cyan"),
           (finding.message, "")]
    if 0 < finding.row <= len(source_lines):
        last = min(finding.end_row, len(source_lines))
        first_shown = max(1, finding.row - CONTEXT_LINES)
        last_shown = min(len(source_lines), last + CONTEXT_LINES)
        gutter = len(str(last_shown))
        blank = " " * gutter + " |"
        yield [(blank, "blue")]
        hidden = range(finding.row + MAX_RANGE_LINES // 2, last - 1) if last - finding.row >= MAX_RANGE_LINES else range(0)
        for row in range(first_shown, last_shown + 1):
            if row in hidden:
                if row == hidden.start:
                    yield [(blank + " ...", "blue")]
                continue
            line = source_lines[row - 1]
            yield [(f"{row:>{gutter}} | ", "blue"), (line.expandtabs(TAB_WIDTH), "")]
            if finding.row <= row <= last and (line.strip() or row in (finding.row, last)):
                start = finding.column if row == finding.row else len(line) - len(line.lstrip()) + 1
                end = finding.end_column if row == finding.end_row else len(line) + 1
                indent = _cells(line[:start - 1])
                width = max(1, _cells(line[:end - 1]) - indent)
                label = f" {finding.code}" if row == last else ""
                yield [(blank + " " * (indent + 1), "blue"), ("^" * width + label, "bold red")]
        yield [(blank, "blue")]
        if finding.fix:
            yield [(" " * gutter + " = ", "blue"), ("help: ", "bold cyan"), (finding.fix.message, "")]
    elif finding.fix:
        yield [("  = ", "blue"), ("help: ", "bold cyan"), (finding.fix.message, "")]
    yield []


def full_lines(findings: list, unsafe_fixes: bool = False, sources=None):
    reader = SourceLines(sources)
    for finding in findings:
        yield from _full_lines(finding, reader.get(finding.filename, finding.cell), unsafe_fixes)


def concise_lines(findings: list, unsafe_fixes: bool = False):
    for f in findings:
        yield [(f.location, "bold"), (": ", ""), (f.code, "bold red"), (" ", ""),
               (_fix_marker(f, unsafe_fixes), "cyan"), (f.message, "")]


def summary_lines(findings: list, unsafe_fixes: bool = False):
    if not findings:
        yield [("All checks passed!", "bold green")]
        return
    yield [(found_line(findings), "")]
    fixable = sum(1 for f in findings if f.fix and (f.fix.safe or unsafe_fixes))
    hidden = sum(1 for f in findings if f.fix and not f.fix.safe and not unsafe_fixes)
    if fixable:
        yield [("[*]", "cyan"), (f" {fixable} fixable with the `--fix` option.", "")]
    if hidden:
        yield [(f"({hidden} hidden fix{'es' if hidden != 1 else ''} can be enabled with the `--unsafe-fixes` option.)", "")]


def statistics_lines(findings: list, unsafe_fixes: bool = False):
    from .registry import get_rule

    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if f.fix and (f.fix.safe or unsafe_fixes)}
    width = len(str(max(counts.values(), default=0)))
    for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        rule = get_rule(code)
        yield [(f"{count:>{width}}\t", ""), (code, "bold red"), ("\t", ""),
               ("[*] " if code in fixable else "    ", "cyan"), (rule.name if rule else "", "")]


def statistics_json(findings: list, unsafe_fixes: bool = False) -> str:
    from .registry import get_rule

    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if f.fix and (f.fix.safe or unsafe_fixes)}
    rows = [{"code": code, "name": get_rule(code).name if get_rule(code) else None, "count": count,
             "fixable": code in fixable}
            for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return json.dumps(rows, indent=2) + "\n"


def plain(lines) -> str:
    return "".join("".join(text for text, _ in line) + "\n" for line in lines)


# -- machine formats -----------------------------------------------------------------

def to_json(findings: list) -> str:
    return json.dumps([f.to_json() for f in findings], indent=2, ensure_ascii=False) + "\n"


def _github_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github_property(text: str) -> str:
    return _github_data(text).replace(":", "%3A").replace(",", "%2C")


def _in_cell(finding: Finding) -> str:
    return f"cell {finding.cell}, line {finding.row}: " if finding.cell is not None else ""


def _file_rows(finding: Finding, reader: SourceLines):
    """The rows of the file a finding spans: in a notebook, the JSON lines of its cell's source."""
    if finding.cell is None:
        return finding.row, finding.end_row
    book = reader.notebook(finding.filename)
    if book is None:
        return 1, 1
    return book.file_row(finding.cell, finding.row), book.file_row(finding.cell, finding.end_row)


def to_github(findings: list) -> str:
    out = []
    reader = SourceLines()
    for f in findings:
        row, end_row = _file_rows(f, reader)
        place = [f"line={row}", f"endLine={end_row}"] if f.cell is not None else [
            f"line={f.row}", f"col={f.column}", f"endLine={f.end_row}", f"endColumn={f.end_column}"]
        properties = ",".join([
            f"title={_github_property(f'matlint ({f.code})')}",
            f"file={_github_property(f.filename)}", *place,
        ])
        out.append(f"::{_level(f)} {properties}::{_github_data(f'{f.code} {_in_cell(f)}{f.message}')}\n")
    return "".join(out)


def _artifact_location(filename: str) -> dict:
    path = Path(filename)
    if path.is_absolute():
        return {"uri": path.as_uri()}
    return {"uri": quote(path.as_posix()), "uriBaseId": "%SRCROOT%"}


def _sarif_rule(cls) -> dict:
    from .diagnostics import rule_url

    docs = cls.rendered_docs()
    return {
        "id": cls.code,
        "name": cls.name,
        "shortDescription": {"text": cls.summary},
        "fullDescription": {"text": docs},
        "help": {"text": docs, "markdown": docs},
        "helpUri": rule_url(cls.code),
        "defaultConfiguration": {"level": cls.level(),
                                 "enabled": bool(cls.default_enabled)},
        "properties": {"tags": [cls.family()]},
    }


def _sarif_region(row: int, column: int, end_row: int, end_column: int) -> dict:
    return {"startLine": row, "startColumn": column, "endLine": end_row, "endColumn": end_column}


def _sarif_fix(finding: Finding) -> dict:
    return {
        "description": {"text": finding.fix.message},
        "artifactChanges": [{
            "artifactLocation": _artifact_location(finding.filename),
            "replacements": [{
                "deletedRegion": _sarif_region(e.row, e.column, e.end_row, e.end_column),
                "insertedContent": {"text": e.content},
            } for e in finding.fix.edits],
        }],
    }


def to_sarif(findings: list) -> str:
    from . import __version__
    from .registry import all_rules

    rules = list(all_rules())
    index = {cls.code: i for i, cls in enumerate(rules)}
    results = []
    reader = SourceLines()
    for f in findings:
        if f.cell is None:
            region = _sarif_region(f.row, f.column, f.end_row, f.end_column)
        else:
            # A notebook: the lines of the file that hold the cell's lines; the cell and its
            # row and column go in the message and the properties.
            row, end_row = _file_rows(f, reader)
            region = {"startLine": row, "endLine": end_row}
        result = {
            "ruleId": f.code,
            "level": _level(f),
            "message": {"text": f"{_in_cell(f)}{f.message}"},
            "locations": [{"physicalLocation": {
                "artifactLocation": _artifact_location(f.filename),
                "region": region,
            }}],
        }
        if f.cell is not None:
            result["properties"] = {"cell": f.cell, "cellRow": f.row, "cellColumn": f.column}
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        if f.fix and f.cell is None:
            result["fixes"] = [_sarif_fix(f)]
        results.append(result)
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "matlint",
                "version": __version__,
                "informationUri": INFORMATION_URI,
                "rules": [_sarif_rule(cls) for cls in rules],
            }},
            "columnKind": "unicodeCodePoints",
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(os.getcwd()).as_uri() + "/"}},
            "results": results,
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"
