"""CI-sized slices of benchmarks/crash_free.py and benchmarks/fix_roundtrip.py, on the standard
library (present on every machine): no internal error, and fixes that parse and are stable."""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import crash_free  # noqa: E402
import fix_roundtrip  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Ordinary packages, and lib2to3's test data: Python 2 files and deliberately odd syntax.
SLICE = ["json", "email", "asyncio", "lib2to3/tests/data", "test/test_grammar.py", "test/badsyntax_3131.py"]


def test_every_rule_over_a_stdlib_slice_without_internal_errors():
    files = crash_free.python_files([STDLIB / p for p in SLICE if (STDLIB / p).exists()])
    assert len(files) > 60
    codes, internal, _, lines, _ = crash_free.run(files, jobs=2)
    assert internal == []
    assert lines > 20_000 and codes["MAT001"] >= 1  # the odd files were read, and reported as such


def test_fixes_on_planted_findings_parse_and_are_stable(tmp_path):
    from matlint.registry import all_rules

    project = tmp_path / "project"
    for rule in all_rules():
        for i, example in enumerate(rule.examples):
            if example.expect:
                (project / rule.code).mkdir(parents=True, exist_ok=True)
                (project / rule.code / f"example_{i}.py").write_text(example.code, encoding="utf-8")
    report = fix_roundtrip.roundtrip([project], jobs=2)
    assert report["fixes"] > 20 and report["changed"] > 20
    assert report["broken"] == [] and report["unstable"] == [] and report["second_run_fixes"] == 0
