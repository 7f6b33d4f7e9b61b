"""The project's own modules that a file imports, read (parsed, never run) to see what the
functions it calls from them do: `from utils import accuracy` in train.py, accuracy's body in
utils.py next to it. A module is the project's when its file lies beside the importing file or in
a folder above it (up to `_LEVELS_UP`), as a script's sibling modules do.

What a file's findings depend on is the set of these files: the cache keys a file's findings by
their contents too (`imported_paths`).
"""
from __future__ import annotations

import ast
import os
import re
import stat
import threading
from contextlib import contextmanager
from typing import Optional

from .tree import is_main_guard

_LEVELS_UP = 2  # `src/train.py` importing `utils` from `src/`, `src/..` or `src/../..`
_PLAIN_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*)", re.M)
_PARSED: dict = {}  # path -> (size, mtime_ns, tree or None)
_SNAPSHOT = threading.local()  # `.paths` while `files_unchanged()` is open: path -> its stat (None: none)


@contextmanager
def files_unchanged():
    """The project's files are taken as they are when it opens, while it stays open (a run of the
    `matlint` command, or the lint of one file with its cache key): each path is looked up once
    (whether a file is there, and its size and modification time), however many imports and
    importers ask. Nested: the outermost one holds. One per thread."""
    if getattr(_SNAPSHOT, "paths", None) is not None:
        yield
        return
    _SNAPSHOT.paths, _SNAPSHOT.checked, _SNAPSHOT.resolved = {}, set(), {}
    try:
        yield
    finally:
        _SNAPSHOT.paths = _SNAPSHOT.checked = _SNAPSHOT.resolved = None


def _checked_in_snapshot(key) -> bool:
    """Whether `key` (a cache and its files) was found unchanged earlier in the open
    `files_unchanged()`, whose files do not change while it is open; marks it so from now on."""
    checked = getattr(_SNAPSHOT, "checked", None)
    if checked is None:
        return False
    if key in checked:
        return True
    checked.add(key)
    return False


def _stat(path: str) -> Optional[os.stat_result]:
    """`os.stat(path)`, None where there is nothing to read; once per path in `files_unchanged`."""
    seen = getattr(_SNAPSHOT, "paths", None)
    if seen is not None and path in seen:
        return seen[path]
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        found = None
    if seen is not None:
        seen[path] = found
    return found


def _is_file(path: str) -> bool:
    found = _stat(path)
    return found is not None and stat.S_ISREG(found.st_mode)


def _is_folder(path: str) -> bool:
    found = _stat(path)
    return found is not None and stat.S_ISDIR(found.st_mode)


def resolve(filename: str, module: str, level: int) -> Optional[str]:
    """The project file `module` names from `filename` (`level`: the leading dots of a relative
    import), or None (an installed package, the standard library, not found)."""
    if not filename or not _is_file(filename):
        return None
    target = os.path.abspath(filename)
    here = os.path.dirname(target)
    key = (here, module, level)
    resolved = getattr(_SNAPSHOT, "resolved", None)
    candidates = resolved.get(key) if resolved is not None else None
    if candidates is None:
        candidates = _module_files(here, module, level)
        if resolved is not None:
            resolved[key] = candidates
    found = next((path for path in candidates if path != target), None)
    name = module.strip(".")
    if found is None and not level and name and "." not in name:
        return _in_sibling_folder(here, name)
    return found


def _module_files(here: str, module: str, level: int) -> tuple:
    """The files that `module` may name from a file in the folder `here`, in the order Python
    would look: the folders `_LEVELS_UP` above it (or the package `level` dots name), and a
    `lib/` or `src/` folder beside each, where a script's packages sit on `sys.path` (put there
    by the program, `_init_paths.py`, or by an install of a src layout)."""
    parts = [p for p in module.split(".") if p]
    if level:
        bases = [here]
        for _ in range(level - 1):
            bases = [os.path.dirname(bases[0])]
    else:
        bases = [here]
        for _ in range(_LEVELS_UP):
            bases.append(os.path.dirname(bases[-1]))
    if not level and parts:
        bases += [folder for folder in (os.path.join(base, name) for base in bases for name in _PACKAGE_FOLDERS)
                  if _is_folder(folder)]
    found = []
    for base in bases:
        stem = os.path.join(base, *parts) if parts else base
        found.extend(candidate for candidate in (stem + ".py", os.path.join(stem, "__init__.py")) if _is_file(candidate))
    return tuple(found)


_PACKAGE_FOLDERS = ("lib", "src")


