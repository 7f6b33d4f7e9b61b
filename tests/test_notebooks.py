"""Jupyter notebooks: the code cells are one program, IPython syntax parses, findings are located
by cell, `# noqa` works per line, fixes rewrite only the fixed cell's source, and a bad notebook
gets one clear finding while the run goes on."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from matlint import engine, notebook
from matlint.registry import all_rules, get_rule

from matlint_helpers import TRACEBACK, bad_example, fix_example, run_matlint, write


def code_cell(source, count=None, outputs=()):
    return {"cell_type": "code", "execution_count": count, "metadata": {}, "outputs": list(outputs),
            "source": source}


def markdown(text):
    return {"cell_type": "markdown", "metadata": {}, "source": [text]}


def lines(text: str) -> list:
    return text.splitlines(keepends=True)


def notebook_json(cells, **dump) -> str:
    nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
          "nbformat": 4, "nbformat_minor": 5}
    dump.setdefault("indent", 1)
    dump.setdefault("ensure_ascii", False)
    return json.dumps(nb, **dump) + "\n"


def statement_cells(source: str) -> list:
    """`source` cut into one chunk per top-level statement (decorators and comments above a
    statement go with it)."""
    tree = ast.parse(source)
    text = lines(source)
    starts = [min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])]) for s in tree.body]
    starts[0] = 1
    bounds = starts + [len(text) + 1]
    return ["".join(text[a - 1:b - 1]) for a, b in zip(bounds, bounds[1:])]


def _lint(text: str, rules, name="nb.ipynb"):
    return engine.lint_notebook(text, name, rules)


# -- one program ------------------------------------------------------------------------------

BAD_EXAMPLES = [pytest.param(rule, example, id=f"{rule.code}-{i}")
                for rule in all_rules() if not rule.code.startswith("MAT0")
                for i, example in enumerate(rule.examples) if example.expect]


@pytest.mark.parametrize("rule, example", BAD_EXAMPLES)
def test_a_program_cut_into_cells_has_the_same_findings(rule, example):
    """Every bad example of every rule, one top-level statement per cell with markdown between:
    the same findings, each in the cell and at the row and column of its statement."""
    chunks = statement_cells(example.code)
    cells, where, row = [], {}, 1
    for chunk in chunks:
        cells += [markdown("Some prose.\n"), code_cell(lines(chunk))]
        for offset in range(chunk.count("\n") or 1):
            where[row + offset] = (len(cells), offset + 1)
        row += chunk.count("\n")
    as_file = [f for f in engine.lint_source(example.code, "example.py", [rule]) if f.code == rule.code]
    in_cells = [f for f in _lint(notebook_json(cells), [rule]) if f.code == rule.code]
    assert sorted((*where[f.row], f.column) for f in as_file) == sorted((f.cell, f.row, f.column) for f in in_cells)


def test_a_model_defined_in_one_cell_and_trained_in_another():
    cells = [
        code_cell(["import torch\n", "import torch.nn as nn\n", "device = 'cuda'\n"]),
        markdown("## The model\n"),
        code_cell(["class Net(nn.Module):\n", "    def __init__(self):\n", "        super().__init__()\n",
                   "        self.fc = nn.Linear(8, 1)\n", "    def forward(self, x):\n",
                   "        return self.fc(x)\n", "model = Net().to(device)\n",
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"]),
        code_cell(["def train(loader):\n", "    for x, y in loader:\n", "        x, y = x.to(device), y.to(device)\n",
                   "        loss = (model(x) - y).pow(2).mean()\n", "        loss.backward()\n",
                   "        opt.step()\n", "        opt.zero_grad()\n", "        print(loss.item())\n"]),
    ]
    found = {(f.code, f.cell, f.row) for f in _lint(notebook_json(cells), [get_rule("MAT502")])}
    assert ("MAT502", 4, 8) in found


# -- IPython syntax ---------------------------------------------------------------------------

LOOP = ["outs = []\n", "for i in range(8):\n", "    outs.append(torch.matmul(xs[i], ws[i]))\n"]


@pytest.mark.parametrize("before, loop_offset", [
    (["%matplotlib inline\n"], 1),
    (["%load_ext autoreload\n", "%autoreload 2\n"], 2),
    (["!pip install -q torch\n"], 1),
    (["files = !ls *.pt\n"], 1),
    (["result = %timeit -o sum(range(10))\n"], 1),
    (["torch.matmul?\n", "??torch.nn.Linear\n"], 2),
    (["%%time\n"], 1),
    (["%%capture captured\n"], 1),
    (["display(xs.shape)\n"], 1),
    (["await asyncio.sleep(0)\n"], 1),
    (["if True:\n", "    %time xs.sum()\n"], 2),
    # found in public notebooks: IPython's wildcard search, and a `%` that starts a continuation
    # line inside brackets (Python's modulo, not a magic) in a cell that also holds a magic
    (["torch.*Tensor?\n", "xs[0]?\n"], 2),
    (["%matplotlib inline\n", "print('%d/%d'\n", "      %(1, 2))\n", 's = """\n', "%not a magic\n",
      '"""\n', "t = 10 \\\n", "  % 3\n"], 8),
])
def test_ipython_syntax_parses_and_positions_stay_those_of_the_cell(before, loop_offset):
    cells = [code_cell(["import asyncio\n", "import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell(before + LOOP)]
    found = _lint(notebook_json(cells), [get_rule("MAT101")])
    assert [(f.code, f.cell, f.row, f.column) for f in found] == [("MAT101", 2, loop_offset + 3, 17)]


def test_an_indented_cell_is_dedented_as_ipython_does():
    """IPython removes the indentation common to a cell's lines (found in public notebooks: a
    cell whose every line starts with a space). Columns stay those of the cell; the cell's fixes,
    made for the dedented text, are not offered."""
    rule, example = fix_example()
    cells = [code_cell(["import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell(["  " + line if line.strip() else line for line in ["%matplotlib inline\n", "\n", *LOOP]]),
             code_cell(["  " + line if line.strip() else line for line in lines(example.code)])]
    found = _lint(notebook_json(cells), [get_rule("MAT101"), rule])
    assert [(f.code, f.cell, f.row, f.column) for f in found if f.cell == 2] == [("MAT101", 2, 5, 19)]
    assert not [f for f in found if f.code == "MAT001"]
    in_third = [f for f in found if f.cell == 3]
    assert in_third and all(f.fix is None for f in in_third)
    as_file = engine.lint_source(example.code, "example.py", [rule])
    assert sorted((f.row, f.column + 2) for f in as_file) == sorted((f.row, f.column) for f in in_third)


@pytest.mark.parametrize("magic", ["%%bash", "%%writefile train.py", "%%html", "%%javascript", "%%sql"])
def test_cells_of_other_languages_are_skipped(magic):
    cells = [code_cell(["import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell([magic + "\n", "for i in range(8) do echo $i; done\n", *LOOP])]
    assert _lint(notebook_json(cells), [get_rule("MAT101")]) == []


# -- locations in every format ------------------------------------------------------------

@pytest.fixture
def project(tmp_path):
    example = bad_example("MAT101")
    cells = [markdown("# Loops\n")] + [code_cell(lines(chunk)) for chunk in statement_cells(example.code)]
    write(tmp_path / "nb.ipynb", notebook_json(cells))
    return tmp_path


def test_text_json_sarif_and_github_name_the_cell(project):
    found = json.loads(run_matlint("check", "--format", "json", "--select", "MAT101", cwd=project).stdout)
    assert found and all(f["cell"] and f["filename"] == "nb.ipynb" for f in found)
    book = notebook.read((project / "nb.ipynb").read_text())
    concise = run_matlint("check", "--format", "concise", "--select", "MAT101", cwd=project).stdout
    full = run_matlint("check", "--select", "MAT101", cwd=project).stdout
    sarif = json.loads(run_matlint("check", "--format", "sarif", "--select", "MAT101", cwd=project).stdout)
    github = run_matlint("check", "--format", "github", "--select", "MAT101", cwd=project).stdout.splitlines()
    file_lines = (project / "nb.ipynb").read_text().splitlines()
    for f, result, annotation in zip(found, sarif["runs"][0]["results"], github):
        cell, row, col = f["cell"], f["location"]["row"], f["location"]["column"]
        place = f"nb.ipynb:cell {cell}:{row}:{col}: MAT101"
        assert place in concise and place in full
        source_line = book.cell(cell).source.splitlines()[row - 1]
        # The excerpt shows the cell's line under its row in the cell.
        assert f"{row} | {source_line}" in full
        # SARIF and GitHub point at the line of the .ipynb file that holds that source line.
        region = result["locations"][0]["physicalLocation"]["region"]
        assert json.dumps(source_line)[1:-1] in file_lines[region["startLine"] - 1]
        assert result["properties"] == {"cell": cell, "cellRow": row, "cellColumn": col}
        assert result["message"]["text"].startswith(f"cell {cell}, line {row}: ")
        assert f"line={region['startLine']}," in annotation and f"cell {cell}, line {row}: " in annotation


def test_noqa_per_line_inside_a_cell(tmp_path):
    cells = [code_cell(["import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell(["outs = []\n", "for i in range(8):\n", "    outs.append(torch.matmul(xs[i], ws[i]))  # noqa: MAT101\n"]),
             code_cell(LOOP)]
    found = _lint(notebook_json(cells), [get_rule("MAT101")])
    assert [(f.cell, f.row) for f in found] == [(3, 3)]


def test_messages_name_lines_of_the_cell():
    cells = [code_cell(["import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell(LOOP)]
    (finding,) = _lint(notebook_json(cells), [get_rule("MAT101")])
    assert "loop on line 2" in finding.message


# -- discovery and config -------------------------------------------------------------------

def test_notebooks_are_found_in_directories_and_excluded_by_glob(project):
    write(project / "loops.py", bad_example("MAT101").code)
    found = json.loads(run_matlint("check", "--format", "json", cwd=project).stdout)
    assert {f["filename"] for f in found} == {"nb.ipynb", "loops.py"}
    write(project / "pyproject.toml", '[tool.matlint]\nextend-exclude = ["*.ipynb"]\n')
    found = json.loads(run_matlint("check", "--format", "json", cwd=project).stdout)
    assert {f["filename"] for f in found} == {"loops.py"}
    write(project / "pyproject.toml", '[tool.matlint.per-file-ignores]\n"*.ipynb" = ["MAT101"]\n')
    found = json.loads(run_matlint("check", "--format", "json", cwd=project).stdout)
    assert {(f["filename"], f["code"]) for f in found} == {("loops.py", "MAT101")}


def test_a_gitignored_notebook_is_skipped(project):
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    write(project / ".gitignore", "nb.ipynb\n")
    result = run_matlint("check", cwd=project)
    assert result.returncode == 0, result.stdout


# -- fixes ------------------------------------------------------------------------------------

def _fix_notebook_cells():
    rule, example = fix_example()
    cells = [markdown("# Notes, café ☕\n"),
             code_cell(["print('unchanged')\n"], count=1,
                       outputs=[{"output_type": "stream", "name": "stdout", "text": ["unchanged\n"]},
                                {"output_type": "display_data", "metadata": {},
                                 "data": {"image/png": "iVBORw0KGgo" * 2000, "text/plain": ["<Figure>"]}}]),
             code_cell(lines(example.code), count=2)]
    return rule, example, cells


FORMATS = {
    "jupyter": dict(indent=1, ensure_ascii=False, sort_keys=True),
    "two-space, ascii": dict(indent=2, ensure_ascii=True),
    "tabs": dict(indent="\t"),
    "one line": dict(indent=None),
}


@pytest.mark.parametrize("style", FORMATS)
def test_fix_rewrites_only_the_fixed_cells_source(tmp_path, style):
    rule, example, cells = _fix_notebook_cells()
    text = notebook_json(cells, **FORMATS[style])
    if style == "one line":
        text = text.rstrip("\n")  # no trailing newline: kept
    path = write(tmp_path / "nb.ipynb", text)
    flags = ["--unsafe-fixes"] if example.unsafe else []
    run_matlint("check", "--fix", *flags, "--select", rule.code, "nb.ipynb", cwd=tmp_path)
    after = path.read_text(encoding="utf-8")
    before_nb, after_nb = json.loads(text), json.loads(after)
    assert "".join(after_nb["cells"][2]["source"]) == example.fixed_code
    after_nb["cells"][2]["source"] = before_nb["cells"][2]["source"]
    assert after_nb == before_nb
    # Byte for byte outside the fixed source: same prefix up to it, same suffix after it.
    start = text.index('"source"', text.index('"execution_count": 2' if style != "one line" else '"execution_count": 2'))
    assert after[:start] == text[:start]
    tail = text[text.index("]", text.index("[", start)) + 1:]
    assert after.endswith(tail)


def test_nothing_to_fix_leaves_the_file_untouched(tmp_path):
    cells = [code_cell(["import torch\n", "y = torch.ones(2)\n"], outputs=[{"output_type": "stream", "name": "stdout", "text": ["x"]}])]
    text = notebook_json(cells, indent=4, sort_keys=False)
    path = write(tmp_path / "nb.ipynb", text)
    stamp = path.stat().st_mtime_ns
    result = run_matlint("check", "--fix", "nb.ipynb", cwd=tmp_path)
    assert result.returncode == 0 and path.read_text() == text and path.stat().st_mtime_ns == stamp


def test_fix_keeps_magics_and_a_string_source(tmp_path):
    rule, example = fix_example()
    source = "%load_ext autoreload\n!nvidia-smi\n" + example.code
    text = notebook_json([code_cell(source)])
    path = write(tmp_path / "nb.ipynb", text)
    flags = ["--unsafe-fixes"] if example.unsafe else []
    diff = run_matlint("check", "--diff", *flags, "--select", rule.code, "nb.ipynb", cwd=tmp_path)
    assert diff.returncode == 1 and diff.stdout.startswith("--- a/nb.ipynb:cell 1\n+++ b/nb.ipynb:cell 1\n")
    assert path.read_text() == text
    run_matlint("check", "--fix", *flags, "--select", rule.code, "nb.ipynb", cwd=tmp_path)
    cell = json.loads(path.read_text())["cells"][0]
    assert cell["source"] == "%load_ext autoreload\n!nvidia-smi\n" + example.fixed_code


# -- bad notebooks ---------------------------------------------------------------------------

BAD_NOTEBOOKS = {
    "invalid JSON": ('{"cells": [}, "import torch"', "not valid JSON"),
    "JSON, not a notebook": ('{"torch": 1}', "not a Jupyter notebook"),
    "a list": ('["torch"]', "not a Jupyter notebook"),
    "cells not a list": ('{"cells": "torch", "nbformat": 4}', "`cells` is not a list"),
    "source not text": ('{"cells": [{"cell_type": "code", "source": [1, "torch"]}], "nbformat": 4}', "not text"),
    "nbformat 2": ('{"worksheets": [{"cells": []}], "nbformat": 2, "torch": 0}', "nbformat 2"),
}


@pytest.mark.parametrize("name", BAD_NOTEBOOKS)
def test_a_bad_notebook_gets_one_finding_and_the_run_goes_on(tmp_path, name):
    text, says = BAD_NOTEBOOKS[name]
    write(tmp_path / "bad.ipynb", text)
    write(tmp_path / "loops.py", bad_example("MAT101").code)
    result = run_matlint("check", "--format", "json", cwd=tmp_path)
    assert TRACEBACK not in result.stderr and result.returncode == 1
    found = json.loads(result.stdout)
    (problem,) = [f for f in found if f["filename"] == "bad.ipynb"]
    assert problem["code"] == "MAT001" and says in problem["message"], problem
    assert any(f["filename"] == "loops.py" for f in found)


def test_a_cell_that_does_not_parse_is_reported_and_the_others_linted():
    cells = [code_cell(["import torch\n", "xs = torch.randn(8, 4, 4)\n", "ws = torch.randn(8, 4, 4)\n"]),
             code_cell(["def broken(:\n", "    pass\n"]),
             code_cell(LOOP)]
    found = _lint(notebook_json(cells), [get_rule("MAT101")])
    assert [(f.code, f.cell, f.row) for f in found] == [("MAT001", 2, 1), ("MAT101", 3, 3)]
    assert "cell does not parse" in found[0].message


def test_nbformat_3_is_read():
    loop = "import torch\nxs = torch.randn(8, 4, 4)\nws = torch.randn(8, 4, 4)\n" + "".join(LOOP)
    nb = {"nbformat": 3, "nbformat_minor": 0, "metadata": {},
          "worksheets": [{"cells": [{"cell_type": "markdown", "source": ["hi"]},
                                    {"cell_type": "code", "language": "python", "input": lines(loop),
                                     "outputs": [], "prompt_number": 1}]}]}
    (finding,) = _lint(json.dumps(nb, indent=1), [get_rule("MAT101")])
    assert (finding.cell, finding.row) == (2, 6)


def test_markdown_only_and_empty_notebooks_are_clean(tmp_path):
    write(tmp_path / "notes.ipynb", notebook_json([markdown("torch is nice\n")]))
    write(tmp_path / "empty.ipynb", notebook_json([code_cell([]), code_cell("import torch\n")]))
    result = run_matlint("check", cwd=tmp_path)
    assert result.returncode == 0 and "All checks passed!" in result.stdout


def test_outputs_are_not_read_as_code():
    """Code-like text in outputs and markdown is not linted."""
    stream = {"output_type": "stream", "name": "stdout", "text": lines("".join(LOOP))}
    cells = [code_cell(["import torch\n"], outputs=[stream]), markdown("".join(LOOP))]
    assert _lint(notebook_json(cells), list(all_rules())) == []


def test_nbqa_flake8_reports_what_matlint_check_reports(tmp_path):
    """flake8 cannot read notebooks; `nbqa flake8 --select MAT` runs the plugin on them, and
    finds what `matlint check` finds (nbqa numbers code cells only)."""
    from matlint_helpers import installed_script
    import subprocess

    # nbqa shifts the rows it reports after code that precedes a `def` or `class` in a cell (it
    # adds blank lines around definitions), so each top-level statement has a cell of its own.
    cells = [markdown("# Loops\n")]
    for code in ("MAT101", "MAT102", "MAT601"):
        for chunk in statement_cells(bad_example(code).code):
            cells += [code_cell(lines(chunk)), markdown("More prose.\n")]
    write(tmp_path / "nb.ipynb", notebook_json(cells))
    result = subprocess.run([installed_script("nbqa"), "flake8", "nb.ipynb", "--select", "MAT"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    via_nbqa = set(re.findall(r"^nb\.ipynb:cell_(\d+):(\d+):(\d+): (MAT\d+)", result.stdout, re.M))
    found = json.loads(run_matlint("check", "--format", "json", cwd=tmp_path).stdout)
    code_cells = [i + 1 for i, cell in enumerate(cells) if cell["cell_type"] == "code"]
    ours = {(str(code_cells.index(f["cell"]) + 1), str(f["location"]["row"]), str(f["location"]["column"]), f["code"])
            for f in found}
    assert {code for *_, code in ours} == {"MAT101", "MAT102", "MAT601"}
    assert via_nbqa == ours, result.stdout + result.stderr


def test_a_statement_cannot_run_on_from_one_cell_into_the_next():
    """Each cell runs alone: a bracket left open in one cell is that cell's syntax error, even
    though the cells joined would parse."""
    cells = [code_cell(["import torch\n", "x = torch.ones(\n"]), code_cell(["    2)\n"]), code_cell(LOOP)]
    found = _lint(notebook_json(cells), [get_rule("MAT101")])
    assert [(f.code, f.cell) for f in found][:2] == [("MAT001", 1), ("MAT001", 2)]
