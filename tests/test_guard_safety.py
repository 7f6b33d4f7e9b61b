"""The guard never changes results, never raises into the user's code, and gets out of the way."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import matlint.runtime_guard.capture as capture  # noqa: E402
from matlint.runtime_guard.session import PLAIN_STEPS  # noqa: E402
from matlint.runtime_guard import GuardFindingsError, guard  # noqa: E402


def quiet(**options):
    return guard(**{"json_path": None, "report": False, "estimate_savings": False, **options})


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(32, 50)

    def forward(self, x):
        return self.head(self.block(self.emb(x)))


class GRUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.gru(x)[0][:, -1])


class AttentionWithDropout(nn.Module):
    """Hand-written attention (MAT601, timed by the estimator) followed by dropout."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        return self.drop(weights @ v).transpose(1, 2).reshape(b, s, d)


class PerHeadLoop(nn.Module):
    """A matmul per head from a Python loop (MAT101, timed by the estimator)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 8))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(torch.stack([x[h] @ self.w[h] for h in range(4)]))


MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 4)),
            lambda: torch.randn(8, 16), lambda out: out.square().mean()),
    "cnn": (SmallCNN, lambda: torch.randn(4, 3, 16, 16), lambda out: F.cross_entropy(out, torch.arange(4))),
    "transformer": (TinyTransformer, lambda: torch.randint(0, 50, (2, 12)),
                    lambda out: F.cross_entropy(out.flatten(0, 1), torch.randint(0, 50, (24,)))),
    "gru": (GRUModel, lambda: torch.randn(4, 6, 8), lambda out: out.square().mean()),
    "attention": (AttentionWithDropout, lambda: torch.randn(2, 6, 16), lambda out: out.square().mean()),
    "loop": (PerHeadLoop, lambda: torch.randn(4, 3, 8), lambda out: out.square().mean()),
}
ESTIMATED = {"attention": "MAT601", "loop": "MAT101"}


def train(name, under_guard, steps=3):
    """Trains `steps` steps; returns per step the outputs and gradients, then the parameters
    and the RNG state after the guard's exit (its checks and savings estimates included)."""
    make, data, loss_fn = MODELS[name]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = quiet(window=2, warmup=1, estimate_savings=True)
    outputs, grads = [], []
    with g if under_guard else contextlib.nullcontext():
        for i in range(steps):
            torch.manual_seed(100 + i)
            opt.zero_grad()
            out = model(data())
            loss_fn(out).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            outputs.append(out.detach().clone())
    return {"outputs": outputs, "grads": grads, "params": [p.detach().clone() for p in model.parameters()],
            "rng": torch.get_rng_state(), "next_draw": torch.rand(8)}, g


