"""Settings from `[tool.matlint]` in pyproject.toml, merged with command-line overrides.

Rule selection works like ruff's: among the `select` and `ignore` selectors that match a code,
the longest one wins and `ignore` wins ties. The engine's own codes (MAT0xx) are on unless
ignored; a rule that is off by default is on only when `ALL` or a selector longer than `MAT`
names it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from .registry import all_rules, get_rule

DEFAULT_SELECT = ("MAT",)
DEFAULT_EXCLUDE = (
    ".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox", ".nox", ".mypy_cache",
    ".ruff_cache", ".matlint_cache", "build", "dist", "*.egg-info",
)
DEFAULT_CACHE_DIR = ".matlint_cache"
SELECTOR_RE = re.compile(r"^MAT\d{0,3}$")

_LIST_KEYS = ("select", "ignore", "extend-select", "extend-ignore", "exclude", "extend-exclude")
_SELECTOR_KEYS = ("select", "ignore", "extend-select", "extend-ignore")
KNOWN_KEYS = _LIST_KEYS + ("per-file-ignores", "respect-gitignore", "cache-dir", "rules")


class ConfigError(Exception):
    """A configuration problem the user must fix; the message names the key and its source."""


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def normalize_selector(raw: Any, key: str, source: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"{source}: `{key}` must list rule codes as strings, got {raw!r}")
    selector = raw.strip().upper()
    if selector != "ALL" and not (SELECTOR_RE.match(selector)
                                  and any(cls.code.startswith(selector) for cls in all_rules())):
        raise ConfigError(
            f"{source}: `{key}` has unknown rule selector {raw!r} "
            "(use ALL, MAT, or a prefix of a rule code such as MAT1 or MAT101; `matlint rule` lists them)")
    return selector


@dataclass(frozen=True)
class Settings:
    """Everything that decides what a run checks. Frozen and picklable (sent to worker processes)."""

    root: str = "."
    config_file: Optional[str] = None
    select: tuple = DEFAULT_SELECT
    ignore: tuple = ()
    per_file_ignores: tuple = ()  # ((glob, (selector, ...)), ...)
    exclude: tuple = DEFAULT_EXCLUDE
    respect_gitignore: bool = True
    cache_dir: str = DEFAULT_CACHE_DIR
    rule_option_items: tuple = ()  # ((code, ((option, value), ...)), ...) sorted

    # -- rule selection -----------------------------------------------------
    def is_enabled(self, code: str) -> bool:
        return code in self.enabled_codes()

    def enabled_codes(self) -> frozenset:
        return _enabled_codes(self.select, self.ignore)

    def enabled_rules(self) -> tuple:
        codes = self.enabled_codes()
        return tuple(cls for cls in all_rules() if cls.code in codes)

    @property
    def rule_options(self) -> dict:
        return {code: dict(items) for code, items in self.rule_option_items}

    # -- per-file-ignores -----------------------------------------------------
    def is_ignored(self, path, code: str) -> bool:
        """Whether per-file-ignores switch `code` off for `path`."""
        if not self.per_file_ignores:
            return False
        relative = self.relative_path(path)
        for index, (_, selectors) in enumerate(self.per_file_ignores):
            if any(_matches(s, code) for s in selectors) and _per_file_specs(self.per_file_ignores)[index].match_file(relative):
                return True
        return False

    def relative_path(self, path) -> str:
        """`path` relative to the config's directory, in posix form, for glob matching (its
        name alone when it is not under that directory)."""
        absolute = os.path.abspath(os.fspath(path))
        return matched_path(self.path_from_root(absolute), os.path.basename(absolute))

    def path_from_root(self, absolute: str) -> Optional[str]:
        """`os.path.relpath` of an absolute path from the config's directory, in posix form (`..`
        when it is outside), or None when there is no relative path (another drive on Windows)."""
        try:
            relative = os.path.relpath(absolute, self.root)
        except ValueError:
            return None
        return relative if os.sep == "/" else relative.replace(os.sep, "/")

    def fingerprint(self) -> str:
        """Changes when anything that decides a file's findings changes (keys the cache).
        Per-file-ignores and file selection are left out: they are applied after the cache."""
        payload = json.dumps([sorted(self.enabled_codes()), self.rule_option_items], default=repr)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def cache_path(self) -> Path:
        path = Path(self.cache_dir)
        return path if path.is_absolute() else Path(self.root) / path


@lru_cache(maxsize=64)
def _enabled_codes(select: tuple, ignore: tuple) -> frozenset:
    enabled = set()
    for cls in all_rules():
        code = cls.code
        best_ignore = max((_specificity(s) for s in ignore if _matches(s, code)), default=-1)
        if code.startswith("MAT0"):
            # Engine codes are always reported unless ignored; the implicit select counts like ALL.
            selecting = [0] + [_specificity(s) for s in select if _matches(s, code)]
        else:
            selecting = [_specificity(s) for s in select if _matches(s, code)
                         and (cls.default_enabled or s == "ALL" or len(s) > len("MAT"))]
        if selecting and max(selecting) > best_ignore:
            enabled.add(code)
    return frozenset(enabled)


@lru_cache(maxsize=64)
def _per_file_specs(per_file_ignores: tuple) -> list:
    import pathspec

    return [pathspec.GitIgnoreSpec.from_lines([pattern]) for pattern, _ in per_file_ignores]


# -- loading ----------------------------------------------------------------------

def matched_path(relative: Optional[str], name: str) -> str:
    """What exclude and per-file-ignores patterns are matched against: the path from the config's
    directory (`path_from_root`), or the file's `name` when it has none inside that directory."""
    if relative is None or relative.startswith(".."):
        return name
    return relative


