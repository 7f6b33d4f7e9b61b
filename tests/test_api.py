"""The public Python API: matlint.check, matlint.lint_text, lazy attributes, cheap import."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib.metadata import version

import pytest

import matlint
from matlint.config import Settings, load_settings

from matlint_helpers import bad_example, run_matlint, write


@pytest.fixture
def project(tmp_path, monkeypatch):
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "pkg" / "loops.py", bad_example("MAT101").code)
    write(tmp_path / "pkg" / "train.py", bad_example("MAT502").code)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _positions(findings) -> list:
    return [(f.code, f.row, f.column) for f in findings]


def test_check_source_string():
    example = bad_example("MAT101")
    findings = matlint.check(example.code, select="MAT101")
    assert _positions(findings) == [("MAT101", row, col) for row, col in example.expect]
    assert {f.filename for f in findings} == {"<string>"}
    assert matlint.check(example.code, ignore="MAT1") == []
    assert matlint.check("import torch\nx = torch.ones(2)\n") == []


def test_check_paths_agrees_with_the_cli(project):
    cli = json.loads(run_matlint("check", "--format", "json", "--no-cache", cwd=project).stdout)
    for argument in (project, str(project), [project / "pkg"], ["pkg/loops.py", "pkg/train.py"], "pkg"):
        findings = matlint.check(argument)
        assert [f.code for f in findings] == [f["code"] for f in cli]
        assert [(f.row, f.column) for f in findings] == [(f["location"]["row"], f["location"]["column"]) for f in cli]


@pytest.mark.parametrize("select, ignore, codes", [
    ("MAT1", None, {"MAT101"}), (["MAT5"], None, {"MAT502"}), (None, ["MAT101"], {"MAT502"}), (None, "MAT", set()),
])
def test_check_select_and_ignore(project, select, ignore, codes):
    found = {f.code for f in matlint.check(project, select=select, ignore=ignore)}
    assert found & {"MAT101", "MAT502"} == codes


def test_check_reports_bad_files(project):
    write(project / "pkg" / "broken.py", "import torch\ndef f(:\n")
    (project / "pkg" / "gone.py").symlink_to(project / "nowhere.py")
    codes = {(f.filename.split("/")[-1], f.code) for f in matlint.check("pkg")}
    assert {("broken.py", "MAT001"), ("gone.py", "MAT003"), ("loops.py", "MAT101")} <= codes


def test_check_missing_path_raises_usage_error(project):
    from matlint.files import UsageError

    with pytest.raises(UsageError, match="missing.py"):
        matlint.check(project / "missing.py")


def test_lint_text_applies_settings_noqa_and_per_file_ignores(tmp_path):
    example = bad_example("MAT101")
    only_mat101 = Settings(select=("MAT101",))
    assert _positions(matlint.lint_text(example.code, "m.py", only_mat101)) == \
        [("MAT101", row, col) for row, col in example.expect]
    assert "MAT101" in {f.code for f in matlint.lint_text(example.code, "m.py", Settings())}
    assert "MAT101" not in {f.code for f in matlint.lint_text(example.code, "m.py", Settings(select=("MAT5",)))}
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nselect = ["MAT101"]\n'
          '[tool.matlint.per-file-ignores]\n"legacy/*" = ["MAT101"]\n')
    settings = load_settings(tmp_path)
    assert matlint.lint_text(example.code, str(tmp_path / "legacy" / "m.py"), settings) == []
    assert matlint.lint_text(example.code, str(tmp_path / "m.py"), settings)
    row = example.expect[0][0]
    lines = example.code.splitlines()
    lines[row - 1] += "  # noqa: MAT101"
    assert not [f for f in matlint.lint_text("\n".join(lines) + "\n", "m.py") if f.row == row and f.code == "MAT101"]


def test_version_matches_the_installed_metadata():
    assert matlint.__version__ == version("matlint")


def test_unknown_attribute():
    with pytest.raises(AttributeError):
        matlint.no_such_thing  # noqa: B018


def _modules_after(code: str) -> set:
    script = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_import_matlint_is_cheap():
    modules = _modules_after("import matlint")
    assert not {"torch", "rich", "matlint.runtime_guard", "matlint.engine"} & modules


def test_linting_never_imports_torch(tmp_path):
    write(tmp_path / "m.py", bad_example("MAT101").code)
    modules = _modules_after(f"import matlint; assert matlint.check({str(tmp_path)!r})")
    assert "torch" not in modules and "matlint.engine" in modules
    modules = _modules_after(f"from matlint.cli import main; main(['check', '--no-cache', {str(tmp_path)!r}])")
    assert "torch" not in modules and "matlint.runner" in modules


def test_guard_is_loaded_lazily():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the runtime guard needs torch (the `guard` extra)")
    script = ("import sys, matlint\n"
              "assert 'matlint.runtime_guard' not in sys.modules\n"
              "guard = matlint.guard\n"
              "from matlint.runtime_guard import guard as direct\n"
              "assert guard is direct and callable(guard)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
