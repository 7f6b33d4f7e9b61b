"""The pre-commit hook, run by the real `pre-commit try-repo` against throw-away repositories.
Building the hook's environment installs matlint from this checkout (and its dependencies
from the package index), so this is slow."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from matlint_helpers import bad_example, installed_script, write

REPO = Path(__file__).resolve().parents[1]
PRE_COMMIT = installed_script("pre-commit")

pytestmark = pytest.mark.slow


def test_hook_definition():
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "matlint" and hook["language"] == "python"
    assert hook["entry"] == "matlint check"
    assert hook["types_or"] == ["python", "pyi"]


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory):
    return tmp_path_factory.mktemp("pre-commit-home")


def _git_repo(path: Path, files: dict) -> Path:
    for name, text in files.items():
        write(path / name, text)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "."], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=path, check=True, env=env)
    return path


def _try_repo(project: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run([PRE_COMMIT, "try-repo", str(REPO), "matlint", "--all-files", "--verbose"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=900)


def test_hook_fails_on_a_finding(tmp_path, pre_commit_home):
    example = bad_example("MAT101")
    project = _git_repo(tmp_path / "bad", {"model.py": example.code, "README.md": "hello\n"})
    result = _try_repo(project, pre_commit_home)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    row, col = example.expect[0]
    assert f"model.py:{row}:{col}: MAT101" in output
    assert "Failed" in output


def test_hook_is_skipped_without_python_files(tmp_path, pre_commit_home):
    project = _git_repo(tmp_path / "docs", {"README.md": "# only docs\n", "data.txt": "import torch\n"})
    result = _try_repo(project, pre_commit_home)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Skipped" in output


def test_hook_passes_on_clean_python(tmp_path, pre_commit_home):
    project = _git_repo(tmp_path / "clean", {"model.py": "import torch\n\ny = torch.ones(2)\n"})
    result = _try_repo(project, pre_commit_home)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Passed" in output