def find_config(start) -> Optional[Path]:
    """The nearest pyproject.toml with a [tool.matlint] table, searching upward from `start`."""
    path = Path(os.path.abspath(os.fspath(start)))
    if not os.path.isdir(path):
        path = path.parent
    for directory in (path, *path.parents):
        candidate = directory / "pyproject.toml"
        if os.path.isfile(candidate):
            try:
                text = candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                if "tool.matlint" in text:
                    return candidate  # ours but broken: loading it reports the TOML error
                continue  # a broken pyproject without our table is not our business
            if isinstance(data.get("tool"), dict) and "matlint" in data["tool"]:
                return candidate
    return None


def _read_table(config_file: Path) -> dict:
    try:
        text = config_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{config_file}: cannot read the config file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{config_file}: the config file is not UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file}: invalid TOML: {exc}") from None
    if config_file.name == "pyproject.toml":
        table = data.get("tool", {}).get("matlint", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{config_file}: [tool.matlint] must be a table")
        return table
    # A dedicated file given with --config may hold the keys at top level or under [tool.matlint].
    if isinstance(data.get("tool"), dict) and "matlint" in data["tool"]:
        return data["tool"]["matlint"]
    return data


def _string_list(table: dict, key: str, source: str) -> tuple:
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: `{key}` must be a list of strings, got {value!r}")
    return tuple(value)


def _option_value(option, value, key: str, source: str):
    expected = option.type
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{source}: `{key}` must be of type {expected.__name__}, got {value!r}")
    return value


def _rule_options(table: Any, source: str) -> dict:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: `rules` must be a table of [tool.matlint.rules.MATxxx] tables")
    options: dict = {}
    for rule_key, values in table.items():
        cls = get_rule(rule_key)
        if cls is None:
            raise ConfigError(f"{source}: `rules.{rule_key}` names no rule (`matlint rule` lists them)")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: `rules.{rule_key}` must be a table of options")
        by_normal_name = {name.replace("-", "_"): name for name in cls.options}
        for option_key, value in values.items():
            name = by_normal_name.get(option_key.replace("-", "_"))
            key = f"rules.{rule_key}.{option_key}"
            if name is None:
                known = ", ".join(cls.options) or "none"
                raise ConfigError(f"{source}: unknown key `{key}` ({cls.code} options: {known})")
            options.setdefault(cls.code, {})[name] = _option_value(cls.options[name], value, key, source)
    return options


def _parse_table(table: dict, source: str) -> dict:
    unknown = [k for k in table if k not in KNOWN_KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key `{unknown[0]}` in [tool.matlint] (known keys: {', '.join(KNOWN_KEYS)})")
    parsed: dict = {}
    for key in _LIST_KEYS:
        if key in table:
            parsed[key] = _string_list(table, key, source)
    for key in _SELECTOR_KEYS:
        if key in parsed:
            parsed[key] = tuple(normalize_selector(s, key, source) for s in parsed[key])
    if "per-file-ignores" in table:
        value = table["per-file-ignores"]
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: `per-file-ignores` must be a table of glob = [codes]")
        entries = []
        for pattern, codes in value.items():
            key = f"per-file-ignores.{pattern}"
            if not isinstance(codes, list):
                raise ConfigError(f"{source}: `{key}` must be a list of rule codes, got {codes!r}")
            entries.append((pattern, tuple(normalize_selector(c, key, source) for c in codes)))
        parsed["per-file-ignores"] = tuple(entries)
    if "respect-gitignore" in table:
        if not isinstance(table["respect-gitignore"], bool):
            raise ConfigError(f"{source}: `respect-gitignore` must be true or false, got {table['respect-gitignore']!r}")
        parsed["respect-gitignore"] = table["respect-gitignore"]
    if "cache-dir" in table:
        if not isinstance(table["cache-dir"], str) or not table["cache-dir"]:
            raise ConfigError(f"{source}: `cache-dir` must be a path string, got {table['cache-dir']!r}")
        parsed["cache-dir"] = table["cache-dir"]
    if "rules" in table:
        parsed["rules"] = _rule_options(table["rules"], source)
    return parsed


def _cli_selectors(overrides: dict, key: str) -> Optional[tuple]:
    value = overrides.get(key.replace("-", "_"))
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    parts = [part for item in value for part in str(item).split(",") if part.strip()]
    return tuple(normalize_selector(p, f"--{key}", "command line") for p in parts)


def load_settings(start_path=None, config_file=None, cli_overrides: Optional[dict] = None) -> Settings:
    """Settings for a run whose first path is `start_path` (default: the current directory).

    `cli_overrides` may hold `select`, `ignore`, `extend_select`, `extend_ignore` (lists of
    selectors, or comma-separated strings). A command-line `select` starts the selection afresh,
    discarding the config's select and ignore lists, as ruff does.
    """
    overrides = cli_overrides or {}
    if config_file is not None:
        config_path = Path(config_file)
        if not os.path.isfile(config_path):
            raise ConfigError(f"{config_file}: config file not found")
    else:
        config_path = find_config(start_path if start_path is not None else os.getcwd())
    config_path = config_path.resolve() if config_path else None
    table = _parse_table(_read_table(config_path), str(config_path)) if config_path else {}
    root = str(config_path.parent) if config_path else os.path.abspath(os.getcwd())

    select = table.get("select", DEFAULT_SELECT) + table.get("extend-select", ())
    ignore = table.get("ignore", ()) + table.get("extend-ignore", ())
    cli_select = _cli_selectors(overrides, "select")
    if cli_select is not None:
        select, ignore = cli_select, ()
    select += _cli_selectors(overrides, "extend-select") or ()
    ignore += (_cli_selectors(overrides, "ignore") or ()) + (_cli_selectors(overrides, "extend-ignore") or ())

    rule_options = table.get("rules", {})
    return Settings(
        root=root,
        config_file=str(config_path) if config_path else None,
        select=tuple(dict.fromkeys(select)),
        ignore=tuple(dict.fromkeys(ignore)),
        per_file_ignores=table.get("per-file-ignores", ()),
        exclude=table.get("exclude", DEFAULT_EXCLUDE) + table.get("extend-exclude", ()),
        respect_gitignore=table.get("respect-gitignore", True),
        cache_dir=table.get("cache-dir", DEFAULT_CACHE_DIR),
        rule_option_items=tuple(sorted((code, tuple(sorted(opts.items()))) for code, opts in rule_options.items())),
    )
