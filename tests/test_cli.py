"""End-to-end tests of `matlint check` and `matlint rule`, run as a user runs them."""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from matlint import cli
from matlint.registry import all_rules, get_rule
from matlint.runner import MIN_FILES_FOR_PARALLEL

from matlint_helpers import TRACEBACK, bad_example, fix_example, installed_script, run_matlint, write


@pytest.fixture
def project(tmp_path):
    """A project with one MAT101 finding (pkg/loops.py), one MAT502 file, and a clean file."""
    # Other rules may also fire on these examples; the config keeps the run to the two we plant.
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nselect = ["MAT101", "MAT502"]\n')
    write(tmp_path / "pkg" / "loops.py", bad_example("MAT101").code)
    write(tmp_path / "pkg" / "train.py", bad_example("MAT502").code)
    write(tmp_path / "pkg" / "clean.py", "import torch\n\nx = torch.zeros(3)\n")
    return tmp_path


def _json_findings(result) -> list:
    return json.loads(result.stdout)


def _expected(path: str, code: str) -> list:
    return [(path, row, col, code) for row, col in bad_example(code).expect]


def test_check_reports_findings_and_exits_1(project):
    result = run_matlint("check", "--format", "concise", cwd=project)
    assert result.returncode == 1, result.stderr
    expected = sorted(_expected("pkg/loops.py", "MAT101") + _expected("pkg/train.py", "MAT502"))
    got = sorted(tuple(line.split(": ")[0].split(":")) for line in result.stdout.splitlines() if ": MAT" in line)
    assert got == [(p, str(r), str(c)) for p, r, c, _ in expected]
    assert f"Found {len(expected)} warnings." in result.stdout
    assert result.stderr == ""


def test_default_path_is_current_directory(project):
    explicit = run_matlint("check", ".", "--format", "json", cwd=project)
    implicit = run_matlint("check", "--format", "json", cwd=project)
    assert _json_findings(explicit) == _json_findings(implicit) != []


def test_clean_tree_exits_0(tmp_path):
    write(tmp_path / "ok.py", "import torch\n\nx = 1\n")
    result = run_matlint("check", ".", cwd=tmp_path)
    assert result.returncode == 0
    assert "All checks passed!" in result.stdout


def test_exit_zero(project):
    result = run_matlint("check", "--exit-zero", cwd=project)
    assert result.returncode == 0
    assert "MAT101" in result.stdout


@pytest.mark.parametrize("args, codes", [
    (["--ignore", "MAT101"], {"MAT502"}),
    (["--select", "MAT5"], {"MAT502"}),
    (["--select", "MAT10"], {"MAT101"}),
    (["--select", "MAT101", "--extend-select", "MAT502"], {"MAT101", "MAT502"}),
    (["--select", "MAT1,MAT5", "--ignore", "MAT502"], {"MAT101"}),
    (["--extend-ignore", "MAT"], {"MAT101", "MAT502"}),  # the config's longer MAT101 and MAT502 win
    (["--extend-ignore", "MAT101,MAT502"], set()),  # ties go to ignore
    (["--select", "ALL"], {"MAT101", "MAT502"}),
])
def test_select_and_ignore(project, args, codes):
    result = run_matlint("check", "--format", "json", *args, cwd=project)
    found = {f["code"] for f in _json_findings(result)}
    assert found & {"MAT101", "MAT502"} == codes
    assert result.returncode == (1 if found else 0)


def test_unknown_selector_on_command_line_is_usage_error(project):
    result = run_matlint("check", "--select", "E501", cwd=project)
    assert result.returncode == 2
    assert "--select" in result.stderr and "E501" in result.stderr
    assert TRACEBACK not in result.stderr


def test_statistics_counts_per_code_sorted_by_count(project):
    result = run_matlint("check", "--statistics", cwd=project)
    assert result.returncode == 1
    rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    counts = {"MAT502": len(bad_example("MAT502").expect), "MAT101": len(bad_example("MAT101").expect)}
    assert [(row[1], int(row[0])) for row in rows] == sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert {row[2].strip(" [*]") for row in rows} == {get_rule(c).name for c in counts}


def test_output_file(project):
    result = run_matlint("check", "--format", "json", "--output-file", "report.json", cwd=project)
    assert result.returncode == 1
    assert result.stdout == ""
    report = json.loads((project / "report.json").read_text())
    assert {f["code"] for f in report} == {"MAT101", "MAT502"}


