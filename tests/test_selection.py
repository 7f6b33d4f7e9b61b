"""One selector: the CLI, the flake8 plugin, the language server and the runtime guard switch on
the same codes for the same select/ignore pairs (the longest matching selector wins, `ignore`
wins ties, `ALL` selects everything).

Selectors given as options are compared where a surface takes options (CLI flags, flake8's
`--select`/`--ignore`, `guard(select=..., ignore=...)`); selectors in `[tool.matlint]` where a
surface reads the project's config (CLI, server, guard)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from matlint.registry import all_rules

from matlint_helpers import bad_example, installed_script, run_matlint, write

RULES = [cls.code for cls in all_rules() if not cls.code.startswith("MAT0") and any(e.expect for e in cls.examples)]

PAIRS = [
    (None, None),
    ("ALL", None),
    ("MAT101", "MAT1"),
    ("MAT1", "MAT101"),
    (None, "MAT5"),
    ("MAT6,MAT101", "MAT601"),
    ("MAT", "MAT2,MAT30"),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """One file per rule holding its first bad example: a code is on where its file reports it."""
    root = tmp_path_factory.mktemp("selection")
    for code in RULES:
        write(root / f"{code.lower()}.py", bad_example(code).code)
    return root


def _owned(found) -> set:
    """Codes reported in their own rule's file (an example may trigger other rules too)."""
    return {code for filename, code in found if filename == f"{code.lower()}.py"}


def cli_codes(root, select, ignore) -> set:
    flags = [*(["--select", select] if select else []), *(["--ignore", ignore] if ignore else [])]
    result = run_matlint("check", "--no-cache", "--format", "json", *flags, ".", cwd=root)
    return _owned((f["filename"], f["code"]) for f in json.loads(result.stdout))


def flake8_codes(root, select, ignore) -> set:
    flags = [f"--select={select or 'MAT'}", *([f"--ignore={ignore}"] if ignore else [])]
    result = subprocess.run([installed_script("flake8"), *flags, "."], cwd=root, capture_output=True,
                            text=True, timeout=300)
    return _owned(re.findall(r"^\./(\S+?):\d+:\d+: (MAT\d{3})", result.stdout, re.M))


def guard_codes(root, select, ignore, monkeypatch) -> set:
    pytest.importorskip("torch")
    from matlint.runtime_guard.session import Guard

    monkeypatch.chdir(root)
    return set(Guard(select=select, ignore=ignore, json_path=None, report=False).enabled_codes) & set(RULES)


def server_codes(root) -> set:
    pytest.importorskip("pygls")
    from matlint.server import MatlintServer

    settings = MatlintServer().project_settings(str(root / "m.py"), root)
    return set(settings.enabled_codes()) & set(RULES)


@pytest.mark.parametrize("select, ignore", PAIRS)
def test_options_select_the_same_codes_everywhere(project, select, ignore, monkeypatch):
    (project / "pyproject.toml").unlink(missing_ok=True)
    cli = cli_codes(project, select, ignore)
    assert guard_codes(project, select, ignore, monkeypatch) == cli
    if select != "ALL":  # flake8 has no ALL
        assert flake8_codes(project, select, ignore) == cli
    if select == "MAT101" and ignore == "MAT1":
        assert cli == {"MAT101"}


@pytest.mark.parametrize("select, ignore", PAIRS)
def test_the_project_config_selects_the_same_codes_everywhere(project, select, ignore, monkeypatch):
    table = "".join(f"{key} = {json.dumps(value.split(','))}\n" for key, value in
                    (("select", select), ("ignore", ignore)) if value)
    write(project / "pyproject.toml", f"[tool.matlint]\n{table}")
    try:
        cli = cli_codes(project, None, None)
        assert guard_codes(project, None, None, monkeypatch) == cli
        assert server_codes(project) == cli
    finally:
        (project / "pyproject.toml").unlink()


def test_guard_options_win_over_the_config(project, monkeypatch):
    write(project / "pyproject.toml", '[tool.matlint]\nignore = ["MAT101"]\n')
    try:
        assert "MAT101" not in guard_codes(project, None, None, monkeypatch)
        assert "MAT101" in guard_codes(project, "MAT1", None, monkeypatch)
    finally:
        (project / "pyproject.toml").unlink()


def test_guard_rejects_a_selector_that_names_no_rule(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from matlint.runtime_guard.session import Guard

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown rule selector"):
        Guard(select="MAT9", json_path=None)
