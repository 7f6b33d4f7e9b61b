"""The pre-commit hook, run by the real `pre-commit try-repo` against throw-away repositories.
Building the hook's environment installs matlint from this checkout (and its dependencies
from the package index), so this is slow."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
    assert hook["types_or"] == ["python", "pyi", "jupyter"]


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


def _readme_config(marker: str) -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return re.search(r"```yaml\n(.+?)\n```", readme.split(marker, 1)[1], re.S).group(1) + "\n"


def _run_config(project: Path, config: str, home: Path) -> subprocess.CompletedProcess:
    """`pre-commit run --all-files` with the given .pre-commit-config.yaml, as a user runs it from
    the virtualenv that has matlint (its bin directory first on PATH)."""
    (project / ".pre-commit-config.yaml").write_text(config)
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([PRE_COMMIT, "run", "--all-files", "--verbose"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900)


def _notebook(code: str) -> str:
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# Notes\n"]},
                                 {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                  "source": code.splitlines(keepends=True)}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)


def _bad_and_clean_runs(tmp_path, config: str, home: Path):
    """A repository with a finding in a .py file and one in a notebook fails the hook with both;
    a clean one passes."""
    example = bad_example("MAT101")
    bad = _git_repo(tmp_path / "bad", {"model.py": example.code, "explore.ipynb": _notebook(example.code)})
    result = _run_config(bad, config, home)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    row, col = example.expect[0]
    assert f"model.py:{row}:{col}: MAT101" in output and "Failed" in output
    assert f"explore.ipynb:cell 2:{row}:{col}: MAT101" in output
    clean = _git_repo(tmp_path / "clean", {"model.py": "import torch\n\ny = torch.ones(2)\n"})
    result = _run_config(clean, config, home)
    assert result.returncode == 0 and "Passed" in result.stdout, result.stdout + result.stderr


def test_readme_local_hook_works_as_written(tmp_path, pre_commit_home):
    _bad_and_clean_runs(tmp_path, _readme_config("<!-- pre-commit-local -->"), pre_commit_home)


def test_readme_repo_form_works_with_a_clone_and_a_real_commit(tmp_path, pre_commit_home):
    clone = tmp_path / "matlint-clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.strip()
    config = _readme_config("<!-- pre-commit-repo -->")
    config = re.sub(r"repo: \S+.*", f"repo: {clone}", config)
    config = re.sub(r"rev: \S+.*", f"rev: {commit}", config)
    _bad_and_clean_runs(tmp_path, config, pre_commit_home)
