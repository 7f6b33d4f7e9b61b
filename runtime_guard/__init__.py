"""The runtime guard: `matlint.guard` records real ops on real tensors and reports rule findings.

Needs torch (the `guard` extra); imported lazily so that `import matlint.runtime_guard.pytest_plugin`
works without torch.
"""

__all__ = ["guard", "Guard", "GuardFindingsError"]


def __getattr__(name):
    if name in __all__:
        from . import session

        return getattr(session, name)
    raise AttributeError(name)
