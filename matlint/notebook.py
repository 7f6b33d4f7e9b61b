"""Jupyter notebooks: their code cells, in notebook order, are one program.

A notebook is read with its positions (`read`): every code cell's text and where its `source`
value lies in the file, so that a fix rewrites that value and nothing else; outputs are skipped
by the C JSON decoder, never turned into text. IPython's own syntax (line and cell magics, shell
escapes, `?` help) becomes placeholder Python of the same line count (`Program`), so positions
stay those of the cell; cells under a cell magic that does not run Python (`%%bash`,
`%%writefile`, ...) are left out. Findings are located by cell (1-based, counting every cell of
the notebook, as ruff does) and by row and column inside the cell.
"""
from __future__ import annotations

import ast
import bisect
import json
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Optional

from .diagnostics import Edit, Finding
from .fixes import apply_fixes, parses

NOTEBOOK_SUFFIX = ".ipynb"
# Cell magics whose body is Python that runs in the kernel's namespace; any other cell magic
# (`%%bash`, `%%writefile`, `%%html`, `%%sql`, ...) makes the cell something else.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "memit", "lprun", "python", "python3"})
# A placeholder line ends with this comment, naming the line it stands for.
_MARK = "#\ue000"
_MARKED = re.compile(r".*#\ue000(\d+)$")
_ESCAPE_START = re.compile(r"^(\s*)(%%?|!!?|\?\??)")
# `obj?`, `??obj`, `obj.method()?` and IPython's wildcard search (`torch.*Tensor?`, `%time?`)
_HELP = re.compile(r"^(\s*)(\?\??%{0,2}[\w.*]+|%{0,2}[\w*]+(\.[\w*]+|\[-?\d+\])*(\(\))?\?\??)\s*$")
_MARGIN = re.compile(r"[ \t]*")
# `x = !ls`, `out = %timeit -o f()`
_ESCAPE_ASSIGNMENT = re.compile(r"^(\s*[\w.\[\], ()*]+?\s*=\s*)(%%?|!!?)")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_LINE_REFERENCE = re.compile(r"\bline (\d+)\b")
_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


class NotebookError(ValueError):
    """The file is not a notebook matlint can read; `row` and `column` locate the problem in it."""

    def __init__(self, message: str, row: int = 1, column: int = 1):
        super().__init__(message)
        self.row, self.column = row, column


@dataclass
class Cell:
    number: int            # 1-based, counting every cell of the notebook
    source: str            # the cell's text, as stored
    start: int             # where its source value starts and ends in the file's text
    end: int
    as_list: bool          # stored as a list of lines (nbformat's usual form) or as one string


@dataclass
class Notebook:
    text: str
    cells: list            # code cells only
    nbformat: int
    # cell number -> the file's row of each of its lines: only SARIF and GitHub output ask
    _file_rows: dict = field(default_factory=dict, repr=False)

    def cell(self, number: int) -> Optional[Cell]:
        return next((c for c in self.cells if c.number == number), None)

    def file_row(self, number: int, row: int) -> int:
        """The row of the notebook file that holds row `row` of cell `number`."""
        cell = self.cell(number)
        if cell is None:
            return 1
        rows = self._file_rows.get(number)
        if rows is None:
            rows = self._file_rows[number] = _file_rows(self.text, cell)
        return rows[min(max(row, 1), len(rows)) - 1]

    def with_sources(self, sources: dict) -> str:
        """The file's text with the given cells' sources replaced ({number: text}); every other
        byte, outputs and formatting included, as it was."""
        text = self.text
        ascii_only = _writes_ascii(text)
        for cell in sorted((c for c in self.cells if c.number in sources), key=lambda c: c.start, reverse=True):
            value = _source_value(text[cell.start:cell.end], sources[cell.number], cell.as_list, ascii_only)
            text = text[:cell.start] + value + text[cell.end:]
        return text


# -- reading ----------------------------------------------------------------------------------

