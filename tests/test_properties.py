"""Property tests over generated programs (the CI-sized slice; benchmarks/fuzz.py is the long run).

For every program: linting never raises and never reports MAT000; a file that does not parse
gets one MAT001/MAT002; fixes give source that parses and a second pass changes nothing; each
safe fix removes its finding and adds none of another code; CRLF gives the same findings as LF.
Set MATLINT_PROPERTY_SCALE (a factor, default 1) for a longer local run.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matlint.registry import all_rules

import program_strategies as programs

SCALE = float(os.environ.get("MATLINT_PROPERTY_SCALE", "1"))
# derandomize: CI sees the same programs on every run, so a failure reproduces.
BASE = settings(deadline=None, derandomize=True, database=None)


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def _stdlib_files(limit_bytes: int) -> list:
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return [p.read_text(encoding="utf-8") for p in paths if p.stat().st_size <= limit_bytes]


SEEDS = programs.seed_files() + _stdlib_files(12_000)


def test_generated_torch_programs_hold_the_properties_and_reach_the_rules():
    reached = set()

    # Composing whole modules is slower than hypothesis expects of one example.
    @settings(BASE, max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
    @given(programs.torch_programs())
    def holds(source):
        problems, findings = programs.check_program_findings(source)
        assert not problems, problems
        reached.update(f.code for f in findings)

    holds()
    rule_codes = {r.code for r in all_rules() if not r.code.startswith("MAT0")}
    missed = sorted(rule_codes - reached)
    # The generator must reach the rules' visit code, or the properties above say little.
    assert len(missed) <= len(rule_codes) // 5, f"no generated program triggered {missed}"


# hypothesmith compiles its programs to keep the valid ones; `1()` and the like warn there.
@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@settings(BASE, max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(hypothesmith.from_grammar().map(programs.with_torch_header))
def test_grammar_generated_programs_hold_the_properties(source):
    assert "torch" in source  # so the engine's pre-filter does not skip it
    assert programs.check_program(source) == []


@settings(BASE, max_examples=examples(1000))
@given(st.sampled_from(SEEDS), st.randoms(use_true_random=False), st.integers(1, 4), st.booleans())
def test_mutated_real_files_hold_the_properties(base, rng, rounds, keep_parsing):
    mutator = programs.mutate_until_parses if keep_parsing else programs.mutate
    assert programs.check_program(mutator(base, rng, rounds)) == []


@settings(BASE, max_examples=examples(500))
@given(st.sampled_from([s for s in SEEDS if "torch" in s[:400]]), st.floats(0, 1))
def test_a_truncated_file_gives_a_syntax_error_not_an_internal_error(base, where):
    source = base[:int(len(base) * where)]
    findings = programs._lint(source)
    codes = [f.code for f in findings]
    assert "MAT000" not in codes
    if "torch" in source and not programs.parses(source):
        assert codes in (["MAT001"], ["MAT002"])


def test_the_generators_produce_code_the_properties_are_about():
    """Guard against vacuous runs: generated programs parse, mention torch and reach fixes;
    mutations include files that do not parse."""
    torch_sources, mutated = [], []

    @settings(BASE, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
    @given(programs.torch_programs(), st.sampled_from(SEEDS), st.randoms(use_true_random=False))
    def collect(source, base, rng):
        torch_sources.append(source)
        mutated.append(programs.mutate(base, rng, 3))

    collect()
    assert all(programs.parses(s) and "torch" in s for s in torch_sources)
    assert sum(any(f.fix for f in programs._lint(s)) for s in torch_sources) >= 10
    assert any(not programs.parses(s) for s in mutated)


def test_the_property_check_catches_a_crashing_rule(monkeypatch):
    rule = next(r for r in all_rules() if r.code == "MAT301")
    source = "import torch\ndef attn(q, k):\n    return torch.matmul(q, k.transpose(-2, -1).contiguous())\n"
    assert programs.check_program(source) == []

    def boom(self, node):
        raise KeyError("planted")

    for name in [n for n in dir(rule) if n.startswith("visit_")]:
        monkeypatch.setattr(rule, name, boom)
    problems = programs.check_program(source)
    assert problems and "MAT000" in problems[0] and "planted" in problems[0]


def test_the_property_check_catches_a_fix_that_is_not_idempotent(monkeypatch):
    import matlint.rules.mat303_view_after_transpose as mat303

    source = "import torch as T\ndef f(x):\n    return x.permute(0, 2, 1).view(-1)\n"
    assert programs.check_program(source) == []
    monkeypatch.setattr(mat303.ViewAfterTranspose, "_fix",
                        lambda self, func: self.replace(func, self.ctx.segment(func), "a fix that changes nothing"))
    problems = programs.check_program(source)
    assert any("not idempotent" in p for p in problems), problems


def test_minimize_keeps_the_failing_line_only():
    source = "".join(f"line{i}\n" for i in range(40))
    assert programs.minimize(source, lambda s: "line17" in s) == "line17\n"


@pytest.mark.parametrize("source", [
    # mutated stdlib code: the compiler's warnings about the linted file leaked to stderr
    'import torch\nx = re.compile("\\s+\\d")\n',
], ids=["compiler-warnings"])
def test_regressions(source):
    assert programs.check_program(source) == []
