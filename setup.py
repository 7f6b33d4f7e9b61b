"""The package list, which pyproject.toml cannot compute: `rules/` and `runtime_guard/` are
installed as `matlint.rules` and `matlint.runtime_guard` (see [tool.setuptools.package-dir]), and
every rule that is a package (a directory of rules/ with an `__init__.py`) ships as a subpackage
of `matlint.rules`, without a list to keep up to date. Everything else is in pyproject.toml."""
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _packages(root: str, name: str) -> list:
    return [name] + [f"{name}.{'.'.join(init.parent.relative_to(HERE / root).parts)}"
                     for init in sorted((HERE / root).rglob("__init__.py")) if init.parent != HERE / root]


# matlint.rules.fixtures: the rules' examples (rules/fixtures/<code>.py), data that `Rule.examples`
# reads for the docs and `matlint rule`; listed as a package because its files end in .py.
setup(packages=_packages("matlint", "matlint") + _packages("rules", "matlint.rules") + ["matlint.rules.fixtures"]
      + _packages("runtime_guard", "matlint.runtime_guard"))
