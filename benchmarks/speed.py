"""matlint's speed and memory against its peers (ruff, flake8, torchfix, fixit), in one run,
with every target of the speed issue checked against the numbers of that same run.

    python benchmarks/speed.py --output benchmarks/results/static_speed_main_corpus.md   # the default corpus
    python benchmarks/speed.py --corpus timm,torchvision --repeat 5          # a smaller one

The corpus is the sources of transformers, timm, torchvision, diffusers and lightning, as
benchmarks/real_code.py downloads them (cached outside the repository); --corpus picks others.

Every tool runs in a virtual environment outside the repository (default
~/.cache/matlint-bench/venv), created and filled on first use: the peers from the package index,
and matlint as a wheel built at the start of each run from a copy of this checkout (uncommitted
changes included). matlint has to live in flake8's own environment for its flake8 plugin to be
measured; a snapshot wheel, rather than an editable install, writes nothing into the checkout and
keeps what is measured fixed while others edit the tree. flake8 loads every installed plugin
whatever `--select` says, so the flake8 rows switch plugins on and off by uninstalling and
reinstalling matlint and torchfix in that environment.

Each command runs as a child process with its output thrown away, its working directory an
empty scratch folder (no config file applies; matlint's cache lives there). os.wait4 gives the
wall time, the CPU time (user + system, of the process and the children it waited for) and the
peak RSS of the largest single process: multi-process runs (matlint --jobs N, flake8, torchfix,
fixit) hold more than that in total. Each command is run --repeat times and the medians are
reported, except that a command stops repeating once it has used --budget seconds. The runs go
in rounds (every command once per round), so drift in the machine's speed falls on every row.
Ratios compare CPU time: on a shared machine wall time swings with the load, CPU time less.

ruff runs twice: with its default threads, and pinned to one core (`taskset -c 0`), as the
issue's single-core figures were measured; the ruff target is checked against the pinned run.

torchfix, fixit and flake8 with torchfix installed are one to two orders of magnitude slower
than the rest, so they run on a sample of the corpus (every k-th file), beside matlint --jobs 1
and plain flake8 on the same sample: their ratios compare the same files, nothing is
extrapolated. --sample 1 runs them on the whole corpus.

The one-changed-file row lints a copy of the corpus with a warm cache, appends a comment to
one file and lints again; the cache writes one entry per file it lints (a hit rewrites
nothing), so the entries rewritten by the second run are the files it re-linted.

The language server's latency comes from benchmarks/server_latency.py, run in the same
environment (matlint installed there with its `server` extra).

flake8 with and without the plugin also runs under callgrind on a few files of the corpus
(when valgrind is installed): instruction counts do not move with the machine's load, so they
settle the few-percent questions (1.05×, 1.2×) that timings on a shared machine cannot.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_code  # noqa: E402  (its fetch() downloads and unpacks the corpus)

DEFAULT_CORPUS = real_code.CORPORA["main"]
# The notebooks of benchmarks/notebook_corpus, where its run.py caches them.
NOTEBOOKS = Path(os.environ.get("MATLINT_NOTEBOOK_CORPUS", Path.home() / ".cache" / "matlint-notebook-corpus")) / "notebooks"
PEERS = ["ruff", "flake8", "torchfix", "fixit"]
# torchfix has depended on torch in some releases; an unpinned torch would pull gigabytes.
CONSTRAINTS = "torch==2.13.0\n"
# Linters exit 1 when they find something; that is a successful run here.
OK_CODES = (0, 1)


# -- environment ----------------------------------------------------------------------------

def venv_bin(venv: Path, name: str) -> str:
    return str(venv / "bin" / name)


def pip(venv: Path, *args) -> subprocess.CompletedProcess:
    if args[0] == "install":
        constraints = venv / "constraints.txt"
        constraints.write_text(CONSTRAINTS)
        args = (*args, "-c", str(constraints))
    return subprocess.run([venv_bin(venv, "python"), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def installed(venv: Path) -> dict:
    """Distribution name (lower case) -> version, for everything in the venv."""
    code = ("import importlib.metadata as m\n"
            "for d in m.distributions(): print(d.metadata['Name'].lower(), d.version)")
    # -I: not the working directory, where a checkout's *.egg-info would pass for an installed matlint.
    out = subprocess.run([venv_bin(venv, "python"), "-I", "-c", code], capture_output=True, text=True, check=True)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def build_matlint_wheel(dest: Path) -> Path:
    """A wheel of the checkout as it is now, built from a copy (the build writes into its source)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode()
    shutil.rmtree(dest, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "matlint"
        for rel in filter(None, listed.split("\0")):
            if (REPO / rel).is_file():
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, src / rel)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dest), str(src)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit("cannot build a matlint wheel:\n" + done.stderr)
    return next(dest.glob("matlint-*.whl"))


