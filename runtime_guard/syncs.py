"""Every host sync of the observed steps, from torch's own detector.

`torch.cuda.set_sync_debug_mode("warn")` makes torch's C++ side warn at each operation that waits
for the GPU: `.item()`, `.cpu()`, boolean-mask indexing, `nonzero`, `unique`, `masked_select`,
`torch.cuda.synchronize()`, shapes that depend on data. The watch turns those warnings into
counts per source line (the first frame of the user's code) instead of printing them, and lets
every other warning through. Syncs the guard makes itself (timing a step) are not counted.
CUDA only: on the CPU nothing waits.
"""
from __future__ import annotations

import sys
import warnings

import torch

from .capture import user_site

SYNC_WARNING = "called a synchronizing CUDA operation"


class SyncWatch:
    def __init__(self, recorder):
        self.recorder = recorder
        self.active = False
        self._mode = None
        self._show = None
        self._filter = None

    def start(self) -> bool:
        """Watches from now on; False (and nothing changed) where CUDA is not in use or the user
        set torch's sync debug mode already."""
        if self.active or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return False
        if torch.cuda.get_sync_debug_mode() != 0:
            return False  # the user's own setting ("warn" or "error") stays in charge
        self.listen()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "a prototype feature": said once per switch, not the user's concern
            torch.cuda.set_sync_debug_mode("warn")
        return True

    def listen(self) -> None:
        """Counts the sync warnings from now on, and only those (the detector's switch aside)."""
        self._show = warnings.showwarning
        warnings.showwarning = self._showwarning
        warnings.filterwarnings("always", message=SYNC_WARNING)
        self._filter = warnings.filters[0]
        self.active = True

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.cuda.set_sync_debug_mode(0)
        if warnings.showwarning == self._showwarning:
            warnings.showwarning = self._show
        try:
            warnings.filters.remove(self._filter)
        except ValueError:
            pass
        mutated = getattr(warnings, "_filters_mutated", None)  # drops the registries' cached verdicts
        if mutated is not None:
            mutated()

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if self.active and SYNC_WARNING in str(message):
            self.count(sys._getframe(1))
            return None
        return self._show(message, category, filename, lineno, file, line)

    def count(self, frame) -> None:
        while frame is not None and frame.f_code.co_filename == warnings.__file__:
            frame = frame.f_back  # the warnings machinery between the op and this hook
        site = user_site(frame)
        if site is not None:
            syncs = self.recorder.rec.syncs
            syncs[site] = syncs.get(site, 0) + 1
