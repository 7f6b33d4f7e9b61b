"""MAT502 at runtime: host syncs issued per step, from the ops the guard saw and from torch's own
sync detector (runtime_guard/syncs.py). Imported only by the guard (needs torch)."""
from __future__ import annotations

import os
from collections import defaultdict

from matlint.runtime_guard.checks import ROUND_TRIPS_MIN_PER_STEP, finding, rollout_sites, stays_on_host
from matlint.runtime_guard.registry import runtime_check

SYNC_MIN_PER_STEP = 2   # syncs a step from one line, torch's own among them (GradScaler's one check is inherent)
OWN_SYNC_MIN_PER_STEP = 1  # ... or the user's own calls (`loss.item()` once a step)
ROLLOUT_SYNCS_PER_ITERATION = 2  # a rollout's line reading about once an iteration (an argument check) is its design
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"})


def _is_sync(key, ctx) -> bool:
    if key.op in SYNC_OPS:
        # A read of data that stays on the host waits for nothing. On the CPU nothing syncs; count
        # what would on a GPU, issued by the user's own code.
        return not stays_on_host(key, ctx) and (key.device == "cuda" or key.direct)
    return bool(key.out) and key.out[2] == "d2h"


def _round_trips(rec, site, count, steps) -> bool:
    """Whether the host needs the values read at `site` to make the model's next input: at least
    ROUND_TRIPS_MIN_PER_STEP reads a step, and most of them, came back (a tensor made from Python
    data after the read fed a GEMM; capture.Recorder._host_read). A rollout reads each action for
    the environment's next state, a decoder on the host each token: the loop itself runs through
    the host, and reading less often would change what it computes."""
    trips = rec.host_round_trips.get(site, 0)
    return trips / steps >= ROUND_TRIPS_MIN_PER_STEP and 2 * trips >= count


def _graph_break_lines(rec) -> set:
    """(file, line) of the graph breaks torch.compile made in the window: MAT505 reports each with
    dynamo's reason (a data-dependent branch, `.item()`) and its fix, which is the sync's too."""
    events = rec.compile_events
    if events is None:
        return set()
    return {(os.path.abspath(site.filename), site.lineno) for site, _ in events.breaks}


@runtime_check("MAT502")
def check_host_syncs(rec, steps, ctx):
    breaks = _graph_break_lines(rec)
    per_site = defaultdict(lambda: [0, 0, []])
    for key, stat in rec.ops.items():
        if key.backward or not _is_sync(key, ctx):
            continue
        entry = per_site[(key.site, key.module)]
        entry[0] += stat.count
        entry[1] += stat.count if key.direct else 0
        entry[2].append(key)
    reported, design = set(), set()
    rollout = rollout_sites(rec, steps)
    rollout_limit = ROLLOUT_SYNCS_PER_ITERATION * sum(rec.host_round_trips.values()) / steps
    for (site, module), (count, own, keys) in per_site.items():
        per_step = count / steps
        if per_step < SYNC_MIN_PER_STEP and own / steps < OWN_SYNC_MIN_PER_STEP:
            continue
        if _round_trips(rec, site, count, steps) or (os.path.abspath(site.filename), site.lineno) in breaks:
            design.add(site)  # the same line's syncs that the detector counts too
            continue
        if site in rollout and per_step <= rollout_limit:
            continue  # a sync or two an iteration of a loop that waits for the device at each anyway
        ops = sorted({k.qualname for k in keys})
        where = "each one waits for the GPU" if ctx.device_type == "cuda" else "on a GPU each one would wait for the device"
        read = "once per step (or every N steps)" if per_step >= 2 else \
            "every N steps, or accumulate on the device and read once after the loop"
        msg = (f"{per_step:g} host sync{'s' if per_step != 1 else ''} per step from this line ({', '.join(ops)}): "
               f"{where}; keep the values on the device and read them {read}")
        ev = {"per_step": round(per_step, 2), "module": module, "ops": ops, "device": ctx.device_type,
              "phase": "forward"}
        reported.add(site)
        yield finding("MAT502", site, msg, ev)
    # The rest that torch's own sync detector saw (syncs.py): ops that wait inside C++, such as
    # boolean-mask indexing or a shape read off the data.
    for site, count in rec.syncs.items():
        per_step = count / steps
        if site in reported or site in design or per_step < SYNC_MIN_PER_STEP:
            continue
        if _round_trips(rec, site, count, steps):
            continue
        if site in rollout and per_step <= rollout_limit:
            continue
        msg = (f"{per_step:g} host syncs per step from this line, found by torch's sync detector (an op that "
               f"waits for the GPU inside: boolean-mask indexing, `nonzero`, a shape read off the data, a copy to "
               f"the host): keep the work on the device (`torch.where`, masks of fixed shape) or do it every N steps")
        yield finding("MAT502", site, msg, {"per_step": round(per_step, 2), "device": "cuda", "phase": "forward",
                                            "found_by": "torch.cuda.set_sync_debug_mode"})
