"""Sliced observation (runtime_guard/slices.py): after the warm-up step, each observed step runs
the dispatch mode over one slice of the step; together the slices report what whole steps do."""
from __future__ import annotations

import pytest

from matlint.runtime_guard.slices import Call, Slicer, plan_slices

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402


# -- where a step is cut --------------------------------------------------------------------------
def _mlp_log(layers=8, ops_per_layer=10, optimizer_ops=40):
    """A Sequential's calls: the container (top level), its layers, then the optimizer's step."""
    log = [Call(0, 1, 2, 2)]
    for i in range(layers):
        log.append(Call(1, 100 + i, 2 + i * ops_per_layer, 0))
    forward = 2 + layers * ops_per_layer
    log.append(Call(1, 999, forward + 3, 0))
    return log, forward + 3 + optimizer_ops


def test_cuts_near_equal_shares_of_the_ops():
    log, total = _mlp_log(layers=8, optimizer_ops=5)  # 90 ops
    plan = plan_slices(log, total, 3)
    assert plan.slices == 3 and plan.calls == len(log)
    starts = [log[ordinal - 1].ops_before for ordinal, _ in plan.cuts]
    assert starts == [32, 62]  # the layer calls nearest 30 and 60
    assert [owner for _, owner in plan.cuts] == [103, 106]


def test_a_cut_prefers_a_call_straight_after_another_then_the_nearest_then_the_shallowest():
    log = [Call(0, 1, 0, 0),      # the model, top level
           Call(1, 2, 12, 5),     # after glue: ops the caller ran on its inputs (a permute)
           Call(2, 3, 13, 0),     # inside that call, straight after its start
           Call(1, 4, 14, 0),     # a sibling, straight after the last call ended
           Call(0, 5, 14, 0)]     # a top-level call as near
    plan = plan_slices(log, 24, 2)  # the target is 12: the nearest call free of glue
    assert plan.cuts == ((3, 3),)
    log[2] = Call(2, 3, 13, 1)
    assert plan_slices(log, 24, 2).cuts == ((4, 4),)  # as near as the top-level call, and deeper in
    log = [Call(0, 1, 0, 0), Call(1, 2, 10, 5), Call(2, 3, 11, 1), Call(0, 5, 12, 3)]
    assert plan_slices(log, 24, 2).cuts == ((4, 5),)  # all after glue: the nearest


def test_no_plan_without_a_call_to_cut_at():
    assert plan_slices([], 100, 4) is None
    assert plan_slices([Call(0, 1, 0, 0)], 100, 4) is None  # the one call is at the step's start
    assert plan_slices(_mlp_log()[0], 200, 1) is None


def test_a_far_call_still_makes_two_slices():
    # the optimizer's step holds most of the ops (a CPU optimizer's loop over the parameters)
    log = [Call(0, 1, 2, 2), Call(1, 2, 2, 0), Call(1, 3, 4, 0), Call(1, 9, 11, 0)]
    assert plan_slices(log, 51, 2).cuts == ((4, 9),)


def test_a_settled_optimizer_step_is_cut_off_and_the_other_slices_share_the_ops_before_it():
    # an optimizer whose state was made before the warm-up step is not observed again: its many ops
    # (AdamW's per-parameter `.item()`s) must not leave the forward in few, large slices
    log, total = _mlp_log(layers=8, optimizer_ops=400)
    assert [log[o - 1].ops_before for o, _ in plan_slices(log, total, 4).cuts] == [85]  # not settled: two slices
    log[-1] = log[-1]._replace(settled=True)
    plan = plan_slices(log, total, 4)
    assert plan.slices == 4 and plan.cuts[-1] == (len(log), 999)
    assert [log[o - 1].ops_before for o, _ in plan.cuts[:-1]] == [32, 52]  # the calls nearest thirds of the 85 ops before it
    assert plan_slices(log, total, 3, after=4).cuts == ((7, 105), (len(log), 999))  # re-planned after the 4th call
    assert plan_slices(log, total, 3, after=len(log)) is None  # the first slice ends where the optimizer begins