def setup_venv(venv: Path, wheel: Path) -> dict:
    """Create the venv and install what is missing; return {peer: error} for peers that failed."""
    if not (venv / "bin" / "python").exists():
        print(f"creating {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    have = installed(venv)
    errors = {}
    for peer in PEERS:
        if peer not in have:
            print(f"installing {peer}", file=sys.stderr)
            done = pip(venv, "install", peer)
            if done.returncode:
                errors[peer] = "install failed: " + last_line(done.stderr)
    # The version number does not change with the code: replace whatever matlint is there.
    # The server extra brings the language client and server the latency row runs.
    for step in (["--no-deps", "--force-reinstall", str(wheel)], [f"{wheel}[server]"]):
        done = pip(venv, "install", *step)
        if done.returncode:
            raise SystemExit("cannot install matlint into the benchmark venv:\n" + done.stderr)
    return errors


def set_plugins(venv: Path, wanted: set, sources: dict) -> None:
    """Install exactly the flake8 plugins in `wanted` among `sources` ({name: pip requirement})."""
    have = installed(venv)
    for name, requirement in sources.items():
        if name in have and name not in wanted:
            pip(venv, "uninstall", "-y", name)
        elif name not in have and name in wanted:
            done = pip(venv, "install", "--no-deps", requirement)
            if done.returncode:
                raise SystemExit(f"cannot reinstall {name}:\n{done.stderr}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


# -- measuring -------------------------------------------------------------------------------

@dataclass
class Run:
    wall: float
    cpu: float
    rss_mb: float


@dataclass(eq=False)
class Bench:
    name: str
    argv: list            # the files are appended
    plugins: set          # flake8 plugins that must be installed (and no others)
    needs: tuple = ()     # peers it runs
    sample: bool = False  # runs on the sample instead of the whole corpus
    prime: bool = False   # run once, untimed, before measuring (warm cache)
    reference: bool = False
    runs: list = field(default_factory=list)
    error: Optional[str] = None

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


def run_once(argv: list, cwd: Path, timeout: float):
    """One run of `argv`: a Run, or a string saying why it failed."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        except OSError as exc:
            return f"cannot start: {exc}"
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        # os.wait4 rather than getrusage(RUSAGE_CHILDREN) deltas: ru_maxrss of the latter is the
        # largest child of the whole benchmark so far, not of this run.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if timed_out.is_set():
            return f"timed out after {timeout:g} s"
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode not in OK_CODES or "Traceback (most recent call last)" in stderr:
        return f"exit {proc.returncode}: {last_line(stderr)}"
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def measure_once(bench: Bench, files: list, cwd: Path, budget: float, timeout: float) -> None:
    """One more timed run of `bench`, unless it failed or has used up its budget (a warm-cache
    command is primed by one untimed run before its first)."""
    if bench.error or (bench.runs and sum(r.wall for r in bench.runs) >= budget):
        return
    argv = [*bench.argv, *files]  # every tool gets the same files, not folders
    if bench.prime and not bench.runs:
        outcome = run_once(argv, cwd, timeout)
        if isinstance(outcome, str):
            bench.error = outcome
            return
    outcome = run_once(argv, cwd, timeout)
    if isinstance(outcome, str):
        bench.error = outcome
        return
    bench.runs.append(outcome)
    print(f"  {bench.name}: {outcome.wall:.2f} s wall, {outcome.cpu:.2f} s CPU, {outcome.rss_mb:.0f} MB",
          file=sys.stderr)


def changed_file_rerun(matlint: list, files: list, scratch: Path, timeout: float):
    """Lint a copy of `files` with a warm cache, change one file, lint again.

    Returns (files re-linted by the second run, its Run, the changed file's path in the copy),
    or a string saying what failed. The cache writes one entry per file it lints and none for
    a hit, so the entries the second run rewrote are the files it re-linted (the snapshot of the
    whole run, one more file that any run with a miss rewrites, is not an entry).
    """
    tree = scratch / "changed-file"
    shutil.rmtree(tree, ignore_errors=True)
    common = Path(os.path.commonpath(files))
    copies = []
    for f in files:
        target = tree / "src" / Path(f).relative_to(common)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        copies.append(str(target))
    argv = [*matlint, "--jobs", "1", *copies]
    for _ in range(2):  # the second run confirms the cache is warm
        outcome = run_once(argv, tree, timeout)
        if isinstance(outcome, str):
            return outcome

    def entries():
        # v2: matlint/cache.py's FORMAT, the folder of the per-file entries
        return {p: p.stat().st_mtime_ns for p in tree.rglob(".matlint_cache/v2/**/*") if p.is_file()}

    before = entries()
    if not before:
        return "no cache entries were written"
    changed = next((c for c in copies if b"torch" in Path(c).read_bytes()), copies[0])
    with open(changed, "a", encoding="utf-8") as handle:
        handle.write("\n# changed by the benchmark\n")
    time.sleep(0.01)  # a rewritten entry gets a later mtime even on coarse clocks
    outcome = run_once(argv, tree, timeout)
    if isinstance(outcome, str):
        return outcome
    after = entries()
    relinted = sum(1 for p, mtime in after.items() if before.get(p) != mtime)
    shutil.rmtree(tree, ignore_errors=True)
    return relinted, outcome, str(Path(changed).relative_to(tree / "src"))


def flake8_instructions(flake8: str, selects: tuple, files: list, cwd: Path, timeout: float):
    """Instructions (callgrind's count, a fixed hash seed) that `flake8 -j1 --select <select>`
    executes on `files` and on a one-line file, for each of `selects`: {select: (one-line, files)},
    or a string saying why not. Counts do not move with the machine's load, so they settle the
    few-percent questions that timings on a shared machine cannot."""
    if not shutil.which("valgrind"):
        return "valgrind is not installed"
    one_line = cwd / "one_line.py"
    one_line.write_text("x = 1\n")
    counts = {}
    for select in selects:
        pair = []
        for targets in ([str(one_line)], files):
            done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", flake8, "-j1",
                                   "--select", select, *targets], cwd=cwd, capture_output=True, text=True,
                                  timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
            match = re.search(r"Collected : (\d+)", done.stderr)
            if not match:
                return f"callgrind failed: {last_line(done.stderr)}"
            pair.append(int(match.group(1)))
        counts[select] = tuple(pair)
    return counts


def server_latency(python: str, cwd: Path, timeout: float):
    """benchmarks/server_latency.py's median edit-to-diagnostics latency in ms, and its output.
    It runs outside the checkout: there `python -m matlint.server` would import the source tree,
    not the wheel."""
    script = Path(__file__).resolve().parent / "server_latency.py"
    try:
        done = subprocess.run([python, str(script)], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    match = re.search(r"median ([0-9.]+) ms", done.stdout)
    if not match:
        return None, last_line(done.stderr or done.stdout) or f"exit {done.returncode}"
    return float(match.group(1)), done.stdout.strip()


# -- corpus ----------------------------------------------------------------------------------

def corpus_files(names: list) -> list:
    folders = real_code.fetch(names, real_code.corpus_root())
    return sorted(str(p) for folder in folders for p in folder.rglob("*.py"))


def count_lines(files: list) -> int:
    return sum(Path(f).read_bytes().count(b"\n") for f in files)


def notebook_code_lines(notebooks: list) -> int:
    """Lines of the notebooks' code cells (what both linters read)."""
    sys.path.insert(0, str(REPO))
    from matlint.notebook import code_text

    return sum(code_text(Path(f).read_bytes()).count("\n") for f in notebooks)


def corpus_versions(names: list) -> str:
    root = real_code.corpus_root() / "sources"
    found = [d.name.removesuffix(".dist-info") for n in names for d in (root / n).glob("*.dist-info")]
    return ", ".join(v.replace("-", " ", 1) for v in found)


# -- report ----------------------------------------------------------------------------------

def machine() -> list:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown CPU")
    cores = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [f"{platform.system()} {platform.release()}, {model}, {cores} cores usable, {memory:.0f} GiB RAM",
            f"Python {platform.python_version()}"]


def checkout_version() -> str:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True).stdout
    return f"commit {commit}{' with uncommitted changes' if dirty.strip() else ''}"


def versions(venv: Path, matlint_commit: str) -> str:
    have = installed(venv)
    matlint = f"matlint {have.get('matlint', '?')} ({matlint_commit})"
    others = [f"{n} {have[n]}" for n in ("ruff", "flake8", "pyflakes", "pycodestyle", "torchfix", "fixit", "libcst")
              if n in have]
    return ", ".join([matlint, *others])


def table(benches: list, lines: int) -> list:
    ref = next(b for b in benches if b.reference)
    out = ["| command | runs | wall s | CPU s | lines/s (CPU) | peak MB | × matlint -j1 CPU |",
           "|---|--:|--:|--:|--:|--:|--:|"]
    for b in benches:
        if b.error or not b.runs:
            out.append(f"| {b.name} | – | {b.error or 'not run'} | | | | |")
            continue
        wall, cpu = b.median("wall"), b.median("cpu")
        ratio = f"{cpu / ref.median('cpu'):.2f}" if ref.runs else "–"
        out.append(f"| {b.name} | {len(b.runs)} | {wall:.2f} | {cpu:.2f} | {lines / max(cpu, 1e-9):,.0f} | "
                   f"{b.median('rss_mb'):.0f} | {ratio} |")
    return out


def cpu_ratio(benches: list, numerator: str, denominator: str) -> Optional[float]:
    a, b = (next((x for x in benches if x.name == n), None) for n in (numerator, denominator))
    if not (a and b and a.runs and b.runs):
        return None
    return a.median("cpu") / b.median("cpu")


def overhead(benches: list, base: str, other: str) -> str:
    a, b = (next(x for x in benches if x.name == n) for n in (base, other))
    if not (a.runs and b.runs):
        return f"- `{other}`: not measured"
    return (f"- `{other}` vs `{base}`: {b.median('cpu') / a.median('cpu'):.2f}× CPU time, "
            f"{b.median('wall') / a.median('wall'):.2f}× wall time")


def instruction_lines(instructions: dict, few: list) -> list:
    base = instructions.get(frozenset())
    mine = instructions.get(frozenset({"matlint"}))
    failed = next((x for x in (base, mine) if isinstance(x, str)), None)
    if base is None or mine is None or failed:
        return [f"- not measured: {failed or 'skipped (--callgrind-files 0)'}"]
    rows = [("--select E,F,W, no plugins", base["E,F,W"]), ("--select E,F,W, matlint installed", mine["E,F,W"]),
            ("--select E,F,W,MAT", mine["E,F,W,MAT"])]
    one0, all0 = base["E,F,W"]
    out = [f"`flake8 -j1` on {len(few)} files of the corpus ({count_lines(few):,} lines) and on a one-line file; "
           "millions of instructions, and the ratio to flake8 without plugins:", "",
           "| command | one-line file | the files | the files less the one-line file |", "|---|--:|--:|--:|"]
    for name, (one, all_) in rows:
        out.append(f"| flake8 {name} | {one / 1e6:,.0f} ({one / one0:.3f}×) | {all_ / 1e6:,.0f} ({all_ / all0:.3f}×) | "
                   f"{(all_ - one) / 1e6:,.0f} ({(all_ - one) / (all0 - one0):.3f}×) |")
    return out


def instruction_ratio(instructions: dict, select: str) -> Optional[float]:
    base, mine = instructions.get(frozenset()), instructions.get(frozenset({"matlint"}))
    if not isinstance(base, dict) or not isinstance(mine, dict):
        return None
    return mine[select][1] / base["E,F,W"][1]


def verdict(name: str, value: Optional[float], limit: float, unit: str, fmt: str = ".2f") -> str:
    if value is None:
        return f"| {name} | not measured | {limit:{fmt}}{unit} | – |"
    return f"| {name} | {value:{fmt}}{unit} | ≤ {limit:{fmt}}{unit} | {'met' if value <= limit else 'NOT MET'} |"


# -- main ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="main",
                        help="comma-separated packages, or 'main' (transformers, timm, torchvision, diffusers, "
                             "lightning), 'extra', as in real_code.py; default: %(default)s")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command, medians reported (default: 3)")
    parser.add_argument("--budget", type=float, default=300,
                        help="no new run of a command starts once it has used this many seconds (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before one run is killed (default: 900)")
    parser.add_argument("--sample", type=float, default=0.05,
                        help="fraction of the files the slow peers run on (default: 0.05)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="matlint's --jobs for the parallel rows (default: usable cores)")
    parser.add_argument("--callgrind-files", type=int, default=20,
                        help="files of the corpus on which flake8's instructions are counted under callgrind, "
                             "with and without matlint (default: %(default)s; 0 skips it)")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS,
                        help="a folder of .ipynb files timed with matlint against ruff, one core "
                             "(default: the notebook corpus, `benchmarks/notebook_corpus/run.py` fills it; "
                             "skipped when absent)")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "matlint-bench" / "venv")
    parser.add_argument("--output", type=Path, help="also write the markdown report to this file")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.corpus.split(",") if n.strip()]
    names = [m for n in names for m in real_code.CORPORA.get(n, [n])]
    files = corpus_files(names)
    if not files:
        raise SystemExit("the corpus has no .py files")
    step = max(1, round(1 / args.sample))
    sample = files[::step]
    lines, sample_lines = count_lines(files), count_lines(sample)

    matlint_version = checkout_version()
    wheel = build_matlint_wheel(args.venv.parent / "wheel")
    errors = setup_venv(args.venv, wheel)
    have = installed(args.venv)
    sources = {"matlint": str(wheel)}
    if "torchfix" in have:
        sources["torchfix"] = f"torchfix=={have['torchfix']}"
    scratch = args.venv.parent / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    bin_ = lambda name: venv_bin(args.venv, name)  # noqa: E731
    matlint = [bin_("matlint"), "check", "--format", "concise", "--exit-zero"]
    flake8 = [bin_("flake8"), "--select", "E,F,W"]
    ruff = [bin_("ruff"), "check", "--no-cache", "--output-format", "concise", "--exit-zero"]
    one_core = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if shutil.which("taskset") else []
    j = args.jobs
    ref_name, flake8_name = "matlint --jobs 1 --no-cache", "flake8 --select E,F,W (no plugins)"
    ruff_all_one = "ruff check --select ALL --no-cache, one core" if one_core else "ruff check --select ALL --no-cache"
    full = [
        Bench(ref_name, [*matlint, "--jobs", "1", "--no-cache"], {"matlint"}, reference=True),
        Bench(f"matlint --jobs {j} --no-cache", [*matlint, "--jobs", str(j), "--no-cache"], {"matlint"}),
        Bench("matlint --jobs 1, warm cache", [*matlint, "--jobs", "1"], {"matlint"}, prime=True),
        Bench(f"matlint --jobs {j}, warm cache", [*matlint, "--jobs", str(j)], {"matlint"}, prime=True),
        Bench("ruff check --no-cache", [*ruff], {"matlint"}, ("ruff",)),
        Bench("ruff check --select ALL --no-cache", [*ruff, "--select", "ALL"], {"matlint"}, ("ruff",)),
        *([Bench("ruff check --no-cache, one core", [*one_core, *ruff], {"matlint"}, ("ruff",)),
           Bench(ruff_all_one, [*one_core, *ruff, "--select", "ALL"], {"matlint"}, ("ruff",))] if one_core else []),
        Bench(flake8_name, flake8, set(), ("flake8",)),
        Bench("flake8 --select E,F,W (matlint installed)", flake8, {"matlint"}, ("flake8",)),
        Bench("flake8 --select E,F,W,MAT", [bin_("flake8"), "--select", "E,F,W,MAT"], {"matlint"}, ("flake8",)),
    ]
    slow = [
        Bench(ref_name, [*matlint, "--jobs", "1", "--no-cache"], {"matlint"}, reference=True),
        Bench(flake8_name, flake8, set(), ("flake8",)),
        Bench("flake8 --select E,F,W (torchfix installed)", flake8, {"torchfix"}, ("flake8",)),
        Bench("torchfix", [bin_("torchfix")], {"torchfix"}),
        Bench("fixit lint", [bin_("fixit"), "lint"], {"matlint"}, ("fixit",)),
    ]
    for b in full + slow:
        b.sample = any(b is s for s in slow)
        b.error = next((errors[p] for p in (*b.needs, *b.plugins) if p in errors), None)

    load_before = os.getloadavg()
    plugin_sets = {}
    # Rounds: every command runs once per round, so a machine that gets slower or faster during
    # the run moves all rows alike instead of the ones measured last. Within a round the commands
    # are grouped by plugin set (each set installed once), and every other round takes the sets
    # in reverse order, so that no row always runs first or last.
    order = [set(), {"torchfix"}, {"matlint"}]
    for round_ in range(args.repeat):
        for plugins in (order if round_ % 2 == 0 else order[::-1]):
            group = [b for b in full + slow if b.plugins == plugins]
            set_plugins(args.venv, plugins, sources)
            if frozenset(plugins) not in plugin_sets:
                flake8_version = subprocess.run([bin_("flake8"), "--version"], capture_output=True, text=True).stdout
                plugin_sets[frozenset(plugins)] = " ".join(flake8_version.split())
            for b in group:
                if b.prime and not b.runs:
                    shutil.rmtree(scratch / ".matlint_cache", ignore_errors=True)
                measure_once(b, sample if b.sample else files, scratch, args.budget, args.timeout)
    notebooks = sorted(str(p) for p in args.notebooks.rglob("*.ipynb")) if args.notebooks.is_dir() else []
    notebook_benches = [
        Bench(ref_name, [*matlint, "--jobs", "1", "--no-cache"], {"matlint"}, reference=True),
        *([Bench("ruff check --no-cache, one core", [*one_core, *ruff], {"matlint"}, ("ruff",)),
           Bench(ruff_all_one, [*one_core, *ruff, "--select", "ALL"], {"matlint"}, ("ruff",))] if one_core else
          [Bench("ruff check --no-cache", ruff, {"matlint"}, ("ruff",)),
           Bench(ruff_all_one, [*ruff, "--select", "ALL"], {"matlint"}, ("ruff",))]),
    ] if notebooks else []
    if notebook_benches:
        print("  notebooks ...", file=sys.stderr)
        set_plugins(args.venv, {"matlint"}, sources)
        for b in notebook_benches:
            b.error = next((errors[p] for p in b.needs if p in errors), None)
        for _ in range(args.repeat):
            for b in notebook_benches:
                measure_once(b, notebooks, scratch, args.budget, args.timeout)
    instructions = {}
    few = files[::max(1, len(files) // max(args.callgrind_files, 1))][:args.callgrind_files]
    if few:
        print("  flake8 under callgrind ...", file=sys.stderr)
        for plugins, selects in ((set(), ("E,F,W",)), ({"matlint"}, ("E,F,W", "E,F,W,MAT"))):
            set_plugins(args.venv, plugins, sources)
            instructions[frozenset(plugins)] = flake8_instructions(bin_("flake8"), selects, few, scratch,
                                                                   args.timeout)
    set_plugins(args.venv, set(sources), sources)
    print("  one changed file ...", file=sys.stderr)
    changed = changed_file_rerun(matlint, files, scratch, args.timeout)
    print("  language server latency ...", file=sys.stderr)
    latency_ms, latency_text = server_latency(bin_("python"), scratch, args.timeout)
    load_after = os.getloadavg()

    ref = full[0]
    torchfix_ratio = cpu_ratio(slow, "torchfix", ref_name)
    if isinstance(changed, str):
        changed_lines = [f"- failed: {changed}"]
        relinted = None
    else:
        relinted, rerun, changed_path = changed
        changed_lines = [f"- after a warm run, `{changed_path}` got one more line; the next `matlint check "
                         f"--jobs 1` re-linted {relinted} of {len(files)} files (cache entries rewritten) in "
                         f"{rerun.wall:.2f} s wall, {rerun.cpu:.2f} s CPU"]
    warm = next(b for b in full if b.name == "matlint --jobs 1, warm cache")
    targets = [
        "| target | measured | limit | |",
        "|---|--:|--:|---|",
        verdict("matlint -j1 cold CPU / torchfix CPU (sample)", 1 / torchfix_ratio if torchfix_ratio else None,
                1 / 25, "", ".3f"),
        verdict("matlint -j1 cold CPU / flake8 E,F,W CPU", cpu_ratio(full, ref_name, flake8_name), 0.5, "×"),
        verdict(f"matlint -j1 cold CPU / {ruff_all_one} CPU", cpu_ratio(full, ref_name, ruff_all_one), 3, "×"),
        verdict("matlint -j1 cold CPU / ruff ALL --no-cache CPU (default threads)",
                cpu_ratio(full, ref_name, "ruff check --select ALL --no-cache"), 3, "×"),
        verdict("warm re-run of the unchanged corpus, wall", warm.median("wall") if warm.runs else None, 0.5, " s"),
        verdict("files re-linted after one file changed", relinted, 1, "", ".0f"),
        verdict("flake8 E,F,W,MAT CPU / flake8 E,F,W CPU",
                cpu_ratio(full, "flake8 --select E,F,W,MAT", flake8_name), 1.2, "×"),
        verdict("flake8 E,F,W CPU, matlint installed / not installed",
                cpu_ratio(full, "flake8 --select E,F,W (matlint installed)", flake8_name), 1.05, "×"),
        verdict(f"the same two, in instructions (callgrind), flake8 -j1 on {len(few)} files: E,F,W,MAT / E,F,W",
                instruction_ratio(instructions, "E,F,W,MAT"), 1.2, "×", ".3f"),
        verdict("... and E,F,W, matlint installed / not installed",
                instruction_ratio(instructions, "E,F,W"), 1.05, "×", ".3f"),
        verdict("peak memory, matlint -j1 cold", ref.median("rss_mb") if ref.runs else None, 300, " MB", ".0f"),
        verdict("language server: edit to diagnostics, 2,000-line file (median)", latency_ms, 50, " ms", ".1f"),
    ]

    report = [
        f"# matlint speed, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        *(f"- {line}" for line in machine()),
        f"- load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.1f}' for x in load_after)}",
        f"- {versions(args.venv, matlint_version)}",
        f"- corpus: {corpus_versions(names)}: {len(files)} files, {lines:,} lines; "
        f"sample: 1 file in {step}, {len(sample)} files, {sample_lines:,} lines",
        f"- medians of {args.repeat} runs (fewer where a command used up its {args.budget:.0f} s budget); "
        "CPU = user + system time of all its processes; peak MB = largest single process",
        "- the peers run with their default parallelism (ruff threads; flake8, torchfix and fixit worker "
        "processes on every usable core) unless the row says one core; ratios are of CPU time",
        "",
        "## Targets",
        "",
        *targets,
        "",
        f"## Whole corpus ({len(files)} files, {lines:,} lines)",
        "",
        *table(full, lines),
        "",
        f"## Slow peers, on the sample ({len(sample)} files, {sample_lines:,} lines)",
        "",
        *table(slow, sample_lines),
        "",
        *([f"## Notebooks ({len(notebooks)} notebooks of {args.notebooks}, {notebook_code_lines(notebooks):,} lines "
           "of cell code)", "", *table(notebook_benches, notebook_code_lines(notebooks)), ""]
          if notebook_benches else []),
        "## One changed file",
        "",
        *changed_lines,
        "",
        "## Language server (benchmarks/server_latency.py)",
        "",
        *(f"    {line}" for line in latency_text.splitlines()),
        "",
        "## flake8 plugin overhead (same command, same venv, plugin installed or not)",
        "",
        overhead(full, flake8_name, "flake8 --select E,F,W (matlint installed)"),
        overhead(full, flake8_name, "flake8 --select E,F,W,MAT"),
        overhead(slow, flake8_name, "flake8 --select E,F,W (torchfix installed)"),
        "",
        "Instructions executed (callgrind, PYTHONHASHSEED=0; the same with and without matlint installed):",
        "",
        *instruction_lines(instructions, few),
        "",
        "flake8 --version per plugin set:",
        "",
        *(f"- {' + '.join(sorted(k)) or 'no plugins'}: `{v}`" for k, v in plugin_sets.items()),
        "",
    ]
    text = "\n".join(report)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
