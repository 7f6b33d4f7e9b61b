"""Bad input: each bad file gives exactly one MAT0xx finding naming its problem, the other files
are still linted, and no traceback ever reaches the user."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from matlint_helpers import TRACEBACK, bad_example, run_matlint, write

RUNNING_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def bad_tree(tmp_path):
    write(tmp_path / "good.py", bad_example("MAT101").code)
    write(tmp_path / "syntax.py", "import torch\n\ndef f(x:\n    return x\n")
    write(tmp_path / "latin1.py", "import torch\n# caf\xe9\n".encode("latin-1"))
    write(tmp_path / "nul.py", b"import torch\nx = 1\0\n")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "deleted.py")
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")  # ELOOP: cannot be opened, even by root
    write(tmp_path / "x.py" / "inner.py", "import torch\nx = torch.ones(1)\n")  # a directory named like a file
    return tmp_path


EXPECTED = {
    "syntax.py": ("MAT001", "does not parse"),
    "latin1.py": ("MAT004", "not valid UTF-8"),
    "nul.py": ("MAT004", "NUL byte"),
    "dangling.py": ("MAT003", "broken symbolic link"),
    "loop.py": ("MAT003", "symbolic links"),
}


def _check(bad_tree, *args):
    # Engine codes are reported whatever the selection; MAT101 is the one finding planted.
    result = run_matlint("check", *args, "--select", "MAT101", "--format", "json", cwd=bad_tree)
    assert TRACEBACK not in result.stderr
    assert result.stderr == "" or result.stderr.startswith("Found")
    return result, json.loads(result.stdout)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_each_bad_file_gets_one_finding_and_the_run_goes_on(bad_tree, jobs):
    result, findings = _check(bad_tree, "--jobs", jobs)
    assert result.returncode == 1
    by_file: dict = {}
    for f in findings:
        by_file.setdefault(f["filename"], []).append(f)
    for name, (code, words) in EXPECTED.items():
        assert len(by_file[name]) == 1, by_file.get(name)
        assert by_file[name][0]["code"] == code
        assert words in by_file[name][0]["message"]
    assert [(f["location"]["row"], f["location"]["column"]) for f in by_file["good.py"]] == \
        list(bad_example("MAT101").expect)
    assert set(by_file) == set(EXPECTED) | {"good.py"}


def test_bad_files_named_explicitly(bad_tree):
    names = sorted(EXPECTED)
    result, findings = _check(bad_tree, *names, "good.py")
    assert result.returncode == 1
    assert sorted((f["filename"], f["code"]) for f in findings if f["code"].startswith("MAT0")) == \
        sorted((name, EXPECTED[name][0]) for name in names)


def test_syntax_error_position_and_full_format(bad_tree):
    result = run_matlint("check", "syntax.py", cwd=bad_tree)
    assert result.returncode == 1
    assert result.stdout.startswith("syntax.py:3:")
    assert "MAT001" in result.stdout and TRACEBACK not in result.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="`type X = ...` parses on Python 3.12+")
def test_newer_syntax_names_the_python_it_needs(tmp_path):
    write(tmp_path / "new.py", "import torch\n\ntype Batch = torch.Tensor\n")
    result = run_matlint("check", "--format", "json", cwd=tmp_path)
    (finding,) = json.loads(result.stdout)
    assert finding["code"] == "MAT002" and "3.12" in finding["message"]


def test_nonexistent_path_is_a_usage_error(bad_tree):
    result = run_matlint("check", "good.py", "no/such/file.py", cwd=bad_tree)
    assert result.returncode == 2
    assert "no/such/file.py" in result.stderr and TRACEBACK not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("table, words", [
    ("[tool.matlint]\nselct = ['MAT1']\n", "selct"),
    ("[tool.matlint]\nrespect-gitignore = 'yes'\n", "respect-gitignore"),
    ("[tool.matlint]\nignore = ['MAT1', 'W605']\n", "W605"),
])
def test_bad_config_exits_2_naming_key_and_file(bad_tree, table, words):
    write(bad_tree / "pyproject.toml", table)
    result = run_matlint("check", cwd=bad_tree)
    assert result.returncode == 2
    assert words in result.stderr and str(bad_tree / "pyproject.toml") in result.stderr
    assert TRACEBACK not in result.stderr and result.stdout == ""


def test_stdout_closed_early_is_quiet(tmp_path):
    for i in range(200):
        write(tmp_path / f"m{i:03}.py", bad_example("MAT101").code)
    # `matlint check | head -1`: the reader goes away mid-report.
    command = f"{sys.executable} -m matlint check --no-cache | head -1"
    result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert result.stdout.startswith("m000.py:")
    assert TRACEBACK not in result.stderr and "Exception ignored" not in result.stderr


def test_unwritable_output_file_is_a_usage_error(bad_tree):
    result = run_matlint("check", "good.py", "--output-file", "no/such/dir/report.txt", cwd=bad_tree)
    assert result.returncode == 2
    assert "no/such/dir/report.txt" in result.stderr and TRACEBACK not in result.stderr


# Root reads everything, so as root the permission cases run as `nobody`: the interpreter
# imports all it needs first, then drops its privileges and runs the real command line.
UNPRIVILEGED = """
import os, sys
import matlint.api, matlint.cache, matlint.cli, matlint.config, matlint.engine, matlint.files, matlint.reporters
import matlint.runner
from matlint.registry import all_rules
all_rules()
os.setgid(65534)
os.setuid(65534)
sys.exit(matlint.cli.main(sys.argv[1:]))
"""


def run_without_privileges(*args, cwd):
    if not RUNNING_AS_ROOT:
        return run_matlint(*args, cwd=cwd)
    return subprocess.run([sys.executable, "-c", UNPRIVILEGED, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"}, timeout=120)


@pytest.fixture
def world_readable_tmp():
    """A directory `nobody` can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="matlint-perm-"))
    path.chmod(0o755)
    yield path
    for child in path.rglob("*"):
        if not child.is_symlink():
            child.chmod(0o755)
    shutil.rmtree(path)


def test_unreadable_file_and_directory(world_readable_tmp):
    root = world_readable_tmp
    write(root / "good.py", bad_example("MAT101").code).chmod(0o644)
    write(root / "secret.py", "import torch\n").chmod(0)
    write(root / "locked" / "inner.py", "import torch\n")
    (root / "locked").chmod(0)
    result = run_without_privileges("check", "--no-cache", "--jobs", "1", "--select", "MAT101", "--format", "json",
                                    cwd=root)
    assert TRACEBACK not in result.stderr and result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)
    problems = {f["filename"]: f["message"] for f in findings if f["code"].startswith("MAT0")}
    assert problems == {"locked": "cannot read the directory: Permission denied",
                        "secret.py": "cannot read the file: Permission denied"}
    assert [(f["location"]["row"], f["location"]["column"]) for f in findings if f["filename"] == "good.py"] == \
        list(bad_example("MAT101").expect)
