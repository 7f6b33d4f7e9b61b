"""flake8 plugin (`MAT` codes). It reuses the tree flake8 has already parsed, and does nothing at
all when flake8's selection switches every MAT code off: flake8 runs every installed plugin
whatever `--select` says, so that decision has to be ours (made once, in `parse_options`).

flake8 itself applies `# noqa` and `--per-file-ignores` to what the plugin yields.
"""
from __future__ import annotations

import ast
from typing import ClassVar

MAT = "MAT"


def _explicit_selectors(options) -> list:
    return [s.strip().upper() for s in [*(getattr(options, "select", None) or ()),
                                         *(getattr(options, "extend_select", None) or ())] if s.strip()]


def _may_select_mat(decider) -> bool:
    """False when no MAT code can be selected: flake8 selects a code only if it starts with one of
    the selectors, so some selector must be a prefix of `MAT` or start with it. Saves importing
    every rule on each flake8 run of a user who has matlint installed and does not select it."""
    selectors = (*getattr(decider, "selected_explicitly", (MAT,)), *getattr(decider, "selected", (MAT,)))
    return any(s.startswith(MAT) or MAT.startswith(s) for s in selectors)


def rules_selected_by(options) -> tuple:
    """Rule classes that flake8's select/ignore options switch on.

    A rule that is off by default runs only when a selector longer than `MAT` names it
    (`--select MAT9` or `--extend-select MAT901`), never by the default selection or `--select MAT`.
    """
    from flake8.style_guide import Decision, DecisionEngine

    decider = DecisionEngine(options)
    if not _may_select_mat(decider):
        return ()
    from .registry import all_rules

    explicit = _explicit_selectors(options)
    chosen = []
    for cls in all_rules():
        if not cls._handlers or decider.decision_for(cls.code) is not Decision.Selected:
            continue
        if cls.default_enabled or any(cls.code.startswith(s) and len(s) > len(MAT) for s in explicit):
            chosen.append(cls)
    return tuple(chosen)


class MatlintFlake8:
    name = "matlint"  # flake8 takes the version from the installed distribution

    rules: ClassVar[tuple] = ()
    rule_options: ClassVar[dict] = {}

    def __init__(self, tree: ast.AST, lines: list, filename: str = "stdin"):
        self.tree = tree
        self.lines = lines
        self.filename = filename

    @classmethod
    def parse_options(cls, options) -> None:
        cls.rules = rules_selected_by(options)
        if not cls.rules:
            return
        from .config import ConfigError, load_settings

        try:
            # Rule options come from [tool.matlint]; flake8's own options decide the selection.
            cls.rule_options = load_settings().rule_options
        except ConfigError as exc:
            raise SystemExit(f"matlint: error: {exc}") from None

    def run(self):
        if not self.rules:
            return
        source = "".join(self.lines)
        from .engine import mentions_torch
        if not mentions_torch(source):
            return
        from .engine import FILE_NOQA_RE, lint_tree, noqa_map

        findings = lint_tree(self.tree, source, self.filename, self.rules, self.rule_options)
        if not findings:
            return
        # `# matlint: noqa`; flake8 handles `# noqa`. Tokenizing for comments only pays where the
        # text holds one at all.
        file_codes, file_noqa = None, False
        if FILE_NOQA_RE.search(source):
            _, file_codes, file_noqa = noqa_map(source)
        for finding in findings:
            if file_noqa and (file_codes is None or finding.code in file_codes):
                continue
            yield finding.row, finding.column - 1, f"{finding.code} {finding.message}", type(self)
