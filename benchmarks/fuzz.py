"""Long property run over generated programs: no internal error, fixes that parse and are
idempotent, safe fixes that remove their finding, CRLF-independent findings
(the properties are `check_program` in tests/program_strategies.py).

Generators: `torch` (hypothesis strategies composing PyTorch-flavoured code), `mutation`
(random line/token edits of real files: examples/, the rules' examples, the stdlib, and the
corpus of benchmarks/real_code.py when it is cached), `grammar` (hypothesmith's
`from_grammar()`, with torch imports prepended so the rules run).

    python benchmarks/fuzz.py                                  # 50,000 programs
    python benchmarks/fuzz.py --count 2000 --mix torch=1 --jobs 2

A failing program is minimized (line-level) and saved under --failures; the run goes on.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import sysconfig
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import program_strategies as programs  # noqa: E402

CHUNK = 500


def _corpus_files(limit_bytes: int) -> list:
    """Real files that mention torch from the cached corpus, plus stdlib files."""
    root = Path(os.environ.get("MATLINT_CORPUS", Path.home() / ".cache" / "matlint-corpus")) / "sources"
    paths = sorted(root.glob("*/**/*.py")) if root.exists() else []
    paths += sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return [p for p in paths if 0 < p.stat().st_size <= limit_bytes]


def _hypothesis_run(strategy, count: int, seed: int, check):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    ran, failures = [0], []

    @fixed_seed(seed)
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # throughput run: slow generation is expected
    @given(strategy)
    def run(source):
        ran[0] += 1
        problems = check(source)
        if problems:
            failures.append((source, problems))

    run()
    return ran[0], failures


def run_chunk(task):
    """One worker task: (generator, count, seed) -> (generator, programs run, seconds, failures, codes)."""
    generator, count, seed = task
    codes: Counter = Counter()

    def check(source):
        problems, findings = programs.check_program_findings(source)
        codes.update({f.code for f in findings})
        return problems

    start = time.perf_counter()
    if generator == "torch":
        ran, failures = _hypothesis_run(programs.torch_programs(), count, seed, check)
    elif generator == "grammar":
        import hypothesmith

        ran, failures = _hypothesis_run(hypothesmith.from_grammar().map(programs.with_torch_header), count, seed, check)
    else:
        rng = random.Random(seed)
        seeds = programs.seed_files()
        files = _corpus_files(30_000)
        ran, failures = 0, []
        for _ in range(count):
            if files and rng.random() < 0.7:
                path = rng.choice(files)
                try:
                    base = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
            else:
                base = rng.choice(seeds)
            mutator = programs.mutate_until_parses if rng.random() < 0.5 else programs.mutate
            source = mutator(base, rng, rounds=rng.randint(1, 4))
            ran += 1
            problems = programs.check_program(source)
            if problems:
                failures.append((source, problems))
    return generator, ran, time.perf_counter() - start, failures, codes


def _minimize(source: str) -> str:
    first = programs.check_program(source)
    kinds = {p.split(" at ")[0].split(":")[0] for p in first}
    return programs.minimize(source, lambda s: bool(
        {p.split(" at ")[0].split(":")[0] for p in programs.check_program(s)} & kinds))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=50_000, help="programs in all (default 50000)")
    parser.add_argument("--mix", default="torch=6,mutation=3,grammar=1",
                        help="share of each generator (default torch=6,mutation=3,grammar=1)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--failures", type=Path, default=REPO / "benchmarks" / "results" / "fuzz-failures",
                        help="folder for minimized failing programs")
    args = parser.parse_args(argv)

    weights = {name: float(w) for name, w in (item.split("=") for item in args.mix.split(","))}
    unknown = set(weights) - {"torch", "mutation", "grammar"}
    if unknown:
        parser.error(f"unknown generators {sorted(unknown)}")
    total_weight = sum(weights.values())
    tasks = []
    for name, weight in weights.items():
        share = round(args.count * weight / total_weight)
        for index, start in enumerate(range(0, share, CHUNK)):
            tasks.append((name, min(CHUNK, share - start), args.seed * 100_003 + index * 7919 + len(name)))

    totals: Counter = Counter()
    seconds: Counter = Counter()
    codes: Counter = Counter()
    failures = []
    wall = time.perf_counter()
    pool = Pool(args.jobs) if args.jobs > 1 else None
    with pool or contextlib.nullcontext():
        for generator, ran, spent, found, seen in (pool.imap_unordered(run_chunk, tasks) if pool else map(run_chunk, tasks)):
            totals[generator] += ran
            seconds[generator] += spent
            codes.update(seen)
            failures.extend((generator, source, problems) for source, problems in found)
            print(f"{sum(totals.values()):>7} programs  {time.perf_counter() - wall:7.0f} s  "
                  f"{len(failures)} failing", flush=True)
    wall = time.perf_counter() - wall

    print(f"\n{'generator':<10} {'programs':>9} {'worker s':>9} {'programs/s':>11}")
    for name in weights:
        rate = totals[name] / seconds[name] if seconds[name] else 0.0
        print(f"{name:<10} {totals[name]:>9} {seconds[name]:>9.0f} {rate:>11.1f}")
    print(f"{'all':<10} {sum(totals.values()):>9} {wall:>9.0f} {sum(totals.values()) / wall:>11.1f}  (wall, {args.jobs} jobs)")
    if codes:
        print("rules with findings on generated programs:", ", ".join(f"{c} {n}" for c, n in sorted(codes.items())))
    if failures:
        args.failures.mkdir(parents=True, exist_ok=True)
        for index, (generator, source, problems) in enumerate(failures):
            small = _minimize(source)
            path = args.failures / f"{generator}-{index}.py"
            header = "".join(f"# {p}\n" for p in problems)
            path.write_text(header + small, encoding="utf-8")
            print(f"FAIL {path}: {problems[0]}")
    print(f"{len(failures)} failing programs")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
