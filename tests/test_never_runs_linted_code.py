"""The linter reads the code it lints and never imports or runs it: every planted file here
would write a marker file if Python executed it."""
from __future__ import annotations

import subprocess

from matlint_helpers import TRACEBACK, bad_example, installed_script, write

PLANT = "import pathlib, torch\npathlib.Path({marker!r}).write_text('ran {name}')\n"


def _plant(root):
    marker = root / "MARKER"
    for name in ("model.py", "conftest.py", "setup.py", "pkg/__init__.py", "pkg/__main__.py", "sitecustomize.py",
                 "matlint.py", "torch.py", "stubs.pyi"):
        write(root / name, PLANT.format(marker=str(marker), name=name) + bad_example("MAT101").code)
    # A config that names the planted module as if it were a plugin or a hook.
    write(root / "pyproject.toml", "[tool.matlint]\nselect = ['ALL']\n\n[project]\nname = 'model'\n"
                                   "[project.entry-points.'matlint.rules']\nx = 'model:run'\n")
    return marker


def test_cli_api_and_flake8_never_run_the_linted_code(tmp_path):
    marker = _plant(tmp_path)
    # The console scripts, as users run them (`python -m` would put the planted matlint.py first on sys.path).
    matlint = installed_script("matlint")
    result = subprocess.run([matlint, "check", "--no-cache", "."], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and TRACEBACK not in result.stderr and "MAT101" in result.stdout
    result = subprocess.run([matlint, "check", "--no-cache", "--fix", "--unsafe-fixes", "--jobs", "2", "."],
                            cwd=tmp_path, capture_output=True, text=True)
    assert TRACEBACK not in result.stderr
    script = f"import matlint; assert matlint.check({str(tmp_path)!r})"
    subprocess.run([installed_script("python"), "-c", script], cwd=tmp_path.parent, check=True, timeout=120)
    result = subprocess.run([installed_script("flake8"), "--select", "MAT", "."], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert "MAT101" in result.stdout and TRACEBACK not in result.stderr
    assert not marker.exists(), marker.read_text()


def test_the_plant_would_have_run_if_imported(tmp_path):
    # The check above can fail: importing the planted module does write the marker.
    marker = _plant(tmp_path)
    subprocess.run([installed_script("python"), "-c", "import sys; sys.path.remove(''); import model"],
                   cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False, timeout=120)
    assert marker.read_text() == "ran model.py"
