"""`%load_ext matlint` in a real IPython shell: `%%matlint` guards a cell, `%matlint` a statement;
the report is in the cell's output and its findings point at notebook cells."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
IPython = pytest.importorskip("IPython")

SETUP = """
import torch
w = torch.nn.Parameter(torch.randn(8, 16, 16))
opt = torch.optim.SGD([w], lr=0.01)
x = torch.randn(8, 4, 16)
"""
TRAIN = """for step in range(4):
    opt.zero_grad()
    y = torch.stack([x[h] @ w[h] for h in range(8)])
    y.square().mean().backward()
    opt.step()
"""


@pytest.fixture
def shell(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext matlint", store_history=True).raise_error()
    shell.run_cell(SETUP, store_history=True).raise_error()
    yield shell
    shell.user_ns.pop("__vsc_ipynb_file__", None)
    InteractiveShell.clear_instance()


def test_cell_magic_guards_the_cell_and_names_its_cell(shell, capsys):
    count = shell.execution_count
    result = shell.run_cell("%%matlint --no-estimate\n" + TRAIN, store_history=True)
    result.raise_error()
    out = capsys.readouterr().out
    assert "MAT101" in out and f"Cell In[{count}]:3" in out and "<ipython-input" not in out
    (finding,) = [f for f in json.load(open(".matlint/runtime.json")) if f["code"] == "MAT101"]
    assert finding["evidence"]["cell"] == {"execution_count": count}
    assert finding["location"]["row"] == 3
    # The cell ran: its names are the notebook's.
    assert shell.user_ns["step"] == 3


def test_findings_go_to_the_notebook_cell_when_the_kernel_knows_the_notebook(shell, tmp_path, capsys):
    """A frontend that sends cell ids, with the notebook saved (VS Code sets __vsc_ipynb_file__)."""
    cells = [{"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["# Training\n"]},
             {"cell_type": "code", "id": "setup-cell", "metadata": {}, "outputs": [], "execution_count": None,
              "source": SETUP.strip().splitlines(keepends=True)},
             {"cell_type": "code", "id": "train-cell", "metadata": {}, "outputs": [], "execution_count": None,
              "source": ["%%matlint --no-estimate --json report.json\n", *TRAIN.splitlines(keepends=True)]}]
    path = tmp_path / "work.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    shell.user_ns["__vsc_ipynb_file__"] = str(path)
    shell.run_cell("".join(cells[2]["source"]), store_history=True, cell_id="train-cell").raise_error()
    (finding,) = [f for f in json.load(open("report.json")) if f["code"] == "MAT101"]
    assert (finding["filename"], finding["cell"], finding["location"]["row"]) == ("work.ipynb", 3, 3)
    assert finding["evidence"]["cell"]["cell_id"] == "train-cell"
    assert "work.ipynb:cell 3:3" in capsys.readouterr().out


def test_line_magic_guards_one_statement(shell, capsys):
    shell.run_cell("def train():\n" + "".join("    " + line for line in TRAIN.splitlines(keepends=True)),
                   store_history=True).raise_error()
    shell.run_cell("%matlint --no-estimate --select MAT101 train()", store_history=True).raise_error()
    out = capsys.readouterr().out
    assert "MAT101" in out and "Cell In[" in out


def test_a_bad_option_is_one_message(shell, capsys):
    result = shell.run_cell("%%matlint --window many\nx.sum()\n", store_history=True)
    assert result.success
    out = capsys.readouterr()
    assert "%%matlint: argument --window: invalid int value: 'many'" in out.out
    assert "Traceback" not in out.out + out.err


def test_loading_the_extension_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.instance().run_cell('%load_ext matlint').raise_error()\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr


def test_in_a_real_kernel_the_report_renders_as_the_cells_output(tmp_path):
    """A Jupyter kernel (ipykernel, driven by jupyter_client as a notebook frontend drives it): the
    cell's output is rich's HTML rendering of the report, with no ANSI escapes in any output."""
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        def run(code: str) -> list:
            msg_id = client.execute(code)
            outputs = []
            while True:
                msg = client.get_iopub_msg(timeout=120)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content["execution_state"] == "idle":
                    return outputs
                if kind in ("stream", "display_data", "execute_result", "error"):
                    outputs.append((kind, content))

        assert not [o for o in run("%load_ext matlint") if o[0] == "error"]
        assert not [o for o in run(SETUP) if o[0] == "error"]
        outputs = run("%%matlint --no-estimate\n" + TRAIN)
        assert not [o for o in outputs if o[0] == "error"], outputs
        html = [c["data"]["text/html"] for kind, c in outputs if kind == "display_data" and "text/html" in c["data"]]
        assert any("MAT101" in h for h in html), outputs
        texts = [c.get("text", "") for kind, c in outputs if kind == "stream"]
        texts += [c["data"].get("text/plain", "") for kind, c in outputs if kind == "display_data"]
        assert not any("\x1b[" in t for t in texts), [t[:200] for t in texts if "\x1b[" in t]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
