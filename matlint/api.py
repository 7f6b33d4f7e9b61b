"""The public Python API: `matlint.check(...)` for files or source text, and `lint_text` for
callers that already hold the text and the settings (the language server)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

from . import engine
from .config import Settings, load_settings

STRING_FILENAME = "<string>"


def lint_text(source: str, filename: str, settings: Optional[Settings] = None) -> list:
    """Findings for `source` as if it were the file `filename` (per-file-ignores and `# noqa` apply)."""
    from .runner import finalize

    settings = settings or Settings()
    findings = engine.lint_source(source, filename, settings.enabled_rules(), settings.rule_options)
    return finalize(findings, filename, settings)


def _is_path(value) -> bool:
    if isinstance(value, os.PathLike):
        return True
    return isinstance(value, str) and "\n" not in value and len(value) < 4096 and os.path.lexists(value)


def check(paths_or_source: Union[str, os.PathLike, list, tuple], select=None, ignore=None) -> list:
    """Lint files or source text with the project's `[tool.matlint]` config.

    A `Path`, a list of paths, or a string naming an existing path lints files (directories are
    walked as by `matlint check`); any other string is linted as source named `<string>`.
    `select` / `ignore` take codes or prefixes (`"MAT1"` or `["MAT101", "MAT5"]`) and act like
    the command line's `--select` / `--ignore`.
    """
    from .files import find_files
    from .runner import lint_discovered

    overrides = {"select": select, "ignore": ignore}
    if isinstance(paths_or_source, (list, tuple)):
        paths = [os.fspath(p) for p in paths_or_source]
    elif _is_path(paths_or_source):
        paths = [os.fspath(paths_or_source)]
    else:
        settings = load_settings(Path.cwd(), cli_overrides=overrides)
        return lint_text(paths_or_source, STRING_FILENAME, settings)
    if not paths:
        return []
    settings = load_settings(paths[0], cli_overrides=overrides)
    return lint_discovered(find_files(paths, settings), settings, use_cache=False)
