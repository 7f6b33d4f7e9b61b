"""The guard's sync detector (runtime_guard/syncs.py): torch's warnings at each op that waits for
the GPU become MAT502 counts per user line; other warnings pass through. On CUDA torch raises
them (`torch.cuda.set_sync_debug_mode("warn")`); here they are raised as torch raises them, from
the op's call site."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from matlint.runtime_guard.capture import Recorder, Recording  # noqa: E402
from matlint.rules.mat502_host_sync_in_loop.runtime import check_host_syncs  # noqa: E402
from matlint.runtime_guard.checks import DeviceContext  # noqa: E402
from matlint.runtime_guard.syncs import SYNC_WARNING, SyncWatch  # noqa: E402


def boolean_mask_step(x):
    warnings.warn(SYNC_WARNING, UserWarning)  # where `x[x > 0]` would warn: the user's line
    return x.sum()


@pytest.fixture
def watch():
    w = SyncWatch(Recorder(profile_cuda=False))
    w.listen()
    yield w
    w.stop()


def test_each_sync_is_counted_at_the_users_line(watch):
    for _ in range(3):
        boolean_mask_step(torch.ones(3))
    (site, count), = watch.recorder.rec.syncs.items()
    assert count == 3 and site.function == "boolean_mask_step"
    assert "SYNC_WARNING, UserWarning" in open(site.filename).read().splitlines()[site.lineno - 1]


def test_other_warnings_still_reach_the_user(watch):
    with pytest.warns(DeprecationWarning, match="old api"):
        warnings.warn("old api", DeprecationWarning)
    assert not watch.recorder.rec.syncs


def test_stopping_restores_the_warnings_machinery():
    before_show, before_filters = warnings.showwarning, list(warnings.filters)
    w = SyncWatch(Recorder(profile_cuda=False))
    w.listen()
    w.stop()
    assert warnings.showwarning is before_show and warnings.filters == before_filters


def test_the_detectors_syncs_become_mat502_per_step(watch):
    for _ in range(4):
        boolean_mask_step(torch.ones(3))
    rec = watch.recorder.rec
    (finding,) = check_host_syncs(rec, 2, DeviceContext("cuda", (9, 0)))
    assert finding.code == "MAT502" and finding.evidence["per_step"] == 2
    assert finding.evidence["found_by"] == "torch.cuda.set_sync_debug_mode"
    assert "sync detector" in finding.message


def test_a_recording_absorbs_the_sync_counts():
    a, b = Recording(), Recording()
    a.syncs["s"] = 2
    b.syncs["s"] = 3
    a.absorb(b)
    assert a.syncs == {"s": 5}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's sync detector watches CUDA")
def test_on_cuda_every_sync_of_a_step_is_found_at_its_line(tmp_path):
    from matlint.runtime_guard.session import Guard

    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 64, device="cuda")
    lines = {}
    with Guard(json_path=None, report=False, estimate_savings=False) as g:
        for _ in range(6):
            y = model(x)
            for _ in range(2):  # the guard reports a line that syncs at least twice a step
                kept = y[y > 0]; lines["mask"] = kept  # noqa: E702
                idx = torch.nonzero(y > 1); lines["nonzero"] = idx  # noqa: E702
            loss = y.square().mean() + kept.sum() * 0
            loss.backward()
            opt.step()
            opt.zero_grad()
    source = open(__file__).read().splitlines()
    reported = {source[f.row - 1].strip().split(";")[0] for f in g.findings if f.code == "MAT502"}
    assert "kept = y[y > 0]" in reported and "idx = torch.nonzero(y > 1)" in reported, [
        (f.row, f.message) for f in g.findings]
    assert not any("opt.step()" in line for line in reported)  # the guard's own timing syncs
