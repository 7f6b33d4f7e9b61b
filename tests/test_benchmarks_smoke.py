"""The speed benchmark's measuring and reporting, on trivial commands (no peers, no network)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SPEED = Path(__file__).resolve().parent.parent / "benchmarks" / "speed.py"
spec = importlib.util.spec_from_file_location("matlint_bench_speed", SPEED)
speed = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = speed  # dataclasses look their module up there
spec.loader.exec_module(speed)


def python(code: str) -> list:
    return [sys.executable, "-c", code]


def test_a_run_reports_time_and_memory(tmp_path):
    run = speed.run_once(python("x = bytearray(50 * 2**20)"), tmp_path, timeout=60)
    assert isinstance(run, speed.Run)
    assert run.wall > 0 and run.cpu >= 0
    assert run.rss_mb > 50


def test_findings_exit_code_is_success_but_errors_and_timeouts_are_reported(tmp_path):
    assert isinstance(speed.run_once(python("raise SystemExit(1)"), tmp_path, timeout=60), speed.Run)
    assert speed.run_once(python("raise SystemExit(2)"), tmp_path, timeout=60).startswith("exit 2")
    assert "ValueError: boom" in speed.run_once(python("raise ValueError('boom')"), tmp_path, timeout=60)
    assert speed.run_once(python("import time; time.sleep(30)"), tmp_path, timeout=0.5) == "timed out after 0.5 s"
    assert speed.run_once(["/nonexistent/linter"], tmp_path, timeout=60).startswith("cannot start")


def test_budget_stops_repeats_and_table_shows_ratios_and_failures(tmp_path):
    ref = speed.Bench("ref", python("pass"), set(), reference=True)
    for _ in range(3):
        speed.measure_once(ref, [], tmp_path, budget=0, timeout=60)
    assert len(ref.runs) == 1
    again = speed.Bench("again", python("pass"), set())
    for _ in range(3):
        speed.measure_once(again, [], tmp_path, budget=60, timeout=60)
    assert len(again.runs) == 3
    broken = speed.Bench("broken", [], set(), error="install failed: no such package")
    lines = speed.table([ref, broken], lines=1000)
    assert "| ref | 1 |" in lines[2] and lines[2].endswith("| 1.00 |")
    assert "install failed: no such package" in lines[3]


def test_instruction_counts_table_and_ratios(tmp_path):
    few = [tmp_path / "a.py"]
    few[0].write_text("x = 1\ny = 2\n")
    counts = {frozenset(): {"E,F,W": (400e6, 1400e6)},
              frozenset({"matlint"}): {"E,F,W": (410e6, 1410e6), "E,F,W,MAT": (420e6, 1620e6)}}
    assert abs(speed.instruction_ratio(counts, "E,F,W,MAT") - 1620 / 1400) < 1e-9
    lines = speed.instruction_lines(counts, few)
    assert "2 lines" in lines[0]
    assert lines[-1] == "| flake8 --select E,F,W,MAT | 420 (1.050×) | 1,620 (1.157×) | 1,200 (1.200×) |"
    failed = {frozenset(): "valgrind is not installed", frozenset({"matlint"}): "valgrind is not installed"}
    assert speed.instruction_ratio(failed, "E,F,W") is None
    assert speed.instruction_lines(failed, few) == ["- not measured: valgrind is not installed"]


FUZZ = Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz.py"
fuzz_spec = importlib.util.spec_from_file_location("matlint_bench_fuzz", FUZZ)
fuzz = importlib.util.module_from_spec(fuzz_spec)
sys.modules[fuzz_spec.name] = fuzz  # worker processes look run_chunk up there
fuzz_spec.loader.exec_module(fuzz)


def test_fuzz_runs_each_generator_and_passes(tmp_path, capsys):
    assert fuzz.main(["--count", "9", "--mix", "torch=1,mutation=1,grammar=1", "--failures", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 failing programs" in out
    assert all(f"{name:<10} {3:>9}" in out for name in ("torch", "mutation", "grammar"))


def test_fuzz_saves_a_failing_program_minimized(tmp_path, monkeypatch, capsys):
    def planted(source, line_endings=True, per_fix=True):
        return (["planted: flags any `import torch`"] if "import torch" in source else []), []

    monkeypatch.setattr(fuzz.programs, "check_program_findings", planted)
    monkeypatch.setattr(fuzz.programs, "check_program", lambda source: planted(source)[0])
    assert fuzz.main(["--count", "1", "--mix", "torch=1", "--failures", str(tmp_path)]) == 1
    saved = sorted(tmp_path.iterdir())
    assert [p.name for p in saved] == ["torch-0.py"]
    header, *program = saved[0].read_text().splitlines()
    assert header == "# planted: flags any `import torch`"
    assert len(program) == 1 and "import torch" in program[0]  # minimized to the one line that fails


SCORE = Path(__file__).resolve().parent.parent / "benchmarks" / "user_corpus" / "score.py"
score_spec = importlib.util.spec_from_file_location("matlint_bench_score", SCORE)
score = importlib.util.module_from_spec(score_spec)
score_spec.loader.exec_module(score)


def test_a_statement_finding_matches_every_labelled_site_of_its_statement():
    """MAT502 reports a statement once, at its first sync: the labels of its other syncs, on the
    statement's other lines, are found by it too; a second finding of the statement (another
    kind of sync) takes their verdict without counting them again."""
    source = (b"for x in loader:\n"
              b"    log({\n"
              b"        'a': a.item(),\n"
              b"        'b': b.item(),\n"
              b"        'c': c.cpu(),\n"
              b"    })\n"
              b"    if d.item() > 0:\n"
              b"        e.item()\n")
    assert score.statement_span(source, 3) == (2, 6)
    assert score.statement_span(source, 7) == (7, 7)  # the `if`'s header, not its body
    label = lambda line, kind: {"repo": "r", "path": "p", "line": str(line), "codes": "MAT502", "label": kind}
    labels = [label(3, "pos"), label(4, "pos"), label(5, "pos"), label(7, "neg"), label(8, "pos")]
    findings = [("r", "p", 3, "MAT502", "", (2, 6)), ("r", "p", 5, "MAT502", "", (2, 6)),
                ("r", "p", 7, "MAT502", "", (7, 7))]
    matched, verdicts = score.match(findings, labels, [])
    assert [int(l["line"]) for l in matched] == [3, 4, 5]
    assert [v for _, v in verdicts] == ["pos", "pos", "neg"]


def test_score_repos_option_restricts_the_corpus_to_the_listed_repositories(tmp_path, capsys):
    """`--repos FILE` scores only the listed repositories (an empty list lints nothing), and a
    name that is not in repos.csv is an error rather than a silently empty score."""
    listed = tmp_path / "none.txt"
    listed.write_text("# no repositories\n")
    assert score.main(["--repos", str(listed)]) == 0
    assert "0 repositories, 0 files, 0 positive and 0 negative labels" in capsys.readouterr().out
    listed.write_text("nobody/no-such-repo\n")
    with pytest.raises(SystemExit):
        score.main(["--repos", str(listed)])
    assert "not in repos.csv: nobody/no-such-repo" in capsys.readouterr().err


def test_notebook_rows_count_the_lines_of_code_cells(tmp_path):
    import json

    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# a\n", "b\n"]},
             {"cell_type": "code", "metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout",
                                                                "text": ["x\n"] * 50}],
              "execution_count": 1, "source": ["import torch\n", "x = 1"]}]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert speed.notebook_code_lines([str(path)]) == 2


GUARD_RECALL = Path(__file__).resolve().parent.parent / "benchmarks" / "guard_recall" / "score.py"
recall_spec = importlib.util.spec_from_file_location("matlint_bench_guard_recall", GUARD_RECALL)
recall = importlib.util.module_from_spec(recall_spec)
sys.modules[recall_spec.name] = recall  # dataclasses look their module up there
recall_spec.loader.exec_module(recall)


def test_guard_recall_matching_takes_the_nearest_label_of_the_same_code_and_program():
    """A finding matches labels of its program and code within 2 lines; its verdict is the nearest
    one's (positive on a tie); a finding elsewhere is unlabelled, one outside the program outside."""
    path = str(recall.PROGRAMS / "p.py")
    lab = lambda line, code, kind: recall.Label("p.py", line, code, kind, "cpu", "")
    labels = [lab(10, "MAT502", "pos"), lab(13, "MAT502", "neg"), lab(20, "MAT101", "pos"), lab(30, "MAT201", "pos")]
    fnd = lambda line, code, file=path: recall.Finding("p.py", code, file, line, "")
    findings = [fnd(11, "MAT502"), fnd(14, "MAT502"), fnd(20, "MAT201"), fnd(31, "MAT201"), fnd(5, "MAT101", "/x/torch.py")]
    found = recall.match(findings, labels)
    assert [f.verdict for f in findings] == ["pos", "neg", "unlabelled", "pos", "outside"]
    assert found == {id(labels[0]), id(labels[3])}
    rows = recall.table(labels, findings, found)
    assert rows[-1] == "| overall | 3 | 2 | 0.67 | 5 | 5 | 2 | 0.40 | 0.40 | 1/1 |"


def test_guard_recall_scores_one_program_under_the_guard(capsys):
    """The scorer runs a program under the guard in a subprocess and reports its labels."""
    assert recall.main(["--device", "cpu", "--programs", "sales_forecast_mlp"]) == 0
    out = capsys.readouterr().out
    assert "device: cpu; 1 programs; 6 labels observable here (0 positive), 4 only on cuda" in out
    assert "FAILED" not in out and "guard error" not in out
    assert "| overall | 0 | 0 |   -  |" in out