class _Reader:
    """Walks the JSON text, keeping positions; values it does not need are skipped by the C
    decoder (`raw_decode`)."""

    def __init__(self, text: str):
        self.text = text
        self.decoder = json.JSONDecoder()

    def skip_ws(self, i: int) -> int:
        return _WHITESPACE.match(self.text, i).end()

    def value(self, i: int):
        try:
            return self.decoder.raw_decode(self.text, i)
        except json.JSONDecodeError as exc:
            raise self.error(f"not valid JSON: {exc.msg}", exc.pos) from None

    def error(self, message: str, pos: int) -> NotebookError:
        row = self.text.count("\n", 0, pos) + 1
        return NotebookError(message, row, pos - (self.text.rfind("\n", 0, pos) + 1) + 1)

    def expect(self, i: int, char: str, what: str) -> int:
        i = self.skip_ws(i)
        if not self.text.startswith(char, i):
            raise self.error(f"not valid JSON: expected {what}", i)
        return i + 1

    def members(self, i: int, visit) -> int:
        """Reads the object at `i`, calling visit(key, value_start) -> value_end for each member."""
        i = self.expect(i, "{", "'{'")
        i = self.skip_ws(i)
        if self.text.startswith("}", i):
            return i + 1
        while True:
            i = self.skip_ws(i)
            if not self.text.startswith('"', i):
                raise self.error("not valid JSON: expected a property name", i)
            key, i = self.value(i)
            i = self.expect(i, ":", "':'")
            i = visit(key, self.skip_ws(i))
            i = self.skip_ws(i)
            if self.text.startswith(",", i):
                i += 1
            elif self.text.startswith("}", i):
                return i + 1
            else:
                raise self.error("not valid JSON: expected ',' or '}'", i)

    def items(self, i: int, visit) -> int:
        """Reads the array at `i`, calling visit(index, value_start) -> value_end for each item."""
        i = self.expect(i, "[", "'['")
        i = self.skip_ws(i)
        if self.text.startswith("]", i):
            return i + 1
        index = 0
        while True:
            i = visit(index, self.skip_ws(i))
            index += 1
            i = self.skip_ws(i)
            if self.text.startswith(",", i):
                i += 1
            elif self.text.startswith("]", i):
                return i + 1
            else:
                raise self.error("not valid JSON: expected ',' or ']'", i)


def read(text: str) -> Notebook:
    """The notebook in `text` (nbformat 4, or 3's worksheets). Raises NotebookError."""
    reader = _Reader(text)
    start = reader.skip_ws(0)
    if not text.startswith("{", start):
        reader.value(start)  # invalid JSON raises here with its own message
        raise NotebookError("it is JSON but not a Jupyter notebook (not an object with `cells`)")
    cells: list = []
    top: dict = {}

    def read_cells(at: int) -> int:
        def cell(_, cell_start):
            found: dict = {}

            def member(key, value_start):
                if key in ("cell_type", "source", "input"):
                    value, end = reader.value(value_start)
                    found[key] = (value, value_start, end)
                    return end
                return reader.value(value_start)[1]

            if not text.startswith("{", cell_start):
                reader.value(cell_start)  # invalid JSON raises here with its own message
                raise reader.error("a cell is not a JSON object", cell_start)
            end = reader.members(cell_start, member)
            number = len(cells) + 1
            cells.append((number, found, cell_start))
            return end

        return reader.items(at, cell)

    def worksheet(_, at):
        return reader.members(at, lambda key, value_start: read_cells(value_start) if key == "cells"
                              else reader.value(value_start)[1])

    def member(key, value_start):
        if key == "cells":
            top["cells"] = True
            if not text.startswith("[", value_start):
                raise reader.error("`cells` is not a list", value_start)
            return read_cells(value_start)
        if key == "worksheets" and text.startswith("[", value_start):
            top["worksheets"] = True
            return reader.items(value_start, worksheet)
        value, end = reader.value(value_start)
        top[key] = value
        return end

    end = reader.members(start, member)
    if text[reader.skip_ws(end):].strip():
        raise reader.error("not valid JSON: extra data after the notebook", reader.skip_ws(end))
    if not isinstance(top.get("nbformat"), int) or not (top.get("cells") or top.get("worksheets")):
        raise NotebookError("it is JSON but not a Jupyter notebook (no `nbformat` and `cells`)")
    nbformat = top["nbformat"]
    if nbformat not in (3, 4):
        raise NotebookError(f"it is an nbformat {nbformat} notebook; matlint reads nbformat 3 and 4")
    key = "input" if nbformat == 3 else "source"
    code_cells = []
    for number, found, cell_start in cells:
        if found.get("cell_type", (None,))[0] != "code" or key not in found:
            continue
        value, value_start, value_end = found[key]
        if isinstance(value, list) and all(isinstance(line, str) for line in value):
            source, as_list = "".join(value), True
        elif isinstance(value, str):
            source, as_list = value, False
        else:
            raise reader.error(f"the source of cell {number} is not text", value_start)
        code_cells.append(Cell(number, source, value_start, value_end, as_list))
    return Notebook(text, code_cells, nbformat)


