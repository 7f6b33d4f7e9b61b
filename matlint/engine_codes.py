"""The engine's own diagnostics (MAT0xx): files that cannot be linted, and internal errors.

They are documented like rules so `matlint rule MAT001` and the README table cover them, but
they have no check of their own: the engine emits them.
"""
from __future__ import annotations

from .rule import Rule

_COMMON_QUIET = """
## Stays quiet on
Files that never mention `torch` nor call `.backward(` are not parsed at all (the pre-filter), so their syntax is
not judged; ruff or flake8 report that.

## Fix safety
No fix: the file has to be repaired by hand.
"""


class InternalError(Rule):
    code = "MAT000"
    name = "internal-error"
    summary = "matlint itself failed on this file; the other files were still linted."
    docs = """
    ## What it does
    Reports a failure inside matlint (a rule or the engine raised) for one file, instead of a
    traceback. The rest of the run goes on.

    ## Why is this bad?
    The file was not (fully) checked. Please report it with the file that triggered it.

    ## Example
    Any file on which a rule crashes.

    ## Use instead
    Nothing to change in your code; `--ignore MAT000` hides these.

    ## Stays quiet on
    Everything that lints normally.

    ## Fix safety
    No fix.
    """


class SyntaxErrorRule(Rule):
    code = "MAT001"
    name = "syntax-error"
    summary = "The file, or a notebook's cell, does not parse with the grammar of the Python that runs matlint."
    docs = """
    ## What it does
    Reports a file that cannot be parsed, with the parser's message and position. In a Jupyter
    notebook: a file that is not valid JSON or not a notebook (one finding for the file), or a
    code cell that does not parse (a finding in that cell; the other cells are linted).

    ## Why is this bad?
    A file that does not parse cannot be checked, and will not import either.

    ## Example
    ```python
    import torch
    def f(x)
        return x @ x
    ```

    ## Use instead
    Fix the syntax error the message names.
    """ + _COMMON_QUIET


class NewerSyntax(Rule):
    code = "MAT002"
    name = "newer-python-syntax"
    summary = "The file uses syntax newer than the Python that runs matlint."
    docs = """
    ## What it does
    Reports a file that fails to parse because it uses a feature of a newer Python (for
    example `type X = ...` or `def f[T]()`, Python 3.12) than the interpreter matlint runs on.
    The message names the feature and the Python version it needs.

    ## Why is this bad?
    matlint reads files with the grammar of its own interpreter, so it cannot check this one.

    ## Example
    ```python
    import torch
    type Batch = torch.Tensor
    ```

    ## Use instead
    Run matlint with a Python at least as new as the one the message names.
    """ + _COMMON_QUIET


class UnreadableFile(Rule):
    code = "MAT003"
    name = "unreadable-file"
    summary = "The file cannot be read (permissions, a broken link, a directory error)."
    docs = """
    ## What it does
    Reports a path that was found but could not be read, naming the operating system's reason.

    ## Why is this bad?
    The file was not checked.

    ## Example
    A symbolic link whose target was deleted.

    ## Use instead
    Fix the path or exclude it (`extend-exclude` in `[tool.matlint]`).

    ## Stays quiet on
    Readable files.

    ## Fix safety
    No fix.
    """


class UndecodableFile(Rule):
    code = "MAT004"
    name = "undecodable-file"
    summary = "The file is not valid text in its declared encoding (UTF-8 by default) or contains NUL bytes."
    docs = """
    ## What it does
    Reports a file whose bytes are not valid in its encoding (UTF-8 unless a PEP 263 coding
    comment says otherwise), or that contains NUL bytes, with the offset of the first bad byte.

    ## Why is this bad?
    Python will refuse to import it, and matlint cannot read it.

    ## Example
    A file saved as Latin-1 without a `# -*- coding: latin-1 -*-` line.

    ## Use instead
    Re-save the file as UTF-8, or declare its encoding.

    ## Stays quiet on
    Files with a correct coding declaration.

    ## Fix safety
    No fix.
    """


ENGINE_RULES = (InternalError, SyntaxErrorRule, NewerSyntax, UnreadableFile, UndecodableFile)
