"""`matlint.guard`: the context manager / decorator that wraps the recorder.

Steps: a step ends at every `optimizer.step()` (a global optimizer hook), at `guard.step()`,
and, for the decorator form, at the end of each call when the call held no optimizer step.
In the context-manager form with the default window, until an optimizer step or `guard.step()` is
seen, a top-level module call that ran without grad (an inference loop) is a step of its own: the
next top-level module call begins a new one. When an optimizer step or `guard.step()` then comes
(a sanity validation before training, a target network called under no_grad in a training step),
what those steps observed is thrown away and the window starts again at that boundary.
The first `warmup` steps are observed provisionally and thrown away as soon as a later step
begins (one-off work such as lazy init stays out of the per-step counts); after `window`
kept steps the dispatch mode, module hooks and profiler are removed and the guarded code runs
at full speed.

By default (`window=None`) the warm-up step is observed whole and the steps after it in slices
(slices.py): each observes the ops of one stretch of the step, between two module calls, and
the slices together make one whole step, so that no observed step after the warm-up costs much
more than a plain one. The warm-up step is kept after all when the slices ran the same ops as
often (it did no one-off work). Where a step cannot be sliced (no module calls to cut at,
torch.compile'd code, kernels attributed, `slices=1`) or stops running the warm-up's module
calls, whole steps are observed: observation stops as soon as two observed steps ran the same
ops the same number of times, after at most 3 kept steps, so a steady loop is observed for two
steps, and one that lazily initializes in its first step for three. The observed steps are
nearly all of the guard's cost over a run.

Reporting: the context-manager form reports when its block exits; the decorator form reports
when the window is complete (or at interpreter exit, if it never completes). Under
torch.distributed each rank observes its own steps and rank 0 reports for all of them (ranks.py).
"""
from __future__ import annotations

import atexit
import collections
import functools
import itertools
import os
import threading
import time
from typing import Iterable, Optional

import torch
from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack

from .compiles import CompileEvents, CompileWatch
from .ranks import MODES as RANK_MODES, Merged, RankReport, Ranks, creation_line, merge_findings, rank_json_path
from .syncs import SyncWatch
from .capture import CaptureMode, Recorder, attribute_kernels, hold_backward_engine, release_backward_engine
from .slices import MAX_OBSERVATIONS, Slicer

DEFAULT_JSON_PATH = os.path.join(".matlint", "runtime.json")
MIN_DEFAULT_WINDOW, MAX_DEFAULT_WINDOW = 2, 3
PLAIN_STEPS = 5  # steps timed after the window closes (the guard off): the step time savings are capped by


class GuardFindingsError(AssertionError):
    """Raised at exit when `raise_on_findings=True` and selected findings were made."""

    def __init__(self, findings):
        self.findings = findings
        lines = [f"{f.code} {f.filename}:{f.row} {f.message}" for f in findings]
        super().__init__(f"matlint guard: {len(findings)} finding(s)\n" + "\n".join(lines))


def _codes(value) -> Optional[tuple]:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    return tuple(v.strip() for v in value if v.strip()) or None


def _selection(select, ignore, notes: list) -> frozenset:
    """The codes the guard reports, chosen as `matlint check --select ... --ignore ...` chooses
    them: `[tool.matlint]` of the working directory's project, with `select` starting afresh and
    `ignore` added. A selector that names no rule raises ValueError; a broken config is noted
    and left out."""
    from matlint.config import ConfigError, Settings, load_settings, normalize_selector

    overrides = {"select": _codes(select), "ignore": _codes(ignore)}
    for key, given in overrides.items():
        for selector in given or ():
            try:
                normalize_selector(selector, key, "matlint.guard()")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
    try:
        return load_settings(os.getcwd(), cli_overrides=overrides).enabled_codes()
    except ConfigError as exc:
        notes.append(f"[tool.matlint] not read: {exc}")
        explicit = {k: tuple(s.upper() for s in v) for k, v in overrides.items() if v}
        return Settings(**explicit).enabled_codes()


