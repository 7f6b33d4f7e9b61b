"""The flake8 plugin, run through the real flake8 in a subprocess."""
from __future__ import annotations

import subprocess
import sys

import pytest

from matlint.flake8_plugin import rules_selected_by
from matlint.registry import all_rules
from matlint.rule import Rule

from matlint_helpers import TRACEBACK, bad_example, installed_script, write

FLAKE8 = installed_script("flake8")

# Runs flake8 in-process with the engine's entry points wrapped, so a test can see whether
# the plugin traversed anything and how often Python source was parsed.
PROBE = """
import ast, sys
import matlint.engine
calls = {"lint_tree": 0, "parse": 0}
real_lint_tree, real_parse = matlint.engine.lint_tree, ast.parse
def lint_tree(*a, **k):
    calls["lint_tree"] += 1
    return real_lint_tree(*a, **k)
def parse(*a, **k):
    calls["parse"] += 1
    return real_parse(*a, **k)
matlint.engine.lint_tree, ast.parse = lint_tree, parse
from flake8.main.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("PROBE", calls["lint_tree"], calls["parse"])
sys.exit(code)
"""


def flake8(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([FLAKE8, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


def probe(*args, cwd):
    result = subprocess.run([sys.executable, "-c", PROBE, "--jobs", "1", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    counts = result.stdout.strip().splitlines()[-1].split()
    return result, int(counts[1]), int(counts[2])


def _mat_lines(result, *codes) -> list:
    """flake8's MAT lines; with `codes`, only those (other rules may fire on the examples too)."""
    lines = [line for line in result.stdout.splitlines() if ": MAT" in line]
    return [line for line in lines if line.split(": ", 1)[1].split()[0] in codes] if codes else lines


@pytest.fixture
def project(tmp_path):
    write(tmp_path / "loops.py", bad_example("MAT101").code)
    write(tmp_path / "train.py", bad_example("MAT502").code)
    return tmp_path


def _expected(name: str, code: str) -> list:
    return [f"{name}:{row}:{col}: {code}" for row, col in bad_example(code).expect]


def test_default_run_reports_mat_findings_at_matlints_positions(project):
    result = flake8("loops.py", "train.py", cwd=project)
    assert result.returncode == 1, result.stderr
    got = [line.split(" ", 2)[0] + " " + line.split(" ", 2)[1] for line in _mat_lines(result, "MAT101", "MAT502")]
    assert sorted(got) == sorted(_expected("loops.py", "MAT101") + _expected("train.py", "MAT502"))
    assert TRACEBACK not in result.stderr


def test_messages_match_the_cli(project):
    from matlint import check

    result = flake8("--select", "MAT", "loops.py", cwd=project)
    messages = [line.split(": ", 1)[1] for line in _mat_lines(result)]
    assert messages == [f"{f.code} {f.message}" for f in check(project / "loops.py")]


def test_select_mat_reports_only_mat(project):
    result = flake8("--select", "MAT", "loops.py", "train.py", cwd=project)
    assert result.returncode == 1
    assert result.stdout.splitlines() == _mat_lines(result) and _mat_lines(result)


def test_select_mat5_runs_only_that_family(project):
    result = flake8("--select", "MAT5", "loops.py", "train.py", cwd=project)
    codes = {line.split(": ")[1].split()[0] for line in _mat_lines(result)}
    assert "MAT502" in codes and all(code.startswith("MAT5") for code in codes)


def test_no_traversal_when_no_mat_code_is_selected(project):
    result, traversals, parses = probe("--select", "E,F,W", "loops.py", cwd=project)
    assert traversals == 0 and not _mat_lines(result)
    result, traversals, _ = probe("--extend-ignore", "MAT", "loops.py", cwd=project)
    assert traversals == 0 and not _mat_lines(result)
    result, traversals, _ = probe("--select", "MAT", "loops.py", cwd=project)
    assert traversals == 1 and _mat_lines(result)


def test_rules_are_not_even_imported_when_no_mat_code_can_be_selected(project):
    script = ("import sys\nfrom flake8.main.cli import main\ntry:\n    main(sys.argv[1:])\n"
              "except SystemExit:\n    pass\nprint('RULES', 'matlint.registry' in sys.modules)\n")

    def rules_imported(*args) -> bool:
        result = subprocess.run([sys.executable, "-c", script, "--jobs", "1", *args, "loops.py"], cwd=project,
                                capture_output=True, text=True, timeout=120)
        return result.stdout.strip().splitlines()[-1] == "RULES True"

    assert not rules_imported("--select", "E,F,W")
    assert not rules_imported("--select", "E,MB", "--extend-select", "W")
    assert rules_imported("--select", "E,MA")
    assert rules_imported("--select", "E", "--extend-select", "MAT5")
    assert rules_imported()


def test_the_plugin_reuses_flake8s_tree(project):
    _, _, parses_without = probe("--select", "E,F,W", "loops.py", cwd=project)
    _, traversals, parses_with = probe("--select", "MAT", "loops.py", cwd=project)
    assert traversals == 1
    assert parses_with == parses_without  # no second parse of the file


def test_noqa(project):
    example = bad_example("MAT101")
    lines = example.code.splitlines()
    row = example.expect[0][0]
    lines[row - 1] += "  # noqa: MAT101"
    write(project / "loops.py", "\n".join(lines) + "\n")
    assert not [l for l in _mat_lines(flake8("--select", "MAT", "loops.py", cwd=project), "MAT101") if f":{row}:" in l]
    # a noqa for another code does not hide it
    lines[row - 1] = lines[row - 1].replace("MAT101", "MAT502")
    write(project / "loops.py", "\n".join(lines) + "\n")
    assert [l for l in _mat_lines(flake8("--select", "MAT", "loops.py", cwd=project), "MAT101") if f":{row}:" in l]


def test_file_level_matlint_noqa(project):
    write(project / "loops.py", "# matlint: noqa: MAT101\n" + bad_example("MAT101").code)
    assert not _mat_lines(flake8("--select", "MAT", "loops.py", cwd=project), "MAT101")


def test_per_file_ignores(project):
    result = flake8("--select", "MAT", "--per-file-ignores", "loops.py:MAT101", "loops.py", "train.py", cwd=project)
    assert {line.split(":")[0] for line in _mat_lines(result, "MAT101", "MAT502")} == {"train.py"}


def test_flake8_config_file(project):
    write(project / "setup.cfg", "[flake8]\nextend-ignore = MAT502\n")
    result = flake8("loops.py", "train.py", cwd=project)
    assert {line.split(":")[0] for line in _mat_lines(result, "MAT101", "MAT502")} == {"loops.py"}


class _DefaultOff(Rule):
    code = "MAT199"
    name = "test-default-off"
    summary = "a rule that is off unless selected"
    docs = ""
    default_enabled = False
    _handlers = {("visit", "Call"): ["visit_Call"]}

    def visit_Call(self, node):
        pass


@pytest.mark.parametrize("argv, on", [
    ([], False), (["--select", "MAT"], False), (["--select", "MAT1"], True), (["--extend-select", "MAT199"], True),
    (["--select", "MAT1", "--extend-ignore", "MAT19"], False), (["--select", "E"], False),
    (["--select", "M"], False), (["--select", "E,MA"], False), (["--select", "E,MAT19"], True),
    (["--select", "E,MB"], False),
])
def test_default_off_rules_need_a_longer_prefix(monkeypatch, argv, on):
    from flake8.options.parse_args import parse_args

    monkeypatch.setattr("matlint.registry.all_rules", lambda: all_rules() + (_DefaultOff,))
    _, options = parse_args(argv)
    selected = rules_selected_by(options)
    assert (_DefaultOff in selected) is on
    default_on = [cls for cls in all_rules() if cls._handlers and cls.default_enabled]
    if argv in ([], ["--select", "MAT"], ["--select", "M"], ["--select", "E,MA"]):
        assert list(selected) == default_on
    if argv in (["--select", "E"], ["--select", "E,MB"]):
        assert selected == ()


def test_rule_options_come_from_tool_matlint(tmp_path):
    write(tmp_path / "m.py", bad_example("MAT403").code)
    assert _mat_lines(flake8("--select", "MAT403", "m.py", cwd=tmp_path), "MAT403")
    write(tmp_path / "pyproject.toml", "[tool.matlint.rules.MAT403]\nmin_dim = 1000000000\n")
    assert not _mat_lines(flake8("--select", "MAT403", "m.py", cwd=tmp_path), "MAT403")
    write(tmp_path / "pyproject.toml", "[tool.matlint.rules.MAT403]\nmin_dim = 'big'\n")
    result = flake8("--select", "MAT403", "m.py", cwd=tmp_path)
    assert result.returncode != 0 and "rules.MAT403.min_dim" in result.stderr and TRACEBACK not in result.stderr