def test_replanning_divides_only_the_ops_after_a_call():
    log, total = _mlp_log(layers=8, optimizer_ops=5)
    plan = plan_slices(log, total, 3, after=4)  # thirds of the ops from the 4th call (22 ops in) on
    starts = [log[ordinal - 1].ops_before for ordinal, _ in plan.cuts]
    assert all(ordinal > 4 for ordinal, _ in plan.cuts) and starts == [42, 72]


def test_the_slicer_turns_the_mode_on_over_its_slice_and_its_preamble():
    events, ops = [], [0]
    slicer = Slicer(switch=lambda on: events.append(("mode", on)), dispatched=lambda: ops[0],
                    new_part=lambda: "part", preamble=lambda on: events.append(("preamble", on)), slices=4)
    owners = [object() for _ in range(5)]
    slicer.start_log()
    for i, owner in enumerate(owners):
        ops[0] = 10 * i
        slicer.on_call(owner, 1)
    ops[0] = 50
    assert slicer.end_log("last part") and slicer.plan.slices == 4
    assert slicer.parts == ["part"] * 5 + ["last part"]
    # the first slice observed, alike the warm-up's parts: the next step observes the second, calls
    # 2..3 (its preamble from call 1 on)
    slicer.keep("recording", lambda first, second: True)
    assert slicer.done[0] and slicer.observed[0] == [["part", "part"], ["recording"]]
    slicer.next_slice()
    assert slicer.index == 1 and not slicer.observed_from_start()
    for owner in owners:
        slicer.on_call(owner, 1)
    assert events == [("preamble", True), ("preamble", False), ("mode", True), ("mode", False)]
    assert slicer.step_ended_as_planned()


def test_a_slice_unlike_the_warm_up_is_observed_again_in_the_next_step():
    ops = [0]
    slicer = Slicer(switch=lambda on: None, dispatched=lambda: ops[0], new_part=lambda: "part",
                    preamble=lambda on: None, slices=2)
    slicer.start_log()
    for i in range(3):
        ops[0] = 10 * i
        slicer.on_call(object(), 1)
    ops[0] = 30
    assert slicer.end_log("last part") and slicer.plan.slices == 2
    unlike = lambda first, second: first[0] == second[0]  # each recording alike only itself
    slicer.keep("read gated to step 0", unlike)
    slicer.next_slice()
    assert slicer.index == 0 and not slicer.done[0]
    slicer.keep("plain", unlike)
    slicer.next_slice()
    assert slicer.index == 0  # its last two observations differ: a third
    slicer.keep("plain", unlike)
    assert slicer.done[0] and len(slicer.observed[0]) == 3
    slicer.next_slice()
    assert slicer.index == 1


def test_the_slice_of_an_optimizers_first_step_is_observed_next():
    """The warm-up step made the optimizer's state in its last slice: that slice is observed right
    after the first, so a run that ends early does not report the warm-up's one-off work."""
    ops = [0]
    slicer = Slicer(switch=lambda on: None, dispatched=lambda: ops[0], new_part=lambda: "part",
                    preamble=lambda on: None, slices=4)
    slicer.start_log()
    for i in range(6):
        ops[0] = 10 * i
        slicer.on_call(object(), 1)
    optimizer = object()
    ops[0] = 60
    slicer.on_call(optimizer, 1, True, False, True)  # its state is made in this step
    ops[0] = 90
    assert slicer.end_log("last part") and slicer.plan.slices == 4
    last = slicer.plan.slices - 1
    assert slicer.plan.cuts[-1][1] == id(optimizer) or slicer._makes_optimizer_state(last)
    slicer.keep("first", lambda first, second: True)
    slicer.next_slice()
    assert slicer.index == last
    slicer.keep("optimizer", lambda first, second: True)
    slicer.next_slice()
    assert slicer.index == 1  # then the others in turn


def test_a_short_run_does_not_count_the_optimizers_state_as_per_step_work():
    g, _ = _train(_quiet(), steps=5)
    made = {k.op for k in g.recorder.rec.ops if k.op in ("zeros_like", "empty_like")}  # AdamW's moments
    assert made == set()


