"""What a person sees of `matlint rule` and the runtime guard's report in terminals 80, 100 and 120
columns wide, and in a pipe.

Each command runs in a real terminal (tmux, with the size set), and the test reads the screen back
(`capture-pane -J`: a line the program wrote wider than the terminal comes back whole, so it shows
as too long). The captures are kept under build/terminal-captures/.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from matlint.registry import all_rules, get_rule

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "build" / "terminal-captures"
TMUX = shutil.which("tmux")
WIDTHS = (80, 100, 120)
BOX_DRAWING = re.compile("[\u2500-\u257f]")
CODE = re.compile(r"MAT\d{3}")

needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install tmux)")


def user_env() -> dict:
    """The environment of a user's shell: no size or color overrides of ours."""
    return {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TMUX"}}


def in_terminal(command: str, width: int, cwd: Path, name: str, timeout: float = 300) -> list:
    """The screen (scroll-back included) after `command` ran in a `width`-column terminal, as lines."""
    socket = cwd / f"{name}.tmux"  # a server of its own, gone with the test's folder
    conf = cwd / f"{name}.tmux.conf"
    conf.write_text("set -g history-limit 20000\nset -g status off\n")
    tmux = [TMUX, "-S", str(socket), "-f", str(conf)]
    shell = f"cd {shlex.quote(str(cwd))} && {command}; {shlex.join(tmux)} wait-for -S {name}; sleep 600"
    subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", "50", "sh", "-c", shell],
                   check=True, env=user_env())
    try:
        subprocess.run([*tmux, "wait-for", name], check=True, timeout=timeout)
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-", "-E", "-"],
                                check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    lines = [line.rstrip() for line in screen.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    keep(name, lines)
    return lines


def keep(name: str, lines: list) -> None:
    CAPTURES.mkdir(parents=True, exist_ok=True)
    (CAPTURES / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def blocks(lines: list) -> list:
    """The list layout read back: (first line of a block, the text of the lines indented under it)."""
    found = []
    for line in lines:
        if line and not line[0].isspace():
            found.append((line, []))
        elif line and found:
            found[-1][1].append(line.strip())
    return [(head, " ".join(rest)) for head, rest in found]


def assert_readable(lines: list, width: int) -> None:
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"wider than {width} columns: {too_long[:3]}"
    assert not any("…" in line for line in lines), "something was cut with an ellipsis"


def assert_rules_listed(lines: list, width: int) -> None:
    assert_readable(lines, width)
    assert not any(BOX_DRAWING.search(line) for line in lines)
    listed = blocks(lines)
    rules = list(all_rules())
    assert len(listed) == len(rules), list(listed)[:5]
    for rule, (head, summary) in zip(rules, listed):
        code, name, facts = head.split(maxsplit=2)
        assert (code, name, facts.split(", ")[0]) == (rule.code, rule.name, rule.family())
        assert ("off by default" in facts) == (not rule.default_enabled)
        assert summary == " ".join(rule.summary.split()), rule.code
    # One line for the code and name, the summary's wrapped lines, one blank line between families.
    families = len({rule.family() for rule in rules})
    summary_lines = sum(-(-len(rule.summary) // (width - 12)) for rule in rules)
    assert len(lines) <= len(rules) + summary_lines + families


@needs_tmux
@pytest.mark.parametrize("width", WIDTHS)
def test_rule_list_reads_well_in_a_terminal(tmp_path, width):
    lines = in_terminal(f"{shlex.quote(sys.executable)} -m matlint rule", width, tmp_path, f"rule-{width}")
    assert_rules_listed(lines, width)


@needs_tmux
def test_rule_table_on_a_wide_terminal_cuts_nothing(tmp_path):
    lines = in_terminal(f"{shlex.quote(sys.executable)} -m matlint rule", 160, tmp_path, "rule-160")
    assert_readable(lines, 160)
    rows = []
    for line in lines:
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if len(cells) != 7 or cells[0] == "code":
            continue
        if cells[0]:
            rows.append(cells)
        else:  # a wrapped summary goes on in the next line
            rows[-1][6] += " " + cells[6]
    assert [row[:5] + row[6:] for row in rows] == [
        [rule.code, rule.name, rule.family(), rule.level(), "on" if rule.default_enabled else "off",
         " ".join(rule.summary.split())]
        for rule in all_rules()]


@needs_tmux
def test_rule_list_piped_from_a_terminal_takes_its_width_and_no_escapes(tmp_path):
    out = tmp_path / "piped.txt"
    in_terminal(f"{shlex.quote(sys.executable)} -m matlint rule | tee {out}", 100, tmp_path, "rule-pipe-100")
    text = out.read_text(encoding="utf-8")
    assert "\x1b" not in text
    assert_rules_listed(text.splitlines(), 100)


def test_rule_list_in_a_pipe_without_a_terminal(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "matlint", "rule"], cwd=tmp_path, env=user_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    keep("rule-no-terminal", proc.stdout.splitlines())
    assert "\x1b" not in proc.stdout
    assert_rules_listed(proc.stdout.splitlines(), 80)  # rich's width when nothing tells it one


# -- the runtime guard's report ------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded_project(tmp_path_factory):
    """A user's project: the example training step (a per-head matmul loop, hand-written attention)."""
    pytest.importorskip("torch")
    project = tmp_path_factory.mktemp("project")
    (project / "examples").mkdir()
    shutil.copy(REPO / "examples" / "guard_attention.py", project / "examples")
    return project


def report_part(lines: list) -> list:
    """The guard's report: from its first line on (torch may warn before it)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("matlint guard:"))
    return lines[start:]


def assert_guard_report(lines: list, width: int, project: Path) -> None:
    report = report_part(lines)
    assert_readable(report, width)
    assert not any(BOX_DRAWING.search(line) for line in report)
    findings = json.loads((project / ".matlint" / "runtime.json").read_text())
    assert {f["code"] for f in findings} == {"MAT101", "MAT601"}  # the q @ kᵀ copy is the attention's (MAT601)
    listed = [(head, rest) for head, rest in blocks(report) if CODE.fullmatch(head.split()[0])]
    assert len(listed) == len(findings)
    for finding, (head, rest) in zip(findings, listed):
        code, name, where = head.split()
        assert (code, name) == (finding["code"], get_rule(code).name)
        assert where == f"examples/guard_attention.py:{finding['location']['row']}"
        assert rest.endswith(" ".join(finding["message"].split()))
    assert report[-1] == "JSON report: .matlint/runtime.json"
    # Per finding: its head, the facts, the message's wrapped lines; then up to two lines a note.
    wrapped = sum(-(-len(f["message"]) // (width - 12)) for f in findings)
    notes = sum(line.startswith("note:") for line in report)
    assert len(report) <= 2 + 2 * len(findings) + wrapped + 2 * notes


@needs_tmux
@pytest.mark.parametrize("width", WIDTHS)
def test_guard_report_reads_well_in_a_terminal(guarded_project, width):
    (guarded_project / ".matlint" / "runtime.json").unlink(missing_ok=True)
    lines = in_terminal(f"{shlex.quote(sys.executable)} examples/guard_attention.py", width, guarded_project,
                        f"guard-{width}")
    assert_guard_report(lines, width, guarded_project)


def test_guard_report_in_a_pipe_without_a_terminal(guarded_project):
    (guarded_project / ".matlint" / "runtime.json").unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "examples/guard_attention.py"], cwd=guarded_project, env=user_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, start_new_session=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    keep("guard-no-terminal", proc.stderr.splitlines())
    assert "\x1b" not in proc.stderr
    assert_guard_report(proc.stderr.splitlines(), 80, guarded_project)
