"""torch.compile under the guard: attaching and detaching never recompiles (dynamo's counters),
whether the model was compiled before the guard or inside its window."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint.runtime_guard.capture import ModulePaths  # noqa: E402


@pytest.fixture
def dynamo():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()
    counters.clear()  # the guard reads "frames compiled so far" from them: later tests start clean


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(16, 32)


def train_step(fn, opt, x):
    loss = fn(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def compiled_frames(counters):
    return counters["frames"]["ok"], counters["stats"]["unique_graphs"]


def quiet(**options):
    return guard(**{"json_path": None, "report": False, "estimate_savings": False, **options})


def test_compiled_inside_the_window_is_not_recompiled_when_it_closes(dynamo):
    model, opt, x = make()
    g = quiet()
    losses = []
    with g:
        compiled = torch.compile(model, backend="aot_eager")
        for _ in range(8):  # the window closes after 2-3 steps; the rest run unobserved
            losses.append(train_step(compiled, opt, x))
    for _ in range(3):     # and after the guard
        losses.append(train_step(compiled, opt, x))
    assert compiled_frames(dynamo) == (1, 1)
    assert not g.recording and g.errors == []
    assert any(k.op in ("mm", "addmm") for k in g.recorder.rec.ops)  # the compiled graph's ops were seen
    # the same numbers as without the guard
    model2, opt2, _ = make()
    compiled2 = torch.compile(model2, backend="aot_eager")
    assert all(torch.equal(a, train_step(compiled2, opt2, x)) for a in losses)


def test_compiled_before_the_guard_is_not_recompiled(dynamo):
    model, opt, x = make()
    compiled = torch.compile(model, backend="aot_eager")
    train_step(compiled, opt, x)
    for _ in range(2):  # two guards, one after the other
        with quiet():
            for _ in range(5):
                train_step(compiled, opt, x)
    train_step(compiled, opt, x)
    assert compiled_frames(dynamo) == (1, 1)


def test_decorated_step_with_a_compiled_model(dynamo):
    model, opt, x = make()
    compiled = torch.compile(model, backend="aot_eager")
    g = quiet()

    @g
    def step():
        return train_step(compiled, opt, x)

    for _ in range(8):
        step()
    assert compiled_frames(dynamo) == (1, 1)
    assert g.findings is not None and g.errors == []


def test_the_counters_see_a_recompile_from_global_hooks(dynamo):
    """The control: global module hooks present while dynamo traces, then removed, recompile."""
    model, opt, x = make()
    paths = ModulePaths()
    paths.install()
    compiled = torch.compile(model, backend="aot_eager")
    train_step(compiled, opt, x)
    paths.remove()
    train_step(compiled, opt, x)
    assert compiled_frames(dynamo)[0] == 2
