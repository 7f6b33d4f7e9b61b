"""The built wheel: layout (rules/ and runtime_guard/ only inside matlint/), metadata (torch only
under the `guard` extra), a static lint from the wheel that never imports torch nor reads the
rules' examples, and the examples (package data) read from the wheel."""
from __future__ import annotations

import email
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from matlint_helpers import bad_example, write

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _source_files() -> list:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout (the build writes build/ and egg-info dirs)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for name in _source_files():
        if (REPO / name).is_file() and not name.startswith(("vscode-extension/", "benchmarks/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(source), "-w", str(work / "dist")]
    if importlib.util.find_spec("setuptools") is not None:
        command.insert(4, "--no-build-isolation")  # offline and faster; CI without setuptools builds isolated
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = (work / "dist").glob("matlint-*.whl")
    return built


def _names(wheel: Path) -> list:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
        return archive.read(path).decode()


def test_wheel_layout(wheel):
    names = _names(wheel)
    assert "matlint/__init__.py" in names and "matlint/cli.py" in names
    assert "matlint/rules/__init__.py" in names
    # every module of rules/: the rules that are packages (their runtime halves too) and the fixtures
    for path in (REPO / "rules").rglob("*.py"):
        assert f"matlint/rules/{path.relative_to(REPO / 'rules').as_posix()}" in names
    assert any(n.startswith("matlint/rules/mat601_manual_attention/") for n in names)
    assert any(n.startswith("matlint/runtime_guard/") for n in names)
    for path in (REPO / "runtime_guard").glob("*.py"):
        assert f"matlint/runtime_guard/{path.name}" in names
    top_level = {n.split("/")[0] for n in names}
    assert top_level == {"matlint", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert not any(n.startswith(("rules/", "runtime_guard/", "tests/")) for n in names)


def test_wheel_metadata_keeps_torch_in_the_guard_extra(wheel):
    metadata = email.message_from_string(_dist_info(wheel, "METADATA"))
    requires = metadata.get_all("Requires-Dist") or []
    torch = [r for r in requires if r.split(";")[0].strip().lower().startswith("torch")]
    assert torch, "torch is declared (for the guard)"
    assert all("extra ==" in r and "guard" in r.split(";", 1)[1] for r in torch), torch
    assert "guard" in (metadata.get_all("Provides-Extra") or [])


def test_wheel_entry_points(wheel):
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "matlint = matlint.cli:run" in entry_points
    assert "MAT = matlint.flake8_plugin:MatlintFlake8" in entry_points


def test_static_lint_from_the_wheel_never_imports_torch(wheel, tmp_path):
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    # A `torch` that explodes on import, ahead of the real one: any import of torch fails loudly.
    write(tmp_path / "poison" / "torch" / "__init__.py", "raise ImportError('matlint imported torch')\n")
    target = write(tmp_path / "project" / "model.py", bad_example("MAT101").code)
    script = f"""
import sys, json
sys.path[:0] = [{str(unpacked)!r}, {str(tmp_path / 'poison')!r}]
import matlint
assert matlint.__file__.startswith({str(unpacked)!r}), matlint.__file__
findings = matlint.check({str(target)!r}, select="MAT101")
from matlint.cli import main
code = main(["check", "--no-cache", "--select", "MAT101", "--format", "json", {str(target)!r}])
from matlint.rule import load_examples
print(json.dumps({{"codes": [f.code for f in findings], "exit": code, "torch": "torch" in sys.modules,
                  "examples_read": load_examples.cache_info().currsize}}))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"codes": ["MAT101"] * len(bad_example("MAT101").expect), "exit": 1, "torch": False,
                      "examples_read": 0}


def test_rule_examples_and_listing_from_the_wheel(wheel, tmp_path):
    """The examples are package data: `Rule.examples` and `matlint rule` (its fix column comes
    from them) read them from the installed package."""
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    script = f"""
import sys, json
sys.path[:0] = [{str(unpacked)!r}]
import matlint
from matlint.registry import all_rules
from matlint.cli import main
assert matlint.__file__.startswith({str(unpacked)!r}), matlint.__file__
print(json.dumps({{r.code: len(r.examples) for r in all_rules()}}))
main(["rule"])
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    counts, listing = result.stdout.split("\n", 1)
    from matlint.registry import all_rules
    assert json.loads(counts) == {r.code: len(r.examples) for r in all_rules()}
    assert "MAT601" in listing and "unsafe" in listing