def test_a_step_that_calls_other_modules_no_longer_fits_the_plan():
    events = []
    slicer = Slicer(switch=events.append, dispatched=lambda: len(events), new_part=lambda: None,
                    preamble=lambda on: None, slices=4)
    owners = [object() for _ in range(5)]
    slicer.start_log()
    for owner in owners:
        events.append("op")
        slicer.on_call(owner, 1)
    slicer.end_log(None)
    events.clear()
    slicer.next_slice()
    for owner in [owners[0], object(), object(), object(), owners[4]]:
        slicer.on_call(owner, 1)
    assert not slicer.step_ended_as_planned() and events[-1] is True  # observed to the step's end


def test_the_number_of_slices_is_checked():
    with pytest.raises(ValueError, match="slices"):
        guard(slices=0)


# -- what the slices report -----------------------------------------------------------------------
class Frames(nn.Module):
    """A time-major GRU whose output is permuted into a Linear (a layout finding across a call),
    and one shared Linear applied per frame group (a loop finding)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(40, 48)
        self.rnn = nn.GRU(48, 48)
        self.mix = nn.Linear(48, 48)
        self.head = nn.Linear(48, 10)

    def forward(self, x):                                  # (T, B, 40)
        h, _ = self.rnn(self.proj(x))
        groups = [self.mix(h[i]) for i in range(8)]        # one call per frame group
        h = h + torch.stack(groups).mean(0)
        return self.head(h.permute(1, 0, 2))               # (B, T, 10) from a permuted view


def _train(g, steps=20, gate=None, before=0):
    """`steps` steps under the guard `g`, after `before` steps without it."""
    torch.manual_seed(0)
    model = Frames()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(30, 16, 40), torch.randint(0, 10, (16, 30))
    for _ in range(before):
        F.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    dispatched = []
    with g:
        for step in range(steps):
            before = g.recorder.dispatched
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, 10), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen = loss.item()                             # a host sync every step
            if gate is not None and step % gate == 0:
                seen += logits.abs().max().item()          # ... and one every `gate` steps
            dispatched.append(g.recorder.dispatched - before)
    return g, dispatched


def _quiet(**options):
    return guard(json_path=None, report=False, estimate_savings=False, **options)


def _found(g):
    return sorted((f.code, f.row, (f.evidence or {}).get("per_step")) for f in g.findings)


def _forward_counts(rec):
    return {key: stat.count for key, stat in rec.ops.items()}


def test_slices_report_what_whole_steps_do():
    whole, _ = _train(_quiet(slices=1))
    for slices in (None, 2, 3):
        sliced, dispatched = _train(_quiet(slices=slices))
        assert sliced.sliced_into >= 2 and not sliced.errors
        # each sliced step sees less than the warm-up step, all of them together at least as much
        warm, sliced_steps = dispatched[0], dispatched[1:]
        assert max(sliced_steps) < warm and sum(sliced_steps) >= warm
        assert sliced.recorder.rec.steps == whole.recorder.rec.steps == 2
        assert _forward_counts(sliced.recorder.rec) == _forward_counts(whole.recorder.rec)
        assert _found(sliced) == _found(whole)
    codes = {code for code, _, _ in _found(whole)}
    assert {"MAT101", "MAT302", "MAT502"} <= codes


def test_a_gated_sync_in_one_slice_is_no_sync_per_step():
    g, _ = _train(_quiet(slices=3), steps=30, gate=100)
    lines = [row for code, row, _ in _found(g) if code == "MAT502"]
    assert len(lines) == 1  # the loss read every step; the gated read is not one a step
    assert g.sliced_into == 3


def test_a_run_that_ends_among_the_slices_reports_the_warm_up_step_for_the_rest():
    g, dispatched = _train(_quiet(slices=3), steps=2)
    assert g.sliced_into == 3 and not g.errors and dispatched[1] < dispatched[0]
    # the head's slice was never observed: its findings come from the warm-up step's parts
    assert {"MAT101", "MAT302"} <= {code for code, _, _ in _found(g)}
    assert g.recorder.rec.steps >= 1


def test_steps_that_stop_calling_the_warm_up_steps_modules_are_observed_whole():
    torch.manual_seed(0)
    model, extra = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)]), nn.Linear(16, 16)
    opt = torch.optim.SGD(list(model.parameters()) + list(extra.parameters()), lr=0.01)
    x = torch.randn(4, 16)
    g = _quiet(slices=3)
    with g:
        for step in range(12):
            out = model(x)
            if step >= 2:
                out = extra(out)  # a module the warm-up step did not call
            out.square().mean().backward()
            opt.step()
            opt.zero_grad()
    assert any("observed whole steps" in note for note in g.notes)
    assert g.sliced_into == 0 and g.recorder.rec.steps >= 1 and not g.errors
    assert any(k.module.endswith("Linear") for k in g.recorder.rec.ops)


def test_the_report_says_the_steps_were_sliced():
    import io

    from rich.console import Console

    from matlint.runtime_guard.report import print_report

    g, _ = _train(_quiet(slices=2))
    out = io.StringIO()
    print_report(g, Console(file=out, width=100))
    assert "2 step(s) observed (after the warm-up step, each in 2 slices)" in out.getvalue()


def test_matlint_run_takes_the_number_of_slices():
    from matlint.runtime_guard.cli import _parser, guard_options

    opts = _parser().parse_args(["--slices", "1", "train.py"])
    assert guard_options(opts)["slices"] == 1
    assert guard_options(_parser().parse_args(["train.py"]))["slices"] is None


def test_a_run_of_one_step_reports_the_warm_up_step_whole():
    one, _ = _train(_quiet(), steps=1)
    two, _ = _train(_quiet(slices=1), steps=3)  # whole steps: the warm-up step and one alike
    assert one.recorder.rec.steps == 1 and two.recorder.rec.steps == 2
    model_ops = lambda rec: {k: n for k, n in _forward_counts(rec).items() if k.module.startswith("Frames")}
    assert model_ops(one.recorder.rec) == {k: n // 2 for k, n in model_ops(two.recorder.rec).items()}
    assert {"MAT101", "MAT302"} <= {code for code, _, _ in _found(one)}


def test_the_decorator_form_slices_its_calls_as_steps():
    def decorated(**options):
        torch.manual_seed(0)
        model = Frames()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        x, y = torch.randn(30, 16, 40), torch.randint(0, 10, (16, 30))

        @guard(json_path=None, report=False, estimate_savings=False, **options)
        def train_step():
            loss = F.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()

        for _ in range(20):
            train_step()
        return train_step.matlint_guard

    sliced, whole = decorated(slices=3), decorated(slices=1)
    assert sliced.sliced_into == 3 and sliced._finished and not sliced.errors
    assert sliced.recorder.rec.steps == whole.recorder.rec.steps == 2
    assert _forward_counts(sliced.recorder.rec) == _forward_counts(whole.recorder.rec)
    assert _found(sliced) == _found(whole)


def _mlp_train(g, before, steps=12):
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (nn.Linear(64, 64), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    observed = []
    for i in range(before + steps):
        if i == before:
            g.__enter__()
        if i >= before:
            observed.append(g.recording and g._slicer.index if g._slicer.active else g.recording)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    g.__exit__(None, None, None)
    return g, observed


def test_the_step_of_an_optimizer_with_its_state_made_is_not_observed_again():
    # the optimizer's step is a slice of its own; its state made before the guard, it runs the same
    # ops every step, as the warm-up step saw them
    settled, observed = _mlp_train(_quiet(slices=4), before=2)
    whole, _ = _mlp_train(_quiet(slices=1), before=2)
    n = settled.sliced_into
    assert n >= 2 and observed[:n + 1] == [True, *range(n - 1), False]  # the warm-up step, then all but the last
    assert _forward_counts(settled.recorder.rec) == _forward_counts(whole.recorder.rec)
    assert _found(settled) == _found(whole)
    # its state made in the warm-up step (lazily): its slice is observed after it
    lazy, observed = _mlp_train(_quiet(slices=4), before=0)
    assert lazy.sliced_into - 1 in observed