def identical(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_gradients_parameters_and_rng_are_bitwise_identical(name):
    plain, _ = train(name, False)
    guarded, g = train(name, True)
    for what in ("outputs", "grads", "params", "rng", "next_draw"):
        assert identical(plain[what], guarded[what]), what
    assert g.errors == []
    assert g.recorder.rec.steps == 2 and g.recorder.rec.ops
    if name in ESTIMATED:  # the estimator really ran its own ops between the step and the draw
        [f] = [f for f in g.findings if f.code == ESTIMATED[name]]
        assert f.estimated_savings_ms is not None, f.evidence


def test_rng_streams_untouched_by_estimates():
    w = torch.randn(8, 16, 16)
    x = torch.randn(8, 4, 16)
    torch.manual_seed(7)
    g = quiet(warmup=0, window=1, estimate_savings=True)
    with g:
        torch.stack([x[h] @ w[h] for h in range(8)])
    assert any(f.estimated_savings_ms is not None for f in g.findings)
    after = torch.randn(4)
    torch.manual_seed(7)
    torch.stack([x[h] @ w[h] for h in range(8)])
    assert torch.equal(after, torch.randn(4))


# -- fault injection: the guard's own failures are reported at exit, never raised -------------------

class Injected(RuntimeError):
    pass


def boom(*args, **kwargs):
    raise Injected("injected fault")


def guard_is_gone(g) -> bool:
    """No dispatch mode on the stack, no module or optimizer hooks left behind."""
    return torch._C._len_torch_dispatch_stack() == 0 and not g.recorder.modules._handles and g._opt_hook is None


def fresh_user_function():
    """A function whose code object the guard has never classified (its call-site cache is global)."""
    fresh_user_function.count = getattr(fresh_user_function, "count", 0) + 1
    namespace = {}
    exec(compile("def user_step(model, x):\n    out = model(x).tanh() @ x.T\n    out.sum().backward()\n    return out\n",
                 f"<user code {fresh_user_function.count}>", "exec"), namespace)
    return namespace["user_step"]


CAPTURE_FAULTS = {
    "per-op recording": lambda mp: mp.setattr(capture.Recorder, "record", boom),
    "call-site lookup": lambda mp: mp.setattr(capture, "_code_kind", boom),
    "op table": lambda mp: (mp.setattr(capture, "_OP_INFO", {}), mp.setattr(capture, "_op_info", boom)),
    "module paths": lambda mp: mp.setattr(capture.ModulePaths, "_child_name", boom),
    "step boundary": lambda mp: mp.setattr(capture.Recorder, "new_step", boom),
    "entering the dispatch mode": lambda mp: mp.setattr(capture.CaptureMode, "__enter__", boom),
    "pausing for backward": lambda mp: mp.setattr(capture, "_pop_mode", boom),
    "deriving backward GEMMs": lambda mp: mp.setattr(capture, "derive_backward_gemms", boom),
}


@pytest.mark.parametrize("where", sorted(CAPTURE_FAULTS))
def test_fault_in_capture_is_reported_and_results_unchanged(where, monkeypatch, capsys):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)))
    x = torch.randn(3, 4)
    step = fresh_user_function()
    expected = [step(model, x) for _ in range(3)]
    CAPTURE_FAULTS[where](monkeypatch)
    g = guard(json_path=None, estimate_savings=False, warmup=0, window=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with g:
        got = []
        for _ in range(3):
            got.append(step(model, x))
            opt.step()  # a step boundary
    monkeypatch.undo()
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert g.errors and all("Injected: injected fault" in e for e in g.errors), g.errors
    err = capsys.readouterr().err
    assert "internal error(s); the guarded code was not affected" in err and "injected fault" in err
    assert guard_is_gone(g)


def two_findings_workload():
    """A per-head loop (MAT101, loop estimate) and hand-written attention (MAT601, sdpa estimate)."""
    w = torch.randn(4, 8, 8)
    x = torch.randn(4, 3, 8)
    attention = AttentionWithDropout().eval()
    tokens = torch.randn(1, 6, 16)

    def step():
        torch.stack([x[h] @ w[h] for h in range(4)])
        attention(tokens).sum().backward()
    return step


def run_two_findings(**options):
    step = two_findings_workload()
    g = guard(**{"json_path": None, "warmup": 0, "window": 1, "select": ["MAT101", "MAT601"], **options})
    with g:
        step()
    return g, {f.code: f for f in g.findings}


def test_fault_in_one_check_is_reported_and_the_other_checks_still_run(monkeypatch, capsys):
    from matlint.runtime_guard import registry

    checks = registry.checks()
    monkeypatch.setitem(checks, "MAT101", dataclasses.replace(checks["MAT101"], fn=boom))
    g, found = run_two_findings(estimate_savings=False)
    assert set(found) == {"MAT601"}
    assert g.errors == ["check MAT101: Injected: injected fault"]
    assert "1 internal error(s)" in capsys.readouterr().err


def test_fault_in_the_analysis_is_reported(monkeypatch, capsys):
    import matlint.runtime_guard.checks as checks

    monkeypatch.setattr(checks, "run_checks", boom)
    g, found = run_two_findings(estimate_savings=False)
    assert found == {} and g.errors == ["checks: Injected: injected fault"]
    err = capsys.readouterr().err
    assert "no findings" in err and "checks: Injected: injected fault" in err


def test_fault_in_an_estimator_is_reported_and_the_other_estimates_made(monkeypatch, capsys):
    import matlint.runtime_guard.savings as savings

    from matlint.runtime_guard import registry

    monkeypatch.setattr(savings, "_cache", {})
    estimators = registry.estimators()
    monkeypatch.setitem(estimators, "loop", dataclasses.replace(estimators["loop"], fn=boom))
    g, found = run_two_findings()
    assert found["MAT101"].estimated_savings_ms is None
    assert found["MAT101"].evidence["estimate_method"] == "not estimated: Injected: injected fault"
    assert found["MAT601"].estimated_savings_ms is not None
    assert g.errors == ["savings estimate for MAT101: Injected: injected fault"]
    assert "savings estimate for MAT101" in capsys.readouterr().err


@pytest.mark.parametrize("oom", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory"),
    MemoryError(),
], ids=["torch", "cuda", "cpu-allocator", "MemoryError"])
def test_out_of_memory_during_an_estimate_skips_that_estimate(oom, monkeypatch):
    import matlint.runtime_guard.savings as savings

    real_time_pair, calls = savings.time_pair, []

    def time_pair(slow, fast, device, *args, **kwargs):
        calls.append(device)
        if len(calls) == 1:  # the first timed call: MAT101's (findings are estimated in code order)
            raise oom
        return real_time_pair(slow, fast, device, *args, **kwargs)

    monkeypatch.setattr(savings, "_cache", {})
    monkeypatch.setattr(savings, "time_pair", time_pair)
    g, found = run_two_findings(report=False)
    assert found["MAT101"].estimated_savings_ms is None
    assert found["MAT101"].evidence["estimate_method"].startswith("not estimated: out of memory")
    assert found["MAT601"].estimated_savings_ms is not None and len(calls) == 2
    assert g.errors == []  # running out of memory is the device's state, not a guard bug


