"""Where the rules' runtime halves register, keyed by code (as torch registers its FLOP formulas).

A rule with a runtime check is a package under `rules/` whose `runtime` submodule registers its
check and the estimators of the fixes it suggests:

    from matlint.runtime_guard.registry import estimator, runtime_check

    @runtime_check("MAT101")
    def check_loop_matmul(rec, steps, ctx):      # Recording, observed steps, DeviceContext
        yield finding("MAT101", site, message, evidence, LoopEstimate(...))

    @estimator("loop")                            # the `kind` of the estimate specs it times
    def estimate_loop(spec: LoopEstimate, budget):
        return timed.scaled(spec.loops_per_step), "how it was timed"

Only the guard imports those submodules (`load()`, when it runs its checks or estimates): they
import torch, and `import matlint.rules.<rule>` must not.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional

RUNTIME_MODULE = "runtime"


class RegistrationError(Exception):
    pass


@dataclass(frozen=True)
class RuntimeCheck:
    """`fn(rec, steps, ctx)` yields the code's findings over a recording.

    `needs_gpu`: evaluated only on a CUDA GPU with tensor cores (elsewhere the guard says it was
    not). `drop_negligible`: a finding whose measured saving is negligible is dropped after the
    estimates (`checks.negligible`); `dropped_note(gpu_wait_ms, step_ms)`, when given, is the
    note that says why."""

    code: str
    fn: Callable
    needs_gpu: bool = False
    drop_negligible: bool = False
    dropped_note: Optional[Callable] = None

    @property
    def where(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


@dataclass(frozen=True)
class Estimator:
    """`fn(spec, budget) -> ((saved, lo, hi, pairs), method)`: milliseconds per step, for the
    estimate specs whose `kind` is `kind`. `kernel_time_only`: the fix only makes kernels
    shorter (no fewer launches, no less host work), so its saving is capped by how long the host
    waited for the GPU."""

    kind: str
    fn: Callable
    kernel_time_only: bool = False

    @property
    def where(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


_checks: dict = {}
_estimators: dict = {}
_loaded = False


def runtime_check(code: str, *, needs_gpu: bool = False, drop_negligible: bool = False,
                  dropped_note: Optional[Callable] = None):
    """Registers the decorated function as the runtime check of `code`."""

    def register(fn):
        if code in _checks:
            raise RegistrationError(f"runtime check {code} registered twice: {_checks[code].where} and "
                                    f"{fn.__module__}.{fn.__qualname__}")
        _checks[code] = RuntimeCheck(code, fn, needs_gpu, drop_negligible, dropped_note)
        return fn

    return register


def estimator(kind: str, *, kernel_time_only: bool = False):
    """Registers the decorated function as the estimator of the specs whose `kind` is `kind`."""

    def register(fn):
        if kind in _estimators:
            raise RegistrationError(f"estimator {kind!r} registered twice: {_estimators[kind].where} and "
                                    f"{fn.__module__}.{fn.__qualname__}")
        _estimators[kind] = Estimator(kind, fn, kernel_time_only)
        return fn

    return register


def runtime_modules() -> list:
    """The names of the rule packages' `runtime` submodules, found without importing them."""
    import matlint.rules as pkg

    names = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.ispkg or info.name.startswith("_"):
            continue
        package = f"{pkg.__name__}.{info.name}"
        if importlib.util.find_spec(f"{package}.{RUNTIME_MODULE}") is not None:
            names.append(f"{package}.{RUNTIME_MODULE}")
    return sorted(names)


def load() -> None:
    """Imports every rule's runtime submodule (once), and checks that each registered check
    belongs to a rule of the catalog."""
    global _loaded
    if _loaded:
        return
    for name in runtime_modules():
        importlib.import_module(name)
    from matlint.registry import rules_by_code

    known = rules_by_code()
    orphans = [f"{c.code} ({c.where})" for c in _checks.values() if c.code not in known]
    if orphans:
        raise RegistrationError(f"runtime checks without a rule: {', '.join(orphans)}")
    _loaded = True


def checks() -> dict:
    """Code -> RuntimeCheck, by code."""
    load()
    return _checks


def estimators() -> dict:
    """Estimate kind -> Estimator."""
    load()
    return _estimators
