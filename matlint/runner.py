"""Lints many files: read bytes, pre-filter, cache, engine; in parallel over processes.

Nothing that goes wrong with one file stops the run or prints a traceback: an unexpected
exception becomes a MAT000 finding for that file.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Callable, Optional

from . import engine, notebook
from .cache import Cache
from .semantic.project import files_unchanged, project_dependencies
from .diagnostics import Finding
from .files import unreadable
from .registry import rules_fingerprint

# Below this many files, starting worker processes costs more than it saves.
MIN_FILES_FOR_PARALLEL = 48
# Below this many files, opening each one's cache entry is quick enough: no snapshot of the run.
MIN_FILES_FOR_SNAPSHOT = 48
CHUNK_SIZE = 16


def internal_error(path: str, exc: BaseException) -> Finding:
    return Finding("MAT000", f"internal error while linting this file ({type(exc).__name__}: {exc}); "
                   "the other files were still linted", path, 1, 1, 1, 1)


def finalize(findings: list, path: str, settings) -> list:
    """Drop codes the settings switch off for this path (engine codes, per-file-ignores)."""
    enabled = settings.enabled_codes()
    return [f for f in findings if f.code in enabled and not settings.is_ignored(path, f.code)]


def lint_path(path: str, settings, cache: Optional[Cache]) -> tuple:
    """Findings for one file, before per-file-ignores, and its stat taken before it was read (what
    a cache may store them under; None without a cache, or where the file could not be read)."""
    with files_unchanged():  # the project's files, looked up once for the key and the lint
        return _lint_path(path, settings, cache)


def _lint_path(path: str, settings, cache: Optional[Cache]) -> tuple:
    entry = stat = None
    if cache:
        stat = cache.stat(path)  # before the read: a write after it makes the next run look again
        entry = cache.load(path) if stat is not None else None
        cached = cache.unchanged(entry, path, stat)
        if cached is not None:
            return cached, stat
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return [unreadable(path, exc.strerror or str(exc))], None
    if not engine.mentions_torch(data):
        # Not parsed at all, and no entry of its own (a run's snapshot holds it); only an
        # undecodable file is worth a word.
        return engine.lint_bytes(data, path, ()), stat
    if cache:
        # Findings may read the project modules the file imports (and, for some, the files that
        # import it): they are part of the key
        text = notebook.code_text(data) if path.endswith(notebook.NOTEBOOK_SUFFIX) else data.decode("utf-8", "replace")
        imports = project_dependencies(text, path)
        key = cache.key(data, path, imports)
        recorded = cache.with_imports(stat, imports)
        cached = cache.same_key(entry, path, key)
        if cached is None:
            with collector_paused_per_file():
                cached = engine.lint_bytes(data, path, settings.enabled_rules(), settings.rule_options)
        cache.put(key, path, cached, recorded)  # a hit by content is stored again under the new stat
        return cached, recorded
    with collector_paused_per_file():
        return engine.lint_bytes(data, path, settings.enabled_rules(), settings.rule_options), None


@contextmanager
def collector_paused_per_file():
    """No cyclic garbage collection while one file is linted, one young-generation pass after it.

    Parsing allocates hundreds of thousands of AST nodes, which set off full collections that
    scan every live object again and again (a fifth of the run). The file's own objects are freed
    by reference counting or by the pass at the end, so memory stays bounded by one file.
    Restores the collector's state, so it is safe inside a user's process too.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _lint_one(path: str, settings, cache: Optional[Cache]) -> tuple:
    """(findings before per-file-ignores, stat) as `lint_path` gives them, or an internal error."""
    try:
        return lint_path(path, settings, cache)
    except Exception as exc:  # one file's failure must not end the run
        return [internal_error(path, exc)], None


def _lint_chunk(paths: list, settings, use_cache: bool) -> list:
    cache = Cache(settings.cache_path(), settings.fingerprint()) if use_cache else None
    with files_unchanged():  # the project as the chunk found it, each path looked up once
        return [_lint_one(path, settings, cache) for path in paths]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ignore_interrupts() -> None:
    # ^C is the parent's to handle; workers that also raised would each print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _context():
    # fork starts workers in milliseconds with the rules already imported; elsewhere spawn.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods and sys.platform == "linux" else None)


def lint_files(paths: list, settings, use_cache: bool = True, jobs: Optional[int] = None,
               on_progress: Optional[Callable[[int], None]] = None) -> list:
    """Findings for every file in `paths`, sorted by file and position."""
    jobs = jobs or default_jobs()
    results: dict = {}  # path -> (findings before per-file-ignores, stat)
    cache = Cache(settings.cache_path(), settings.fingerprint()) if use_cache else None
    snapshot = cache is not None and len(paths) >= MIN_FILES_FOR_SNAPSHOT
    if snapshot:
        for path, record in cache.load_snapshot(paths).items():
            stat = cache.stat(path)
            found = cache.snapshot_findings(record, path, stat)
            if found is not None:
                results[path] = (found, stat)
        if on_progress and results:
            on_progress(len(results))
    todo = [p for p in paths if p not in results]
    if jobs > 1 and len(todo) >= MIN_FILES_FOR_PARALLEL:
        # Import the rules and hash their sources once, here: forked workers inherit both.
        settings.enabled_rules()
        if use_cache:
            rules_fingerprint()
        chunks = [todo[i:i + CHUNK_SIZE] for i in range(0, len(todo), CHUNK_SIZE)]
        try:
            pool = ProcessPoolExecutor(max_workers=min(jobs, len(chunks)), mp_context=_context(),
                                       initializer=_ignore_interrupts)
        except OSError:
            pool = None  # no workers can start here: lint in this process
        if pool is not None:
            try:
                futures = {pool.submit(_lint_chunk, chunk, settings, use_cache): chunk for chunk in chunks}
                for future in as_completed(futures):
                    chunk = futures[future]
                    try:
                        chunk_results = future.result()
                    except BrokenProcessPool:
                        raise
                    except Exception as exc:
                        chunk_results = [([internal_error(p, exc)], None) for p in chunk]
                    results.update(zip(chunk, chunk_results))
                    if on_progress:
                        on_progress(len(chunk))
            except (BrokenProcessPool, OSError):
                pass  # a worker died: lint what is left in this process
            finally:
                # On ^C, do not wait for the queued chunks.
                pool.shutdown(wait=True, cancel_futures=True)
    with files_unchanged():  # the project as the run found it, each path looked up once
        for path in todo:
            if path not in results:
                results[path] = _lint_one(path, settings, cache)
                if on_progress:
                    on_progress(1)
    if snapshot and todo:
        cache.save_snapshot(paths, [results[p][1] for p in paths], [results[p][0] for p in paths])
    findings = [f for path in paths for f in finalize(results[path][0], path, settings)]
    findings.sort(key=Finding.sort_key)
    return findings


def lint_discovered(found, settings, **options) -> list:
    """Findings for what `files.find_files` found: its MAT003 problems and its files' findings."""
    problems = [f for problem in found.problems for f in finalize([problem], problem.filename, settings)]
    return sorted(problems + lint_files(found.files, settings, **options), key=Finding.sort_key)