def _in_sibling_folder(here: str, name: str) -> Optional[str]:
    """`name.py` in a folder beside `here`, where exactly one such folder holds one: a script run
    with its project's folders on `sys.path` (`src/solver/solver.py` importing `loss` from
    `src/transformer/loss.py`)."""
    table = while_unchanged(_SIBLING_MODULES, os.path.dirname(here), _modules_in_subfolders, {})
    found = [path for path in table.get(name, ()) if os.path.dirname(path) != here]
    return found[0] if len(found) == 1 else None


def _modules_in_subfolders(parent: str) -> dict:
    """{module name: [paths of `name.py`]} of the subfolders of `parent`."""
    table: dict = {}
    try:
        folders = [e.path for e in os.scandir(parent) if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        return table
    for folder in folders[:_SIBLING_FOLDERS]:
        try:
            names = [e.name for e in os.scandir(folder) if e.name.endswith(".py") and e.is_file()]
        except OSError:
            continue
        for file in names:
            table.setdefault(file[:-3], []).append(os.path.join(folder, file))
    return table


_SIBLING_MODULES: dict = {}  # folder -> (size, mtime_ns, {module name: [`name.py` in its subfolders]})
_SIBLING_FOLDERS = 50  # a folder with more subfolders than this is no project's source folder


_RE_EXPORT_HOPS = 2  # how many package `__init__.py` re-exports a definition is followed through


def imported_files(ctx) -> list:
    """`imported_paths` of the file being linted, worked out once."""
    found = ctx.shared.get("imported_files")
    if found is None:
        found = ctx.shared["imported_files"] = imported_paths(ctx.source, ctx.filename)
    return found


def imported_paths(source: str, filename: str) -> list:
    """The project files `source` imports, from its import lines (no parse: the cache asks before
    linting), and, for names imported from a package, the modules its `__init__.py` re-exports
    them from (as `imported_definition` follows them) or the package's modules of those names
    (`from . import layers`, also where the folder has no `__init__.py`). Sorted, each once."""
    found = set()
    for match in _PLAIN_IMPORT.finditer(source):
        for name in (m.strip().split(" ")[0] for m in match.group(1).split(",")):
            path = resolve(filename, name, 0) if name else None
            if path is not None:
                found.add(path)
    for dots, module, imported in _from_imports(source):
        path = resolve(filename, module, len(dots)) if module or dots else None
        if path is None or os.path.basename(path) == "__init__.py":
            # `from . import layers`, `from pkg import utils`: modules of the package, imported by name
            for name in imported or ():
                submodule = resolve(filename, f"{module}.{name}" if module else name, len(dots))
                if submodule is not None:
                    found.add(submodule)
        if path is None:
            continue
        found.add(path)
        if os.path.basename(path) == "__init__.py":
            found.update(_re_export_sources(path, imported, _RE_EXPORT_HOPS))
    return sorted(found)


_IMPORTERS_FILES = 400  # a tree with more Python files than this is a library, not a script's project
_SKIPPED_FOLDERS = frozenset({".git", ".venv", "venv", "env", "node_modules", "site-packages", "build", "dist",
                              "__pycache__", ".tox", ".mypy_cache", ".matlint_cache"})
_IMPORTERS: dict = {}  # the nearby files -> (their mtimes, {path: the files that import it})


def steps_without_device(source: str) -> bool:
    """A training step (`.backward(`) in a file that names no device: where it runs is set by the
    files that import it (MAT401 reads them), so they are part of what its findings depend on."""
    return ".backward(" in source and not names_cuda_work(source)


def project_dependencies(source: str, filename: str) -> list:
    """The files a file's findings may depend on: the project modules it imports and the project
    files that import it (what they call on every step runs every step; where a training step in
    a file that names no device runs). For such a step, also its folder: a script added beside
    it may be the one that moves it to the device."""
    found = set(imported_paths(source, filename)) | set(importers(filename))
    if steps_without_device(source) and filename and _is_file(filename):
        found.add(os.path.dirname(os.path.abspath(filename)))
    return sorted(found)


_CUDA_WORK = re.compile(r"\bcuda\b|\.to\(\s*[\w.]*(?:device|DEVICE)|\bdevice\s*=|\.device\b"
                        r"|[Aa]ccelerator|DataParallel")
_CUDA_WORK_WORDS = ("cuda", "device", "DEVICE", "ccelerator", "DataParallel")  # one is in each match


def moves_work_to_cuda(ctx) -> bool:
    """The file moves work to a CUDA device: names CUDA (`.cuda()`, `"cuda"`, `torch.cuda`),
    moves tensors or models to a device it holds or a helper gives (`.to(device)`, `.to(DEVICE)`,
    `.to(default_device())`, `device=device`, `x.device`),
    or hands them to a framework that places them (`accelerator.prepare`, `DataParallel`). A
    file that does none of these runs its tensors where they were made, on the CPU."""
    found = ctx.shared.get("moves_work_to_cuda")
    if found is None:
        found = ctx.shared["moves_work_to_cuda"] = names_cuda_work(ctx.source)
    return found


def names_cuda_work(text: str) -> bool:
    """`moves_work_to_cuda` on a file's text: for the project files another file's findings read."""
    return any(word in text for word in _CUDA_WORK_WORDS) and _CUDA_WORK.search(text) is not None


def cpu_only_script(ctx) -> bool:
    """The file is a program (an `if __name__ == "__main__":` block, or a loop at module level)
    that never moves work to CUDA, nor does any project module it imports (a trainer it hands
    its step function, a `get_device()` helper) or that imports it (a logger module with a demo
    under its main guard, called from a training script on the GPU): everything it runs, it
    made, on the CPU."""
    found = ctx.shared.get("cpu_only_script")
    if found is None:
        found = ctx.shared["cpu_only_script"] = not moves_work_to_cuda(ctx) and any(
            isinstance(stmt, (ast.For, ast.While)) or (isinstance(stmt, ast.If) and is_main_guard(stmt.test))
            for stmt in ctx.tree.body) and not any(
            file_moves_to_cuda(path) for path in imported_files(ctx)) and not imported_by_cuda_code(ctx)
    return found


def cpu_only_project(ctx) -> bool:
    """A training step in a file that names no device (`steps_without_device`), which project
    files import, none of which names a device either: the program runs it on the CPU, where a
    host read waits for nothing. A file that no project file imports (a library's module, a
    trainer whose script lies elsewhere) may run anywhere: False. Its importers are among the
    file's `project_dependencies`, so the cache sees a script that starts moving work to CUDA."""
    found = ctx.shared.get("cpu_only_project")
    if found is None:
        found = False
        if steps_without_device(ctx.source):
            texts = importer_texts(ctx).values()
            # an importer that could not be read may move work to the device
            found = bool(texts) and not any(text is None or names_cuda_work(text) for text in texts)
        ctx.shared["cpu_only_project"] = found
    return found


def imported_by_cuda_code(ctx) -> bool:
    """A project file that imports the file being linted moves work to a CUDA device: the file's
    steps and helpers (a loss-compute class, a metric) run on the tensors it gives them there."""
    found = ctx.shared.get("imported_by_cuda_code")
    if found is None:
        found = ctx.shared["imported_by_cuda_code"] = any(file_moves_to_cuda(path) for path in importers(ctx.filename))
    return found


_BACKWARD_CALL = re.compile(r"\.backward\(")


def imported_by_training_code(ctx) -> bool:
    """A program that imports the file being linted, or imports a project module that imports it
    (train.py importing darknet.py, whose model is built of yolo_layer.py's layers), trains on a
    CUDA device (`_trains_on_cuda`): the models the file defines run on that program's steps.
    A library's trainer module, which imports every model of the library, is no program."""
    found = ctx.shared.get("imported_by_training_code")
    if found is None:
        found = ctx.shared["imported_by_training_code"] = _training_program_nearby(ctx.filename) and (
            any(_trains_on_cuda(path) for path in importers(ctx.filename))
            or any(_trains_on_cuda(path) for importer in importers(ctx.filename) for path in importers(importer))
        ) or in_script_project(ctx) and _imported_by_program_above(ctx.filename)
    return found


_PROGRAM_LEVELS_UP = 4  # `lib/model/rpn/anchor_target_layer.py`, which trainval_net.py imports three folders up


def _imported_by_program_above(filename: str) -> bool:
    """A program directly in the file's folder or in one of the `_PROGRAM_LEVELS_UP` folders above
    it trains on a CUDA device (`_trains_on_cuda`) and imports the file through any chain of
    project imports (trainval_net.py, vgg16.py, faster_rcnn.py, rpn.py, then the file)."""
    if not filename or not _is_file(filename):
        return False
    target = os.path.abspath(filename)
    return any(path != target and _trains_on_cuda(path) and target in _import_closure(path)
               for path in _programs_above(target))


_CLOSURE_FILES = 400  # the most project files a program's imports are followed through


def _import_closure(program: str) -> frozenset:
    """The project files `program` imports, directly or through the modules it imports. Worked out
    once per process while the program is unchanged."""
    return while_unchanged(_IMPORT_CLOSURES, program, _follow_imports, frozenset())


_IMPORT_CLOSURES: dict = {}  # path -> (size, mtime_ns, the files it imports, however indirectly)


def _follow_imports(program: str) -> frozenset:
    found, frontier = set(), [program]
    while frontier and len(found) < _CLOSURE_FILES:
        for imported in _direct_imports(frontier.pop()):
            if imported not in found:
                found.add(imported)
                frontier.append(imported)
    return frozenset(found)


def _training_program_nearby(filename: str) -> bool:
    """Some Python file where an importer of `filename` would sit (`importers`) is a program that
    trains on a CUDA device: the cheap test, before working out which files import which."""
    if not filename or not _is_file(filename):
        return False
    files = _nearby_python_files(os.path.dirname(os.path.abspath(filename)))
    if not files:
        return False
    return _while_files_unchanged(_TRAINING_PROGRAMS, files, lambda: any(_trains_on_cuda(path) for path in files))


_TRAINING_PROGRAMS: dict = {}  # nearby files -> (their mtimes, whether one is a program that trains on CUDA)


_PROGRAM = re.compile(r"^(?:if[ \t]+__name__[ \t]*==|for[ \t]|while[ \t])", re.M)


def _trains_on_cuda(path: str) -> bool:
    """The file at `path` is a program (an `if __name__ == "__main__":` block, or a loop at module
    level) that moves work to a CUDA device and trains: it calls `.backward(`, or a project module
    it imports does (train_student.py running `train_distill` of helper/loops.py). Read once per
    process while the file is unchanged."""
    return while_unchanged(_TRAINS_ON_CUDA, path, _reads_as_training_program, False)


_TRAINS_ON_CUDA: dict = {}  # path -> (size, mtime_ns, whether it is a program that trains on CUDA)


def _reads_as_training_program(path: str) -> bool:
    text = read_text(path)
    if text is None or _PROGRAM.search(text) is None or not names_cuda_work(text):
        return False
    return _BACKWARD_CALL.search(text) is not None or any(file_runs_backward(p) for p in imported_paths(text, path))


def read_text(path: str) -> Optional[str]:
    """The text of the file at `path`, None where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def file_moves_to_cuda(path: str) -> bool:
    """The project file at `path` (a trainer that a script hands its step function, a module
    that picks the device) moves work to a CUDA device. Read once per process while the file is
    unchanged: rules ask it for every candidate node."""
    return while_unchanged(_MOVES_TO_CUDA, path, _names_cuda_work_in, False)


def file_runs_backward(path: str) -> bool:
    """The project file at `path` spells a backward pass (`.backward(`): a function of it may be a
    training step. Read once per process while the file is unchanged."""
    return _mentions(path, ".backward(")


def _names_cuda_work_in(path: str) -> bool:
    text = read_text(path)
    return text is not None and names_cuda_work(text)


def while_unchanged(cache: dict, path: str, compute, missing=None):
    """`compute(path)`, worked out once per process while the file at `path` keeps its size and
    modification time (kept in `cache`, path -> (size, mtime_ns, value)); `missing` where the
    file cannot be read."""
    st = _stat(path)
    if st is None:
        return missing
    cached = cache.get(path)
    if cached is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
        return cached[2]
    value = compute(path)
    cache[path] = (st.st_size, st.st_mtime_ns, value)
    return value


_MOVES_TO_CUDA: dict = {}  # path -> (size, mtime_ns, whether it moves work to CUDA)


def importer_texts(ctx) -> dict:
    """The text of each project file that imports the file being linted (`importers`), by path;
    None for one that could not be read. Read once per file linted."""
    found = ctx.shared.get("importer_texts")
    if found is None:
        found = ctx.shared["importer_texts"] = {}
        for path in importers(ctx.filename):
            found[path] = read_text(path)
    return found


def importers(filename: str, most: int = None) -> list:
    """The project files that import `filename`, directly or through a package's `__init__.py`
    that imports it (`from algo import PPO` with `algo/__init__.py` importing `.ppo`): those
    `imported_paths` resolves to it among the Python files of its folder and the two below it,
    and those beside the folders `_LEVELS_UP` above it, where a script that imports it sits
    (none where there are more than `_IMPORTERS_FILES` of them, or more than `most`). Worked out
    once per process while no such file changes."""
    if not filename or not _is_file(filename):
        return []
    target = os.path.abspath(filename)
    files = _nearby_python_files(os.path.dirname(target))
    if files is None or most is not None and len(files) > most:
        return []
    table = _while_files_unchanged(_IMPORTERS, files, lambda: _importers_table(files))
    found, frontier = set(), {target}
    for _ in range(_RE_EXPORT_HOPS + 1):
        reached = set().union(*(table.get(path, ()) for path in frontier)) - found - {target}
        found |= reached
        frontier = {path for path in reached if os.path.basename(path) == "__init__.py"}
        if not frontier:
            break
    if len(files) <= SCRIPT_PROJECT_FILES:
        found.update(path for path in _programs_above(target) if path != target and target in _direct_imports(path))
    return sorted(found)


def _programs_above(target: str) -> list:
    """The programs (`_PROGRAM`) directly in the file's folder and in the folders up to
    `_PROGRAM_LEVELS_UP` above it: scripts beside the package folder they put on `sys.path`
    (trainval_net.py importing `lib/model/utils/net_utils.py`)."""
    found = []
    folder = os.path.dirname(target)
    for _ in range(_PROGRAM_LEVELS_UP + 1):
        found.extend(path for path in _python_files_in(folder, []) if _is_program(path))
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return found


def _is_program(path: str) -> bool:
    return while_unchanged(_PROGRAMS, path, lambda p: _PROGRAM.search(read_text(p) or "") is not None, False)


_PROGRAMS: dict = {}  # path -> (size, mtime_ns, whether the file is a program)


def _direct_imports(path: str) -> frozenset:
    """The project files the file at `path` imports (`imported_paths`), read once per process
    while it is unchanged."""
    return while_unchanged(_DIRECT_IMPORTS, path, _read_direct_imports, frozenset())


_DIRECT_IMPORTS: dict = {}  # path -> (size, mtime_ns, the files it imports)


def _read_direct_imports(path: str) -> frozenset:
    text = read_text(path)
    return frozenset(os.path.abspath(p) for p in imported_paths(text, path)) if text is not None else frozenset()


def _importers_table(files: list) -> dict:
    """{path: the files among `files` that import it}."""
    table: dict = {}
    for path in files:
        for imported in _direct_imports(path):
            table.setdefault(imported, set()).add(path)
    return table


def _while_files_unchanged(cache: dict, files: list, compute):
    """`compute()`, worked out once per process while none of `files` changes its modification
    time (kept in `cache`, tuple(files) -> (their mtimes, value))."""
    key = tuple(files)
    cached = cache.get(key)
    if cached is not None and _checked_in_snapshot((id(cache), key)):
        return cached[1]
    stats = tuple(_mtime(path) for path in files)
    if cached is None or cached[0] != stats:
        cached = cache[key] = (stats, compute())
    return cached[1]


SCRIPT_PROJECT_FILES = 150  # the most Python files a script's project holds; a tree of more is a library's


def in_script_project(ctx) -> bool:
    """The file lies in a tree of at most `SCRIPT_PROJECT_FILES` Python files: a script's project,
    whose modules the analyses follow into each other (a library's tree is read file by file)."""
    found = ctx.shared.get("in_script_project")
    if found is None:
        size = project_size(ctx.filename)
        found = ctx.shared["in_script_project"] = size is not None and size <= SCRIPT_PROJECT_FILES
    return found


def project_size(filename: str) -> Optional[int]:
    """How many Python files lie where the files that import `filename` would (`importers`);
    None past `_IMPORTERS_FILES` (a library's tree)."""
    if not filename or not _is_file(filename):
        return None
    files = _nearby_python_files(os.path.dirname(os.path.abspath(filename)))
    return None if files is None else len(files)


def _nearby_python_files(here: str) -> Optional[list]:
    """The Python files where a script or module that imports one in `here` sits: those of the
    folder above `here` and of its folders down to two below `here` (`here` itself, its
    siblings: `models/attn.py` importing `utils/masking.py`), and those directly in the folder
    above that. Where that is more than `_IMPORTERS_FILES` files, `here` and the two folders below
    it, and the files directly in the folders `_LEVELS_UP` above it; None past that too. Listed
    once per process while none of the folders read changes (a file added or removed)."""
    cached = _NEARBY.get(here)
    if cached is not None and (_checked_in_snapshot((id(_NEARBY), here))
                               or all(_mtime(folder) == mtime for folder, mtime in cached[0])):
        return cached[1]
    folders: list = []
    found = _list_nearby(here, folders)
    _NEARBY[here] = ([(folder, _mtime(folder)) for folder in folders], found)
    return found


_NEARBY: dict = {}  # folder -> ([(each folder read, its mtime)], its nearby Python files or None)


def _list_nearby(here: str, folders: list) -> Optional[list]:
    parent = os.path.dirname(here)
    wide = _walk_python_files(parent, 3, folders) if parent != here else None
    if wide is not None:
        wide.extend(_python_files_in(os.path.dirname(parent), folders))
        if len(wide) <= _IMPORTERS_FILES:
            return wide
    found = _walk_python_files(here, 2, folders)
    if found is None:
        return None
    above = here
    for _ in range(_LEVELS_UP):
        above = os.path.dirname(above)
        found.extend(_python_files_in(above, folders))
    return found if len(found) <= _IMPORTERS_FILES else None


def _walk_python_files(top: str, depth: int, folders: list) -> Optional[list]:
    """The Python files of `top` and of its folders up to `depth` below it (each folder read is
    added to `folders`); None past `_IMPORTERS_FILES`."""
    found = []
    base_depth = top.rstrip(os.sep).count(os.sep)
    for folder, dirs, names in os.walk(top):
        folders.append(folder)
        if folder.rstrip(os.sep).count(os.sep) - base_depth >= depth:
            dirs[:] = []
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_FOLDERS and not d.startswith("."))
        found.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
        if len(found) > _IMPORTERS_FILES:
            return None
    return found


def _python_files_in(folder: str, folders: list) -> list:
    folders.append(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.endswith(".py") and _is_file(os.path.join(folder, n))]


def _mtime(path: str) -> int:
    found = _stat(path)
    return found.st_mtime_ns if found is not None else 0


def _from_imports(source: str):
    """(dots, module, the names imported, or None for `*`) of each `from ... import ...` line."""
    for match in _FROM_IMPORT.finditer(source):
        dots, module, listed = match.groups()
        listed = listed.strip().strip("()")
        if listed.strip() == "*":
            yield dots, module, None
            continue
        yield dots, module, {part.split()[0] for part in listed.replace("\\", " ").split(",") if part.split()}


def _re_export_sources(init: str, names, hops: int) -> set:
    """The modules the package `init` (`__init__.py`) re-exports `names` (None: all) from, followed
    through re-exporting packages up to `hops` times."""
    if hops <= 0:
        return set()
    found = set()
    for dots, module, exported in while_unchanged(_INIT_IMPORTS, init, _from_import_lines, ()):
        shared = names if exported is None else (exported if names is None else exported & names)
        if shared is not None and not shared:
            continue
        path = resolve(init, module, len(dots)) if module or dots else None
        if path is None:
            continue
        found.add(path)
        if os.path.basename(path) == "__init__.py":
            found |= _re_export_sources(path, shared, hops - 1)
    return found


def _from_import_lines(path: str) -> list:
    text = read_text(path)
    return list(_from_imports(text)) if text is not None else []


_INIT_IMPORTS: dict = {}  # path -> (size, mtime_ns, its `_from_imports`)


def parsed(path: str) -> Optional[ast.Module]:
    """The module at `path`, parsed once per process while its file is unchanged."""
    return while_unchanged(_PARSED, path, _parse_file)


def _parse_file(path: str) -> Optional[ast.Module]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        tree = ast.parse(data)
    except (OSError, SyntaxError, ValueError):
        return None
    _PARSED_FROM[path] = (len(data), hash(data))
    return tree


_PARSED_FROM: dict = {}  # path -> (length, hash) of the bytes `parsed` read


def parsed_from(filename: str, data: bytes) -> Optional[ast.Module]:
    """The tree `parsed` holds for the file at `filename` when it was parsed from these same
    bytes (a file the analysis of another one read before the engine came to lint it), else None."""
    path = os.path.abspath(filename)
    cached = _PARSED.get(path)
    if cached is None or cached[2] is None or _PARSED_FROM.get(path) != (len(data), hash(data)):
        return None
    return cached[2]


def imported_function(ctx, func: ast.AST) -> Optional[tuple]:
    """(the function definition, its file) that `func` names through an import of a project
    module at the file's top level (`accuracy` after `from utils import accuracy`, `utils.accuracy`
    after `import utils`), else None."""
    return imported_definition(ctx, func, (ast.FunctionDef, ast.AsyncFunctionDef))


def imported_definition(ctx, func: ast.AST, kinds: tuple) -> Optional[tuple]:
    """(the top-level definition of one of `kinds`, its file) that `func` names through an import
    of a project module, else None. Worked out once per file for each name or `module.name`."""
    if isinstance(func, ast.Name):
        spelled = func.id
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        spelled = (func.value.id, func.attr)
    else:
        return None
    key = ("imported_definition", spelled, kinds)
    if key not in ctx.shared:
        ctx.shared[key] = _imported_definition(ctx, func, kinds)
    return ctx.shared[key]


def _imported_definition(ctx, func: ast.AST, kinds: tuple) -> Optional[tuple]:
    table = import_table(ctx)
    if isinstance(func, ast.Name) and func.id in table:
        module, level, attr = table[func.id]
    elif isinstance(func, ast.Name) and table.get(_STARS):
        return _star_imported(ctx, func.id, table[_STARS], kinds)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in table:
        module, level, attr = table[func.value.id]
        if attr is not None:  # `from ..utils import box_utils`, then `box_utils.f(...)`: a module of a package
            submodule = resolve(ctx.filename, f"{module}.{attr}" if module else attr, level)
            return _definition_in(submodule, func.attr, kinds, _RE_EXPORT_HOPS) if submodule else None
        attr = func.attr
    else:
        return None
    return _definition_in(resolve(ctx.filename, module, level), attr, kinds, _RE_EXPORT_HOPS)


def imported_number(ctx, module: str, level: int, name: str) -> bool:
    """`from module import name` binds a Python number: the project module binds `name` once,
    at its top level, to an int or float literal (`SOS_token = 0` in load.py), and nothing there
    rebinds it."""
    key = ("imported_number", module, level, name)
    found = ctx.shared.get(key)
    if found is None:
        path = resolve(ctx.filename, module, level)
        tree = parsed(path) if path is not None else None
        found = ctx.shared[key] = tree is not None and _binds_number_once(tree, name)
    return found


def _binds_number_once(tree: ast.Module, name: str) -> bool:
    top = [s for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
           and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    if len(top) != 1 or not (isinstance(top[0].value, ast.Constant) and type(top[0].value.value) in (int, float)):
        return False
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    return len(stores) == 1 and not any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(tree))


def _definition_in(path: Optional[str], name: str, kinds: tuple, hops: int) -> Optional[tuple]:
    """(the top-level definition of `name` in the module at `path`, its file), following a
    re-export (`from .util import mask_`, `from .base import *` in a package's `__init__.py`) up to
    `hops` times."""
    tree = parsed(path) if path is not None else None
    if tree is None:
        return None
    definition = next((s for s in tree.body if isinstance(s, kinds) and s.name == name), None)
    if definition is not None:
        return definition, path
    if hops > 0 and os.path.basename(path) == "__init__.py":
        table = _import_table(tree)
        imported = table.get(name)
        if imported is not None and imported[2] is not None:
            module, level, attr = imported
            return _definition_in(resolve(path, module, level), attr, kinds, hops - 1)
        if imported is None:  # `from .base import *`
            for module, level in table.get(_STARS) or ():
                found = _definition_in(resolve(path, module, level), name, kinds, hops - 1)
                if found is not None:
                    return found
    return None


def _mentions(path: str, word: str) -> bool:
    """The file's text holds `word` (read once per process while the file is unchanged)."""
    return while_unchanged(_MENTIONS.setdefault(word, {}), path, lambda p: _holds(p, word), False)


def _holds(path: str, word: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return word.encode() in handle.read()
    except OSError:
        return False


_MENTIONS: dict = {}  # word -> {path: (size, mtime_ns, whether the text holds it)}


def imported_definitions(ctx, mentioning: tuple) -> list:
    """(local name, top-level function or class definition, its file) for each name the file
    imports by name from a module of the project (`from loss import LossCompute`) whose text
    holds every word of `mentioning` (the others are not parsed)."""
    key = ("project_definitions", mentioning)
    found = ctx.shared.get(key)
    if found is None:
        found = []
        table = import_table(ctx)
        trees: dict = {}  # (module, level) -> its parsed tree, or None
        for name, entry in table.items():
            if name is _STARS or entry[2] is None:
                continue
            module, level, attr = entry
            if (module, level) not in trees:
                path = resolve(ctx.filename, module, level)
                trees[(module, level)] = (path, parsed(path) if path is not None and all(
                    _mentions(path, w) for w in mentioning) else None)
            path, tree = trees[(module, level)]
            definition = next((s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                               and s.name == attr), None) if tree is not None else None
            if definition is not None:
                found.append((name, definition, path))
        ctx.shared[key] = found
    return found


def _star_imported(ctx, name: str, stars: list, kinds: tuple) -> Optional[tuple]:
    """(definition, file) of `name` that a `from utils import *` of a project module brings, the
    last such import that defines it winning, as in Python; None where the file binds the name
    itself at its top level."""
    table = ctx.shared.get("project_star_names")
    if table is None:  # built once per file: name -> (definition, file)
        table = {}
        for module, level in stars:
            path = resolve(ctx.filename, module, level)
            tree = parsed(path) if path is not None else None
            for stmt in tree.body if tree is not None else ():
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    table[stmt.name] = (stmt, path)
        # what the file's own top level binds (names in its nested scopes too: a safe excess)
        for node in ast.walk(ctx.tree) if table else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                table.pop(node.name, None)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                table.pop(node.id, None)
        ctx.shared["project_star_names"] = table
    found = table.get(name)
    return found if found is not None and isinstance(found[0], kinds) else None


_STARS = None  # the import table's key for the modules imported with `*`


def import_table(ctx) -> dict:
    """`_import_table` of the file, read once (no file of the project is looked up for it)."""
    table = ctx.shared.get("import_table")
    if table is None:
        table = ctx.shared["import_table"] = _import_table(ctx.tree)
    return table


def _import_table(tree: ast.Module) -> dict:
    """local name -> (module, level, imported attribute or None for a whole module); under
    `_STARS`, the (module, level) of each `from module import *`."""
    table = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name == "*":
                    table.setdefault(_STARS, []).append((stmt.module or "", stmt.level))
                else:
                    table[alias.asname or alias.name] = (stmt.module or "", stmt.level, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname or "." not in alias.name:
                    table[alias.asname or alias.name] = (alias.name, 0, None)
    return table


def _local_from_imports(tree: ast.Module, table: dict) -> dict:
    """`table` with the `from module import name` lines inside functions added, where the module
    level binds no such name (`from functions.denoising import generalized_steps` in the method
    that calls it)."""
    added = dict(table)
    stack = [stmt for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name != "*" and (alias.asname or alias.name) not in table:
                    added.setdefault(alias.asname or alias.name, (stmt.module or "", stmt.level, alias.name))
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(s for s in getattr(stmt, field, ()) if isinstance(s, (ast.stmt, ast.excepthandler)))
    return added


def linted_project_imports(ctx) -> dict:
    """`project_imports` of the linted file, read once per file."""
    found = ctx.shared.get("project_imports")
    if found is None:
        found = ctx.shared["project_imports"] = project_imports(ctx.tree, ctx.filename) if ctx.filename else {}
    return found


def project_imports(tree: ast.Module, filename: str) -> dict:
    """What the imports of the file at `filename` bind to project files: `{local name: (path,
    name)}` for a definition imported from a module (`from utils import accuracy as acc`, also
    inside a function), `{alias: (path, None)}` for a module (`import utils`, `from utils import
    array_tool as at`), and under `"*"` the paths of the modules imported with `*`. Paths are
    absolute."""
    found = {}
    for local, entry in _local_from_imports(tree, _import_table(tree)).items():
        if local is _STARS:
            stars = [os.path.abspath(p) for p in (resolve(filename, m, level) for m, level in entry) if p]
            if stars:
                found["*"] = stars
            continue
        module, level, name = entry
        if name is not None:
            submodule = resolve(filename, f"{module}.{name}" if module else name, level)
            if submodule is not None:
                found[local] = (os.path.abspath(submodule), None)
                continue
        path = resolve(filename, module, level) if module or level else None
        if path is not None:
            found[local] = (os.path.abspath(path), name)
    return found


_RESOLVERS: dict = {}  # path -> (its parsed tree, a NameResolver of it)


def star_imported_aliases(tree: ast.Module, filename: str, importing: frozenset = frozenset()) -> dict:
    """The qualified names that the file's `from module import *` lines of project modules bind
    (`torch`, `nn`, `np` from a utils module that imports them), public names only; also those
    such a module takes with its own `import *` (train.py's `from network import *`, where
    network.py has `from module import *` and module.py `import torch as t`)."""
    found = {}
    stars = _import_table(tree).get(_STARS) if filename else None
    for module, level in stars or ():
        path = resolve(filename, module, level)
        if path is None or path in importing or parsed(path) is None:
            continue
        resolver = _RESOLVERS.get(path)
        if resolver is None or resolver[0] is not parsed(path):
            from .names import NameResolver

            imported = star_imported_aliases(parsed(path), path, importing | {filename})
            resolver = _RESOLVERS[path] = (parsed(path), NameResolver(parsed(path), imported))
        found.update((name, qual) for name, qual in resolver[1].module_aliases().items() if not name.startswith("_"))
    return found
