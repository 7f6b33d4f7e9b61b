"""Sliced observation: after the warm-up step, each observed step runs the dispatch mode over one
slice of the step, and the slices of consecutive steps together make up whole steps.

Why: the dispatch mode costs every op it sees a call from C++ into Python (an empty mode alone
makes a CPU-bound step 1.4-1.8x slower), so a step observed whole runs about twice as slow. A
step observed in one of n slices pays that on about 1/n of its ops.

How a step is cut: the warm-up step is observed whole, recorded in parts, a new part at every
module call (forward pre-hook) and at the optimizer's step (pre-hook); the log keeps each call's
depth, its module and how many ops the mode had seen before it. The cuts are placed at calls
near equal shares of the step's ops, preferring calls that follow the previous module call's
beginning or end with no op in between (the call's inputs come straight out of another module:
between the blocks of a transformer, the stages of a ResNet, the layers of an MLP, not inside an
attention's arithmetic), then the call nearest the share, then the shallowest, a top-level call
after any call inside one (the user's code hands a top-level call data made just before it).
A slice that begins at a call is observed from the call before it on (`Slicer`'s preamble).
A step that ends in the step of an optimizer whose state was made before the warm-up step is cut
there, and the other slices share the ops before it: that slice is not observed again (below),
and its ops (AdamW's `.item()` of each parameter's step count) would otherwise leave the forward
in few, large slices.

A cut is the n-th call of a step; in each sliced step the same n-th call must be the same
module, and the step must make as many calls as the warm-up did, or the plan no longer fits the
code: the slices are thrown away and whole steps are observed again (`Slicer.valid`).

How long: each slice is observed until it is steady, as a whole step is in an unsliced window:
its first observation is compared with the warm-up step's parts over the same calls (alike: both
are kept), else it is observed again until its last two observations are alike, three at most.
A slice not yet steady is observed again in the next step. A slice that is only the step of an
optimizer whose state existed before the warm-up step is steady as the warm-up observed it. The
report weighs each slice by how often it was observed (`Slicer.observed`).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

SLICES = 6           # slices a step is first cut into: the observed step costs about 1/SLICES of a whole one
MAX_SLICES = 8       # slices at most, once the first slice has measured what an observed op costs
SLICE_BUDGET = 0.2   # what observing one slice may add to a plain step (a share of its time)
MAX_OBSERVATIONS = 3  # of one slice, as the unsliced window keeps 3 steps at most
MAX_CALLS = 20_000   # calls logged in the warm-up step; a step making more is observed whole
TOP_LEVEL_RANK = 1_000  # a cut at a top-level call ranks after every call inside one


class Call(NamedTuple):
    depth: int        # 0 for a top-level module call
    owner: int        # id() of the module or optimizer
    ops_before: int   # ops the mode saw in the step before this call
    glue: int         # ... since the last module call began or ended (0: inputs straight from a module)
    settled: bool = False  # an optimizer's step whose state was made before: the same ops every step
    optimizer: bool = False  # an optimizer's step (one not settled makes its state: one-off work)


class Plan(NamedTuple):
    cuts: tuple       # ((ordinal, owner id), ...): slice i + 1 begins at the call with that 1-based ordinal
    calls: int        # calls a step makes

    @property
    def slices(self) -> int:
        return len(self.cuts) + 1

    def bounds(self, index: int) -> tuple:
        """(first, end) ordinals of slice `index`'s calls: it covers the warm-up's parts first..end-1
        (part 0 runs from the step's start to the first call, part i from call i to call i + 1)."""
        first = self.cuts[index - 1][0] if index > 0 else 0
        end = self.cuts[index][0] if index < len(self.cuts) else self.calls + 1
        return first, end


def _rank(call: Call, target: float) -> tuple:
    return (call.glue > 0, abs(call.ops_before - target), call.depth or TOP_LEVEL_RANK)


def plan_slices(log: list, total_ops: int, slices: int = SLICES, after: int = 0) -> Optional[Plan]:
    """Cuts of a step whose calls are `log` and whose ops number `total_ops` into about equal
    slices, or None where the step cannot be cut in two. With `after`, the cuts divide only the
    ops from the call with that ordinal on (the step's slices before it are already planned)."""
    if slices < 2 or not log or len(log) >= MAX_CALLS:
        return None
    last = log[-1]
    if last.settled and after < len(log):
        # A settled optimizer's step ends the step: its slice is not observed again (`Slicer`), so
        # the other slices share the ops before it.
        before = plan_slices(log[:-1], last.ops_before, slices - 1, after)
        return Plan((before.cuts if before is not None else ()) + ((len(log), last.owner),), len(log))
    first_ops = log[after - 1].ops_before if after else 0
    share = (total_ops - first_ops) / slices
    if share < 1:
        return None
    cuts = []
    last_ops = first_ops
    for j in range(1, slices):
        target = first_ops + share * j
        between = [(i, c) for i, c in enumerate(log, 1) if i > after and last_ops < c.ops_before < total_ops]
        near = [(i, c) for i, c in between if abs(c.ops_before - target) <= share / 2]
        if near:
            ordinal, call = min(near, key=lambda ic: _rank(ic[1], target))
        elif between:  # none near an equal share: the nearest call makes two slices still
            ordinal, call = min(between, key=lambda ic: abs(ic[1].ops_before - target))
        else:
            continue
        cuts.append((ordinal, call.owner))
        last_ops = call.ops_before
    if not cuts:
        return None
    return Plan(tuple(cuts), len(log))


class Slicer:
    """Which slice the step being observed runs the mode over, and what the slices recorded.

    `switch(on)` turns the dispatch mode on or off; `dispatched()` counts the ops the mode saw so
    far; `new_part()` starts a new recording for the warm-up step's next part and returns the one
    that ended; `preamble(on)` turns the mode on into a recording that is thrown away, or turns
    that recording back into the slice's own.

    A slice that begins at a call is observed from the call before it on, in its preamble: the
    ops in between (a permute, a `.contiguous()`, the batch made on the host) leave the dataflow
    tags that the slice's first ops read, while their counts belong to the slice before.

    `slices`: how many slices a step is cut into, or None to cut it into SLICES first and then
    into as many as keep each slice's cost within SLICE_BUDGET of a plain step."""

    def __init__(self, switch, dispatched, new_part, preamble, slices: Optional[int] = None):
        self._switch = switch
        self._preamble = preamble
        self._dispatched = dispatched
        self._new_part = new_part
        self.slices = slices
        self.log: Optional[list] = None   # the warm-up step's calls, while it runs
        self.parts: list = []             # ... and what each of its parts recorded
        self._log_start = 0
        self._last_event = 0              # dispatched() at the last module call's beginning or end
        self._ops = 0                     # the warm-up step's ops
        self.plan: Optional[Plan] = None
        self.index = 0                    # the slice the step now running observes
        self.valid = True                 # the step ran the plan's calls
        self.observed: list = []          # per slice, its observations kept: each a list of recordings
        self.done: list = []              # per slice, whether it is steady
        self._ordinal = 0
        self._begin = 0                   # ordinal where this step's slice begins (0: at the step's start)
        self._end = 0                     # ordinal where it ends (0: at the step's end)
        self._cuts: dict = {}
        self._calls: list = []            # the warm-up step's calls, once planned
        self._slice_start = 0             # dispatched() as the first slice began (what it saw: `fit_to_cost`)

    @property
    def active(self) -> bool:
        return self.plan is not None

    def observed_from_start(self) -> bool:
        """Whether the mode is on as the step begins: for the first slice, or for the preamble of a
        slice that begins at the step's first call."""
        return self._begin <= 1

    # -- the warm-up step --------------------------------------------------------------------
    def start_log(self) -> None:
        self.log = []
        self.parts = []
        self._log_start = self._last_event = self._dispatched()

    def on_call(self, owner, depth: int, glue_free: bool = False, settled: bool = False,
                optimizer: bool = False) -> None:
        """A module call (or the optimizer's step) begins."""
        log = self.log
        if log is not None:
            if len(log) < MAX_CALLS:
                now = self._dispatched()
                log.append(Call(depth, id(owner), now - self._log_start, 0 if glue_free else now - self._last_event,
                                settled, optimizer))
                self._last_event = now
                self.parts.append(self._new_part())
            return
        if self.plan is None:
            return
        self._ordinal = n = self._ordinal + 1
        if n + 1 == self._begin:
            self._preamble(True)
        expected = self._cuts.get(n)
        if expected is None:
            return
        if expected != id(owner):
            self.valid = False
            self._preamble(False)
            self._switch(True)  # the rest of this step is observed; the step is thrown away
        elif n == self._begin:
            self._preamble(False)
            self._switch(True)
        elif n == self._end and self.valid:
            self._switch(False)

    def on_return(self) -> None:
        """A module call ends."""
        if self.log is not None:
            self._last_event = self._dispatched()

    def end_log(self, last_part) -> bool:
        """The warm-up step ended (`last_part` recorded its last part): plan its slices. True when
        the next step starts the first."""
        log, self.log = self.log, None
        if log is None:
            return False
        self.parts.append(last_part)
        if self.slices == 1 or len(log) >= MAX_CALLS:
            return False
        self._ops = self._dispatched() - self._log_start
        self.plan = plan_slices(log, self._ops, self.slices or SLICES)
        if self.plan is None:
            return False
        self._calls = log
        self._cuts = dict(self.plan.cuts)
        self._reset_observations()
        self._begin_slice(0)
        self._slice_start = self._dispatched()
        return True

    def warmup_part(self, index: int) -> list:
        """The warm-up step's parts over slice `index`'s calls."""
        first, end = self.plan.bounds(index)
        return self.parts[first:end]

    # -- the sliced steps ----------------------------------------------------------------------
    def fit_to_cost(self, warmup_ms: float, slice_ms: float) -> None:
        """After the first slice: what one observed op costs, from the warm-up step (all ops
        observed) and this step (the first slice's), and from that the slices left re-cut into as
        many as keep each within SLICE_BUDGET of a plain step. The warm-up step's one-off work
        (new call sites, a first step's lazy set-up) makes an op look dearer: more slices, never
        fewer than the cost needs."""
        if self.slices is not None or self.plan is None or self.index != 0 or any(self.observed):
            return
        seen = self._dispatched() - self._slice_start
        rest = self._ops - seen
        if rest <= 0 or slice_ms <= 0:
            return
        per_op = (warmup_ms - slice_ms) / rest
        plain_ms = slice_ms - per_op * seen
        if per_op <= 0 or plain_ms <= 0:
            return
        wanted = min(MAX_SLICES - 1, max(1, math.ceil(rest * per_op / (SLICE_BUDGET * plain_ms))))
        if wanted == self.plan.slices - 1:
            return
        first_cut = self.plan.cuts[0]
        rest_plan = plan_slices(self._calls, self._ops, wanted, after=first_cut[0]) if wanted > 1 else None
        cuts = (first_cut,) + (rest_plan.cuts if rest_plan is not None else ())
        self.plan = Plan(cuts, self.plan.calls)
        self._cuts = dict(cuts)
        self._reset_observations()

    def step_ended_as_planned(self) -> bool:
        return self.valid and self.plan is not None and self._ordinal == self.plan.calls

    def keep(self, recording, same) -> None:
        """What this step's slice recorded. Its first observation keeps the warm-up step's parts
        over the same calls beside it where they are alike (`same(recordings, recordings)`), and the
        slice is then steady; a later one makes it steady where it is alike the one before, or where
        it is the last one kept."""
        kept = self.observed[self.index]
        observation = [recording]
        if not kept:
            warm = self.warmup_part(self.index)
            if same(observation, warm):
                kept.append(warm)
        kept.append(observation)
        if len(kept) >= 2 and same(kept[-1], kept[-2]) or len(kept) >= MAX_OBSERVATIONS:
            self.done[self.index] = True

    def finished(self) -> bool:
        return self.plan is not None and all(self.done)

    def next_slice(self) -> None:
        """The next step observes the same slice again where it is not yet steady (as an unsliced window
        observes the next step: a read gated to one step in many is seen once in three steps, not once
        in two), else the next slice not yet steady (after the last, the first), one whose warm-up part
        holds an optimizer's first step before the others: a slice the run ends before observing is
        reported as the warm-up observed it, and that part made the optimizer's state."""
        n = self.plan.slices
        left = [index for index in ((self.index + step) % n for step in range(0, n + 1)) if not self.done[index]]
        if not left:
            return
        if left[0] != self.index:
            left.sort(key=lambda index: not self._makes_optimizer_state(index))  # stable: else in turn
        self._begin_slice(left[0])

    def _makes_optimizer_state(self, index: int) -> bool:
        first, end = self.plan.bounds(index)
        return any(call.optimizer and not call.settled for call in self._calls[max(first, 1) - 1:end - 1])

    def weighed(self) -> tuple:
        """([(recordings, weight)], steps): each slice's observations (where it was never observed,
        the warm-up step's parts over its calls), weighed so that every slice counts as often as
        the others, over `steps` steps."""
        groups = [kept or [self.warmup_part(i)] for i, kept in enumerate(self.observed)]
        steps = math.lcm(*(len(kept) for kept in groups))
        return [(recording, steps // len(kept)) for kept in groups for observation in kept
                for recording in observation], steps

    def stop(self) -> None:
        """No more slices: whole steps from now on (the plan was done or did not fit)."""
        self.plan = None
        self.log = None
        self._cuts = {}
        self._calls = []
        self.parts = []
        self.observed = []
        self.done = []

    def _reset_observations(self) -> None:
        """No slice observed yet, but one that is nothing but an optimizer's step whose state was made
        before the warm-up step: its ops are the same every step, and the warm-up's parts are them."""
        self.observed = [[] for _ in range(self.plan.slices)]
        self.done = [False] * self.plan.slices
        for index in range(self.plan.slices):
            first, end = self.plan.bounds(index)
            if end == first + 1 == self.plan.calls + 1 and self._calls[first - 1].settled:
                self.observed[index].append(self.warmup_part(index))
                self.done[index] = True

    def _begin_slice(self, index: int) -> None:
        self.index = index
        self.valid = True
        self._ordinal = 0
        first, end = self.plan.bounds(index)
        self._begin = first
        self._end = end if end <= self.plan.calls else 0

