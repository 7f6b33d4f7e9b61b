"""Discovers rules: every module or package under `matlint.rules` whose name does not start
with `_` (a package's rule class is in its `__init__.py`).

Adding a rule is adding a file (or a package) there.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
from functools import lru_cache
from pathlib import Path

from .engine_codes import ENGINE_RULES
from .rule import CODE_RE, DOC_SECTIONS, NAME_RE, SEVERITIES, Rule


class RuleDefinitionError(Exception):
    pass


def _handlers(cls) -> dict:
    table: dict = {}
    for attr in dir(cls):
        for prefix in ("visit_", "leave_"):
            if attr.startswith(prefix):
                table.setdefault((prefix[:-1], attr[len(prefix):]), []).append(attr)
    return table


def _validate(cls) -> None:
    where = f"{cls.__module__}.{cls.__qualname__}"
    for attr in ("code", "name", "summary", "docs"):
        if not isinstance(getattr(cls, attr, None), str):
            raise RuleDefinitionError(f"{where}: missing `{attr}`")
    if not CODE_RE.match(cls.code):
        raise RuleDefinitionError(f"{where}: code {cls.code!r} is not MAT + 3 digits")
    if not NAME_RE.match(cls.name):
        raise RuleDefinitionError(f"{where}: name {cls.name!r} is not kebab-case")
    if cls.severity and cls.severity not in SEVERITIES:
        raise RuleDefinitionError(f"{where}: severity {cls.severity!r} is not one of {SEVERITIES}")
    missing = [s for s in DOC_SECTIONS if f"## {s}" not in cls.docs]
    if missing:
        raise RuleDefinitionError(f"{where}: docs lack sections {missing}")


@lru_cache(maxsize=None)
def all_rules() -> tuple:
    """Every rule class, engine codes first, sorted by code."""
    import matlint.rules as pkg

    found = list(ENGINE_RULES)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"matlint.rules.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                found.append(obj)
    seen_codes, seen_names = {}, {}
    for cls in found:
        _validate(cls)
        if cls.code in seen_codes:
            raise RuleDefinitionError(f"duplicate code {cls.code}: {seen_codes[cls.code]} and {cls.__module__}")
        if cls.name in seen_names:
            raise RuleDefinitionError(f"duplicate name {cls.name}")
        seen_codes[cls.code] = cls.__module__
        seen_names[cls.name] = cls.code
        cls._handlers = _handlers(cls)
    return tuple(sorted(found, key=lambda c: c.code))


@lru_cache(maxsize=None)
def rules_by_code() -> dict:
    return {cls.code: cls for cls in all_rules()}


def severity_of(code: str) -> str:
    """"error" or "warning" (see `Rule.level`); a code no rule has is a warning."""
    cls = rules_by_code().get(code)
    return cls.level() if cls is not None else "warning"


def get_rule(code_or_name: str):
    key = code_or_name.strip()
    by_code = rules_by_code()
    if key.upper() in by_code:
        return by_code[key.upper()]
    for cls in all_rules():
        if cls.name == key.lower():
            return cls
    return None


@lru_cache(maxsize=None)
def rules_fingerprint() -> str:
    """Changes whenever any rule's or the engine's source changes (keys the cache in dev installs)."""
    digest = hashlib.sha256()
    import matlint.rules as pkg

    roots = [Path(__file__).parent] + [Path(p) for p in pkg.__path__]
    for root in roots:
        # every module below, so the rules that are packages and matlint.semantic count too
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