def test_unwritable_json_report_is_reported_and_the_table_still_printed(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    path = str(tmp_path / "a_file" / "runtime.json")
    g, found = run_two_findings(json_path=path, estimate_savings=False)
    assert set(found) == {"MAT101", "MAT601"}
    assert len(g.errors) == 1 and g.errors[0].startswith(f"writing {path}: ")
    err = " ".join(capsys.readouterr().err.split())  # the report's lines wrap at the terminal's width
    assert "MAT101" in err and "1 internal error(s)" in err and f"writing {path}" in err


def test_fault_in_the_report_table_falls_back_to_plain_lines(monkeypatch, capsys):
    import matlint.runtime_guard.report as report

    monkeypatch.setattr(report, "print_report", boom)
    g, found = run_two_findings(estimate_savings=False)
    assert set(found) == {"MAT101", "MAT601"}
    err = capsys.readouterr().err
    assert "matlint guard: 2 finding(s)" in err and "MAT101 " in err and "MAT601 " in err
    assert "report: Injected: injected fault" in err


# -- the user's exceptions and interrupts pass through untouched ----------------------------------

def raise_from_user_code(error):
    raise error


def assert_passes_through(error, run, g):
    with pytest.raises(type(error)) as info:
        run()
    assert info.value is error
    assert info.traceback[-1].name == "raise_from_user_code"  # the traceback still ends where it was raised
    assert guard_is_gone(g) and g._finished
    before = dict(g.recorder.rec.ops)
    torch.ones(2).mul(3)  # an unguarded op afterwards is not recorded
    assert g.recorder.rec.ops == before


@pytest.mark.parametrize("error", [ValueError("the user's own"), KeyboardInterrupt()], ids=["ValueError", "KeyboardInterrupt"])
def test_user_exception_passes_through_the_context_manager(error):
    model = nn.Linear(2, 2)
    g = quiet(warmup=0)

    def run():
        with g:
            model(torch.ones(2)).sum().backward()
            raise_from_user_code(error)
    assert_passes_through(error, run, g)


@pytest.mark.parametrize("error", [ValueError("the user's own"), KeyboardInterrupt()], ids=["ValueError", "KeyboardInterrupt"])
def test_exception_from_a_hook_inside_a_module_passes_through(error):
    model = nn.Linear(2, 2)
    model.register_forward_pre_hook(lambda module, args: raise_from_user_code(error))
    g = quiet(warmup=0)

    def run():
        with g:
            model(torch.ones(2))
    assert_passes_through(error, run, g)


def test_user_exception_passes_through_the_decorator():
    error = ValueError("the user's own")
    g = quiet(warmup=0, window=1)

    @g
    def step():
        torch.ones(2).add(1)
        raise_from_user_code(error)

    with pytest.raises(ValueError) as info:
        step()
    assert info.value is error and info.traceback[-1].name == "raise_from_user_code"
    assert torch._C._len_torch_dispatch_stack() == 0 and not g.recorder.modules._handles


def test_keyboard_interrupt_inside_the_recording_passes_through(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(capture.Recorder, "record", interrupted)
    g = quiet(warmup=0)
    with pytest.raises(KeyboardInterrupt):
        with g:
            torch.ones(2).add(1)
    assert guard_is_gone(g)


def test_a_failing_op_raises_what_it_raises_without_the_guard():
    a, b = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(RuntimeError) as plain:
        a @ b
    g = quiet(warmup=0)
    with pytest.raises(RuntimeError) as guarded:
        with g:
            a @ b
    assert str(guarded.value) == str(plain.value)
    assert guard_is_gone(g) and g.errors == []


def test_raise_on_findings():
    w = torch.randn(8, 16, 16)
    with pytest.raises(GuardFindingsError, match="MAT101"):
        with quiet(warmup=0, raise_on_findings=True):
            [torch.randn(4, 16) @ w[h] for h in range(8)]
    with quiet(warmup=0, raise_on_findings=True, ignore=["MAT1"]):
        [torch.randn(4, 16) @ w[h] for h in range(8)]


def test_backward_ops_are_tied_to_forward_lines_and_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 8)
            self.fc2 = nn.Linear(8, 8)

        def forward(self, x):
            h = torch.tanh(self.fc1(x))
            return self.fc2(h)

    import inspect

    src, start = inspect.getsourcelines(test_backward_ops_are_tied_to_forward_lines_and_modules)
    exp_line = start + next(i for i, line in enumerate(src) if "FORWARD-EXP" in line and "next(" not in line)
    tanh_line = Net.forward.__code__.co_firstlineno + 1
    fc2_line = Net.forward.__code__.co_firstlineno + 2

    def backward_ops(**options):
        net = Net()
        x = torch.randn(4, 8)
        g = quiet(warmup=0, **options)
        with g:
            out = net(x)
            tail = out.exp()  # FORWARD-EXP
            tail.sum().backward()
        ops = g.recorder.rec.ops
        assert {k.module for k in ops if not k.backward and k.op == "addmm"} == {"Net.fc1", "Net.fc2"}
        return [k for k in ops if k.backward]

    # By default the backward GEMMs are recorded (the checks read them), on their forward line
    # and module; the other backward ops are not.
    backward = backward_ops()
    assert {k.op for k in backward} == {"mm"}
    assert any(k.module == "Net.fc2" and k.site.lineno == fc2_line for k in backward)
    # With kernel attribution every backward op is recorded: exp's backward (a mul by the saved
    # result) and tanh's backward sit on their forward lines.
    backward = backward_ops(kernels=True)
    assert any(k.op == "mul" and k.site.lineno == exp_line for k in backward)
    assert any(k.op == "tanh_backward" and k.site.lineno == tanh_line and k.module == "Net" for k in backward)
    assert any(k.op == "mm" and k.module == "Net.fc2" and k.site.lineno == fc2_line for k in backward)


def test_window_then_free():
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = quiet(window=2, warmup=1)
    seen = []
    with g:
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            seen.append((g.recording, torch._C._len_torch_dispatch_stack()))
    # steps 0 (warm-up), 1 and 2 observed; from the end of step 2 on nothing is left on the stack
    assert seen[:2] == [(True, 1), (True, 1)]
    assert all(s == (False, 0) for s in seen[2:])
    rec = g.recorder.rec
    assert rec.steps == 2
    addmm = [s.count for k, s in rec.ops.items() if k.op == "addmm" and not k.backward]
    assert addmm == [2]  # the warm-up step's call was thrown away


def test_a_global_optimizer_hook_registered_after_the_guards_keeps_working():
    """optimizer.step() runs the global post-hooks from a dict while the guard's hook runs: the guard
    must not remove its hook from inside it (once the plain steps are timed) but at the end."""
    from torch.optim.optimizer import _global_optimizer_post_hooks, register_optimizer_step_post_hook

    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    g = quiet()
    with g:
        handle = register_optimizer_step_post_hook(lambda *args: calls.append(1))  # a logger, an EMA library
        try:
            for _ in range(12):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
        finally:
            handle.remove()
    assert len(calls) == 12 and g.errors == []
    assert len(g.plain_step_ms) == PLAIN_STEPS
    assert not _global_optimizer_post_hooks  # the guard's hook went when the block exited


def test_decorator_form_reports_when_window_completes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = torch.randn(8, 16, 16)
    calls = []

    @guard(window=2, warmup=1, report=False)
    def step(x):
        calls.append(1)
        return torch.stack([x @ w[h] for h in range(8)])

    for _ in range(2):
        step(torch.randn(4, 16))
    g = step.matlint_guard
    assert not g._finished
    step(torch.randn(4, 16))
    assert g._finished and [f.code for f in g.findings] == ["MAT101"]
    # the JSON report goes to .matlint/runtime.json by default, in ruff's shape plus evidence
    data = json.loads((tmp_path / ".matlint" / "runtime.json").read_text())
    assert data[0]["code"] == "MAT101"
    assert {"message", "filename", "location", "end_location", "fix", "url", "noqa_row",
            "evidence", "estimated_savings_ms"} <= set(data[0])
    assert data[0]["evidence"]["per_step"] == 8
    before = len(g.recorder.rec.ops)
    step(torch.randn(4, 16))
    assert len(g.recorder.rec.ops) == before and torch._C._len_torch_dispatch_stack() == 0


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(capture, "MAX_KEYS", 50)
    g = quiet(warmup=0)
    with g:
        for n in range(1, 200):
            torch.ones(n).add(1)
    rec = g.recorder.rec
    assert len(rec.ops) == 50 and rec.dropped_keys > 0


def guard_allocated_bytes() -> int:
    """Bytes of live Python allocations made by the guard's own code (tracemalloc must be on)."""
    import gc
    import tracemalloc

    gc.collect()
    own = tracemalloc.Filter(True, os.path.join(os.path.dirname(capture.__file__), "*"))
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([own]).traces)


