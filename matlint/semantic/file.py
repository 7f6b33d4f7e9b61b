"""One Python file as the analyses read it: its text, lines, tree, names and the per-file caches
of the shared analyses. The engine's `FileContext` is one for the file being linted, with the
walk's position added; a project file that the linted file's findings depend on (a script that
imports it) is read as a plain `SourceFile`."""
from __future__ import annotations

import ast
import re
from functools import cached_property
from typing import Optional

from .names import NameResolver
from .project import parsed, star_imported_aliases, while_unchanged

LINE_SPLIT = re.compile(r"\r\n|\r|\n")
_STAR_IMPORT = re.compile(r"^[ \t]*from[ \t]+\S+[ \t]+import[ \t]+\*", re.M)
_LINE_SPLIT_KEEP = re.compile(r"(\r\n|\r|\n)")


def split_lines(source: str) -> list:
    """The lines of `source`, split where Python splits them (`\\r\\n`, `\\r`, `\\n`)."""
    if "\r" not in source:
        return source.split("\n")  # the same lines, several times faster than the regex
    return LINE_SPLIT.split(source)


def _slice_bytes(line: str, start: int, end) -> str:
    """`line[start:end]` where start/end are UTF-8 byte offsets, as ast gives them."""
    if line.isascii():
        return line[start:end]
    return line.encode("utf-8")[start:end].decode("utf-8", "replace")


class SourceFile:
    """A parsed file: `source`, `filename`, `tree`, `lines`, its `names` (imports and aliases)
    and `shared`, the caches of the analyses run on it."""

    # Where a walk stands in the file: nowhere, for a file read but not walked.
    function = None
    class_ = None
    functions: tuple = ()
    classes: tuple = ()
    loops: tuple = ()
    parents: tuple = ()

    def __init__(self, source: str, filename: str, tree: ast.Module):
        self.source = source
        self.filename = filename
        self.tree = tree
        self.lines = split_lines(source)
        self.names = NameResolver(tree, star_imported_aliases(tree, filename) if _STAR_IMPORT.search(source) else None)
        self.qualname = self.names.qualname  # the hottest call of the rules: no wrapper frame
        self.shared: dict = {}

    @property
    def scope(self) -> ast.AST:
        """The function being walked, or the module where the walk is outside every function (a
        script's training loop)."""
        return self.function if self.function is not None else self.tree

    def char_column(self, row: int, byte_col: int) -> int:
        """1-based character column from ast's 0-based UTF-8 byte offset."""
        line = self.lines[row - 1] if 0 < row <= len(self.lines) else ""
        if line.isascii():
            return byte_col + 1
        return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace")) + 1

    def span(self, node: ast.AST, end_node: Optional[ast.AST] = None):
        end = end_node or node
        row, end_row = node.lineno, end.end_lineno or node.lineno
        end_col = end.end_col_offset if end.end_col_offset is not None else node.col_offset
        return row, self.char_column(row, node.col_offset), end_row, self.char_column(end_row, end_col)

    def segment(self, node: ast.AST) -> str:
        """Source text of `node` (like ast.get_source_segment, without re-splitting the file per call)."""
        end_row, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if end_row is None or end_col is None:
            return ""
        lines = self._lines_with_ends
        row, col = node.lineno - 1, node.col_offset
        if row == end_row - 1:
            return _slice_bytes(lines[row], col, end_col)
        parts = [_slice_bytes(lines[row], col, None)]
        parts.extend(lines[row + 1:end_row - 1])
        parts.append(_slice_bytes(lines[end_row - 1], 0, end_col))
        return "".join(parts)

    @cached_property
    def _lines_with_ends(self) -> list:
        if "\r" not in self.source:  # `self.lines` is then split at every \n: add the ends back
            return [line + "\n" for line in self.lines[:-1]] + self.lines[-1:]
        pieces = _LINE_SPLIT_KEEP.split(self.source)
        return [pieces[i] + (pieces[i + 1] if i + 1 < len(pieces) else "") for i in range(0, len(pieces), 2)]


def project_file(path: str) -> Optional[SourceFile]:
    """The project module at `path` as the analyses read it, its caches kept, once per process
    while the file is unchanged; None where it cannot be read or parsed."""
    return while_unchanged(_PROJECT_FILES, path, _read_project_file)


def _read_project_file(path: str) -> Optional[SourceFile]:
    tree = parsed(path)
    if tree is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return SourceFile(handle.read(), path, tree)
    except OSError:
        return None


class Position:
    """A file seen from a place in it other than where its walk stands: inside `functions`
    (outermost first), methods of `class_` where it is given. The analyses that read the walk's
    position (the scopes a name resolves in) read this one; all else is the file's."""

    loops: tuple = ()
    parents: tuple = ()

    def __init__(self, source, functions: tuple, class_=None):
        self._source = source
        self.functions = tuple(functions)
        self.function = self.functions[-1] if self.functions else None
        self.class_ = class_
        self.classes = (class_,) if class_ is not None else ()

    def __getattr__(self, name):
        return getattr(self._source, name)

    @property
    def scope(self) -> ast.AST:
        return self.function if self.function is not None else self.tree


_PROJECT_FILES: dict = {}  # path -> (size, mtime_ns, its SourceFile or None)
