"""Which functions of a file run every step (`matlint/semantic/steps.py`), and the call sites that
say so (`matlint/semantic/calls.py`), read at the engine's position of each `reveal()` call."""
import textwrap

from matlint.engine import lint_source
from matlint.registry import _handlers
from matlint.rule import Rule
from matlint.semantic.calls import file_calls
from matlint.semantic.steps import step_of


class _RevealStep(Rule):
    """Reports, at every `reveal()` call, why the function around it runs every step (or None)."""
    code = "MAT998"
    name = "reveal-step"
    summary = docs = ""

    def visit_Call(self, node):
        if getattr(node.func, "id", None) == "reveal":
            step = step_of(self.ctx, self.ctx.functions)
            self.report(node, "None" if step is None else step.why)


_RevealStep._handlers = _handlers(_RevealStep)


def steps(source: str) -> list:
    findings = lint_source(textwrap.dedent(source), "example.py", [_RevealStep], prefilter=False)
    assert not [f for f in findings if f.code == "MAT000"], findings
    return [f.message for f in findings]


def test_a_training_step_and_the_helpers_it_calls_every_time_run_every_step():
    assert steps("""
        class Agent:
            def learn(self, batch):
                loss = self.loss(batch)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.soft_update()
                if self.debug:
                    self.log_grads()
                reveal()
            def soft_update(self):
                reveal()
            def log_grads(self):
                reveal()
        """) == ["is a training step", "is called from `learn`, which is a training step", "None"]


def test_a_function_that_holds_a_whole_training_loop_is_not_one_step():
    assert steps("""
        def fit(model, loader, opt):
            for x, y in loader:
                model(x, y).backward()
                opt.step()
            reveal()
        """) == ["None"]


def test_what_a_training_or_batch_loop_calls_runs_every_step():
    assert steps("""
        def accuracy(out, y):
            reveal()
        def evaluate(model, val_loader):
            for x, y in val_loader:
                accuracy(model(x), y)
        def train(model, batches, opt):
            for x, y in batches:
                loss = model(x, y)
                loss.backward()
                opt.step()
                helper()
        def helper():
            reveal()
        """) == ["is called from the loop over batches on line 5",
                 "is called from the training loop on line 8"]


def test_hooks_and_a_modules_forward_run_every_step():
    assert steps("""
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                reveal()
                return self.embed(x)
            def embed(self, x):
                reveal()
                return x
            def training_step(self, batch, i):
                reveal()
        class Plain:
            def forward(self, x):
                reveal()
        """) == ["is a module's `forward`, run on every step",
                 "is called from `forward`, which is a module's `forward`, run on every step",
                 "is the `training_step` hook", "None"]


def test_call_sites_record_the_loops_around_them_and_whether_every_pass_runs_them():
    source = textwrap.dedent("""
        def f(x):
            return x
        def g(xs, flag):
            for x in xs:
                f(x)
                if flag:
                    f(x)
            f(xs)
        """)
    import ast

    from matlint.engine import FileContext

    tree = ast.parse(source)
    calls = file_calls(FileContext(source, "example.py", tree))
    f = tree.body[0]
    sites = calls.call_sites(f)
    assert [(s.call.lineno, len(s.loops), s.conditional) for s in sites] == [(6, 1, False), (8, 1, True), (9, 0, False)]


def test_steps_driven_by_a_framework_or_a_loss_scaler_are_training_steps():
    """`accelerator.backward(loss)`, a GradScaler (`scaler.scale(loss).backward()`,
    `scaler.step(opt)`) and apex (`with amp.scale_loss(...) as scaled: scaled.backward()`) drive
    a training step as `loss.backward()` and `opt.step()` do; a loop over
    `metric_logger.log_every(loader, ...)` or `log_every(loader)` goes over batches."""
    assert steps("""
        def accelerated(model, batch, optimizer, accelerator):
            accelerator.backward(model(batch))
            optimizer.step()
            reveal()
        def scaled(model, batch, opt, scaler):
            scaler.scale(model(batch)).backward()
            scaler.step(opt)
            scaler.update()
            reveal()
        def apex(model, batch, optimizer, amp):
            with amp.scale_loss(model(batch), optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            reveal()
        def helper():
            reveal()
        def epoch(model, data_loader, optimizer, metric_logger, scaler):
            for batch in metric_logger.log_every(data_loader, 10, "Epoch"):
                helper()
        def evaluate(model, data_loader):
            for batch in log_every(data_loader):
                helper()
        """) == ["is a training step"] * 3 + ["is called from the loop over batches on line 19"]