def test_memory_stays_flat_over_ten_thousand_observed_steps():
    """Every step observed (the window never closes), two call sites and three batch shapes in
    turn: from step 1,000 to 10,000 the guard's own allocations do not grow."""
    import tracemalloc

    model = nn.Linear(4, 2)
    batches = [torch.randn(n, 4) for n in (1, 2, 3)]
    g = quiet(warmup=0, window=20_000)
    assert not tracemalloc.is_tracing()
    try:
        with g:
            for i in range(10_000):
                if i == 1_000:
                    tracemalloc.start()
                    at_1000 = guard_allocated_bytes()
                x = batches[i % 3]
                if i % 2:
                    model(x).sum().backward()
                else:
                    model(x).square().sum().backward()
                g.step()
            at_10000 = guard_allocated_bytes()
            all_python = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert g.recorder.rec.steps == 10_000 and g.recording is False and g.errors == []
    # every step recorded, in a bounded number of keys (2 sites x 3 shapes x fwd/bwd ops)
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm") == 10_000
    assert len(g.recorder.rec.ops) < 100
    assert at_10000 - at_1000 < 32 * 1024, f"the guard's allocations grew by {at_10000 - at_1000} bytes"
    assert all_python < 1024 * 1024, f"{all_python} bytes of Python allocations still live"


