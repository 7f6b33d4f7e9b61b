"""Helpers shared by the end-to-end tests: run the real command line, and take test inputs
from the rules' own examples so the tests follow the rules as they evolve."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from matlint.registry import all_rules, get_rule

TRACEBACK = "Traceback (most recent call last)"


def installed_script(name: str) -> str:
    """A console script of this environment (next to the interpreter), else the one on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed"
    return found


def run_matlint(*args, cwd, env=None, input=None) -> subprocess.CompletedProcess:
    """`python -m matlint ARGS` in a subprocess, as a user would run it."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "matlint", *map(str, args)], cwd=cwd, env=full_env,
                          input=input, capture_output=True, text=True, timeout=300)


def bad_example(code: str):
    """The first example of rule `code` that has findings."""
    return next(e for e in get_rule(code).examples if e.expect)


def fix_example():
    """(rule, example) for some example with a bad -> fixed pair."""
    for rule in all_rules():
        for example in rule.examples:
            if example.fixed_code is not None and example.expect:
                return rule, example
    raise LookupError("no rule has a fix example")


def write(path: Path, text) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def lines(g, code):
    """The rows of a guard's findings of `code`, sorted."""
    return sorted(f.row for f in g.findings if f.code == code)


def this_line(fn):
    """Line numbers of `fn` holding the marker comment `# <- here`."""
    import inspect

    src, start = inspect.getsourcelines(fn)
    return [start + i for i, line in enumerate(src) if "# <- here" in line]