def _file_rows(text: str, cell: Cell) -> tuple:
    """The row of `text` that holds each line of `cell`'s source (a list: each item's row)."""
    start = cell.start
    first = text.count("\n", 0, start) + 1
    if not cell.as_list:
        return (first,) * max(1, cell.source.count("\n") + 1)
    reader = _Reader(text)
    rows, row = [], first
    i = reader.expect(start, "[", "'['")
    for item in reader.value(start)[0]:
        i = reader.skip_ws(i)
        row += text.count("\n", start, i)
        start = i
        rows.extend([row] * max(1, item.count("\n")))
        i = reader.value(i)[1]
        i = reader.skip_ws(i)
        if text.startswith(",", i):
            i += 1
    return tuple(rows) or (first,)


# -- writing a source back ------------------------------------------------------------------

def _writes_ascii(text: str) -> bool:
    """Whether the file escapes non-ASCII text (`\\u00e9`) rather than writing it as is."""
    if any(ord(ch) > 127 for ch in text):
        return False
    return bool(re.search(r"\\u(00[89a-fA-F]|0[1-9a-fA-F]|[1-9a-fA-F])", text))


def _source_value(old: str, source: str, as_list: bool, ascii_only: bool) -> str:
    """The JSON for `source`, laid out as the value it replaces (`old`) was."""
    if not as_list:
        return json.dumps(source, ensure_ascii=ascii_only)
    items = [json.dumps(line, ensure_ascii=ascii_only) for line in source.splitlines(keepends=True)]
    opening = re.match(r"\[(\s*)", old).group(1)
    closing = re.search(r"(\s*)\]$", old).group(1)
    if not items:
        return "[]"
    if "\n" not in opening:
        return "[" + ", ".join(items) + "]"
    return "[" + opening + ("," + opening).join(items) + closing + "]"


# -- the program ----------------------------------------------------------------------------

@dataclass
class CellCode:
    """One code cell as Python: IPython syntax replaced by placeholders of the same line count."""

    number: int
    text: str                       # Python text to lint
    originals: list = field(default_factory=list)   # the lines the placeholders stand for
    margin: int = 0                 # the indentation IPython removes from every line of the cell

    def restored(self, text: str) -> Optional[str]:
        """`text` (this cell's Python after fixes) with its placeholders back as the IPython lines
        they stand for; None when a fix touched a placeholder or the cell was dedented."""
        if self.margin:
            return None
        lines = text.splitlines(keepends=True)
        seen = set()
        for i, line in enumerate(lines):
            match = _MARKED.match(line.rstrip("\r\n"))
            if match:
                k = int(match.group(1))
                if k >= len(self.originals) or k in seen:
                    return None
                seen.add(k)
                ending = line[len(line.rstrip("\r\n")):]
                lines[i] = self.originals[k] + ending
        return "".join(lines) if len(seen) == len(self.originals) else None


