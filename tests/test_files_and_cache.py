"""Which files a run lints, and the content-hash cache."""
from __future__ import annotations

import json
import os
import time
import subprocess
from pathlib import Path

import pytest

from matlint.config import load_settings
from matlint.files import UsageError, find_files

from matlint_helpers import bad_example, run_matlint, write

SOURCE = "import torch\nx = torch.ones(1)\n"


def _found(root: Path, *paths) -> set:
    settings = load_settings(root)
    found = find_files([str(p) for p in paths] or [str(root)], settings)
    return {Path(p).relative_to(root).as_posix() for p in found.files}


@pytest.fixture
def tree(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    for name in ("a.py", "stubs/b.pyi", "pkg/c.py", "notes.txt", "script",
                 ".git/hooks/h.py", ".hg/x.py", "node_modules/m/n.py", "pkg/__pycache__/c.py",
                 ".tox/py/t.py", ".mypy_cache/m.py", ".matlint_cache/x.py", "build/lib/b.py", "dist/d.py",
                 "proj.egg-info/e.py", "venv_any_name/lib/site.py", "pkg/ignored_by_git.py",
                 "pkg/sub/generated/g.py", "pkg/sub/keep.py", "pkg/sub/skip.py"):
        write(tmp_path / name, SOURCE)
    write(tmp_path / "venv_any_name" / "pyvenv.cfg", "home = /usr\n")
    write(tmp_path / ".gitignore", "ignored_by_git.py\n*.log\n")
    write(tmp_path / "pkg" / "sub" / ".gitignore", "generated/\nskip.py\n")
    return tmp_path


def test_walk_skips_vcs_caches_builds_venvs_and_gitignored(tree):
    assert _found(tree) == {"a.py", "stubs/b.pyi", "pkg/c.py", "pkg/sub/keep.py"}


def test_negation_in_a_nested_gitignore(tree):
    write(tree / "pkg" / ".gitignore", "*.py\n")
    write(tree / "pkg" / "sub" / ".gitignore", "!keep.py\n")
    assert _found(tree) == {"a.py", "stubs/b.pyi", "pkg/sub/keep.py"}


def test_gitignore_above_the_linted_directory_applies_inside_a_repository(tree):
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    write(tree / ".gitignore", "pkg/sub/keep.py\n")
    assert _found(tree, tree / "pkg") == {"pkg/c.py", "pkg/ignored_by_git.py"}


def test_respect_gitignore_false(tree):
    write(tree / "pyproject.toml", "[tool.matlint]\nrespect-gitignore = false\n")
    assert _found(tree) == {"a.py", "stubs/b.pyi", "pkg/c.py", "pkg/sub/keep.py", "pkg/ignored_by_git.py",
                            "pkg/sub/generated/g.py", "pkg/sub/skip.py"}


def test_explicit_paths_are_always_linted(tree):
    explicit = [tree / "pkg" / "ignored_by_git.py", tree / "build" / "lib" / "b.py", tree / "notes.txt"]
    assert _found(tree, *explicit) == {"pkg/ignored_by_git.py", "build/lib/b.py", "notes.txt"}


def test_a_file_named_twice_is_linted_once(tree):
    assert _found(tree, tree / "a.py", tree / "a.py", tree) == {"a.py", "stubs/b.pyi", "pkg/c.py", "pkg/sub/keep.py"}


def test_directory_symlinks_are_not_followed_and_broken_links_are_reported(tmp_path):
    write(tmp_path / "real" / "r.py", SOURCE)
    write(tmp_path / "outside" / "o.py", SOURCE)
    (tmp_path / "real" / "link_to_outside").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "real" / "link.py").symlink_to(tmp_path / "real" / "r.py")
    (tmp_path / "real" / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    (tmp_path / "real" / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    found = find_files([str(tmp_path / "real")], load_settings(tmp_path))
    assert {Path(p).name for p in found.files} == {"r.py", "link.py"}
    assert [(Path(f.filename).name, f.code) for f in found.problems] == [("dangling.py", "MAT003")]
    assert "broken symbolic link" in found.problems[0].message


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="nope.py"):
        find_files([str(tmp_path / "nope.py")], load_settings(tmp_path))
    result = run_matlint("check", "nope.py", cwd=tmp_path)
    assert result.returncode == 2 and "nope.py" in result.stderr


def test_walked_paths_are_shown_relative_to_the_argument(tmp_path):
    write(tmp_path / "pkg" / "m.py", bad_example("MAT101").code)
    for argument, shown in ((".", "pkg/m.py"), ("pkg", "pkg/m.py"), ("./pkg/", "pkg/m.py"),
                            (str(tmp_path), str(tmp_path / "pkg" / "m.py"))):
        result = run_matlint("check", argument, "--format", "json", "--no-cache", cwd=tmp_path)
        assert {f["filename"] for f in json.loads(result.stdout)} == {shown}


# -- cache ---------------------------------------------------------------------------------

@pytest.fixture
def cached_project(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "m.py", bad_example("MAT101").code)
    return tmp_path


def _entries(project: Path) -> list:
    """The per-file entries (not the tags, nor the snapshots of whole runs)."""
    return [p for p in (project / ".matlint_cache" / "v2").rglob("*") if p.is_file()]


def _report(project, *args) -> list:
    result = run_matlint("check", "--format", "json", *args, cwd=project)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_cache_directory_is_tagged_and_ignored_by_git(cached_project):
    first = _report(cached_project)
    cache = cached_project / ".matlint_cache"
    assert (cache / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (cache / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert len(_entries(cached_project)) == 1
    subprocess.run(["git", "init", "-q"], cwd=cached_project, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=cached_project,
                            capture_output=True, text=True).stdout
    assert ".matlint_cache" not in status
    assert first


def _doctor(project: Path, message: str) -> None:
    (entry,) = _entries(project)
    data = json.loads(entry.read_text())
    for finding in data["findings"]:
        finding["message"] = message
    entry.write_text(json.dumps(data))


def test_second_run_reads_the_cache_and_a_change_invalidates_it(cached_project):
    first = _report(cached_project)
    _doctor(cached_project, "from the cache")
    assert {f["message"] for f in _report(cached_project)} == {"from the cache"}
    # --no-cache neither reads ...
    assert _report(cached_project, "--no-cache") == first
    # ... a change to the file's bytes is a miss ...
    with open(cached_project / "m.py", "a") as handle:
        handle.write("\n")
    assert [f["message"] for f in _report(cached_project)] == [f["message"] for f in first]
    # ... and so is a change of the settings.
    _doctor(cached_project, "from the cache")
    assert {f["message"] for f in _report(cached_project, "--extend-ignore", "MAT5")} != {"from the cache"}


TRAIN = """
import torch
from utils import accuracy

def train(model, loader, opt, crit):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        out = model(x)
        crit(out, y).backward()
        opt.step()
        acc = accuracy(out, y)
"""
SYNCING_HELPER = "def accuracy(out, y):\n    return (out.argmax(1) == y).sum().item()\n"
DEVICE_HELPER = "def accuracy(out, y):\n    return (out.argmax(1) == y).sum()\n"


@pytest.mark.parametrize("many", [False, True])
def test_a_change_to_an_imported_project_module_invalidates_the_importing_file(tmp_path, many):
    """train.py's MAT502 finding reads utils.py: a change there is a miss for train.py, through
    the per-file entry and through the snapshot of a run over many files."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAIN)
    write(tmp_path / "utils.py", SYNCING_HELPER)
    for i in range(60 if many else 0):  # past the runner's MIN_FILES_FOR_SNAPSHOT
        write(tmp_path / f"other{i}.py", "import torch\n")
    codes = lambda: sorted(f["code"] for f in _report(tmp_path) if f["filename"].endswith("train.py"))  # noqa: E731
    assert codes() == ["MAT401", "MAT502"]
    assert codes() == ["MAT401", "MAT502"]  # from the cache
    write(tmp_path / "utils.py", DEVICE_HELPER)
    assert codes() == ["MAT401"]
    write(tmp_path / "utils.py", SYNCING_HELPER)
    assert codes() == ["MAT401", "MAT502"]


def test_a_project_helper_that_copies_its_argument_to_the_cpu_is_reported_where_the_step_calls_it(tmp_path):
    """utils.py's `save_image` copies the image with `.to("cpu")` on every call, before its own
    test of whether to save: each step's call waits for the device."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAIN.replace("from utils import accuracy", "import utils")
          .replace("acc = accuracy(out, y)", "utils.save_image(out, 10)"))
    write(tmp_path / "utils.py", "def save_image(img, every):\n    pixels = img.to('cpu').numpy()\n"
                                 "    if every > 100:\n        print(pixels)\n")
    found = [(f["location"]["row"], f["message"]) for f in _report(tmp_path)
             if f["filename"].endswith("train.py") and f["code"] == "MAT502"]
    assert [(line, "whose `.to('cpu')` on line 2 of utils.py runs on every call" in message)
            for line, message in found] == [(11, True)], found


def test_a_project_metric_that_converts_a_torch_sum_to_a_number_is_reported_where_the_step_calls_it(tmp_path):
    """metrics.py's `accuracy` ends in `float(correct)` of a `torch.sum`, and `f1` calls
    `precision`, which does `float(torch.sum(...))`: each call in the step waits for the device.
    `float()` of a Python count (`numel`) and a conversion under an `if` are no such sync."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAIN.replace("from utils import accuracy", "from metrics import *")
          .replace("acc = accuracy(out, y)", "acc = accuracy(out, y) + f1(out, y) + size(out) + maybe(out, y)"))
    write(tmp_path / "metrics.py", """
import torch

def accuracy(out, y):
    correct = torch.sum(out.argmax(1) == y)
    return float(correct) / y.numel()

def precision(out, y):
    return float(torch.sum(out * y)) / (float(torch.sum(out)) + 1e-6)

def f1(out, y):
    p = precision(out, y)
    return 2 * p / (p + 1)

def size(out):
    return float(torch.numel(out))

def maybe(out, y):
    if y is not None:
        return float(torch.sum(out))
    return 0.0
""")
    found = sorted((f["location"]["column"], f["message"].split(" runs on every call")[0])
                   for f in _report(tmp_path) if f["filename"].endswith("train.py") and f["code"] == "MAT502")
    assert found == [(15, "`accuracy()`, whose `float(correct)` on line 6 of metrics.py"),
                     (34, "`f1()`, whose `float(torch.sum(out * y))` on line 9 of metrics.py")], found


def test_a_helper_module_that_never_names_torch_is_linted_for_what_its_importers_pass(tmp_path):
    """logger.py imports nothing of torch; train.py hands it a device loss on every step, and its
    `.item()` is that step's host sync. (The project sits two folders down: the importers of a
    file are looked for up to two folders above it, where pytest keeps other tests' files.)"""
    project = tmp_path / "work" / "project"
    write(project / "pyproject.toml", "[tool.matlint]\n")
    write(project / "train.py", TRAIN.replace("from utils import accuracy", "from logger import log_loss")
          .replace("acc = accuracy(out, y)", "log_loss(crit(out, y))"))
    write(project / "logger.py", "HISTORY = []\n\ndef log_loss(loss):\n    HISTORY.append(loss.item())\n")
    found = [(Path(f["filename"]).name, f["code"]) for f in _report(project)]
    assert ("logger.py", "MAT502") in found, found


def test_an_evaluation_script_calling_a_metric_that_copies_a_tensor_it_is_given_is_reported(tmp_path):
    """val.py trains nothing; its loop over the loader moves each batch to the GPU and calls
    metrics.py's `iou_score`, whose `.cpu()` runs under `if torch.is_tensor(output):`: on every
    call that passes a tensor, which this loop does. `dice` copies only under a test of a value
    (`if threshold > 0.5:`), which not every call runs."""
    project = tmp_path / "proj"  # its own folder: the importers of a module are read from the folders around it
    write(project / "pyproject.toml", "[tool.matlint]\n")
    write(project / "val.py", """
import torch
from metrics import iou_score, dice

def validate(model, loader):
    scores = []
    with torch.no_grad():
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            out = model(x)
            scores.append(iou_score(out, y))
            scores.append(dice(out, y, 0.7))
    return scores
""")
    write(project / "metrics.py", """
import torch

def iou_score(output, target):
    if torch.is_tensor(output):
        output = torch.sigmoid(output).data.cpu().numpy()
    if isinstance(target, torch.Tensor):
        target = target.data.cpu().numpy()
    inter = ((output > 0.5) & (target > 0.5)).sum()
    return inter / ((output > 0.5) | (target > 0.5)).sum()

def dice(output, target, threshold):
    if threshold > 0.5:
        output = output.cpu()
    return output
""")
    found = sorted((Path(f["filename"]).name, f["location"]["row"], f["message"].split(" waits")[0])
                   for f in _report(project) if f["code"] == "MAT502")
    assert found == [("metrics.py", 6, "`.cpu()` of `torch.sigmoid(output).data`"),
                     ("metrics.py", 8, "`.cpu()` of `target.data`"),
                     ("val.py", 11, "`iou_score()`, whose `.cpu()` on line 6 of metrics.py runs on every call,")], found


def test_a_project_helper_that_moves_its_argument_to_the_gpu_is_a_copy_of_a_host_factory(tmp_path):
    """utils.py's `tensor2var` moves what it is given with `.cuda()` and returns it wrapped in a
    `Variable`: `tensor2var(torch.randn(...))` in the training loop draws the noise on the host
    and copies it on every step. `tensor2var(real)` moves a batch, which is no factory."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "utils.py", """
import torch
from torch.autograd import Variable

def tensor2var(x, grad=False):
    if torch.cuda.is_available():
        x = x.cuda()
    return Variable(x, requires_grad=grad)
""")
    write(tmp_path / "train.py", """
import torch
from utils import *

def train(loader, G, D, opt, z_dim):
    for real, _ in loader:
        real = tensor2var(real)
        z = tensor2var(torch.randn(real.size(0), z_dim))
        loss = D(G(z)).mean() - D(real).mean()
        loss.backward()
        opt.step()
""")
    found = [(Path(f["filename"]).name, f["location"]["row"], f["message"].split(" on every")[0])
             for f in _report(tmp_path) if f["code"] == "MAT503"]
    assert found == [("train.py", 8, "`torch.randn(...)` is created on the host and copied to the device by "
                                     "`tensor2var()`")], found


def test_an_optimizer_module_without_a_backward_pass_runs_its_step_every_step(tmp_path):
    """optim.py wraps an optimizer and never calls `.backward()`; its `step` reads every
    parameter's gradient norm on the host, once per training step of train.py, on the GPU. (Two
    folders down, as above.)"""
    tmp_path = tmp_path / "work" / "project"
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "optim.py", "import math\n\nimport torch\n\nclass Clipped:\n    def __init__(self, optimizer, params):\n"
          "        self.optimizer, self.params = optimizer, list(params)\n\n    def step(self):\n"
          "        norm = 0.0\n        for p in self.params:\n            norm += math.pow(p.grad.norm(), 2)\n"
          "        self.optimizer.step()\n        return norm\n")
    write(tmp_path / "train.py", TRAIN.replace("from utils import accuracy", "from optim import Clipped")
          .replace("acc = accuracy(out, y)", "pass"))
    found = [(Path(f["filename"]).name, f["location"]["row"], f["code"]) for f in _report(tmp_path)]
    assert ("optim.py", 12, "MAT502") in found, found


def test_no_cache_writes_nothing(cached_project):
    _report(cached_project, "--no-cache")
    assert not (cached_project / ".matlint_cache").exists()


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"key": 1}', b"\xff\xfe", b'{"key": null, "findings": 3}'])
def test_a_corrupt_entry_is_ignored(cached_project, garbage):
    first = _report(cached_project)
    (entry,) = _entries(cached_project)
    entry.write_bytes(garbage)
    result = run_matlint("check", "--format", "json", cwd=cached_project)
    assert result.returncode == 1 and json.loads(result.stdout) == first and result.stderr.count("\n") <= 1


def test_per_file_ignores_apply_after_the_cache(cached_project):
    assert _report(cached_project)
    write(cached_project / "pyproject.toml", '[tool.matlint.per-file-ignores]\n"m.py" = ["MAT"]\n')
    assert _report(cached_project) == []


def test_an_unusable_cache_dir_does_not_stop_the_run(cached_project):
    write(cached_project / "pyproject.toml", '[tool.matlint]\ncache-dir = "a_file"\n')
    write(cached_project / "a_file", "not a directory")
    result = run_matlint("check", "--format", "json", cwd=cached_project)
    assert result.returncode == 1 and json.loads(result.stdout)


def test_files_without_torch_are_not_cached(tmp_path):
    write(tmp_path / "plain.py", "x = 1\n")
    assert _report(tmp_path) == []
    assert not (tmp_path / ".matlint_cache").exists()


def test_parallel_workers_share_the_cache(tmp_path):
    for i in range(60):
        write(tmp_path / f"m{i:02}.py", bad_example("MAT101").code + f"# {i}\n")
    first = _report(tmp_path, "--jobs", "2")
    assert len(_entries(tmp_path)) == 60
    assert _report(tmp_path, "--jobs", "2") == first


def test_exclude_patterns_are_relative_to_the_config(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nextend-exclude = ["/gen", "src/legacy"]\n')
    for name in ("gen/a.py", "pkg/gen/b.py", "src/legacy/c.py", "other/src/legacy/d.py"):
        write(tmp_path / name, SOURCE)
    assert _found(tmp_path) == {"pkg/gen/b.py", "other/src/legacy/d.py"}
    assert _found(tmp_path, tmp_path / "pkg") == {"pkg/gen/b.py"}


def test_exclude_patterns_when_the_walk_starts_above_the_config(tmp_path):
    """Outside the config's directory an entry is matched by its name; walking down into that
    directory from above, the paths inside are matched from it again."""
    project = tmp_path / "proj"
    write(project / "pyproject.toml", '[tool.matlint]\nextend-exclude = ["/gen", "src/legacy"]\n')
    for name in ("proj/a.py", "proj/gen/g.py", "proj/src/legacy/l.py", "proj/src/ok.py", "gen/o.py",
                 "other/src/legacy/x.py", "b.py"):
        write(tmp_path / name, SOURCE)
    settings = load_settings(project / "a.py")
    found = find_files([str(project / "a.py"), str(tmp_path)], settings)
    assert {Path(p).relative_to(tmp_path).as_posix() for p in found.files} == {
        "proj/a.py", "proj/src/ok.py", "b.py", "other/src/legacy/x.py"}


def _lint_in_process(project: Path) -> list:
    from matlint.runner import lint_files

    return [f.to_json() for f in lint_files([str(project / "m.py")], load_settings(project), jobs=1)]


def test_an_unchanged_file_is_a_hit_without_being_read_or_hashed(cached_project, monkeypatch):
    import matlint.cache
    import matlint.runner

    first = _lint_in_process(cached_project)
    assert first

    def must_not_run(*args, **kwargs):
        raise AssertionError("an unchanged file was read or hashed")

    monkeypatch.setattr(matlint.cache.Cache, "key", must_not_run)
    monkeypatch.setattr(matlint.runner.engine, "mentions_torch", must_not_run)
    assert _lint_in_process(cached_project) == first


def test_same_size_and_mtime_but_new_bytes_is_a_miss(cached_project):
    import os

    path = cached_project / "m.py"
    first = _report(cached_project)
    before = os.stat(path)
    text = path.read_text()
    changed = text.replace("import torch", "import torcH", 1) if "import torch" in text else None
    assert changed is not None and len(changed) == len(text)
    path.write_text(changed)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as before
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns and os.stat(path).st_size == before.st_size
    assert _report(cached_project) != first  # `torcH` is no torch: the findings are gone


def test_a_touched_file_is_a_hit_by_content_and_its_stat_is_stored_again(cached_project, monkeypatch):
    import os

    import matlint.runner

    first = _lint_in_process(cached_project)
    os.utime(cached_project / "m.py", ns=(1_000_000_000, 1_000_000_000))

    def must_not_run(*args, **kwargs):
        raise AssertionError("linted again")

    with monkeypatch.context() as patch:
        patch.setattr(matlint.runner.engine, "lint_bytes", must_not_run)
        assert _lint_in_process(cached_project) == first  # same bytes: a hit by content
        import matlint.cache

        patch.setattr(matlint.cache.Cache, "key", must_not_run)
        assert _lint_in_process(cached_project) == first  # and now by stat


# -- snapshots of whole runs ------------------------------------------------------------------

@pytest.fixture
def many_files(tmp_path):
    """A project of 60 files: 50 with findings, 10 that never mention torch."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    for i in range(50):
        write(tmp_path / f"m{i:02}.py", bad_example("MAT101").code + f"# {i}\n")
    for i in range(10):
        write(tmp_path / f"plain{i}.py", f"x = {i}\n")
    return tmp_path


def _lint_tree(project: Path) -> list:
    from matlint.runner import lint_files

    settings = load_settings(project)
    return [f.to_json() for f in lint_files(find_files([str(project)], settings).files, settings, jobs=1)]


def _snapshots(project: Path) -> list:
    return sorted((project / ".matlint_cache" / "runs").glob("[!.]*"))


def _count_reads(monkeypatch) -> list:
    import matlint.runner

    read = []
    lint_path = matlint.runner.lint_path
    monkeypatch.setattr(matlint.runner, "lint_path", lambda path, *rest: read.append(path) or lint_path(path, *rest))
    return read


def test_a_warm_run_over_many_files_reads_one_snapshot_and_no_file(many_files, monkeypatch):
    import matlint.cache

    first = _lint_tree(many_files)
    assert len(first) == 50 and len(_snapshots(many_files)) == 1
    read = _count_reads(monkeypatch)
    monkeypatch.setattr(matlint.cache.Cache, "load", lambda *args: pytest.fail("a per-file entry was opened"))
    assert _lint_tree(many_files) == first
    assert read == []  # not even the files without torch, which have no entry of their own


def test_a_changed_file_is_relinted_alone_and_the_snapshot_follows(many_files, monkeypatch):
    first = _lint_tree(many_files)
    changed = many_files / "m07.py"
    changed.write_text("import torch\n")  # its finding is gone
    read = _count_reads(monkeypatch)
    second = _lint_tree(many_files)
    assert read == [str(changed)]
    assert len(second) == len(first) - 1 and all(f["filename"] != str(changed) for f in second)
    read.clear()
    assert _lint_tree(many_files) == second and read == []


def test_per_file_ignores_apply_after_the_snapshot(many_files):
    assert len(_lint_tree(many_files)) == 50
    write(many_files / "pyproject.toml", '[tool.matlint.per-file-ignores]\n"m0*.py" = ["MAT101"]\n')
    assert len(_lint_tree(many_files)) == 40


def test_a_corrupt_snapshot_is_ignored(many_files, monkeypatch):
    first = _lint_tree(many_files)
    (snapshot,) = _snapshots(many_files)
    salt = json.loads(snapshot.read_text())["salt"]
    for garbage in ("{not json", '{"salt": "x", "files": []}', "[]", '{"salt": null}',
                    json.dumps({"salt": salt, "files": [[None, [{"code": 1}]], 7] * 30}),
                    json.dumps({"salt": salt, "files": "x"})):
        snapshot.write_text(garbage)
        assert _lint_tree(many_files) == first


def test_only_the_most_recent_snapshots_are_kept(many_files):
    from matlint.cache import MAX_SNAPSHOTS
    from matlint.runner import lint_files

    settings = load_settings(many_files)
    files = find_files([str(many_files)], settings).files
    for drop in range(MAX_SNAPSHOTS + 3):  # as many different lists of files
        lint_files(files[:drop] + files[drop + 1:], settings, jobs=1)
    assert len(_snapshots(many_files)) == MAX_SNAPSHOTS


@pytest.mark.parametrize("patterns", [
    ("build", "dist", "*.egg-info", ".git", "__pycache__"),
    ("/gen", "src/legacy", "**/fixtures/**", "*_pb2.py", "docs/"),
    ("gen/", "!gen/keep.py", "*.py", "!src/*.py", "a/**/b"),
    ("[abc]*.py", "x?.py", "deep/**", "!deep/keep/"),
    (),
])
def test_the_exclude_prefilter_agrees_with_the_patterns(patterns):
    import pathspec

    from matlint.files import _any_pattern

    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    regex = _any_pattern(spec)
    assert regex is not None
    paths = ["a.py", "build/", "build/x.py", "pkg/build/", "x.egg-info/", "src/legacy/", "other/src/legacy/",
             "gen/", "pkg/gen/", "gen/keep.py", "gen/other.py", "src/a.py", "src/sub/a.py", "tests/fixtures/f.py",
             "m_pb2.py", "docs/", "docs/x.py", "a/b", "a/x/y/b", "bz.py", "xy.py", "deep/keep/", "deep/k/x.py",
             ".git/", "pkg/__pycache__/", "ünïcode.py"]
    for path in paths:
        assert not spec.match_file(path) or regex.search(path), path  # the prefilter never hides a match
    assert not regex.search("plain/notes.txt")  # and it does settle paths on its own


def test_a_change_to_the_module_a_package_re_exports_from_invalidates_the_importing_file(tmp_path):
    """train.py imports `accuracy` from package `metrics`, whose `__init__.py` re-exports it from
    `metrics/core.py`: a change there is a miss for train.py."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAIN.replace("from utils import accuracy", "from metrics import accuracy"))
    (tmp_path / "metrics").mkdir()
    write(tmp_path / "metrics" / "__init__.py", "from .core import accuracy\n")
    write(tmp_path / "metrics" / "core.py", SYNCING_HELPER)
    codes = lambda: sorted(f["code"] for f in _report(tmp_path) if f["filename"].endswith("train.py"))  # noqa: E731
    assert codes() == ["MAT401", "MAT502"]
    write(tmp_path / "metrics" / "core.py", DEVICE_HELPER)
    assert codes() == ["MAT401"]


def test_a_file_whose_project_imports_are_unchanged_is_a_hit_by_its_stat(tmp_path):
    """train.py imports utils.py: while neither changes, the next run takes train.py's findings by
    its stat and the stats of its imports, without reading it again or rewriting its entry; a
    change to utils.py is a miss for train.py, and only for the files that import it."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAIN)
    write(tmp_path / "utils.py", SYNCING_HELPER)
    write(tmp_path / "other.py", "import torch\n\ndef f(x):\n    return torch.matmul(x, x)\n")
    _report(tmp_path)
    written = {p: p.stat().st_mtime_ns for p in _entries(tmp_path)}
    time.sleep(0.01)
    _report(tmp_path)
    assert {p: p.stat().st_mtime_ns for p in _entries(tmp_path)} == written
    write(tmp_path / "utils.py", DEVICE_HELPER)
    time.sleep(0.01)
    _report(tmp_path)
    rewritten = {p for p in _entries(tmp_path) if written.get(p) != p.stat().st_mtime_ns}
    assert len(rewritten) == 1  # train.py, which imports it (utils.py names no torch: no entry); not other.py


TRAINER = """
import torch

def fit(model, loader, opt):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
"""
MAIN = "import torch\nfrom trainer import fit\n\nmodel = torch.nn.Linear(4, 1).cuda()\nfit(model, [], None)\n"


def test_a_step_in_a_file_without_a_device_is_judged_with_the_files_that_import_it(tmp_path):
    """trainer.py names no device; main.py imports it and moves the model to CUDA: MAT401 on
    trainer.py's step. When main.py turns on autocast, trainer.py's entry is a miss and the finding
    goes; a trainer alone (no importer) stays quiet, and a script added beside it counts."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "trainer.py", TRAINER)
    codes = lambda: sorted(f["code"] for f in _report(tmp_path) if f["filename"].endswith("trainer.py"))  # noqa: E731
    assert codes() == []
    time.sleep(0.01)
    write(tmp_path / "main.py", MAIN)
    assert codes() == ["MAT401"]
    (finding,) = [f for f in _report(tmp_path) if f["filename"].endswith("trainer.py")]
    assert "neither this file nor `main.py`, which imports it and moves work to a CUDA device" in finding["message"]
    write(tmp_path / "main.py", MAIN.replace("fit(model", "with torch.autocast('cuda', dtype=torch.bfloat16):\n    fit(model"))
    assert codes() == []


def test_importers_are_found_beside_below_above_and_through_a_package_init(tmp_path):
    from matlint.semantic.project import importers

    write(tmp_path / "main.py", "from pkg.algo import PPO\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "algo" / "__init__.py", "from .ppo import PPO\n")
    write(tmp_path / "pkg" / "algo" / "ppo.py", "class PPO:\n    pass\n")
    write(tmp_path / "pkg" / "algo" / "tests" / "check.py", "from ppo import PPO\n")
    write(tmp_path / "pkg" / "algo" / "other.py", "import os\n")
    found = importers(str(tmp_path / "pkg" / "algo" / "ppo.py"))
    assert sorted(os.path.relpath(p, tmp_path) for p in found) == [
        "main.py", os.path.join("pkg", "algo", "__init__.py"), os.path.join("pkg", "algo", "tests", "check.py")]


def test_a_module_imported_by_name_from_its_package_has_that_importer(tmp_path):
    """`from . import layers` (a folder without `__init__.py`) and `from pkg import utils`
    import the package's modules `layers.py` and `utils.py`."""
    from matlint.semantic.project import importers

    write(tmp_path / "drqa" / "reader.py", "from . import layers\n")
    write(tmp_path / "drqa" / "layers.py", "def f():\n    pass\n")
    write(tmp_path / "main.py", "from pkg import utils\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "utils.py", "def g():\n    pass\n")
    assert [os.path.relpath(p, tmp_path) for p in importers(str(tmp_path / "drqa" / "layers.py"))] == [
        os.path.join("drqa", "reader.py")]
    assert [os.path.relpath(p, tmp_path) for p in importers(str(tmp_path / "pkg" / "utils.py"))] == ["main.py"]


def test_one_lint_looks_the_project_up_once_and_the_next_sees_a_module_added_since(tmp_path):
    """While `files_unchanged` is open (the lint of one file) a module found missing stays
    missing; once it closes, the next lookup finds the module added in between."""
    from matlint.semantic.project import files_unchanged, resolve

    write(tmp_path / "train.py", "from utils import accuracy\n")
    train = str(tmp_path / "train.py")
    with files_unchanged():
        assert resolve(train, "utils", 0) is None
        write(tmp_path / "utils.py", "def accuracy(x):\n    return x\n")
        assert resolve(train, "utils", 0) is None
    assert resolve(train, "utils", 0) == str(tmp_path / "utils.py")


def test_a_module_of_a_folder_beside_the_importer_is_read_where_one_folder_holds_it(tmp_path):
    """`src/solver/solver.py` imports `loss`, which `src/transformer/loss.py` is (the project puts
    its folders on `sys.path`); a name two folders hold is not guessed at."""
    from matlint.semantic.project import resolve

    write(tmp_path / "src" / "solver" / "solver.py", "from loss import cal_loss\nfrom utils import pad\n")
    write(tmp_path / "src" / "transformer" / "loss.py", "def cal_loss(x):\n    return x\n")
    write(tmp_path / "src" / "transformer" / "utils.py", "def pad(x):\n    return x\n")
    write(tmp_path / "src" / "data" / "utils.py", "def pad(x):\n    return x\n")
    solver = str(tmp_path / "src" / "solver" / "solver.py")
    assert resolve(solver, "loss", 0) == str(tmp_path / "src" / "transformer" / "loss.py")
    assert resolve(solver, "utils", 0) is None
    assert resolve(solver, "numpy", 0) is None


SYNCING_TRAINER = """
import torch
from torch import nn


class Seq(nn.Module):
    def fit(self, inputs, targets, n_epochs, batch_size):
        optimizer = torch.optim.Adam(self.parameters())
        criterion = nn.MSELoss()
        for epoch in range(n_epochs):
            total = 0.0
            for b in range(0, inputs.shape[0], batch_size):
                optimizer.zero_grad()
                loss = criterion(self(inputs[b:b + batch_size]), targets[b:b + batch_size])
                total += loss.item()
                loss.backward()
                optimizer.step()
        return total
"""
CPU_MAIN = "import torch\nfrom trainer import Seq\n\nmodel = Seq()\nmodel.fit(torch.randn(8, 4), torch.randn(8, 1), 2, 4)\n"


def test_a_sync_in_a_step_without_a_device_is_judged_with_the_files_that_import_it(tmp_path):
    """trainer.py names no device and syncs every step: with no importer it may run anywhere
    (MAT502); imported only by a script that never names a device, it runs on the CPU (quiet);
    when that script moves the model to CUDA, trainer.py's entry is a miss and MAT502 is back."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "trainer.py", SYNCING_TRAINER)
    codes = lambda: sorted(f["code"] for f in _report(tmp_path) if f["filename"].endswith("trainer.py"))  # noqa: E731
    assert codes() == ["MAT502"]
    time.sleep(0.01)
    write(tmp_path / "main.py", CPU_MAIN)
    assert codes() == []
    assert codes() == []  # from the cache
    time.sleep(0.01)
    write(tmp_path / "main.py", CPU_MAIN.replace("Seq()", "Seq().cuda()"))
    assert codes() == ["MAT401", "MAT502"]


HELPERS = "import torch\n\n\ndef causal_mask(n, device):\n    return torch.ones(n, n).tril().to(device)\n"
LOOP_MAIN = """\
import torch
from helpers import causal_mask

for x, y in train_loader:
    loss = model(x.cuda(), causal_mask(x.shape[1], "cuda")).sum()
    loss.backward()
"""


def test_a_helper_is_judged_with_the_files_that_call_it_every_step(tmp_path):
    """helpers.py makes a mask on the host and moves it: MAT503 where a script beside it calls it
    in its training loop, quiet (the cached entry is a miss) once the script calls it once."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "helpers.py", HELPERS)
    write(tmp_path / "main.py", LOOP_MAIN)
    found = lambda: [(f["code"], f["location"]["row"]) for f in _report(tmp_path) if f["filename"].endswith("helpers.py")]  # noqa: E731
    assert found() == [("MAT503", 5)]
    assert found() == [("MAT503", 5)]  # from the cache
    time.sleep(0.01)
    write(tmp_path / "main.py", "from helpers import causal_mask\n\nMASK = causal_mask(8, 'cuda')\n")
    assert found() == []


LOSS_COMPUTE = """\
class LossCompute:
    def __init__(self, criterion, opt):
        self.criterion, self.opt = criterion, opt

    def __call__(self, out, y):
        loss = self.criterion(out, y)
        loss.backward()
        self.opt.step()
        return loss.item()
"""
LOSS_MAIN = """\
import torch
from loss import LossCompute

model = torch.nn.Linear(4, 1).cuda()
compute = LossCompute(torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), 0.1))
for x, y in loader:
    compute(model(x.cuda()), y.cuda())
"""


def test_a_step_in_a_module_without_a_device_syncs_on_the_device_its_importer_moves_to(tmp_path):
    """loss.py's `__call__` trains and returns `loss.item()`; it names no device. Imported by a
    script that moves the model to CUDA, the `.item()` is a sync per step (MAT502); imported by
    a script that stays on the CPU, there is nothing to wait for."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "loss.py", LOSS_COMPUTE)
    write(tmp_path / "main.py", LOSS_MAIN)
    codes = lambda: sorted((f["code"], f["location"]["row"]) for f in _report(tmp_path)  # noqa: E731
                           if f["filename"].endswith("loss.py") and f["code"] == "MAT502")
    assert codes() == [("MAT502", 9)]
    time.sleep(0.01)
    write(tmp_path / "main.py", LOSS_MAIN.replace(".cuda()", ""))
    assert codes() == []


TRAINER_WITH_CALLBACK = """\
import torch


class Trainer:
    def __init__(self, model, loader, optimizer):
        self.model, self.loader, self.optimizer = model, loader, optimizer

    def train(self, get_loss, epochs=1):
        model = self.model.to("cuda")
        for e in range(epochs):
            for batch in self.loader:
                batch = [t.to("cuda") for t in batch]
                self.optimizer.zero_grad()
                loss = get_loss(model, batch)
                loss.backward()
                self.optimizer.step()
"""
SCRIPT_WITH_CALLBACK = """\
import torch
import train


def main(model, loader, optimizer, writer):
    trainer = train.Trainer(model, loader, optimizer)

    def get_loss(model, batch):
        loss = model(*batch).mean()
        writer.add_scalar("loss", loss.item())
        return loss

    trainer.train(get_loss)


if __name__ == "__main__":
    main(None, None, None, None)
"""


def test_a_function_handed_to_a_trainers_loop_runs_every_step(tmp_path):
    """pretrain.py passes `get_loss` to `Trainer.train` of train.py, whose training loop calls it
    on device batches: its `.item()` is a sync per step, though pretrain.py names no device.
    Handed to a method that only calls it once (outside any loop), it is not."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "train.py", TRAINER_WITH_CALLBACK)
    write(tmp_path / "pretrain.py", SCRIPT_WITH_CALLBACK)
    found = lambda: [(f["code"], f["location"]["row"], f["message"]) for f in _report(tmp_path)  # noqa: E731
                     if f["filename"].endswith("pretrain.py") and f["code"] == "MAT502"]
    (finding,) = found()
    assert finding[:2] == ("MAT502", 10)
    assert "`get_loss` is passed to `train` in train.py, which calls it from its training loop on line 11" in finding[2]
    time.sleep(0.01)
    write(tmp_path / "train.py", TRAINER_WITH_CALLBACK.replace(
        "        for e in range(epochs):", "        get_loss(model, [])\n        for e in range(epochs):").replace(
        "loss = get_loss(model, batch)", "loss = model(*batch).mean()"))
    assert found() == []


def test_a_star_import_of_a_project_module_brings_its_torch(tmp_path):
    """`from tool.torch_utils import *`, whose module does `import torch`: `torch.tensor(...)`
    in the file is torch's (YOLOv4's yolo_layer.py), and its host copy in a loop is reported."""
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n")
    write(tmp_path / "tool" / "__init__.py", "")
    write(tmp_path / "tool" / "torch_utils.py", "import torch\nimport numpy as np\n_private = torch\n")
    write(tmp_path / "tool" / "yolo_layer.py", """\
import torch.nn as nn
from tool.torch_utils import *


def decode(bxy, num_anchors, W):
    grid_x = np.linspace(0, W - 1, W)
    out = []
    for i in range(num_anchors):
        out.append(bxy[:, i] + torch.tensor(grid_x, device=bxy.device))
    return out
""")
    found = [(f["code"], f["location"]["row"]) for f in _report(tmp_path) if f["filename"].endswith("yolo_layer.py")]
    assert found == [("MAT503", 9)]
    from matlint.semantic.project import star_imported_aliases
    import ast
    tree = ast.parse((tmp_path / "tool" / "yolo_layer.py").read_text())
    assert star_imported_aliases(tree, str(tmp_path / "tool" / "yolo_layer.py")) == {"torch": "torch", "np": "numpy"}


def test_a_module_an_importer_parsed_is_linted_from_that_tree_while_its_bytes_are_the_same(tmp_path):
    """`from layers import *` in model.py makes the analysis parse layers.py; linting layers.py
    next takes that tree instead of parsing the file again, and only for the same bytes."""
    from matlint.engine import lint_bytes, lint_source
    from matlint.registry import all_rules
    from matlint.semantic import project

    write(tmp_path / "model.py", "import torch\nfrom layers import *\n\ndef f(x):\n    return Block()(x)\n")
    layers = tmp_path / "layers.py"
    write(layers, "import torch\n\nclass Block(torch.nn.Module):\n    def forward(self, xs, ws):\n"
                  "        outs = []\n        for i in range(xs.shape[0]):\n"
                  "            outs.append(torch.matmul(xs[i], ws[i]))\n        return torch.stack(outs)\n")
    rules = all_rules()
    lint_bytes((tmp_path / "model.py").read_bytes(), str(tmp_path / "model.py"), rules)
    data = layers.read_bytes()
    tree = project.parsed_from(str(layers), data)
    assert tree is not None and tree is project.parsed(str(layers))
    assert project.parsed_from(str(layers), data + b"\n") is None  # not the bytes that tree was read from
    assert project.parsed_from(str(tmp_path / "model.py"), (tmp_path / "model.py").read_bytes()) is None
    from_tree = [(f.code, f.row, f.message) for f in lint_bytes(data, str(layers), rules)]
    parsed_again = [(f.code, f.row, f.message) for f in lint_source(data.decode(), str(layers), rules)]
    assert from_tree == parsed_again and from_tree  # the same findings as from a fresh parse


def test_a_helper_of_a_package_module_imported_as_a_module_is_read_where_it_is_called(tmp_path):
    """`from vision.utils import box_utils`, then `box_utils.scalar(loss)` in the training loop:
    the helper is read in box_utils.py, and its `.item()` waits on every step; given the loader's
    host batch (`scale = box_utils.scalar(scale)`) it waits for nothing. In the loss module's
    `forward` (run every training step) `labels` is a tensor because `F.cross_entropy` takes
    `labels[mask]`, so `labels > 0` is a mask and indexing with it syncs."""
    project = tmp_path / "proj"
    write(project / "pyproject.toml", "[tool.matlint]\n")
    write(project / "vision" / "__init__.py", "")
    write(project / "vision" / "utils" / "__init__.py", "")
    write(project / "vision" / "utils" / "box_utils.py", """
def scalar(x):
    return x.item()
""")
    write(project / "vision" / "nn" / "__init__.py", "")
    write(project / "vision" / "nn" / "multibox_loss.py", """
import torch.nn as nn
import torch.nn.functional as F

class MultiboxLoss(nn.Module):
    def forward(self, confidence, locations, labels, gt_locations, mask):
        classification = F.cross_entropy(confidence.reshape(-1, 21), labels[mask])
        pos_mask = labels > 0
        regression = F.smooth_l1_loss(locations[pos_mask, :], gt_locations[pos_mask, :])
        return regression, classification
""")
    write(project / "train.py", """
import torch
from vision.nn.multibox_loss import MultiboxLoss
from vision.utils import box_utils

def train(loader, net, criterion, optimizer):
    for images, boxes, labels, scale in loader:
        scale = box_utils.scalar(scale)
        images, boxes, labels = images.cuda(), boxes.cuda(), labels.cuda()
        confidence, locations = net(images)
        regression, classification = criterion(confidence, locations, labels, boxes, labels >= 0)
        loss = regression + classification
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(box_utils.scalar(loss) * scale)
""")
    found = sorted((Path(f["filename"]).name, f["location"]["row"], f["message"].split(" (its")[0].split(" waits")[0])
                   for f in _report(project) if f["code"] == "MAT502")
    assert found == [("box_utils.py", 3, "`.item()` of `x`"),
                     ("multibox_loss.py", 9, "boolean-mask indexing of `locations` and `gt_locations`"),
                     ("train.py", 16, "`box_utils.scalar()`, whose `.item()` on line 3 of vision/utils/box_utils.py "
                                      "runs on every call,")], found
