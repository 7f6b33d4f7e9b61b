"""Reading source text: decoding a file's bytes, splitting lines as Python does, parsing with
the compiler's warnings kept quiet, and the MAT001/MAT002/MAT004 findings for text that cannot
be read or parsed. A leaf module: the engine, notebooks and fixes all build on it."""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import warnings

from .diagnostics import Finding

from .semantic.file import split_lines  # noqa: F401  (the engine, fixes and reporters split with it)

_RUNNING = f"{sys.version_info[0]}.{sys.version_info[1]}"
# Syntax a newer Python accepts; checked only on the line where parsing failed.
NEWER_SYNTAX = (
    (re.compile(r"^\s*type\s+[A-Za-z_]\w*\s*(\[.*\])?\s*="), (3, 12), "a `type` alias statement"),
    (re.compile(r"^\s*(async\s+)?def\s+[A-Za-z_]\w*\s*\["), (3, 12), "generic function syntax `def f[T]()`"),
    (re.compile(r"^\s*class\s+[A-Za-z_]\w*\s*\["), (3, 12), "generic class syntax `class C[T]`"),
    (re.compile(r"^\s*except\s*\*"), (3, 11), "`except*`"),
    (re.compile(r"^\s*match\s+.+:\s*(#.*)?$"), (3, 10), "the `match` statement"),
    (re.compile(r"^\s*case\s+.+:\s*(#.*)?$"), (3, 10), "the `match` statement"),
    (re.compile(r"^\s*except\s+[^():]+,[^():]+:"), (3, 14), "`except A, B:` without parentheses"),
    (re.compile(r"""\b[tT][rR]?["']"""), (3, 14), "template strings `t\"...\"`"),
    (re.compile(r"""\bf(["']).*\{[^}]*\1"""), (3, 12), "an f-string reusing its own quote inside `{}`"),
)

# Python 2's `except E, e:`, which Python 3.14 reads as `except (E, e):`.
PYTHON2_EXCEPT = re.compile(r"^\s*except\s+[\w.]+\s*,\s*\w+\s*:")

# Python 2 spellings, checked only on the line where parsing failed.
PYTHON2_SYNTAX = re.compile(
    r"^\s*(print|exec)\s+[^\s(=.,)\]}:;+*/%&|^<>!-]"  # print "x", exec "code"
    r"|^\s*print\s*>>"                                 # print >>sys.stderr, x
    r"|^\s*raise\s+[\w.]+\s*,"                        # raise E, "message"
    r"|^\s*except\s+[\w.]+\s*,\s*\w+\s*:"            # except E, e:
    r"|`|<>"                                          # repr backticks, the <> operator
    r"|(?<![\w.])0[0-7]+(?![\w.])|(?<![\w.])\d+[lL](?!\w)"  # 0777, 10L
    r"|(?<!\w)[uU][rR][\"']"                           # ur"..."
)


def decode(data: bytes, filename: str):
    """(source, None) or (None, Finding) for a file that is not text Python can read."""
    nul = data.find(b"\0")
    if nul >= 0:
        row = data.count(b"\n", 0, nul) + 1
        return None, Finding("MAT004", f"file contains a NUL byte at offset {nul}; it is not a Python source file",
                             filename, row, 1, row, 1)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        return None, Finding("MAT004", f"cannot read the file's encoding declaration: {exc}", filename, 1, 1, 1, 1)
    try:
        source = data.decode(encoding)
    except UnicodeDecodeError as exc:
        row = data.count(b"\n", 0, exc.start) + 1
        return None, Finding(
            "MAT004",
            f"file is not valid {encoding.upper() if encoding != 'utf-8-sig' else 'UTF-8'}: byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start} cannot be decoded; save it as UTF-8 or declare its encoding",
            filename, row, 1, row, 1)
    if source.startswith("\ufeff"):
        source = source[1:]
    return source, None


def syntax_finding(exc: SyntaxError, source: str, filename: str) -> Finding:
    row = exc.lineno or 1
    lines = split_lines(source)
    line = lines[row - 1] if 0 < row <= len(lines) else ""
    for pattern, version, feature in NEWER_SYNTAX:
        if version > sys.version_info[:2] and pattern.search(line):
            needed = f"{version[0]}.{version[1]}"
            python2 = ("; or, if this is Python 2's `except E, e:`, port it to Python 3: `except E as e:`"
                       if PYTHON2_EXCEPT.search(line) else "")
            return Finding(
                "MAT002",
                f"uses {feature}, which needs Python {needed}+; matlint runs on Python {_RUNNING} "
                f"and cannot read this file: run matlint with Python {needed} or newer{python2}",
                filename, row, 1, row, 1)
    column = max(exc.offset or 1, 1)
    msg = exc.msg or "invalid syntax"
    grammar = f"Python {_RUNNING} grammar"
    if PYTHON2_SYNTAX.search(line):
        grammar += "; the file looks like Python 2 code: port it to Python 3"
    return Finding("MAT001", f"file does not parse: {msg} ({grammar})", filename, row, column, row, column)


def parse_quietly(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse` without the compiler's warnings about the linted code (invalid escape
    sequences, `1()`, ...): they would print on the user's terminal, once per file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, filename)


def parse(source: str, filename: str):
    try:
        return parse_quietly(source, filename), None
    except SyntaxError as exc:
        return None, syntax_finding(exc, source, filename)
    except (RecursionError, MemoryError):
        return None, Finding("MAT001", "file does not parse: nesting is too deep for the parser",
                             filename, 1, 1, 1, 1)
    except ValueError as exc:
        return None, Finding("MAT001", f"file does not parse: {exc}", filename, 1, 1, 1, 1)
