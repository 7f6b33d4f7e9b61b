"""`matlint run [options] script.py [args]`: run a script under the guard as `python script.py` would."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from .session import DEFAULT_JSON_PATH


def add_guard_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `guard()` as flags: `matlint run`'s and the `%%matlint` magic's."""
    p.add_argument("--json", default=DEFAULT_JSON_PATH, help=f"JSON report path (default {DEFAULT_JSON_PATH})")
    p.add_argument("--window", type=int, default=None,
                   help="whole steps to observe after the warm-up (default: the warm-up step's slices until steady)")
    p.add_argument("--slices", type=int, default=None,
                   help="slices a step after the warm-up is observed in (1: whole steps; default: as the cost needs)")
    p.add_argument("--warmup", type=int, default=1, help="steps to skip first (default 1)")
    p.add_argument("--select", default=None, help="comma-separated codes or prefixes")
    p.add_argument("--ignore", default=None, help="comma-separated codes or prefixes")
    p.add_argument("--no-estimate", action="store_true", help="do not time the suggested fixes")
    p.add_argument("--kernels", action="store_true", help="count CUDA kernel launches with the profiler")
    return p


def guard_options(opts) -> dict:
    """`guard()`'s keyword arguments from the parsed flags."""
    return dict(select=opts.select, ignore=opts.ignore, window=opts.window, warmup=opts.warmup,
                json_path=opts.json, estimate_savings=not opts.no_estimate, kernels=opts.kernels,
                slices=opts.slices)


def _parser() -> argparse.ArgumentParser:
    p = add_guard_options(argparse.ArgumentParser(prog="matlint run", description=__doc__))
    p.add_argument("--exit-nonzero-on-findings", action="store_true",
                   help="exit 1 when the script succeeded but findings were made")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv=None) -> int:
    opts = _parser().parse_args(argv)
    from .session import Guard

    script = opts.script
    if not os.path.exists(script):
        print(f"matlint run: can't open file {script!r}", file=sys.stderr)
        return 2
    g = Guard(**guard_options(opts))
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script] + list(opts.args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    namespace = None
    try:
        with g:
            # The script's objects outlive the report: under torch.distributed every rank reports
            # before freeing its model frees its process group (a gloo group's destructor joins its
            # threads while holding the GIL: pytorch/pytorch#56297).
            namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        del namespace  # the script's objects go only now, after the report
        sys.argv = saved_argv
        if sys.path and sys.path[0] != saved_path0:
            sys.path.pop(0)
    if code == 0 and opts.exit_nonzero_on_findings and g.findings:
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
