"""Analyses whose tables are built on first use: rules take an analysis of a function before they
know whether the node in hand needs it."""
from __future__ import annotations


class BuiltOnFirstUse:
    """`_BUILT` names the attributes that `_build()` sets; reading any of them before the build
    runs it (once: afterwards they are found normally and `__getattr__` is never reached)."""

    _BUILT: frozenset = frozenset()

    def __getattr__(self, name: str):
        if name not in type(self)._BUILT:
            raise AttributeError(name)
        self._build()
        return self.__dict__[name]

    def _build(self) -> None:
        raise NotImplementedError
