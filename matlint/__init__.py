"""matlint: finds the PyTorch code patterns that keep GEMMs off the GPU's matrix units.

Importing matlint is cheap: it imports neither torch nor rich; `check`, `lint_text` and
`guard` load their modules on first use.
"""
from __future__ import annotations

# The one place the version is written: pyproject.toml reads it from here (a constant, so that
# `matlint check`, whose cache is keyed by it, need not read the installed package's metadata).
__version__ = "0.1.0"

_LAZY = {
    "check": ("matlint.api", "check"),
    "lint_text": ("matlint.api", "lint_text"),
    "load_settings": ("matlint.config", "load_settings"),
    "Settings": ("matlint.config", "Settings"),
    "ConfigError": ("matlint.config", "ConfigError"),
    "Finding": ("matlint.diagnostics", "Finding"),
    "Fix": ("matlint.diagnostics", "Fix"),
    "Edit": ("matlint.diagnostics", "Edit"),
    "guard": ("matlint.runtime_guard", "guard"),
}

# `guard` stays out of __all__: `from matlint import *` must not import torch.
__all__ = ["__version__", *(name for name in _LAZY if name != "guard")]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'matlint' has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def load_ipython_extension(ipython) -> None:
    """`%load_ext matlint`: the `%%matlint` cell magic (and `%matlint` line magic) guards a cell."""
    from .runtime_guard.jupyter import load

    load(ipython)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