def test_threads_each_with_its_own_guard_and_unguarded_threads_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    xs = [torch.randn(8, 16) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x) for x in xs]
    results, guards, errors = {}, {}, []

    def work(i, guarded):
        try:
            g = quiet(warmup=0, window=20)  # an explicit window: no step is marked, all 20 calls are one
            with torch.no_grad(), (g if guarded else contextlib.nullcontext()):
                for _ in range(20):
                    results[i] = model(xs[i])
            guards[i] = g
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, i % 2 == 0)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(torch.equal(results[i], expected[i]) for i in range(4))
    for i in (0, 2):
        addmm = sum(s.count for k, s in guards[i].recorder.rec.ops.items() if k.op == "addmm")
        assert addmm == 40  # its own 20 calls × 2 layers, none from the other threads
        assert guards[i].errors == []
    assert not guards[1].recorder.rec.ops and not guards[3].recorder.rec.ops


@pytest.fixture
def fresh_dynamo():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    counters.clear()  # compiled frames switch the guard's module hooks off (they force recompiles)


def test_compile_is_not_forced_to_eager(fresh_dynamo):
    from torch._dynamo.testing import CompileCounter

    def f(x):
        return torch.sin(x) @ x.T + 1

    x = torch.randn(8, 8)
    expected = f(x)

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(f, backend=counter)
    g = quiet(warmup=0)
    with g:
        out = compiled(x)
    assert counter.frame_count == 1
    assert torch.equal(out, expected)
    assert any(k.op == "mm" for k in g.recorder.rec.ops)  # the compiled graph's ops still seen

    # with compiled code about, the backward pass stays observed: a compiled forward's GEMMs do
    # not require grad, so their backward GEMMs could not be derived
    xg = torch.randn(8, 8, requires_grad=True)
    depths = []
    with quiet(warmup=0) as g2:
        out = compiled(xg)
        out.register_hook(lambda grad: depths.append(torch._C._len_torch_dispatch_stack()))
        out.sum().backward()
    assert depths == [1]  # the guard's mode was on during the backward
    assert any(k.backward and k.op == "mm" for k in g2.recorder.rec.ops)

    # the same mode without the opt-out makes dynamo skip the frame: the test above can fail
    class NoOptOut(capture.CaptureMode):
        @classmethod
        def ignore_compile_internals(cls):
            return False

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(f, backend=counter)
    with NoOptOut(capture.Recorder()):
        compiled(x)
    assert counter.frame_count == 0