def cell_code(number: int, source: str) -> Optional[CellCode]:
    """The cell as Python, or None for a cell that is not Python (a `%%bash` cell, say)."""
    code = CellCode(number, source)
    indented = source[:len(source) - len(source.lstrip())].endswith((" ", "\t"))
    if not indented and (not any(ch in source for ch in "%!?") or parses(source, parse)):
        return code
    lines = source.splitlines(keepends=True)
    margin = _margin(lines) if indented else ""
    if margin:
        # IPython removes the indentation common to every line of a cell before it runs it
        lines = [line[len(margin):] if line.strip() else line for line in lines]
        code.margin = len(margin)
        code.text = "".join(lines)
        if not any(ch in source for ch in "%!?") or parses(code.text, parse):
            return code
    elif parses(source, parse):
        return code
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        magic = first[2:].split(None, 1)[0] if first[2:].strip() else ""
        if magic not in PYTHON_CELL_MAGICS:
            return None
    scan = _Continuation()
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        if scan.continuing:
            # inside brackets, a string or after a backslash: `%` starts no magic here (IPython
            # finds escapes at the start of a logical line only), `% (a, b)` is Python's modulo
            scan.feed(body)
            continue
        assignment = _ESCAPE_ASSIGNMENT.match(body)
        escape = _ESCAPE_START.match(body)
        if assignment:
            replacement = f"{assignment.group(1)}None  "
        elif escape or _HELP.match(body):
            replacement = f"{(escape or _HELP.match(body)).group(1)}pass  "
        else:
            scan.feed(body)
            continue
        lines[i] = f"{replacement}{_MARK}{len(code.originals)}{ending}"
        code.originals.append(body)
    code.text = "".join(lines)
    return code


class _Continuation:
    """Whether the next line continues a logical line (open brackets, a triple-quoted string, a
    trailing backslash), from the Python lines fed so far; a light scanner, as the cell as a whole
    does not tokenize before its IPython lines are replaced."""

    def __init__(self):
        self.depth, self.quote, self.backslash = 0, None, False

    @property
    def continuing(self) -> bool:
        return bool(self.depth or self.quote or self.backslash)

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        self.backslash = False
        while i < n:
            ch = line[i]
            if self.quote:
                if ch == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if ch == "#":
                break
            if ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth = max(0, self.depth - 1)
            elif ch in "\"'":
                self.quote = ch * 3 if line.startswith(ch * 3, i) else ch
                i += len(self.quote)
                continue
            elif ch == "\\" and i == n - 1:
                self.backslash = True
            i += 1
        if self.quote and len(self.quote) == 1 and not line.endswith("\\"):
            self.quote = None  # an unclosed one-line string ends with its line (a syntax error)


def _margin(lines: list) -> str:
    """The indentation common to every non-blank line ("" when the first one is not indented)."""
    margins = [_MARGIN.match(line).group(0) for line in lines if line.strip()]
    if not margins or not margins[0]:
        return ""
    common = margins[0]
    for margin in margins[1:]:
        while not margin.startswith(common):
            common = common[:-1]
    return common


def parse(source: str, filename: str = "<notebook>") -> ast.Module:
    """A cell or the whole program, which may `await` at the top level as a kernel allows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, filename, "exec", _PARSE_FLAGS)


@dataclass
class Program:
    """The Python cells of a notebook as one source, and where each cell's rows start in it."""

    cells: list                # CellCode, in notebook order
    source: str = ""
    starts: list = field(default_factory=list)   # row of the program where each cell begins
    tree: Optional[ast.Module] = None             # the source parsed, where it already was

    def __post_init__(self):
        parts, row = [], 1
        for code in self.cells:
            text = code.text if code.text.endswith("\n") or not code.text else code.text + "\n"
            self.starts.append(row)
            parts.append(text)
            row += text.count("\n")
        self.source = "".join(parts)

    def locate(self, row: int):
        """(CellCode, row in that cell) for a row of the program."""
        index = max(0, bisect.bisect_right(self.starts, row) - 1)
        return self.cells[index], row - self.starts[index] + 1

    def to_cell(self, finding: Finding) -> Finding:
        """The finding located in its cell; its fix is kept only when it stays inside the cell."""
        code, row = self.locate(finding.row)
        start = self.starts[self.cells.index(code)]
        last = start + code.text.count("\n") + (0 if code.text.endswith("\n") else 1) - 1
        end_row = min(finding.end_row, last) - start + 1
        end_column = finding.end_column if finding.end_row <= last else finding.column
        fix = finding.fix
        column = finding.column
        if code.margin:
            # the cell was linted dedented: its columns are the margin further right, and its
            # fixes, made for the dedented text, are not offered
            column, end_column, fix = column + code.margin, end_column + code.margin, None
        if fix is not None:
            if all(start <= e.row and e.end_row <= last for e in fix.edits):
                fix = replace(fix, edits=tuple(Edit(e.content, e.row - start + 1, e.column, e.end_row - start + 1,
                                                    e.end_column) for e in fix.edits))
            else:
                fix = None
            if fix is not None:
                fix = replace(fix, message=self.cell_lines(fix.message, code.number))
        noqa_row = finding.noqa_row - start + 1 if finding.noqa_row and start <= finding.noqa_row <= last else None
        return replace(finding, message=self.cell_lines(finding.message, code.number), row=row, column=column,
                       end_row=max(end_row, row), end_column=end_column, fix=fix, noqa_row=noqa_row,
                       cell=code.number)

    def cell_lines(self, message: str, number: int) -> str:
        """`message` with the program's `line N` as the cell's line (`cell 4, line 2` in another cell)."""
        def located(match):
            code, row = self.locate(int(match.group(1)))
            return f"line {row}" if code.number == number else f"cell {code.number}, line {row}"

        return _LINE_REFERENCE.sub(located, message) if "line " in message else message


