"""`matlint run script.py [args]` behaves like `python script.py [args]` and reports at exit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "guard_fixtures"


def matlint_run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "matlint", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_run_keeps_argv_main_and_exit_code_and_writes_json(tmp_path):
    script = FIXTURES / "train_loop_matmul.py"
    out = tmp_path / "seen.json"
    proc = matlint_run("--window", "2", str(script), "8", str(out), "3", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(script), "8", str(out), "3"], "name": "__main__"}
    findings = json.loads((tmp_path / ".matlint" / "runtime.json").read_text())
    [f] = [f for f in findings if f["code"] == "MAT101"]
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "MAT101 here" in text)
    assert f["location"]["row"] == line and Path(f["filename"]) == script
    assert f["evidence"]["per_step"] == 8
    assert f["estimated_savings_ms"] is not None
    assert "MAT101" in proc.stderr and "python-loop-matmul" in proc.stderr  # the table


def test_run_json_path_and_select(tmp_path):
    script = FIXTURES / "train_loop_matmul.py"
    report = tmp_path / "r.json"
    proc = matlint_run("--json", str(report), "--select", "MAT6", "--no-estimate", str(script), "8",
                       str(tmp_path / "seen.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text()) == []
    assert not (tmp_path / ".matlint").exists()


def test_run_script_exception_exits_1_with_traceback(tmp_path):
    proc = matlint_run(str(FIXTURES / "raises.py"), cwd=tmp_path)
    assert proc.returncode == 1
    assert "ValueError: the script's own error" in proc.stderr


def test_run_missing_script(tmp_path):
    proc = matlint_run("nope.py", cwd=tmp_path)
    assert proc.returncode == 2 and "nope.py" in proc.stderr


@pytest.mark.parametrize("name,expected", [("guard_attention", {"MAT101", "MAT601"}),
                                           ("guard_attention_fixed", set())])
def test_examples_runtime_findings_match_their_fix(tmp_path, name, expected):
    script = Path(__file__).parent.parent / "examples" / f"{name}.py"
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((tmp_path / ".matlint" / "runtime.json").read_text())
    assert {f["code"] for f in findings} == expected
