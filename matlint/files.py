"""Which files a run lints: explicit paths always; under directories, every *.py / *.pyi / *.ipynb
that is not excluded, not in a virtualenv and not ignored by a .gitignore. Directory symlinks are not
followed; a broken link or an unreadable entry becomes one MAT003 finding and the walk goes on."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pathspec

from .config import matched_path
from .diagnostics import Finding

PYTHON_SUFFIXES = (".py", ".pyi", ".ipynb")


class UsageError(Exception):
    """A mistake on the command line (exit 2)."""


@dataclass
class Discovery:
    files: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # MAT003 findings for entries that cannot be read


def unreadable(path: str, reason: str, what: str = "file") -> Finding:
    return Finding("MAT003", f"cannot read the {what}: {reason}", path, 1, 1, 1, 1)


def _link_problem(path: str) -> str:
    try:
        os.stat(path)
    except OSError as exc:
        target = os.readlink(path) if os.path.islink(path) else None
        if target is not None and exc.errno == 2:
            return f"broken symbolic link (its target {target!r} does not exist)"
        return exc.strerror or str(exc)
    return "not a regular file"


def _is_regular_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _is_python(name: str) -> bool:
    return name.endswith(PYTHON_SUFFIXES)


def _git_root(directory: Path) -> Optional[Path]:
    for candidate in (directory, *directory.parents):
        if os.path.exists(candidate / ".git"):
            return candidate
    return None


def _load_gitignore(directory: Path) -> Optional[pathspec.PathSpec]:
    lines = []
    for name in (".gitignore", os.path.join(".git", "info", "exclude")):
        try:
            with open(directory / name, encoding="utf-8", errors="replace") as handle:
                lines += handle.read().splitlines()
        except OSError:
            continue
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


class _Ignores:
    """The .gitignore files that apply at one point of the walk, outermost first."""

    def __init__(self, specs=()):
        self.specs = tuple(specs)  # ((directory, spec), ...)

    def entering(self, directory: Path) -> "_Ignores":
        spec = _load_gitignore(directory)
        return _Ignores(self.specs + ((directory, spec),)) if spec else self

    def ignores(self, path: Path, is_dir: bool) -> bool:
        # Deeper files override shallower ones; within one file the last matching pattern wins.
        for directory, spec in reversed(self.specs):
            relative = path.relative_to(directory).as_posix() + ("/" if is_dir else "")
            result = spec.check_file(relative)
            if result.include is not None:
                return result.include
        return False


def _any_pattern(spec: pathspec.PathSpec):
    """One regex that finds a path some pattern of `spec` that excludes (not `!negated`) would
    match, or None: a path it does not find is not excluded, whatever the patterns' order, and
    is settled in one search instead of one per pattern."""
    regexes = [p.regex.pattern for p in spec.patterns if p.include and p.regex is not None]
    if any(isinstance(r, bytes) for r in regexes):
        return None
    try:  # the patterns' named groups (a directory mark) would clash once joined
        return re.compile("|".join(f"(?:{_NAMED_GROUP.sub('(?:', r)})" for r in regexes) or "(?!)")
    except re.error:
        return None


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


class FileFinder:
    def __init__(self, settings):
        self.settings = settings
        self.exclude = pathspec.GitIgnoreSpec.from_lines(settings.exclude)
        self.may_exclude = _any_pattern(self.exclude)

    def find(self, paths) -> Discovery:
        """Files to lint under `paths`, in a stable order. Raises UsageError for a path that does not exist."""
        missing = [p for p in paths if not os.path.lexists(p)]
        if missing:
            raise UsageError(f"path does not exist: {missing[0]}" + (
                f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        found = Discovery()
        seen = set()
        for raw in paths:
            path = os.path.normpath(os.fspath(raw))
            try:
                mode = os.stat(path).st_mode  # one stat per named path: pre-commit names every file
            except OSError:
                mode = 0
            if stat.S_ISDIR(mode):
                # A symlink named explicitly is followed, without the .gitignore files above it.
                ignores = _Ignores() if os.path.islink(path) else self._ignores_above(Path(path))
                self._walk(Path(path), ignores, found, self.settings.path_from_root(os.path.abspath(path)))
            elif stat.S_ISREG(mode):
                found.files.append(path)
            else:
                found.problems.append(unreadable(path, _link_problem(path)))
        unique = []
        for path in found.files:
            key = os.path.abspath(path)
            if key not in seen:
                seen.add(key)
                unique.append(path)
        found.files = unique
        return found

    def _ignores_above(self, directory: Path) -> _Ignores:
        """.gitignore files of the directories between the repository root and `directory`."""
        if not self.settings.respect_gitignore:
            return _Ignores()
        absolute = Path(os.path.abspath(directory))
        root = _git_root(absolute)
        if root is None or root == absolute:
            return _Ignores()
        ignores = _Ignores()
        for parent in reversed(absolute.relative_to(root).parents):
            ignores = ignores.entering(root / parent)
        return ignores

    def _excluded(self, relative: Optional[str], name: str, is_dir: bool) -> bool:
        # Patterns are gitignore-style, relative to the config's directory: `build` matches at
        # any depth, `/build` or `src/gen` only there.
        path = matched_path(relative, name) + ("/" if is_dir else "")
        if self.may_exclude is not None and not self.may_exclude.search(path):
            return False
        return self.exclude.match_file(path)

    def _walk(self, directory, ignores: _Ignores, found: Discovery, relative: Optional[str]) -> None:
        """`relative` is the directory's `Settings.path_from_root`: its entries' paths from the
        config's directory are built from it, not computed again for each."""
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            found.problems.append(unreadable(os.path.normpath(directory), exc.strerror or str(exc), "directory"))
            return
        if self.settings.respect_gitignore and any(e.name in (".gitignore", ".git") for e in entries):
            ignores = ignores.entering(Path(os.path.abspath(directory)))  # its .gitignore or .git/info/exclude
        for entry in entries:
            path, name = entry.path, entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_link = entry.is_symlink()
            except OSError:
                is_dir = is_link = False
            if relative is None or relative.startswith(".."):
                # Outside the config's directory a file is matched by its name; a directory may
                # lead back into it (walking `..` from inside): ask os.path.relpath.
                entry_relative = self.settings.path_from_root(os.path.abspath(path)) if is_dir else None
            else:
                entry_relative = name if relative == "." else f"{relative}/{name}"
            if is_dir:
                # os.path.exists, unlike Path.exists, is False (not an error) inside an unreadable directory.
                if (self._excluded(entry_relative, name, True) or os.path.exists(os.path.join(path, "pyvenv.cfg"))
                        or (ignores.specs and ignores.ignores(Path(os.path.abspath(path)), True))):
                    continue
                self._walk(path, ignores, found, entry_relative)
                continue
            if not _is_python(name) or self._excluded(entry_relative, name, False):
                continue
            if ignores.specs and ignores.ignores(Path(os.path.abspath(path)), False):
                continue
            if is_link:
                if os.path.isdir(path):
                    continue  # directory symlinks are not followed
                if not os.path.isfile(path):
                    found.problems.append(unreadable(os.path.normpath(entry.path), _link_problem(entry.path)))
                    continue
            elif not _is_regular_file(entry):
                continue  # sockets, fifos: nothing to read
            found.files.append(os.path.normpath(entry.path))


def find_files(paths, settings) -> Discovery:
    return FileFinder(settings).find(paths)
