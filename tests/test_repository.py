"""The repository keeps its promises: README commands, generated docs, example twins."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _readme_block(marker: str, language: str = "sh") -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split(marker, 1)[1]
    match = re.search(rf"```{language}\n(.+?)\n```", block, re.S)
    assert match, f"README lacks the block after {marker}"
    return match.group(1).strip()


def _readme_test_command() -> str:
    return _readme_block("<!-- test-command -->")


def _checkout_copy(dest: Path) -> Path:
    """The files a clone of this checkout has (tracked, and new files git does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path):
    """The README's first command, in a fresh copy of the checkout with no virtualenv: it installs
    matlint without torch, lints the examples, prints a finding per example site and a summary
    naming the count, and exits 1 because there are findings."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"## Quickstart.*?```sh\n(.+?)\n```", readme, re.S).group(1).strip()
    assert command.endswith("matlint check examples/")
    copy = _checkout_copy(tmp_path / "matlint")
    result = subprocess.run(["bash", "-c", command], cwd=copy, capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stdout + result.stderr
    headers = re.findall(r"^examples/\S+:(?:cell \d+:)?\d+:\d+: (MAT\d{3}) ", result.stdout, re.M)
    assert headers and "train_notebook.ipynb:cell " in result.stdout, result.stdout
    summary = f"Found {len(headers)} warning{'s' * (len(headers) != 1)}."
    assert summary in result.stdout
    assert f"(`{summary}`" in " ".join(readme.split()), "the README quotes the quickstart's summary as it is"
    installed = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
                               capture_output=True, text=True, check=True).stdout.lower()
    assert "torch==" not in installed


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert _readme_test_command() in commands


def test_generated_docs_are_current():
    result = subprocess.run([sys.executable, "-m", "matlint.docs", "--check", "--root", str(ROOT)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _check(paths):
    return subprocess.run([sys.executable, "-m", "matlint", "check", "--no-cache", "--format", "concise", *paths],
                          capture_output=True, text=True, cwd=ROOT)


def test_examples_have_findings_and_their_fixed_twins_have_none():
    examples = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "examples").glob("*.ipynb"))
    fixed = [p for p in examples if p.stem.endswith("_fixed")]
    assert fixed and any(p.suffix == ".ipynb" for p in fixed), "no fixed twins (of a .py and a notebook) in examples/"
    for twin in fixed:
        original = twin.with_name(twin.stem[: -len("_fixed")] + twin.suffix)
        assert original.exists(), f"{twin.name} has no original"
        bad = _check([str(original.relative_to(ROOT))])
        assert bad.returncode == 1 and bad.stdout.strip(), f"{original.name} should have findings:\n{bad.stdout}{bad.stderr}"
        good = _check([str(twin.relative_to(ROOT))])
        assert good.returncode == 0, f"{twin.name} should be clean:\n{good.stdout}{good.stderr}"


def test_sources_run_on_python_3_9():
    """matlint supports Python 3.9+: no syntax or stdlib API newer than that in the package."""
    result = subprocess.run([str(Path(sys.executable).with_name("vermin")), "--no-tips", "--violations", "-t=3.9-",
                             "matlint", "rules", "runtime_guard"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sources_have_no_unused_imports_or_names():
    """pyflakes finds nothing in the package: no unused import or local, no undefined name. The
    rule fixtures are left out: they are example programs, not package code."""
    sources = [str(p) for d in ("matlint", "rules", "runtime_guard") for p in sorted((ROOT / d).rglob("*.py"))
               if "fixtures" not in p.parts]
    result = subprocess.run([sys.executable, "-m", "pyflakes", *sources], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