class Guard:
    def __init__(
        self,
        select: Optional[Iterable[str]] = None,
        ignore: Optional[Iterable[str]] = None,
        window: Optional[int] = None,
        warmup: int = 1,
        json_path: Optional[str] = DEFAULT_JSON_PATH,
        estimate_savings: bool = True,
        raise_on_findings: bool = False,
        report: bool = True,
        kernels: bool = False,
        savings_budget_s: float = 3.0,
        ranks: str = "merged",
        rank_timeout_s: float = 60.0,
        slices: Optional[int] = None,
    ):
        if (window is not None and window < 1) or warmup < 0:
            raise ValueError("window must be >= 1 (or None: 2 steady steps, else 3) and warmup >= 0")
        if slices is not None and (not isinstance(slices, int) or slices < 1):
            raise ValueError("slices must be an int >= 1 (1: whole steps), or None (as many as the cost needs)")
        if ranks not in RANK_MODES:
            raise ValueError(f"ranks must be one of {', '.join(map(repr, RANK_MODES))}")
        self.notes: list = []
        self.enabled_codes = _selection(select, ignore, self.notes)
        self.window = window
        self._window_len = window or MAX_DEFAULT_WINDOW  # shortened when the steps are steady
        self._step_counts: list = []   # (position in the recording's ops, calls) in the last kept step
        self._counts_so_far: list = []  # calls per position in the recording's ops
        self.warmup = warmup
        self.json_path = json_path
        self.estimate_savings = estimate_savings
        self.raise_on_findings = raise_on_findings
        self.print_report = report
        self.kernels = kernels
        self.savings_budget_s = savings_budget_s
        self.rank_mode = ranks
        self.rank_timeout_s = rank_timeout_s
        self.ranks: Optional[Ranks] = None   # the process group's ranks, once one is seen
        self.merged: Optional[Merged] = None  # rank 0's view of every rank's report, after a merge
        self._created_at = creation_line()    # which guard this is, the same on every rank
        self._raised = False                  # the guarded code left with an exception
        self._reports_here = True             # this rank prints and writes its report
        self.report_path = json_path          # where the JSON report went (a rank's own, with ranks="each")

        self.recorder = Recorder(profile_cuda=kernels)
        self.findings: list = []
        self._lock = threading.RLock()
        self._depth = 0
        self._step = 0                 # steps completed since the first entry
        self._ops_at_boundary = 0      # ops recorded up to the last boundary (or the attach)
        self._boundary_in_entry = False
        self._mode: Optional[CaptureMode] = None
        self._mode_on = False          # the mode is on the dispatch stack (off between the slices of a step)
        self._slicer = Slicer(self._switch_mode, self._dispatched, self._new_part, self._preamble, slices)
        self._slice_rec = None         # the slice's own recording while a preamble records into another
        self._pending_before_preamble: dict = {}
        self.sliced_into = 0           # the slices the steps after the warm-up were observed in (0: whole)
        self._opt_pre_hook = None
        self._holds_engine = False
        self._profiler = None
        self._opt_hook = None
        self._finished = False
        self._atexit = False
        self._warmup_rec = None
        self._noted_compiled = False
        self._optimizer_seen = False   # steps end at optimizer.step() ...
        self._user_steps = False       # ... or at guard.step(); else at each top-level module call without grad
        self._inference_steps = 0      # boundaries made so far by that last rule
        self._decorated = False        # the decorator form: each call is a step
        self._compile_watch = None     # dynamo's callback handler while this guard watches for compiles
        self._thread = None            # the thread observed (module hooks are global: other threads call them too)
        self._last_boundary = None     # perf_counter() at the start of the step now running
        self.observed_step_ms = collections.deque(maxlen=64)  # the last steps observed (with the guard on)
        self.plain_step_ms: list = []     # steps after the window (the guard off)
        self.plain_wait_ms: list = []     # ... the part of each that the host waited for the GPU
        self.recorder.modules.on_top_call = self._on_module_call
        self._syncs = SyncWatch(self.recorder)
        self._compiles = CompileWatch()
        self.compile_events: Optional[CompileEvents] = None  # what torch.compile did in the window

    # -- selection ---------------------------------------------------------------------------
    def selects(self, code: str) -> bool:
        return code in self.enabled_codes

    @property
    def recording(self) -> bool:
        return self._mode is not None

    @property
    def errors(self) -> list:
        return self.recorder.rec.errors

    # -- context manager ---------------------------------------------------------------------
    def __enter__(self):
        self._enter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._raised = exc_type is not None
        done = self._exit(final=True)
        if done and self.raise_on_findings and exc_type is None and self.findings:
            raise GuardFindingsError(self.findings)
        return False

    # -- decorator ---------------------------------------------------------------------------
    def __call__(self, fn):
        self._decorated = True

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._enter()
            failed = True
            try:
                result = fn(*args, **kwargs)
                failed = False
                return result
            finally:
                self._raised = failed
                done = self._exit(final=False)
                if done and self.raise_on_findings and not failed and self.findings:
                    raise GuardFindingsError(self.findings)

        wrapper.matlint_guard = self
        return wrapper

    def step(self) -> None:
        """Mark the end of a step by hand (loops without an optimizer)."""
        with self._lock:
            first = not (self._user_steps or self._optimizer_seen)
            self._user_steps = True
            self._safely(self._restart if first and self._inference_steps else self._boundary)

    # -- internals ---------------------------------------------------------------------------
    def _safely(self, fn, *args, where: str = "guard"):
        try:
            return fn(*args)
        except Exception as exc:  # the guard's own failures are reported, never raised
            self.recorder.fail(exc, where)
            return None

    def _enter(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth > 1 or self._finished:
                return
            self._thread = threading.get_ident()
            self._boundary_in_entry = False
            self._safely(self._see_ranks, where="torch.distributed")
            self._safely(self._start)

    def _see_ranks(self) -> None:
        """The process group's ranks, looked for until seen: at each entry, each observed step
        and the report (a script run by `matlint run` makes its group inside the guard, and may
        destroy it before the guard exits)."""
        if self.ranks is None:
            self.ranks = Ranks.detect()

    def _start(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._opt_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._last_boundary = None if self._step else _now()
        if self._in_window():
            self._attach()

    def _exit(self, final: bool) -> bool:
        """Leave one entry; returns True when this exit produced the report."""
        with self._lock:
            self._depth -= 1
            if self._depth > 0 or self._finished:
                return False
            done = bool(self._safely(self._stop, final))
            if final and not self._finished:  # _stop failed before the report
                self._safely(self.finish)
                done = True
            return done

    def _stop(self, final: bool) -> bool:
        try:
            if not final and not self._boundary_in_entry:
                self._boundary()
            elif final and self.recording and not self._slicer.active:
                if self._slicer.log is not None:  # the warm-up step, unfinished: its parts make it whole
                    self.recorder.rec = self._merged(self._slicer.parts + [self.recorder.rec])
                    self._slicer.stop()
                if self._step_had_ops():
                    self.recorder.rec.steps += 1  # the unfinished step counts
        finally:
            # whatever failed above, nothing of the guard stays hooked into the user's code
            if self._opt_hook is not None:
                self._opt_hook.remove()
                self._opt_hook = None
            self._detach()
        if final or not self._in_window():
            self.finish()
            return True
        if not self._atexit:
            atexit.register(self._report_at_exit)
            self._atexit = True
        return False

    def _in_window(self) -> bool:
        return self._step < self.warmup + self._window_len

    def _close_early_if_steady(self, rec) -> None:
        """Default window: close as soon as two observed steps ran the same ops as often. When the
        warm-up step is one of them it did no one-off work worth keeping out, and it is kept."""
        # Per key in rec.ops's order (keys are only added to it): the calls so far, and this step's
        # (position, calls) where it made any, compared step to step without hashing the keys again
        counts = [stat.count for stat in rec.ops.values()]
        step_counts = [(i, n - before) for i, (n, before) in
                       enumerate(itertools.zip_longest(counts, self._counts_so_far, fillvalue=0)) if n != before]
        if self.window is None:
            warm = self._warmup_rec
            if (rec.steps == 1 and warm is not None and warm.steps == 1
                    and _by_key(rec, step_counts) == {key: stat.count for key, stat in warm.ops.items()}):
                rec.absorb(warm)
                self._warmup_rec = None
                self._window_len = self._step + 1 - self.warmup  # closes at this boundary
            elif rec.steps >= MIN_DEFAULT_WINDOW and step_counts == self._step_counts:
                self._window_len = self._step + 1 - self.warmup
        self._step_counts, self._counts_so_far = step_counts, counts

    def _on_module_call(self) -> None:
        """A top-level module call begins after one that ran without grad (inference): without an
        optimizer or guard.step(), each such call is a step."""
        with self._lock:
            if (self._depth > 0 and not self._finished and self.window is None and not self._decorated
                    and not self._optimizer_seen and not self._user_steps and threading.get_ident() == self._thread):
                self._inference_steps += 1
                self._safely(self._boundary)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        with self._lock:
            if threading.get_ident() != self._thread:  # another thread's optimizer
                return
            first = not (self._optimizer_seen or self._user_steps)
            self._optimizer_seen = True
            if self._done_timing() and not (first and self._inference_steps):
                # a no-op from now on: removing a global hook from inside one would break the loop
                # optimizer.step() runs them in (it goes when the guard exits)
                return
            if self._depth > 0 and not self._finished:
                self._boundary_in_entry = True
                self._safely(self._restart if first and self._inference_steps else self._boundary)

    def _done_timing(self) -> bool:
        """The window is closed and the plain steps the savings are capped by are timed."""
        return not self.recording and len(self.plain_step_ms) >= PLAIN_STEPS

    def _restart(self) -> None:
        """The first optimizer step or guard.step() after top-level inference calls were taken for
        steps: what they observed is thrown away and the window starts again at this boundary."""
        self._detach()
        self._slicer.stop()
        self.recorder.new_step()
        self.recorder.modules.clear_pending()
        self.recorder.rec = self._fresh_recording(self.recorder.rec)
        self._inference_steps = 0
        self._warmup_rec = None
        self._step = 0
        self._window_len = self.window or MAX_DEFAULT_WINDOW
        self._step_counts, self._counts_so_far = [], []
        self.observed_step_ms.clear()
        self.plain_step_ms.clear()
        self.plain_wait_ms.clear()
        self._last_boundary = _now()
        self._attach()

    def _time_step(self) -> None:
        """The step that ends now: its time, observed or plain; of a plain step also how long the
        host, its work issued, waited for the GPU to finish it."""
        issued = time.perf_counter()
        now = _now()
        if self._last_boundary is not None:
            ms = (now - self._last_boundary) * 1e3
            if self.recording:
                self.observed_step_ms.append(ms)
            elif self._step >= self.warmup + self._window_len and len(self.plain_step_ms) < PLAIN_STEPS:
                self.plain_step_ms.append(ms)
                self.plain_wait_ms.append((now - issued) * 1e3)
        self._last_boundary = now

    @property
    def step_ms(self):
        """(median step time in ms, "plain" or "observed"), or (None, "") when no step was timed. An
        observed step ran with the guard on: longer than plain, a looser bound."""
        for times, source in ((self.plain_step_ms, "plain"), (self.observed_step_ms, "observed")):
            if times:
                return sorted(times)[len(times) // 2], source
        return None, ""

    @property
    def gpu_wait_ms(self):
        """Median time a plain step's host waited for the GPU once it had issued the step's work,
        or None when no plain step was timed: what shortening the GPU's kernels can save at most
        (the host's own time stays)."""
        times = self.plain_wait_ms
        return sorted(times)[len(times) // 2] if times else None

    def _boundary(self) -> None:
        self._time_step()
        self._preamble(False)
        if self.ranks is None:
            self._safely(self._see_ranks, where="torch.distributed")
        self.recorder.end_step_operands()  # into the step's own recording, before it is set aside
        rec = self.recorder.rec
        if self.recording:
            if self._step < self.warmup:
                sliced = False
                if self._step == self.warmup - 1 and self._slicer.log is not None:
                    sliced = self._slicer.end_log(rec)
                    rec = self._merged(self._slicer.parts)  # the step whole, from its parts
                    if not sliced:
                        self._slicer.stop()
                # Kept aside: it is the report's content if no later step is ever observed.
                rec.steps = 1
                self._warmup_rec = rec
                self.recorder.rec = self._fresh_recording(rec)
                if sliced:
                    self._window_len = self._slicer.plan.slices * MAX_OBSERVATIONS
            elif self._slicer.active:
                self._end_slice(rec)
            elif self._step_had_ops():
                rec.steps += 1
                self._close_early_if_steady(rec)
        self._step += 1
        self.recorder.new_step()
        self.recorder.modules.clear_pending()
        if not self._in_window():
            self._detach()  # the optimizer hook stays, to time PLAIN_STEPS plain steps
        elif self._sliceable() and self._step == self.warmup - 1:
            self._slicer.start_log()
        self._ops_at_boundary = self._recorded_ops()

    # -- slices (slices.py) ----------------------------------------------------------------------
    def _sliceable(self) -> bool:
        """Whether this window's steps after the warm-up may be observed in slices: the default window,
        module paths recorded (no compiled code) and the backward's GEMMs derived (no kernels)."""
        return (self.window is None and self.warmup >= 1 and self.recorder.derive_backward
                and bool(self.recorder.modules._handles))

    def _dispatched(self) -> int:
        return self.recorder.dispatched

    def _switch_mode(self, on: bool) -> None:
        """Turn the dispatch mode (and the sync detector) on or off within an observed step."""
        mode = self._mode
        if mode is None or on == self._mode_on or threading.get_ident() != self._thread:
            return
        if on:
            mode.__enter__()
            self._mode_on = True
            self.recorder.paused = False
            self._safely(self._syncs.start, where="sync detector")
            return
        depth = _len_torch_dispatch_stack()
        if not depth or _get_dispatch_stack_at(depth - 1) is not mode:
            self._slicer.valid = False  # a mode of the user's own came on top: stay on, whole steps again
            return
        self._safely(self._syncs.stop, where="sync detector")
        mode.__exit__(None, None, None)
        self._mode_on = False
        self.recorder.paused = True

    def _on_optimizer_pre_step(self, optimizer, args, kwargs) -> None:
        if threading.get_ident() == self._thread:
            # a cut as good as any inside the step: only the optimizer's own ops follow it
            self._safely(self._slicer.on_call, optimizer, 1, True, bool(getattr(optimizer, "state", None)), True,
                         where="slices")

    def _on_slice_call(self, module, depth: int) -> None:
        if threading.get_ident() == self._thread:
            self._slicer.on_call(module, depth)

    def _on_slice_return(self) -> None:
        if threading.get_ident() == self._thread:
            self._slicer.on_return()

    def _new_part(self):
        """The warm-up step's next part is recorded apart; returns the part that ended."""
        ended = self.recorder.rec
        self.recorder.set_aside_pending()
        self.recorder.rec = self._fresh_recording(ended)
        return ended

    def _merged(self, recordings):
        rec = self._fresh_recording(self.recorder.rec)
        for part in recordings:
            rec.absorb(part)
        return rec

    def _end_slice(self, rec) -> None:
        """A sliced step ends: its slice's recording is kept (slices.py says how long each slice is
        observed). Once every slice is steady they make up the recording and the window closes. A
        step that did not run the plan's calls throws the slices away: whole steps are observed
        from the next one, as in an unsliced window."""
        slicer = self._slicer
        if not slicer.step_ended_as_planned():
            slicer.stop()
            self.notes.append("observed whole steps: the steps' module calls differ from the warm-up step's")
            self.recorder.rec = self._fresh_recording(rec)
            self._window_len = self._step + 1 - self.warmup + MAX_DEFAULT_WINDOW
            self._step_counts, self._counts_so_far = [], []
            self._switch_mode(True)
            return
        if slicer.index == 0 and len(self.observed_step_ms) >= 2:
            slicer.fit_to_cost(self.observed_step_ms[-2], self.observed_step_ms[-1])
        slicer.keep(rec, _alike)
        self.recorder.rec = self._fresh_recording(rec)
        if slicer.finished():
            self._close_slices()
            self._window_len = self._step + 1 - self.warmup  # closes at this boundary
            return
        slicer.next_slice()
        self._window_len = self._step + 2 - self.warmup  # one more step at least
        self._begin_sliced_step()

    def _begin_sliced_step(self) -> None:
        """The mode as the next sliced step begins: on for the first slice, or for the preamble of a
        slice that begins at the step's first call; else off until the slice's first call."""
        slicer = self._slicer
        if slicer.index > 0 and slicer.observed_from_start():
            self._preamble(True)
        else:
            self._switch_mode(slicer.index == 0)

    def _preamble(self, on: bool) -> None:
        """Observe into a recording that is thrown away (on), or back into the slice's own (off). What
        else the preamble's ops leave for the step's end is thrown away too: the forward GEMMs whose
        backward GEMMs the backward pass derives, and the GEMMs' operands."""
        recorder = self.recorder
        if on and self._slice_rec is None:
            self._pending_before_preamble = recorder.begin_scratch()
            self._slice_rec = recorder.rec
            recorder.rec = self._fresh_recording(self._slice_rec)
            self._switch_mode(True)
        elif not on and self._slice_rec is not None:
            recorder.rec, self._slice_rec = self._slice_rec, None
            recorder.end_scratch(self._pending_before_preamble)

    def _close_slices(self) -> None:
        """What the slices recorded becomes the recording, each slice weighed by how often it was
        observed (slices.py); a slice never observed counts the warm-up step's parts over its calls."""
        slicer = self._slicer
        self.sliced_into = slicer.plan.slices
        weighed, steps = slicer.weighed()
        for part, weight in weighed:
            part.scale(weight)
            part.steps = 0
        rec = self._merged(part for part, _ in weighed)
        rec.steps = steps
        self._warmup_rec = None
        self.recorder.rec = rec
        slicer.stop()

    def _recorded_ops(self) -> int:
        rec = self.recorder.rec
        return sum(s.count for s in rec.ops.values()) + rec.dropped_keys

    def _step_had_ops(self) -> bool:
        """Whether the step now ending recorded anything (an empty step is not counted)."""
        return self._recorded_ops() > self._ops_at_boundary

    @staticmethod
    def _fresh_recording(old):
        from .capture import Recording

        new = Recording()
        new.errors, new.error_count = old.errors, old.error_count
        new.chained_gemm_sites = old.chained_gemm_sites  # what the code's dataflow is, not a count
        return new

    def _attach(self) -> None:
        if self.recording:
            return
        if _compiled_frames() == 0 and not self._noted_compiled:
            self.recorder.modules.install()
            self._watch_compiles()
        else:
            self._note_compiled()
        if self.kernels and torch.cuda.is_available() and torch.cuda.is_initialized():
            self._start_profiler()
        mode = CaptureMode(self.recorder)
        try:
            mode.__enter__()
        except BaseException:
            # not on the stack: nothing to pop later (popping would take someone else's mode)
            self.recorder.modules.remove()
            self._stop_profiler()
            raise
        self._mode = mode
        self._mode_on = True
        self._safely(self._syncs.start, where="sync detector")
        self._safely(self._compiles.start, where="compile watch")
        self._ops_at_boundary = self._recorded_ops()
        if self.recorder.derive_backward and _compiled_frames() == 0:
            hold_backward_engine(self.recorder)
            self._holds_engine = True
        if self._slicer.active:
            self._begin_sliced_step()  # the decorator form attaches again at each call
        if self._sliceable():
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self.recorder.modules.on_call = self._on_slice_call
            self.recorder.modules.on_return = self._on_slice_return
            self._opt_pre_hook = register_optimizer_step_pre_hook(self._on_optimizer_pre_step)
            if self._step == self.warmup - 1:
                self._slicer.start_log()

    def _note_compiled(self) -> None:
        if not self._noted_compiled:
            self.notes.append("module paths not recorded: torch.compile'd code was present")
            self._noted_compiled = True

    def _watch_compiles(self) -> None:
        """Global module hooks seen by dynamo while it traces become part of the compiled code's
        guards: taking them off when the window closes would recompile it. So they go before
        anything is compiled while this guard observes (for the rest of the guard's life)."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return
        callback_handler.register_start_callback(self._on_compile_start)
        self._compile_watch = callback_handler

    def _unwatch_compiles(self) -> None:
        handler, self._compile_watch = self._compile_watch, None
        if handler is not None:
            try:
                handler.remove_start_callback(self._on_compile_start)
            except ValueError:
                pass

    def _on_compile_start(self, *args) -> None:
        try:
            self.recorder.modules.remove()
            self._note_compiled()
        except Exception as exc:  # never raised into the user's compile
            self.recorder.fail(exc, "compile start")

    def _detach(self) -> None:
        self._unwatch_compiles()
        mode, self._mode = self._mode, None
        if mode is None:
            return
        self._preamble(False)
        self.recorder.modules.on_call = self.recorder.modules.on_return = None
        if self._opt_pre_hook is not None:
            self._opt_pre_hook.remove()
            self._opt_pre_hook = None
        try:
            self._safely(self._syncs.stop, where="sync detector")
            events = self._safely(self._compiles.stop, where="compile watch")
            if events is not None:
                self.compile_events = events
            if self._mode_on:
                mode.__exit__(None, None, None)
        finally:
            self._mode_on = False
            self.recorder.paused = False
            if self._holds_engine:
                self._holds_engine = False
                release_backward_engine(self.recorder)
            self.recorder.forget_pending_backward()
            self.recorder.modules.remove()
            self._stop_profiler()

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        try:
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.start()
            self._profiler = prof
        except Exception as exc:
            self.notes.append(f"kernel counts unavailable: the profiler did not start ({exc})")

    def _stop_profiler(self) -> None:
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        prof.stop()  # synchronizes the device once, at the end of the window
        attribute_kernels(self.recorder, prof)

    # -- report --------------------------------------------------------------------------------
    def finish(self) -> list:
        """Run the checks, estimate savings, print and write the report. Idempotent."""
        if self._finished:
            return self.findings
        self._finished = True
        self._detach()
        if self._slicer.active:
            self._close_slices()  # what the slices observed so far (the warm-up's parts for the rest)
        rec = self.recorder.rec
        if rec.steps == 0 and self._warmup_rec is not None:  # nothing but the warm-up (or some of its slices)
            self._warmup_rec.errors, self._warmup_rec.error_count = rec.errors, rec.error_count
            self.recorder.rec = self._warmup_rec
        from .checks import merge_modules, run_checks
        from .report import print_report, write_json

        self._safely(self.recorder.end_step_operands)
        self.recorder.rec.compile_events = self.compile_events
        events = self.compile_events
        if events is not None and (events.breaks_before or events.recompiles_before):
            self.notes.append(f"torch.compile broke graphs for {events.breaks_before} reason(s) and recompiled "
                              f"{events.recompiles_before} time(s) before the guard watched (no lines seen): "
                              f"attach the guard before the first compiled call to have them reported (MAT505)")

        findings = self._safely(run_checks, self.recorder.rec, self, where="checks") or []
        self.findings = [f for f in findings if self.selects(f.code)]
        estimated = self.estimate_savings and bool(self.findings)
        step_ms = None
        if estimated:
            from .savings import estimate

            step_ms, source = self.step_ms
            if step_ms is not None:
                self.notes.append(f"savings capped by the step time: {step_ms:.3f} ms ({source}, median of "
                                  f"{len(self.plain_step_ms if source == 'plain' else self.observed_step_ms)} steps)")
            self._safely(estimate, self.findings, self.savings_budget_s, self.recorder.fail, step_ms,
                         self.gpu_wait_ms, where="savings")
        self.findings = self._safely(merge_modules, self.findings, step_ms, self.gpu_wait_ms,
                                     where="checks") or self.findings
        if estimated:
            from . import registry
            from .checks import negligible

            kept = [f for f in self.findings if not negligible(f, step_ms)]
            checks = registry.checks()
            for f in self.findings:
                note = checks[f.code].dropped_note if f not in kept and f.code in checks else None
                if note is not None:
                    self.notes.append(note(self.gpu_wait_ms, step_ms))
            self.findings = kept
        from .cells import locate

        self._safely(locate, self.findings, where="locating cells")
        self._safely(self._see_ranks, where="torch.distributed")
        if self.ranks is not None and self.rank_mode == "merged":
            self._safely(self._merge_ranks, where="merging the ranks' reports")
        json_path = self.json_path
        if self.ranks is not None and self.rank_mode == "each" and json_path:
            json_path = rank_json_path(json_path, self.ranks.rank)
        if not self._reports_here:
            return self.findings
        self.report_path = json_path
        if json_path:
            self._safely(write_json, self, json_path, where=f"writing {json_path}")
        if self.print_report:
            try:
                print_report(self)
            except Exception as exc:
                self.recorder.fail(exc, "report")
                self._print_plain_report()
        return self.findings

    def _merge_ranks(self) -> None:
        """Send this rank's report to rank 0; on rank 0, take every rank's and merge them (see
        ranks.py). Where the store fails, each rank reports on its own, saying so."""
        rec, ranks = self.recorder.rec, self.ranks
        report = RankReport(ranks.rank, rec.steps, sum(s.count for s in rec.ops.values()), self.findings,
                            list(self.notes), list(rec.errors), rec.error_count, self._raised)
        try:
            if ranks.store is None:
                raise RuntimeError("the default process group has no store")
            merged = ranks.exchange(report, self._created_at, self.rank_timeout_s)
        except Exception as exc:
            self.notes.append(f"rank {ranks.rank} of {ranks.world_size} reports alone: the ranks' reports "
                              f"could not be merged ({type(exc).__name__}: {exc})")
            self.rank_mode = "each"
            return
        if merged is None:
            self._reports_here = False  # rank 0 reports for this rank
            return
        self.merged = merged
        self.findings = merge_findings(merged.reports)

    def _print_plain_report(self) -> None:
        """The report without rich, for when the table itself failed."""
        import sys

        try:
            lines = [f"matlint guard: {len(self.findings)} finding(s)"]
            lines += [f"{f.code} {f.filename}:{f.row} {f.message}" for f in self.findings]
            rec = self.recorder.rec
            lines.append(f"matlint guard: {rec.error_count} internal error(s); the guarded code was not affected")
            lines += [f"  {err}" for err in rec.errors]
            print("\n".join(lines), file=sys.stderr)
        except Exception:
            pass

    def _report_at_exit(self) -> None:
        if not self._finished:
            self.finish()


def _compiled_frames() -> int:
    import sys

    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def _by_key(rec, step_counts) -> dict:
    """A step's calls per op key, from its (position in rec.ops, calls) pairs."""
    keys = list(rec.ops)
    return {keys[i]: n for i, n in step_counts}


def _counts(recordings) -> dict:
    """Calls per forward op key, over the recordings (the backward GEMMs are derived from the forward
    ones: those tell the same)."""
    out: dict = {}
    for rec in recordings:
        for key, stat in rec.ops.items():
            if not key.backward:
                out[key] = out.get(key, 0) + stat.count
    return out


def _alike(first, second) -> bool:
    """Two observations (lists of recordings) ran the same forward ops as often."""
    return _counts(first) == _counts(second)


def _now() -> float:
    """perf_counter() once the device has finished the work queued so far."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def guard(func=None, **options):
    """`with matlint.guard(...):` or `@matlint.guard(...)` (also bare `@matlint.guard`)."""
    if callable(func) and not options:
        return Guard()(func)
    if func is not None:
        raise TypeError("guard() takes keyword options only")
    return Guard(**options)
