"""Every finding on a rule's bad examples, pinned by a snapshot: its range, message and fix
(applicability, title, edits). test_rule_examples.py checks positions and fixed sources; this
catches any change in what the user reads. The snapshots live in
`tests/__snapshots__/test_rule_snapshots/`, one file per rule; after an intended change, review
the diff and rewrite them with `pytest tests/test_rule_snapshots.py --snapshot-update`."""
import pytest
from syrupy.extensions.single_file import SingleFileAmberSnapshotExtension

from matlint.engine import lint_source
from matlint.registry import all_rules


def _span(item) -> str:
    return f"{item.row}:{item.column}-{item.end_row}:{item.end_column}"


def _finding(finding) -> dict:
    fix = finding.fix
    return {
        "range": _span(finding),
        "message": finding.message,
        "fix": None if fix is None else {
            "applicability": "safe" if fix.safe else "unsafe",
            "title": fix.message,
            "edits": [{"range": _span(edit), "content": edit.content} for edit in fix.edits],
        },
    }


@pytest.mark.parametrize("rule", [r for r in all_rules() if any(e.expect for e in r.examples)],
                         ids=lambda r: r.code)
def test_findings(rule, snapshot):
    """Keyed by the example's index in the rule's fixture file (its n-th `# %%` case, not
    counting `fixed` twins)."""
    findings = {
        f"example {i}": [_finding(f) for f in lint_source(example.code, "example.py", [rule], prefilter=False)]
        for i, example in enumerate(rule.examples) if example.expect
    }
    assert findings == snapshot.use_extension(SingleFileAmberSnapshotExtension)
