"""The pytest plugin: a marker and a fixture that turn guard findings into test failures."""
from __future__ import annotations

import importlib.metadata

import pytest

pytest.importorskip("torch")
pytest_plugins = ["pytester"]

TESTS = '''
import pytest
import torch

W = torch.randn(8, 16, 16)


def looped():
    return [torch.randn(4, 16) @ W[h] for h in range(8)]


@pytest.mark.matlint(select=["MAT101"])
def test_marked_loop():
    looped()


@pytest.mark.matlint(select=["MAT101"])
def test_marked_batched():
    torch.bmm(torch.randn(8, 4, 16), W)


@pytest.mark.matlint(select=["MAT6"])
def test_marked_other_code():
    looped()


def test_unmarked_loop():
    looped()


def test_fixture_loop(matlint_guard):
    with matlint_guard:
        looped()


def test_fixture_clean(matlint_guard):
    with matlint_guard:
        torch.randn(4, 16) @ W[0]


@pytest.mark.matlint(select=["MAT101"])
def test_marked_failing_test_keeps_its_own_error():
    looped()
    assert 1 == 2, "the test's own assertion"
'''


def _plugin_args():
    names = {e.name for e in importlib.metadata.entry_points(group="pytest11")}
    return [] if "matlint" in names else ["-p", "matlint.runtime_guard.pytest_plugin"]


def test_marker_and_fixture(pytester):
    pytester.makepyfile(test_perf=TESTS)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=3)
    out = result.stdout.str()
    for name in ("test_marked_loop", "test_fixture_loop", "test_marked_failing_test_keeps_its_own_error"):
        assert f"FAILED test_perf.py::{name}" in out
    assert "MAT101" in out and "8 same-shape GEMMs per step" in out
    assert "the test's own assertion" in out
