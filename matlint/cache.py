"""Content-hash cache of findings, one small JSON file per linted path.

An entry holds the key it was computed under (sha256 of the file's bytes, its path, the matlint
version, the rules' fingerprint and the settings' fingerprint), the file's stat when it was read
(size, mtime, ctime, inode) and the findings. Findings may read the project modules a file imports
(`matlint.semantic.project`): their paths and stats join the key and the stored stat, so a change
to one of them is a miss for the files that import it. A file whose stat is unchanged is a hit without
being read (under the same version, rules and settings); otherwise its bytes are hashed and a
different key is a miss. ctime moves on every write and cannot be set back, so a content change
that keeps size and mtime still misses. Entries are written atomically, and a corrupt or
unreadable entry is a miss, never an error. Keeping one entry per path bounds the cache by the
size of the tree.

A run over many files also leaves a snapshot: one file holding every linted path's stat and
findings (files that never mention torch included), keyed by the salt and the list of paths. The
same run again reads that one file and stats each path, instead of opening an entry per path (a
warm re-run of a large tree was mostly those opens); a path whose stat changed goes through its
entry as above. The most recent few snapshots are kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Optional

from .diagnostics import Finding

CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by matlint.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
FORMAT = "v2"
SNAPSHOTS = "runs"
MAX_SNAPSHOTS = 8


def matlint_version() -> str:
    from . import __version__

    return __version__


class Cache:
    def __init__(self, directory, settings_fingerprint: str):
        from .registry import rules_fingerprint

        self.directory = Path(directory)
        self.entries = os.path.join(self.directory, FORMAT)  # a string: joined once per file looked up
        self.salt = f"{matlint_version()}\0{rules_fingerprint()}\0{settings_fingerprint}\0".encode()
        self.salt_id = hashlib.sha256(self.salt).hexdigest()[:32]
        self.usable = True

    @staticmethod
    def stat(path: str) -> Optional[list]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def load(self, path: str) -> Optional[dict]:
        """The entry for `path`, or None (none yet, unreadable, corrupt)."""
        try:
            with open(self._entry(path), encoding="utf-8") as handle:
                entry = json.load(handle)
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def unchanged(self, entry: Optional[dict], path: str, stat: Optional[list]) -> Optional[list]:
        """The entry's findings if the file's stat and the salt are the ones it was made under."""
        if entry is None or not self.fresh(entry.get("stat"), stat) or entry.get("salt") != self.salt_id:
            return None
        return self._findings(entry, path)

    def fresh(self, recorded, stat: Optional[list]) -> bool:
        """`recorded` (a file's stat, then the stats of the project modules it imports, as
        `with_imports` made it) still holds: the file's stat is `stat` and no import changed."""
        if stat is None or not isinstance(recorded, list) or recorded[:4] != stat:
            return False
        return all(isinstance(item, list) and len(item) == 2 and self.stat(item[0]) == item[1] for item in recorded[4:])

    def with_imports(self, stat: Optional[list], imports: list) -> Optional[list]:
        """`stat` and the stats of the project modules the file imports: findings can depend on them."""
        if stat is None or not imports:
            return stat
        return stat + [[path, self.stat(path)] for path in imports]

    def same_key(self, entry: Optional[dict], path: str, key: str) -> Optional[list]:
        """The entry's findings if it was made under `key` (the same bytes, salt and path)."""
        if entry is None or entry.get("key") != key:
            return None
        return self._findings(entry, path)

    @staticmethod
    def _findings(entry: dict, path: str) -> Optional[list]:
        try:
            findings = [Finding.from_json(item) for item in entry["findings"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        for finding in findings:
            finding.filename = path
        return findings

    def key(self, data: bytes, path: str, imports: tuple = ()) -> str:
        """The file's bytes and path, and the stats of the project modules it imports (reading
        them would cost more than linting: a package's files import its largest modules)."""
        digest = hashlib.sha256(self.salt)
        digest.update(os.path.abspath(path).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(data)
        for imported in imports:
            digest.update(b"\0" + os.path.abspath(imported).encode("utf-8", "surrogateescape")
                          + repr(self.stat(imported)).encode())
        return digest.hexdigest()

    def _entry(self, path: str) -> str:
        name = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.entries, name[:2], name[2:34])

    def put(self, key: str, path: str, findings: list, stat: Optional[list] = None) -> None:
        """Store `findings` under `key`, with the stat taken before the file was read."""
        if not self.usable:
            return
        target = self._entry(path)
        payload = json.dumps({"key": key, "salt": self.salt_id, "stat": stat,
                              "findings": [f.to_json() for f in findings]})
        try:
            entry_dir = os.path.dirname(target)
            self._prepare(entry_dir)
            self._write(entry_dir, target, payload)
        except OSError:
            self.usable = False  # a read-only tree still lints; it just is not cached

    # -- snapshots of whole runs ---------------------------------------------------------------
    def _snapshot_path(self, paths: list) -> str:
        digest = hashlib.sha256(self.salt_id.encode())
        for path in paths:
            digest.update(os.path.abspath(path).encode("utf-8", "surrogateescape") + b"\0")
        return os.path.join(self.directory, SNAPSHOTS, digest.hexdigest()[:32])

    def load_snapshot(self, paths: list) -> dict:
        """{path: (stat, findings as JSON)} from the last run over exactly `paths`, or {}."""
        try:
            with open(self._snapshot_path(paths), encoding="utf-8") as handle:
                snapshot = json.load(handle)
        except (OSError, ValueError):
            return {}
        if not isinstance(snapshot, dict) or snapshot.get("salt") != self.salt_id:
            return {}
        records = snapshot.get("files")
        if not isinstance(records, list) or len(records) != len(paths):
            return {}
        return {path: record for path, record in zip(paths, records)
                if isinstance(record, list) and len(record) == 2 and isinstance(record[1], list)}

    def snapshot_findings(self, record: list, path: str, stat: Optional[list]) -> Optional[list]:
        """The findings a snapshot record holds, if `stat` is the one they were made under."""
        if not self.fresh(record[0], stat):
            return None
        return self._findings({"findings": record[1]}, path)

    def save_snapshot(self, paths: list, stats: list, findings: list) -> None:
        """Store a run over `paths`: each one's stat before it was read (None: not stored) and findings."""
        if not self.usable:
            return
        payload = json.dumps({"salt": self.salt_id, "files": [
            [stat, [f.to_json() for f in found]] if stat is not None else None
            for stat, found in zip(stats, findings)]})
        target = self._snapshot_path(paths)
        try:
            snapshot_dir = os.path.dirname(target)
            self._prepare(snapshot_dir)
            self._write(snapshot_dir, target, payload)
            kept = sorted((e for e in os.scandir(snapshot_dir) if not e.name.startswith(".tmp-")),
                          key=lambda e: e.stat().st_mtime_ns, reverse=True)
            for old in kept[MAX_SNAPSHOTS:]:
                os.unlink(old.path)
        except OSError:
            self.usable = False

    @staticmethod
    def _write(directory: str, target: str, payload: str) -> None:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise

    def _prepare(self, entry_dir: str) -> None:
        if os.path.isdir(entry_dir):
            return
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / ".gitignore").write_text("# Created by matlint.\n*\n", encoding="utf-8")
            (self.directory / "CACHEDIR.TAG").write_text(CACHEDIR_TAG, encoding="utf-8")
        os.makedirs(entry_dir, exist_ok=True)
