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


class Breaking(nn.Module):
    """A branch on a tensor's value in forward: dynamo breaks the graph at the `if`."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # the graph break
            h = h * 2
        return h


def _lines(findings, code="MAT505"):
    return sorted((f.row, f.message) for f in findings if code == f.code)


def test_graph_breaks_in_the_window_are_reported_at_their_line(dynamo):
    torch.manual_seed(0)
    model = Breaking()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    g = quiet(select=["MAT505"])
    with g:
        compiled = torch.compile(model, backend="eager")
        for _ in range(4):
            train_step(compiled, opt, x)
    found = [f for f in g.findings if f.code == "MAT505"]
    branch_line = Breaking.forward.__code__.co_firstlineno + 2
    assert [(f.filename, f.row) for f in found] == [(__file__, branch_line)]
    assert "Data-dependent branching" in found[0].message
    assert found[0].evidence["hint"] and found[0].evidence["hint"] in found[0].message
    assert "is fundamental" not in found[0].evidence["hint"]  # a hint that says what to write
    assert found[0].evidence["reason"] == "Data-dependent branching"


def test_a_recompile_for_changing_shapes_is_reported_at_the_def_with_the_fix(dynamo):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = quiet(select=["MAT505"], window=4)
    with g:
        compiled = torch.compile(model, backend="eager", dynamic=False)
        for n in (4, 5, 6, 7, 8):
            train_step(compiled, opt, torch.randn(n, 32))
    found = [f for f in g.findings if f.code == "MAT505"]
    assert found and all("recompiled" in f.message and "mark_dynamic" in f.message for f in found)
    assert found[0].evidence["recompiles"] >= 1 and "size mismatch" in found[0].evidence["guard_failures"][0]


def test_breaks_before_the_guard_are_a_note_and_the_loggers_are_left_as_they_were(dynamo):
    import logging

    torch.manual_seed(0)
    model = Breaking()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    compiled = torch.compile(model, backend="eager")
    train_step(compiled, opt, x)  # compiled, with its break, before the guard
    loggers = [logging.getLogger(n) for n in ("torch._dynamo.symbolic_convert.__graph_breaks",
                                               "torch._dynamo.convert_frame.__graph_breaks")]
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    g = quiet(select=["MAT505"])
    with g:
        for _ in range(4):
            train_step(compiled, opt, x)
    assert [f for f in g.findings if f.code == "MAT505"] == []
    assert any("broke graphs for 1 reason(s)" in note and "before the guard watched" in note for note in g.notes), g.notes
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers] == before


def test_eager_code_has_no_compile_finding(dynamo):
    model, opt, x = make()
    g = quiet(select=["MAT505"])
    with g:
        for _ in range(4):
            train_step(model, opt, x)
    assert g.findings == [] and not any("torch.compile broke" in n for n in g.notes)


def test_dynamo_graph_break_messages_are_read_in_both_forms():
    from matlint.runtime_guard.compiles import parse_break

    first = ("Graph break in user code at /src/model.py:13\n"
             "Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call:\n\n"
             "Failed to trace builtin operator\n"
             "  Explanation: Dynamo does not know how to trace builtin operator `print`.\n"
             "  Hint: This graph break is fundamental - it is unlikely that Dynamo will ever trace it.\n"
             "  Hint: Avoid calling builtin `print`.\n  Hint: a second hint\n")
    site, brk = parse_break(first)
    assert (site.filename, site.lineno) == ("/src/model.py", 13)
    assert (brk.title, brk.hint) == ("Failed to trace builtin operator", "Avoid calling builtin `print`.")
    again = ("Graph break (user stack suppressed due to duplicate graph break) in user code at /src/model.py:13\n"
             "Graph Break Reason: Data-dependent branching\n  Explanation: Detected data-dependent branching.\n")
    site, brk = parse_break(again)
    assert (site.lineno, brk.title, brk.explanation) == (13, "Data-dependent branching", "Detected data-dependent branching.")
    assert parse_break("Recompiling function forward in /src/model.py:11") is None


def test_the_sync_of_a_branch_that_breaks_the_graph_is_the_breaks_finding_alone(dynamo):
    """`if h.sum() > 0:` in a compiled forward both breaks the graph and reads the value on the host:
    one cause, reported once, as MAT505 with dynamo's reason and hint. The same read in eager code
    is MAT502's."""
    torch.manual_seed(0)
    model = Breaking()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    branch_line = Breaking.forward.__code__.co_firstlineno + 2
    compiled_run, eager_run = quiet(select=["MAT502", "MAT505"]), quiet(select=["MAT502", "MAT505"])
    with compiled_run:
        compiled = torch.compile(model, backend="eager")
        for _ in range(4):
            train_step(compiled, opt, x)
    with eager_run:
        for _ in range(4):
            train_step(model, opt, x)
    assert [(f.code, f.row) for f in compiled_run.findings] == [("MAT505", branch_line)]
    assert [(f.code, f.row) for f in eager_run.findings] == [("MAT502", branch_line)]
