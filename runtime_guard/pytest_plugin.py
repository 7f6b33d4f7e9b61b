"""pytest plugin: `@pytest.mark.matlint(select=[...])` or the `matlint_guard` fixture run a test
under the guard and fail it on findings of the selected codes. Imports torch only when used."""
from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "matlint(select=None, ignore=None, **options): run the test under matlint.guard and fail on findings",
    )


def _guard(**options):
    from matlint.runtime_guard.session import Guard

    options.setdefault("warmup", 0)
    options.setdefault("json_path", None)
    options.setdefault("report", False)
    options.setdefault("estimate_savings", False)
    return Guard(**options)


def _fail_on(g, nodeid):
    if g.findings:
        lines = [f"  {f.code} {f.filename}:{f.row}: {f.message}" for f in g.findings]
        pytest.fail(f"matlint guard: {len(g.findings)} finding(s) in {nodeid}\n" + "\n".join(lines), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("matlint")
    g = None
    if marker is not None:
        options = dict(marker.kwargs)
        if marker.args:
            options["select"] = marker.args
        g = _guard(**options)
        g.__enter__()
    try:
        result = yield
    finally:
        if g is not None:
            g.__exit__(None, None, None)
    # reached only when the test itself passed: its own failure stays the reported one
    for guard in filter(None, (g, getattr(item, "_matlint_fixture_guard", None))):
        if not guard._finished and guard.recorder.rec.ops:
            guard.finish()
        _fail_on(guard, item.nodeid)
    return result


@pytest.fixture
def matlint_guard(request):
    """A guard with default options (use it as `with matlint_guard:`); the test fails on its
    findings. For options (select, ignore, window) use the `matlint` marker."""
    g = _guard()
    request.node._matlint_fixture_guard = g
    return g