def program(notebook: Notebook, filename: str):
    """(Program of the cells that parse, MAT001 findings for the cells that do not)."""
    return program_of([(cell.number, cell.source) for cell in notebook.cells], filename)


def program_of(cells: list, filename: str):
    """`program` for [(cell number, text)], the code cells in notebook order."""
    from .source import syntax_finding

    codes = [code for code in (cell_code(number, source) for number, source in cells)
             if code is not None and code.text.strip()]
    whole = Program(codes)
    try:
        # Most notebooks parse as a whole with no statement running on from one cell into the
        # next: then each cell parses alone too, and the tree is the lint's.
        tree = parse(whole.source, filename)
        if all(whole.locate(stmt.lineno)[0] is whole.locate(stmt.end_lineno)[0] for stmt in tree.body):
            whole.tree = tree
            return whole, []
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    codes, problems = [], []
    for code in whole.cells:
        number = code.number
        try:
            parse(code.text, filename)
        except SyntaxError as exc:
            finding = syntax_finding(exc, code.text, filename)
            problems.append(replace(finding, message=finding.message.replace("file does not", "cell does not", 1),
                                    cell=number))
            continue
        except (ValueError, RecursionError, MemoryError) as exc:
            problems.append(Finding("MAT001", f"cell does not parse: {exc}", filename, 1, 1, 1, 1, cell=number))
            continue
        codes.append(code)
    return Program(codes), problems


def code_text(data: bytes) -> str:
    """The Python of a notebook's code cells, for what reads a file's imports; "" when the file
    is not a notebook."""
    try:
        notebook = read(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, NotebookError):
        return ""
    return "".join(c.source + "\n" for c in notebook.cells)


def fix(notebook: Notebook, filename: str, lint, unsafe: bool = False, max_rounds: int = 10):
    """Fixes the code cells until no fix applies; `lint(program) -> findings located in cells`.
    Returns ({cell number: new source} of the cells that changed, fixes applied, the findings
    left, those of cells that do not parse included)."""
    prog, problems = program(notebook, filename)
    codes = {code.number: code for code in prog.cells}
    texts = {number: code.text for number, code in codes.items()}
    total = 0
    findings = lint(prog)
    for _ in range(max_rounds):
        applied_now = 0
        for number, text in texts.items():
            new, applied = apply_fixes(text, [f for f in findings if f.cell == number], unsafe)
            if applied and codes[number].restored(new) is not None:
                texts[number] = new
                applied_now += len(applied)
        if not applied_now:
            break
        total += applied_now
        findings = lint(Program([replace(code, text=texts[number]) for number, code in codes.items()]))
    changed = {number: codes[number].restored(text) for number, text in texts.items() if text != codes[number].text}
    return changed, total, sorted(problems + findings, key=Finding.sort_key)
