"""Content-hash cache of findings, one small JSON file per linted path.

An entry holds the key it was computed under (sha256 of the file's bytes, its path, the matlint
version, the rules' fingerprint and the settings' fingerprint) and the findings; a lookup whose
key differs is a miss. Entries are written atomically, and a corrupt or unreadable entry is a
miss, never an error. Keeping one entry per path bounds the cache by the size of the tree.
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
FORMAT = "v1"


def matlint_version() -> str:
    from . import __version__

    return __version__


class Cache:
    def __init__(self, directory, settings_fingerprint: str):
        from .registry import rules_fingerprint

        self.directory = Path(directory)
        self.entries = self.directory / FORMAT
        self.salt = f"{matlint_version()}\0{rules_fingerprint()}\0{settings_fingerprint}\0".encode()
        self.usable = True

    def key(self, data: bytes, path: str) -> str:
        digest = hashlib.sha256(self.salt)
        digest.update(os.path.abspath(path).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(data)
        return digest.hexdigest()

    def _entry(self, path: str) -> Path:
        name = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()
        return self.entries / name[:2] / name[2:34]

    def get(self, key: str, path: str) -> Optional[list]:
        try:
            with open(self._entry(path), encoding="utf-8") as handle:
                entry = json.load(handle)
            if entry.get("key") != key:
                return None
            findings = [Finding.from_json(item) for item in entry["findings"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        for finding in findings:
            finding.filename = path
        return findings

    def put(self, key: str, path: str, findings: list) -> None:
        if not self.usable:
            return
        target = self._entry(path)
        payload = json.dumps({"key": key, "findings": [f.to_json() for f in findings]})
        try:
            self._prepare(target.parent)
            fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(payload)
                os.replace(temporary, target)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            self.usable = False  # a read-only tree still lints; it just is not cached

    def _prepare(self, entry_dir: Path) -> None:
        if entry_dir.is_dir():
            return
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / ".gitignore").write_text("# Created by matlint.\n*\n", encoding="utf-8")
            (self.directory / "CACHEDIR.TAG").write_text(CACHEDIR_TAG, encoding="utf-8")
        entry_dir.mkdir(parents=True, exist_ok=True)
