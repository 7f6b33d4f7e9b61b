"""The repository keeps its promises: README commands, generated docs, example twins."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- test-command -->", 1)[1]
    match = re.search(r"```sh\n(.+?)\n```", block, re.S)
    assert match, "README lacks the test command block"
    return match.group(1).strip()


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
    examples = sorted((ROOT / "examples").glob("*.py"))
    fixed = [p for p in examples if p.stem.endswith("_fixed")]
    assert fixed, "no fixed twins in examples/"
    for twin in fixed:
        original = twin.with_name(twin.stem[: -len("_fixed")] + ".py")
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