def _fix_project(tmp_path):
    rule, example = fix_example()
    target = write(tmp_path / "fixme.py", example.code)
    return rule, example, target


def test_fix_applies_fixes_and_reports_remaining(tmp_path):
    rule, example, target = _fix_project(tmp_path)
    flags = ["--unsafe-fixes"] if example.unsafe else []
    if example.unsafe:
        # Without --unsafe-fixes an unsafe fix is only offered.
        result = run_matlint("check", "--fix", "fixme.py", "--select", rule.code, cwd=tmp_path)
        assert target.read_text() == example.code
        assert "--unsafe-fixes" in result.stdout
    result = run_matlint("check", "--fix", *flags, "fixme.py", "--select", rule.code, cwd=tmp_path)
    assert target.read_text() == example.fixed_code
    assert "Fixed 1 finding." in result.stdout
    remaining = run_matlint("check", "fixme.py", "--select", rule.code, "--format", "json", cwd=tmp_path)
    assert result.returncode == (1 if _json_findings(remaining) else 0)


def test_diff_shows_fix_and_writes_nothing(tmp_path):
    rule, example, target = _fix_project(tmp_path)
    flags = ["--unsafe-fixes"] if example.unsafe else []
    result = run_matlint("check", "--diff", *flags, "fixme.py", "--select", rule.code, cwd=tmp_path)
    assert result.returncode == 1
    assert target.read_text() == example.code
    assert result.stdout.startswith("--- a/fixme.py\n+++ b/fixme.py\n")
    removed = [l[1:] for l in result.stdout.splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l[1:] for l in result.stdout.splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert removed and all(line in example.code.splitlines() for line in removed)
    assert added and all(line in example.fixed_code.splitlines() for line in added)
    assert "Would fix 1 finding." in result.stderr
    # Nothing left to fix: exit 0, no diff.
    target.write_text(example.fixed_code)
    again = run_matlint("check", "--diff", *flags, "--select", rule.code, "fixme.py", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == ""


def test_parallel_and_serial_runs_agree(tmp_path):
    source = bad_example("MAT101").code
    for i in range(MIN_FILES_FOR_PARALLEL + 5):
        write(tmp_path / f"m{i:03}.py", source if i % 3 == 0 else "import torch\n")
    args = ("check", "--format", "json", "--no-cache", "--select", "MAT101")
    serial = run_matlint(*args, "--jobs", "1", cwd=tmp_path)
    parallel = run_matlint(*args, "--jobs", "2", cwd=tmp_path)
    assert _json_findings(serial) == _json_findings(parallel)
    assert len(_json_findings(serial)) == len(range(0, MIN_FILES_FOR_PARALLEL + 5, 3)) * len(bad_example("MAT101").expect)


def test_jobs_must_be_positive(project):
    result = run_matlint("check", "--jobs", "0", cwd=project)
    assert result.returncode == 2 and "--jobs" in result.stderr


def test_console_script_and_version(project):
    result = subprocess.run([installed_script("matlint"), "check", "--format", "concise"], cwd=project,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "MAT101" in result.stdout
    from matlint import __version__

    assert run_matlint("--version", cwd=project).stdout.strip() == f"matlint {__version__}"


def test_no_subcommand_prints_help_and_exits_2(tmp_path):
    result = run_matlint(cwd=tmp_path)
    assert result.returncode == 2
    assert "check" in result.stderr and "rule" in result.stderr


def test_rule_lists_every_rule(tmp_path):
    result = run_matlint("rule", cwd=tmp_path)
    assert result.returncode == 0
    for cls in all_rules():
        line = next(l for l in result.stdout.splitlines() if l.startswith(cls.code))
        assert cls.name in line and cls.family() in line
        assert ("off by default" in line) == (not cls.default_enabled)


@pytest.mark.parametrize("key", ["MAT101", "mat101", "python-loop-matmul"])
def test_rule_shows_docs(tmp_path, key):
    result = run_matlint("rule", key, cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == get_rule("MAT101").rendered_docs()


def test_unknown_rule_exits_2(tmp_path):
    result = run_matlint("rule", "MAT999", cwd=tmp_path)
    assert result.returncode == 2 and "MAT999" in result.stderr


@pytest.mark.parametrize("command, extra", [("server", "server"), ("run", "guard")])
def test_optional_command_without_its_extra(tmp_path, command, extra):
    module = cli.OPTIONAL_COMMANDS[command][0]
    # sys.modules[name] = None makes `import name` fail as if the package were not installed.
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            f"from matlint.cli import main; sys.exit(main([{command!r}]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert f"pip install 'matlint[{extra}]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and TRACEBACK not in result.stderr


def test_unexpected_error_prints_one_line_not_a_traceback(project, monkeypatch, capsys):
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("matlint.files.FileFinder.find", explode)
    monkeypatch.chdir(project)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and TRACEBACK not in err


def test_rule_crash_becomes_mat000_for_that_file_only(project, monkeypatch, capsys):
    import matlint.engine

    real = matlint.engine.lint_bytes

    def crash_on_train(data, filename, *args, **kwargs):
        if filename.endswith("train.py"):
            raise ValueError("rule bug")
        return real(data, filename, *args, **kwargs)

    monkeypatch.setattr(matlint.engine, "lint_bytes", crash_on_train)
    monkeypatch.chdir(project)
    assert cli.main(["check", "--no-cache", "--jobs", "1", "--format", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)
    by_file = {(f["filename"], f["code"]) for f in findings}
    assert ("pkg/train.py", "MAT000") in by_file
    assert ("pkg/loops.py", "MAT101") in by_file
    assert not any(code == "MAT502" for _, code in by_file)


def _run_on_terminal(args, cwd, stream: str):
    """Run matlint with `stream` ('stdout' or 'stderr') attached to a pseudo-terminal; return what it wrote there."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env.update(TERM="xterm-256color", COLUMNS="120")
    kwargs = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: slave}
    process = subprocess.Popen([sys.executable, "-m", "matlint", *args], cwd=cwd, env=env, **kwargs)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    process.wait(timeout=60)
    os.close(master)
    return process.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_full_output_is_colored_on_a_terminal(project):
    code, text = _run_on_terminal(["check", "pkg/loops.py"], project, "stdout")
    assert code == 1
    assert "\x1b[" in text and "MAT101" in text


def test_progress_bar_on_a_terminal_for_many_files(tmp_path):
    for i in range(cli.PROGRESS_MIN_FILES + 10):
        write(tmp_path / f"m{i:03}.py", "import torch\nx = torch.ones(2)\n")
    code, text = _run_on_terminal(["check", "--no-cache"], tmp_path, "stderr")
    assert code in (0, 1)
    assert "Linting" in text
    quiet_code, quiet_text = _run_on_terminal(["check", "--no-cache", "--quiet"], tmp_path, "stderr")
    assert quiet_code == code and "Linting" not in quiet_text
    piped = run_matlint("check", "--no-cache", cwd=tmp_path)
    assert "Linting" not in piped.stderr


def test_no_python_files_is_a_warning_not_an_error(tmp_path):
    write(tmp_path / "README.md", "import torch\n")
    result = run_matlint("check", cwd=tmp_path)
    assert result.returncode == 0
    assert "no Python files found" in result.stderr
    assert run_matlint("check", "--quiet", cwd=tmp_path).stderr == ""


def test_fix_inside_a_per_head_loop_keeps_the_loop_reported(tmp_path):
    """examples/multihead_loop.py writes attention one head at a time. `--fix` must not turn it
    into one SDPA call per head, which would hide the loop (MAT101): both findings stay, and the
    MAT601 message asks for one call over all heads, as examples/multihead_loop_fixed.py has it."""
    source = (Path(__file__).parent.parent / "examples" / "multihead_loop.py").read_text()
    target = write(tmp_path / "multihead_loop.py", source)
    result = run_matlint("check", "--fix", "--unsafe-fixes", "--format", "json", "multihead_loop.py", cwd=tmp_path)
    assert target.read_text() == source
    found = {(f["code"], f["location"]["row"]) for f in _json_findings(result)}
    assert {("MAT101", 24), ("MAT601", 24), ("MAT101", 34)} <= found
    message = next(f["message"] for f in _json_findings(result) if f["code"] == "MAT601")
    assert "once per iteration of the `for h` loop on line 23" in message and "call SDPA once" in message