def test_per_head_modules_of_a_class_in_another_project_module(tmp_path):
    """MAT104 reads the head class where the project defines it (`from .head import Head`): the
    heads are identical attention modules with their own projections, applied one by one."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    package = tmp_path / "transformer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "head.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.nn import functional as F\n\n"
        "class Head(nn.Module):\n"
        "    def __init__(self, n_embed, head_size):\n"
        "        super().__init__()\n"
        "        self.key = nn.Linear(n_embed, head_size, bias=False)\n"
        "        self.query = nn.Linear(n_embed, head_size, bias=False)\n"
        "        self.value = nn.Linear(n_embed, head_size, bias=False)\n\n"
        "    def forward(self, x):\n"
        "        w = F.softmax(self.query(x) @ self.key(x).transpose(-2, -1), dim=-1)\n"
        "        return w @ self.value(x)\n")
    block = package / "block.py"
    source = ("import torch\nimport torch.nn as nn\nfrom .head import Head\n\n"
              "class MultiHeadAttention(nn.Module):\n"
              "    def __init__(self, n_heads, n_embed, head_size):\n"
              "        super().__init__()\n"
              "        self.heads = nn.ModuleList([Head(n_embed, head_size) for _ in range(n_heads)])\n\n"
              "    def forward(self, x):\n"
              "        return torch.cat([h(x) for h in self.heads], dim=-1)\n")
    block.write_text(source)
    found = lint_source(source, str(block), [get_rule("MAT104")])
    assert [(f.code, f.row) for f in found] == [("MAT104", 11)]
    # A class of that name that is no attention head (no softmax): not per-head attention.
    (package / "head.py").write_text("import torch.nn as nn\n\nclass Head(nn.Module):\n    pass\n")
    assert lint_source(source, str(block), [get_rule("MAT104")]) == []


def test_a_step_in_a_file_that_imports_project_helpers_still_reports_its_own_syncs(tmp_path):
    """A file that imports a module of its project asks each call whether it is a syncing
    helper; the step's own `print()` and `float()` of a device tensor are still reported."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    (tmp_path / "logger.py").write_text("class Logger:\n    def log(self, value):\n        pass\n")
    train = tmp_path / "train.py"
    source = textwrap.dedent("""\
        import torch
        from logger import Logger

        def train(model, loader, opt):
            log = Logger()
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                opt.step()
                print(f"loss {loss.data}")
                log.log(float(loss))
        """)
    train.write_text(source)
    found = lint_source(source, str(train), [get_rule("MAT502")])
    assert [(f.code, f.row) for f in found] == [("MAT502", 11), ("MAT502", 12)]


def test_a_helper_re_exported_by_a_package_init_is_followed(tmp_path):
    """`from .util import mask_` where `util/__init__.py` re-exports it from `util/util.py`: MAT601
    reads the helper where it is defined, and finds that it only writes a mask into the scores."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    package = tmp_path / "former"
    (package / "util").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "util" / "__init__.py").write_text("from .util import mask_\n")
    (package / "util" / "util.py").write_text(textwrap.dedent("""\
        import torch

        def mask_(matrices, maskval=0.0):
            indices = torch.triu_indices(matrices.size(-2), matrices.size(-1), offset=1)
            matrices[..., indices[0], indices[1]] = maskval
        """))
    modules = package / "modules.py"
    source = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        from .util import mask_

        def attend(q, k, v):
            dot = torch.bmm(q, k.transpose(1, 2))
            mask_(dot, maskval=float("-inf"))
            return torch.bmm(F.softmax(dot, dim=2), v)
        """)
    modules.write_text(source)
    found = lint_source(source, str(modules), [get_rule("MAT601")])
    assert [(f.code, f.row) for f in found] == [("MAT601", 6)]
    # A helper that also reads the scores' values is no mask: quiet.
    (package / "util" / "util.py").write_text("def mask_(matrices, maskval=0.0):\n    print(matrices)\n")
    assert lint_source(source, str(modules), [get_rule("MAT601")]) == []
