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
matlint.__version__  # read on first use, from metadata that `nobody` cannot reach
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


# -- encodings, line endings, sizes ---------------------------------------------------

def _positions(findings, name, code="MAT101"):
    return [(f["location"]["row"], f["location"]["column"]) for f in findings
            if f["filename"] == name and f["code"] == code]


def test_bom_crlf_tabs_and_empty_files_lint_normally(tmp_path):
    example = bad_example("MAT101")
    write(tmp_path / "bom.py", b"\xef\xbb\xbf" + example.code.encode())
    write(tmp_path / "crlf.py", example.code.replace("\n", "\r\n").encode())
    write(tmp_path / "cr_only.py", example.code.replace("\n", "\r").encode())
    tabbed = "\n".join(line.replace("    ", "\t") for line in example.code.split("\n"))
    write(tmp_path / "tabs.py", tabbed)
    write(tmp_path / "empty.py", "")
    write(tmp_path / "bom_only.py", b"\xef\xbb\xbf")
    result, findings = _check(tmp_path, "--no-cache")
    assert result.returncode == 1
    assert not [f for f in findings if f["code"].startswith("MAT0")]
    for name in ("bom.py", "crlf.py", "cr_only.py"):
        assert _positions(findings, name) == list(example.expect), name
    # A tab is one character: the column moves left by the spaces each tab replaced.
    lines = example.code.split("\n")
    expected_tabs = []
    for row, column in example.expect:
        indent = len(lines[row - 1]) - len(lines[row - 1].lstrip(" "))
        expected_tabs.append((row, column - indent + indent // 4))
    assert _positions(findings, "tabs.py") == expected_tabs
    assert {f["filename"] for f in findings} == {"bom.py", "crlf.py", "cr_only.py", "tabs.py"}


def test_fixes_keep_the_bom_and_crlf(tmp_path):
    from matlint_helpers import fix_example

    rule, example = fix_example()
    write(tmp_path / "bom.py", b"\xef\xbb\xbf" + example.code.encode())
    write(tmp_path / "crlf.py", example.code.replace("\n", "\r\n").encode())
    result = run_matlint("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", rule.code, cwd=tmp_path)
    assert TRACEBACK not in result.stderr and result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "bom.py").read_bytes() == b"\xef\xbb\xbf" + example.fixed_code.encode()
    assert (tmp_path / "crlf.py").read_bytes() == example.fixed_code.replace("\n", "\r\n").encode()


def test_a_10_mb_file_is_linted(tmp_path):
    # Model code followed by a generated table, the shape of real multi-megabyte files.
    example = bad_example("MAT101")
    table = "".join(f"    ('w{i}', torch.float32, '{'0123456789abcdef' * 5}'),\n" for i in range(95_000))
    text = example.code + "\nTABLE = [\n" + table + "]\n"
    assert len(text.encode()) > 10_000_000
    write(tmp_path / "huge.py", text)
    write(tmp_path / "small.py", example.code)
    result, findings = _check(tmp_path, "--no-cache")
    assert result.returncode == 1
    assert _positions(findings, "huge.py") == _positions(findings, "small.py") == list(example.expect)
    assert not [f for f in findings if f["code"].startswith("MAT0")]


def test_python_2_source_is_named(tmp_path):
    write(tmp_path / "old.py", 'import torch\n\nprint "loss", torch.zeros(1)\n')
    write(tmp_path / "old_raise.py", 'import torch\nif torch.cuda.is_available():\n    raise ValueError, "gpu"\n')
    write(tmp_path / "good.py", bad_example("MAT101").code)
    result, findings = _check(tmp_path, "--no-cache")
    problems = {f["filename"]: f for f in findings if f["code"].startswith("MAT0")}
    assert set(problems) == {"old.py", "old_raise.py"}
    for name, row in (("old.py", 3), ("old_raise.py", 3)):
        assert problems[name]["code"] == "MAT001" and problems[name]["location"]["row"] == row
        assert "looks like Python 2" in problems[name]["message"]
    assert _positions(findings, "good.py") == list(bad_example("MAT101").expect)


def test_python_3_syntax_errors_do_not_claim_python_2(tmp_path):
    write(tmp_path / "typo.py", "import torch\nx = torch.ones(2\ny = 1\n")
    result, (finding,) = _check(tmp_path, "--no-cache")
    assert finding["code"] == "MAT001" and "Python 2" not in finding["message"]


# -- deep nesting ---------------------------------------------------------------------

DEEP_FILES = {
    # Python itself cannot compile these: one MAT001 each.
    "parens.py": "import torch\nx = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n",
    "long_chain.py": "import torch\nx = " + " + ".join(["torch.ones(1)"] * 100_000) + "\n",
}
# These compile, and nest deeper than the recursion limit: they lint like any file.
COMPILING_DEEP_FILES = {
    "sum.py": "x = " + " + ".join(["w"] * 2_500) + "\n",
    "power.py": "x = " + " ** ".join(["w"] * 900) + "\n",
    "methods.py": "x = w" + ".float()" * 900 + "\n",
    "lambdas.py": "f = " + "lambda: " * 900 + "w\n",
    "negations.py": "x = " + "-" * 2_000 + "w\n",
}


@pytest.fixture
def deep_tree(tmp_path):
    example = bad_example("MAT101")
    for name, text in DEEP_FILES.items():
        write(tmp_path / name, text)
    for name, text in COMPILING_DEEP_FILES.items():
        # The planted MAT101 finding, after the deep expression, must still be found.
        write(tmp_path / name, example.code + "\nw = torch.ones(2)\n" + text)
    return tmp_path


def test_deep_nesting_gives_one_finding_and_the_rest_is_linted(deep_tree):
    expect = bad_example("MAT101").expect
    for jobs in ("1", "2"):
        result, findings = _check(deep_tree, "--no-cache", "--jobs", jobs)
        problems = {f["filename"]: (f["code"], f["message"]) for f in findings if f["code"].startswith("MAT0")}
        assert problems == {"parens.py": ("MAT001", "file does not parse: too many nested parentheses "
                                          f"(Python {sys.version_info[0]}.{sys.version_info[1]} grammar)"),
                            "long_chain.py": ("MAT001", "file does not parse: nesting is too deep for the parser")}
        for name in COMPILING_DEEP_FILES:
            assert _positions(findings, name) == list(expect), name


def test_deep_nesting_in_parallel_workers(deep_tree):
    # --jobs 2 uses worker processes only from MIN_FILES_FOR_PARALLEL files on.
    from matlint.runner import MIN_FILES_FOR_PARALLEL

    for i in range(MIN_FILES_FOR_PARALLEL):
        write(deep_tree / "many" / f"m{i}.py", bad_example("MAT101").code)
    result, findings = _check(deep_tree, "--no-cache", "--jobs", "2")
    assert result.returncode == 1
    assert sorted(f["filename"] for f in findings if f["code"].startswith("MAT0")) == ["long_chain.py", "parens.py"]
    assert len({f["filename"] for f in findings if f["code"] == "MAT101"}) == MIN_FILES_FOR_PARALLEL + len(
        COMPILING_DEEP_FILES)


def test_deep_nesting_through_the_api_and_flake8(deep_tree):
    import matlint

    for name in COMPILING_DEEP_FILES:
        findings = matlint.check(deep_tree / name, select="MAT101")
        assert [(f.code, f.row, f.column) for f in findings] == [("MAT101", *p) for p in bad_example("MAT101").expect]
    from matlint_helpers import installed_script

    result = subprocess.run([installed_script("flake8"), "--select", "MAT", *COMPILING_DEEP_FILES],
                            cwd=deep_tree, capture_output=True, text=True, timeout=300)
    assert TRACEBACK not in result.stderr, result.stderr[-2000:]
    assert "MAT000" not in result.stdout


# -- config ----------------------------------------------------------------

def test_invalid_toml_is_a_usage_error_naming_file_and_line(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.matlint]\nselect = ['MAT1'\nignore = []\n")
    write(tmp_path / "good.py", bad_example("MAT101").code)
    result = run_matlint("check", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "" and TRACEBACK not in result.stderr
    assert str(tmp_path / "pyproject.toml") in result.stderr and "invalid TOML" in result.stderr
    assert "line 3" in result.stderr


def test_invalid_toml_of_another_tool_is_not_ours(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.black]\nline-length = = 3\n")
    write(tmp_path / "good.py", bad_example("MAT101").code)
    result, findings = _check(tmp_path, "--no-cache")
    assert result.returncode == 1 and _positions(findings, "good.py") == list(bad_example("MAT101").expect)


def test_deep_nesting_in_the_language_server_lint_paths(tmp_path):
    pytest.importorskip("pygls")
    from matlint.config import Settings
    from matlint.server import definition_cache, full_lint, quick_lint

    settings = Settings()
    expect = [("MAT101", *p) for p in bad_example("MAT101").expect]
    for name, text in {**DEEP_FILES, **COMPILING_DEEP_FILES}.items():
        source = bad_example("MAT101").code + "\nw = torch.ones(2)\n" + text
        findings, _ = full_lint(source, str(tmp_path / name), settings)
        if name in DEEP_FILES:
            assert [f.code for f in findings] == ["MAT001"], name
            continue
        assert [(f.code, f.row, f.column) for f in findings] == expect, name
        # An edit after the deep line: the quick path re-lints what changed, or declines.
        outcome = quick_lint(source + "y = 1\n", str(tmp_path / name), settings, definition_cache(source, findings))
        if outcome is not None:
            assert [(f.code, f.row, f.column) for f in outcome[0]] == expect, name