@pytest.mark.skipif(not os.environ.get("MATLINT_SLOW_TESTS") and os.cpu_count() < 2, reason="needs 2 CPUs")
def test_ddp_two_gloo_processes(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["identical"], result
        assert result["errors"] == []
        assert result["steps"] == 2
        # by default the backward pass runs unobserved and its GEMMs are derived ...
        assert result["backward_gemms_derived"]
        # ... with kernel attribution every backward op is observed, DDP's allreduce included
        assert result["allreduce_seen_with_kernels"]
        assert result["identical_with_kernels"]


def _ddp_worker(rank, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        def run(under_guard, **options):
            torch.manual_seed(0)
            model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            g = quiet(window=2, warmup=1, **options)
            with g if under_guard else contextlib.nullcontext():
                for i in range(4):
                    torch.manual_seed(rank * 10 + i)
                    opt.zero_grad()
                    model(torch.randn(4, 8)).square().mean().backward()
                    opt.step()
            return [p.detach().clone() for p in model.parameters()], g

        plain, _ = run(False)
        guarded, g = run(True)
        with_kernels, gk = run(True, kernels=True)
        result = {
            "identical": all(torch.equal(a, b) for a, b in zip(plain, guarded)),
            "errors": g.errors + gk.errors,
            "steps": g.recorder.rec.steps,
            "backward_gemms_derived": any(k.backward and k.op == "mm" for k in g.recorder.rec.ops),
            "allreduce_seen_with_kernels": any("allreduce" in k.op for k in gk.recorder.rec.ops),
            "identical_with_kernels": all(torch.equal(a, b) for a, b in zip(plain, with_kernels)),
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(result, fh)
    finally:
        dist.destroy_process_group()


def test_public_entry_points_and_bare_decorator(tmp_path, monkeypatch):
    import matlint

    monkeypatch.chdir(tmp_path)
    assert matlint.guard is guard
    w = torch.randn(8, 4, 4)

    @matlint.guard
    def step():
        return [torch.randn(2, 4) @ w[h] for h in range(8)]

    for _ in range(5):
        step()
    g = step.matlint_guard
    # the default window after one warm-up call: two calls that ran the same ops are enough
    assert g._finished and g.recorder.rec.steps == 2
    assert [f.code for f in g.findings] == ["MAT101"]
    assert (tmp_path / ".matlint" / "runtime.json").exists()


@pytest.mark.parametrize("matmuls, steps, observed_mm, calls_observed", [
    ([8, 8, 8, 8, 8], 2, 8 + 8, 2),        # steady: the warm-up matched the next call and is kept
    ([12, 8, 8, 8, 8], 2, 8 + 8, 3),       # one-off work in the warm-up: thrown away
    ([12, 8, 6, 6, 6], 3, 8 + 6 + 6, 4),   # never steady: at most 3 kept calls
])
def test_default_window_closes_when_two_steps_match(matmuls, steps, observed_mm, calls_observed):
    w = torch.randn(16, 4, 4)
    counts = iter(matmuls)
    g = quiet(warmup=1)
    calls = []

    @g
    def step():
        n = next(counts)
        calls.append(g.recording)
        return [torch.randn(2, 4) @ w[h] for h in range(n)]

    for _ in matmuls:
        step()
    assert g._finished and g.recorder.rec.steps == steps
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "mm") == observed_mm
    assert calls == [True] * calls_observed + [False] * (len(matmuls) - calls_observed)


def _steady_loop(g, steps):
    # optimizer.step() runs inside a profiler record_function whose exit falls after the step
    # hook: it must not make the warm-up step look different from the next one
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    for _ in range(2):  # the optimizer's lazy state already made, as in a loop already running
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    observed = []
    with g:
        for _ in range(steps):
            observed.append(g.recording)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    return observed


def test_whole_steps_window_on_a_steady_training_loop_observes_two_steps():
    g = quiet(slices=1)
    assert _steady_loop(g, 5) == [True, True, False, False, False]
    assert g.recorder.rec.steps == 2 and g.sliced_into == 0
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm" and not k.backward) == 4


def test_default_window_on_a_steady_training_loop_observes_the_warm_up_step_and_each_slice_once():
    g = quiet(slices=2)
    # the second slice is the optimizer's step, its state made before: the warm-up step saw it
    assert _steady_loop(g, 6) == [True, True, False, False, False, False]
    # the first slice ran the same ops as the warm-up step over the same calls: both kept, two steps
    assert g.recorder.rec.steps == 2 and g.sliced_into == 2
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm" and not k.backward) == 4


def test_nested_guards_both_record():
    inner, outer = quiet(warmup=0), quiet(warmup=0)
    with outer:
        with inner:
            torch.ones(3).add(1)
    for g in (inner, outer):
        [key] = [k for k in g.recorder.rec.ops if k.op == "add"]
        assert key.site.filename == __file__
