"""The rules' runtime halves: each check and estimator is registered once, from the package of the
rule it belongs to (`rules/<rule>/runtime.py`), and a rule imports without torch."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from matlint.registry import all_rules, rules_by_code  # noqa: E402
from matlint.runtime_guard import registry  # noqa: E402


def test_every_runtime_check_belongs_to_a_rule_and_lives_in_its_package():
    checks = registry.checks()
    assert checks, "the guard has checks"
    by_code = rules_by_code()
    for code, check in checks.items():
        assert check.code == code
        assert code in by_code, f"runtime check {code} ({check.where}) has no rule"
        assert check.fn.__module__ == f"{by_code[code].__module__}.{registry.RUNTIME_MODULE}", \
            f"{code}'s runtime check is registered in {check.fn.__module__}, not in its rule's package"


def test_every_estimator_is_registered_from_a_rules_runtime_module():
    modules = set(registry.runtime_modules())
    for kind, entry in registry.estimators().items():
        assert entry.kind == kind and entry.fn.__module__ in modules, entry.where


def test_each_runtime_module_registers_its_rules_check():
    """A rule package with a `runtime` module registers a check for its own code there."""
    by_module = {check.fn.__module__: code for code, check in registry.checks().items()}
    for name in registry.runtime_modules():
        rule_module = name.rsplit(".", 1)[0]
        [rule] = [r for r in all_rules() if r.__module__ == rule_module]
        assert by_module.get(name) == rule.code, name


def test_the_rules_with_a_runtime_check_say_what_it_reports_in_their_docs():
    checked = set(registry.checks())
    for rule in all_rules():
        documented = "## At run time (`matlint.guard`)" in rule.rendered_docs()
        assert documented == (rule.code in checked), rule.code


def test_the_runtime_docs_state_the_thresholds_the_checks_use():
    from matlint.runtime_guard import checks
    from matlint.rules.mat101_python_loop_matmul.runtime import LOOP_MIN_PER_STEP
    from matlint.rules.mat401_no_mixed_precision.runtime import PRECISION_MIN_SHARE
    from matlint.rules.mat403_gemm_dim_not_multiple_of_8.runtime import PAD_MIN_SHARE
    from matlint.rules.mat502_host_sync_in_loop.runtime import SYNC_MIN_PER_STEP
    from matlint.rules.mat504_tiny_ops.runtime import TINY_KERNEL_US, TINY_MIN_PER_STEP

    by_code = rules_by_code()
    stated = {
        "MAT101": [f"at least {LOOP_MIN_PER_STEP} GEMMs"],
        "MAT401": [f"at least {PRECISION_MIN_SHARE:.0%}".replace("%", " %")],
        "MAT403": [f"at least {PAD_MIN_SHARE:.0%}".replace("%", " %")],
        "MAT501": [f"at least {checks.PER_ITEM_MIN_PER_STEP} ops", f"at most {checks.TINY_NUMEL} elements"],
        "MAT502": ["from two syncs a step" if SYNC_MIN_PER_STEP == 2 else f"{SYNC_MIN_PER_STEP}"],
        "MAT504": [f"at least {TINY_MIN_PER_STEP} small kernels", f"at most\n{checks.TINY_NUMEL} elements",
                   f"under {TINY_KERNEL_US:g} µs"],
    }
    for code, phrases in stated.items():
        text = by_code[code].runtime_docs
        for phrase in phrases:
            assert " ".join(phrase.split()) in " ".join(text.split()), (code, phrase)


def test_a_code_registered_twice_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_checks", {})
    monkeypatch.setattr(registry, "_estimators", {})
    registry.runtime_check("MAT101")(lambda rec, steps, ctx: ())
    with pytest.raises(registry.RegistrationError, match="MAT101 registered twice"):
        registry.runtime_check("MAT101")(lambda rec, steps, ctx: ())
    registry.estimator("loop")(lambda spec, budget: None)
    with pytest.raises(registry.RegistrationError, match="'loop' registered twice"):
        registry.estimator("loop")(lambda spec, budget: None)


def test_a_runtime_check_without_a_rule_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_checks", dict(registry.checks()))
    monkeypatch.setattr(registry, "_loaded", False)
    registry.runtime_check("MAT999")(lambda rec, steps, ctx: ())
    with pytest.raises(registry.RegistrationError, match="without a rule: MAT999"):
        registry.load()


def test_gpu_only_checks_are_declared_on_their_registration():
    checks = registry.checks()
    assert sorted(code for code, c in checks.items() if c.needs_gpu) == ["MAT401", "MAT403", "MAT504"]
    assert sorted(code for code, c in checks.items() if c.drop_negligible) == ["MAT401", "MAT403"]
    assert sorted(kind for kind, e in registry.estimators().items() if e.kernel_time_only) == ["bf16", "pad"]


def test_importing_the_rules_does_not_import_torch(tmp_path):
    """Every rule, the ones with a runtime half included, imports with a `torch` that raises on
    import: only the guard imports the `runtime` submodules."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('a rule imported torch')\n")
    script = f"""
import sys, json
sys.path.insert(0, {str(tmp_path)!r})
import importlib
import matlint.rules.mat101_python_loop_matmul
from matlint.registry import all_rules
from matlint.runtime_guard.registry import runtime_modules
rules = all_rules()
names = runtime_modules()
print(json.dumps({{"rules": len(rules), "runtime_modules": names, "torch": "torch" in sys.modules,
                  "runtime_imported": [n for n in names if n in sys.modules]}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["rules"] == len(all_rules()) and not report["torch"] and not report["runtime_imported"]
    assert len(report["runtime_modules"]) == len(registry.checks())
