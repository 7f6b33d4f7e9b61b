"""Which functions of a file run every step (`matlint/semantic/steps.py`), and the call sites that
say so (`matlint/semantic/calls.py`), read at the engine's position of each `reveal()` call."""
import os
import textwrap

from matlint.engine import lint_source
from matlint.registry import _handlers
from matlint.rule import Rule
from matlint.semantic.calls import file_calls
from matlint.semantic.steps import step_of
from matlint_helpers import write


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


def test_a_loop_that_moves_its_items_calls_its_helpers_on_every_pass_even_under_a_branch():
    """An evaluation loop nested in the training loop under a periodic test: each pass moves an
    example to the device and scores it. A loop that stops after a few items is a preview."""
    assert steps("""
        import torch
        def score(tokens, logits):
            reveal()
        def preview(tokens):
            reveal()
        def train(model, loader, opt, examples, device):
            for step, (x, y) in enumerate(loader):
                model(x.to(device), y.to(device)).backward()
                opt.step()
                if step % 250 == 0:
                    for example in examples:
                        tokens = example.to(device)
                        score(tokens, model(tokens))
                    count = 0
                    for example in examples:
                        count += 1
                        preview(example.to(device))
                        if count == 2:
                            break
        """) == ["is called from the loop over batches on line 12", "None"]


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


def _mat502_rows(tmp_path, files: dict, linted: str) -> list:
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    source = (tmp_path / linted).read_text()
    return [f.row for f in lint_source(source, str(tmp_path / linted), [get_rule("MAT502")])]


_MODEL = """
    import torch
    import torch.nn as nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
        def forward(self, x, mask, lengths):
            if mask.any().item():
                x = x.masked_fill(mask, 0.0)
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True)
            return self.proj(x), packed

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 2)
        def get_action(self, state):
            action = self.net(state).argmax(-1).cpu()
            return action[0]
    """
_MODEL_TRAIN = """
    import torch
    from model import Attention

    def train(loader, opt):
        model = Attention().cuda()
        for x, mask, lengths in loader:
            out, _ = model(x.cuda(), mask.cuda(), lengths.cuda())
            out.sum().backward()
            opt.step()

    if __name__ == "__main__":
        train(None, None)
    """


def test_syncs_in_a_forward_are_reported_where_a_training_program_runs_the_model(tmp_path):
    """A program that imports the model and trains it on the GPU runs its `forward` on every step:
    the `.item()` of its mask test is a per-step sync. Lengths handed to `pack_padded_sequence`,
    and the action a policy's `get_action` returns, are needed on the host. Imported by a module
    that is no program (a library's trainer), the forward stays exempt."""
    assert _mat502_rows(tmp_path, {"model.py": _MODEL, "train.py": _MODEL_TRAIN}, "model.py") == [10]
    library_trainer = textwrap.dedent(_MODEL_TRAIN).split("if __name__")[0]
    assert _mat502_rows(tmp_path, {"model.py": _MODEL, "train.py": library_trainer}, "model.py") == []


def test_syncs_in_a_layer_are_reported_where_a_training_program_runs_the_model_built_of_it(tmp_path):
    """train.py imports net.py, whose model is built of model.py's `Attention`: the program runs
    that layer's `forward` on every step too, one import further away."""
    net = """
        import torch.nn as nn
        from model import Attention

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.attention = Attention()
            def forward(self, x, mask, lengths):
                return self.attention(x, mask, lengths)
        """
    train = _MODEL_TRAIN.replace("from model import Attention", "from net import Net").replace("Attention()", "Net()")
    assert _mat502_rows(tmp_path, {"model.py": _MODEL, "net.py": net, "train.py": train}, "model.py") == [10]
    library_trainer = textwrap.dedent(train).split("if __name__")[0]
    assert _mat502_rows(tmp_path, {"model.py": _MODEL, "net.py": net, "train.py": library_trainer}, "model.py") == []


def test_a_program_whose_backward_lives_in_a_project_module_it_imports_trains_the_model(tmp_path):
    """train_student.py builds the model, moves it to the GPU and calls `train(...)` of loops.py,
    where the `.backward()` is: the program trains, so the model's `forward` runs on every step.
    Where no project module it imports spells a backward pass, it does not."""
    loops = """
        def train(model, loader, opt):
            for x, mask, lengths in loader:
                out, _ = model(x.cuda(), mask.cuda(), lengths.cuda())
                out.sum().backward()
                opt.step()
        """
    program = """
        from model import Attention
        from loops import train

        if __name__ == "__main__":
            train(Attention().cuda(), None, None)
        """
    files = {"model.py": _MODEL, "loops.py": loops, "train_student.py": program}
    assert _mat502_rows(tmp_path, files, "model.py") == [10]
    files["loops.py"] = loops.replace("out.sum().backward()", "print(out.sum())")
    assert _mat502_rows(tmp_path, files, "model.py") == []


def test_a_helper_that_syncs_in_each_pass_of_its_loop_over_what_it_is_given_syncs_on_every_call(tmp_path):
    """`discriminator_loss` of models.py converts each discriminator's loss with `.item()` in a
    `for` over its arguments: every call syncs, so the call in the training loop is reported.
    A pass that a branch may skip first (`if not n: continue`, NMS over images) does not count."""
    models = """
        import torch

        def discriminator_loss(real, fake):
            loss, r_losses = 0, []
            for dr, dg in zip(real, fake):
                r_loss = torch.mean((1 - dr) ** 2)
                loss += r_loss + torch.mean(dg ** 2)
                r_losses.append(r_loss.item())
            return loss, r_losses

        def nms(prediction):
            output = []
            for x in prediction:
                x = x[x[:, 4] > 0.5]
                if not x.shape[0]:
                    continue
                output.append(x.cpu())
            return output
        """
    train = """
        import torch
        from models import discriminator_loss, nms

        def train(disc, loader, opt):
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                loss, _ = discriminator_loss(disc(x), disc(y))
                loss.backward()
                opt.step()
                boxes = nms(disc(x))
        """
    assert _mat502_rows(tmp_path, {"models.py": models, "train.py": train}, "train.py") == [8]


def test_a_model_passed_in_and_called_on_host_batches_may_move_them_itself(tmp_path):
    """`outputs = model(inputs)` of a model handed to the epoch function, on batches the loop does
    not move (the model is an `nn.DataParallel`, which scatters them; `targets` are moved): the
    outputs may be on the GPU, so `calculate_accuracy(outputs, targets)` and its `.item()` are
    per-step syncs."""
    utils = """
        import torch

        def calculate_accuracy(outputs, targets):
            with torch.no_grad():
                _, pred = outputs.topk(1, 1, largest=True, sorted=True)
                correct = pred.t().eq(targets.view(1, -1))
                return correct.float().sum().item() / targets.size(0)
        """
    training = """
        import torch
        from utils import calculate_accuracy

        def train_epoch(data_loader, model, criterion, optimizer, device):
            model.train()
            for inputs, targets in data_loader:
                targets = targets.to(device, non_blocking=True)
                outputs = model(inputs)
                loss = criterion(outputs, targets)
                acc = calculate_accuracy(outputs, targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """
    assert _mat502_rows(tmp_path, {"utils.py": utils, "training.py": training}, "training.py") == [11]


def test_a_program_above_the_package_folder_it_puts_on_the_path_trains_the_layers_it_imports(tmp_path):
    """trainval_net.py, beside `lib/` (which `_init_paths.py` puts on `sys.path`), imports
    `model.faster_rcnn.net` and trains it on the GPU; the network holds `model/rpn/rpn.py`'s
    layer: its `forward` runs on every step, three folders below the program, and its sync under
    `if self.training:` runs on every training step. Where the program does not train, it is quiet."""
    rpn = """
        import torch.nn as nn

        class RPN(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(8, 8, 3)
            def forward(self, x, labels):
                h = self.conv(x)
                if self.training:
                    keep = h.view(-1).ne(-1).nonzero().view(-1)
                    h = h.view(-1)[keep]
                return h
        """
    net = """
        import torch.nn as nn
        from model.rpn.rpn import RPN

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rpn = RPN()
            def forward(self, x, labels):
                return self.rpn(x, labels)
        """
    program = """
        import _init_paths
        import torch
        from model.faster_rcnn.net import Net

        net = Net().cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, labels in loader:
            net(x.cuda(), labels.cuda()).sum().backward()
            opt.step()
        """
    for folder in ("lib/model/rpn", "lib/model/faster_rcnn"):
        (tmp_path / folder).mkdir(parents=True)
    files = {"lib/model/rpn/rpn.py": rpn, "lib/model/faster_rcnn/net.py": net, "trainval_net.py": program,
             "_init_paths.py": "import sys\nsys.path.insert(0, 'lib')\n"}
    assert _mat502_rows(tmp_path, files, "lib/model/rpn/rpn.py") == [11]
    files["trainval_net.py"] = program.replace(".backward()", ".tolist()")
    assert _mat502_rows(tmp_path, files, "lib/model/rpn/rpn.py") == []


def test_a_helper_handed_a_model_on_the_gpu_syncs_on_its_gradients(tmp_path):
    """`clip_gradient(model, 10.)` of a project module whose body converts the gradients' norm with
    `.item()`: the model the program moved to the GPU holds its gradients there, so the call in
    the training loop syncs every step. In a script that moves nothing to a device it waits for nothing."""
    net_utils = """
        import torch

        def clip_gradient(model, clip_norm):
            totalnorm = 0
            for p in model.parameters():
                if p.requires_grad:
                    totalnorm += p.grad.data.norm() ** 2
            totalnorm = torch.sqrt(totalnorm).item()
            norm = clip_norm / max(totalnorm, clip_norm)
            for p in model.parameters():
                p.grad.mul_(norm)
        """
    train = """
        import torch
        from net_utils import clip_gradient

        def train(loader):
            model = torch.nn.Linear(4, 1).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
                loss.backward()
                clip_gradient(model, 10.)
                opt.step()
        """
    assert _mat502_rows(tmp_path, {"net_utils.py": net_utils, "train.py": train}, "train.py") == [11]
    on_the_host = train.replace(".cuda()", "")
    assert _mat502_rows(tmp_path, {"net_utils.py": net_utils, "train.py": on_the_host}, "train.py") == []


def test_a_helper_whose_result_a_training_steps_rollout_hands_to_the_environment(tmp_path):
    """`step` of an agent rolls out (`actions = epsilon_greedy(eps, to_np(q))`, then
    `self.task.step(actions)`) and updates: the environment needs the actions on the host, so
    `to_np`'s copy is the rollout's design. Where the step keeps what it copies, it syncs."""
    utils = """
        import torch

        def to_np(t):
            return t.cpu().detach().numpy()
        """
    agent = """
        import torch
        from utils import to_np

        class Agent:
            def step(self, states, eps):
                for _ in range(self.rollout_length):
                    q = self.network(torch.as_tensor(states).cuda())
                    actions = epsilon_greedy(eps, to_np(q))
                    states, rewards, terminals, info = self.task.step(actions)
                loss = self.network(torch.as_tensor(states).cuda()).sum()
                loss.backward()
                self.optimizer.step()
        """
    assert _mat502_rows(tmp_path, {"utils.py": utils, "agent.py": agent}, "utils.py") == []
    kept = agent.replace("states, rewards, terminals, info = self.task.step(actions)", "self.log.append(actions)")
    assert _mat502_rows(tmp_path, {"utils.py": utils, "agent.py": kept}, "utils.py") == [5]


_STAR_TRAIN = """
    import torch
    from utils import *

    def train(model, loader, opt, crit):
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            out = model(x)
            crit(out, y).backward()
            opt.step()
            acc = accuracy(out, y)
    """


def test_a_helper_that_a_star_import_brings_is_read_where_the_project_defines_it(tmp_path):
    """`from utils import *` brings `accuracy` from utils.py of the project: its `.item()` runs on
    every step where the loop calls it."""
    utils = {"utils.py": "def accuracy(out, y):\n    return (out.argmax(1) == y).sum().item()\n"}
    assert _mat502_rows(tmp_path, {**utils, "train.py": _STAR_TRAIN}, "train.py") == [11]
    # The file's own `accuracy` shadows the star import: its body is what runs (and returns a tensor).
    own = textwrap.dedent(_STAR_TRAIN) + "\ndef accuracy(out, y):\n    return (out.argmax(1) == y).sum()\n"
    assert _mat502_rows(tmp_path, {**utils, "train.py": own}, "train.py") == []


def test_an_evaluation_loop_over_batches_a_project_module_samples_onto_the_device(tmp_path):
    """nanoGPT's `estimate_loss`: `eval_iters` batches from `get_batch` of data.py, which samples
    indices and moves the batch to the device; a `get_batch` that samples nothing (reads the
    next batch of a stream the caller holds) does not make the loop a pass over batches."""
    data = """
        import torch
        device = "cuda"
        def get_batch(data, block_size, batch_size):
            ix = torch.randint(len(data) - block_size, (batch_size,))
            x = torch.stack([data[i:i + block_size] for i in ix])
            x = x.to(device)
            return x
        """
    train = """
        import torch
        from data import get_batch

        @torch.no_grad()
        def estimate_loss(model, data, eval_iters):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X = get_batch(data, 8, 4)
                losses[k] = model(X).item()
            return losses.mean()

        def train(model, data, opt):
            model(get_batch(data, 8, 4)).backward()
            opt.step()
        """
    assert _mat502_rows(tmp_path, {"data.py": data, "train.py": train}, "train.py") == [10]
    unsampled = data.replace("torch.randint(len(data) - block_size, (batch_size,))", "range(batch_size)")
    assert _mat502_rows(tmp_path, {"data.py": unsampled, "train.py": train}, "train.py") == []


def test_a_loop_that_runs_a_model_in_evaluation_mode_on_each_batch_it_draws_is_a_step_loop(tmp_path):
    """`model.eval()` in the function, then `model(x)` or `self.model(x)` on the batch each
    iteration draws: an evaluation pass, whose syncs happen once per batch. The model must be
    the one put in evaluation mode, and the batch must change with the iteration."""
    program = """
        import torch
        device = torch.device("cuda")

        def batch(data, i):
            return data[i:i + 32]

        def validate(model, data):
            model.eval()
            total = 0.0
            for i in range(0, len(data), 32):
                x = batch(data, i)
                total += model(x).sum().item()
            return total

        class Runner:
            def score(self, data):
                self.model.eval()
                for i in range(0, len(data), 32):
                    print(self.model(batch(data, i)).mean().item())
        """
    assert _mat502_rows(tmp_path, {"run.py": program}, "run.py") == [13, 20]
    other_model = program.replace("model.eval()", "critic.eval()")
    assert _mat502_rows(tmp_path, {"run.py": other_model}, "run.py") == []
    fixed_batch = program.replace("x = batch(data, i)", "x = batch(data, 0)").replace(
        "batch(data, i)).mean()", "batch(data, 0)).mean()")
    assert _mat502_rows(tmp_path, {"run.py": fixed_batch}, "run.py") == []


def test_a_loop_that_moves_its_batches_in_a_program_whose_training_step_lives_in_a_project_module(tmp_path):
    """train.py never calls `.backward()` itself: the loss computer of loss.py does, and steps the
    optimizer. Its evaluation loop, which moves each batch to the device, is a pass over batches;
    with a loss.py that does not train, train.py is no training program (an inference script)."""
    loss = """
        class LossCompute:
            def __init__(self, crit, opt):
                self.crit, self.opt = crit, opt
            def __call__(self, out, y):
                loss = self.crit(out, y)
                loss.backward()
                self.opt.step()
                return loss
        """
    train = """
        import torch
        from loss import LossCompute

        def iter_apply(model, batches, device):
            cost = 0.0
            for xmb, ymb in batches:
                x = torch.tensor(xmb).to(device)
                cost += model(x).sum().item()
            return cost

        def main(model, crit, opt):
            compute = LossCompute(crit, opt)
        """
    assert _mat502_rows(tmp_path, {"loss.py": loss, "train.py": train}, "train.py") == [9]
    no_training = loss.replace("loss.backward()", "loss.detach()").replace("self.opt.step()", "pass")
    assert _mat502_rows(tmp_path, {"loss.py": no_training, "train.py": train}, "train.py") == []


def _reveal_in(tmp_path, files: dict, linted: str) -> list:
    """The `reveal()` messages of `linted`, one of `files` written into a project at `tmp_path`."""
    for name, text in files.items():
        write(tmp_path / name, textwrap.dedent(text))
    path = tmp_path / linted
    findings = lint_source(path.read_text(), str(path), [_RevealStep], prefilter=False)
    assert not [f for f in findings if f.code == "MAT000"], findings
    return [f.message for f in findings]


_MASKS = """\
    import torch

    def causal_mask(n, device):
        reveal()
        return torch.ones(n, n).tril().to(device)

    def debug_dump(x):
        reveal()

    class ProbMask:
        def __init__(self, scores):
            reveal()
            self.mask = torch.ones(scores.shape[-1]).to(scores.device)
    """


def test_a_function_that_an_importing_file_calls_every_step_runs_every_step(tmp_path):
    """masks.py's `causal_mask` is called from train.py's loop over batches; its `ProbMask` is
    made in another module's `forward`, which runs its `__init__`; `debug_dump` only under a
    debug switch. Reached through `from ... import`, a module alias and a sibling folder."""
    train = """\
        import torch
        from utils.masks import causal_mask, debug_dump

        def fit(model, loader, opt, args):
            for x, y in loader:
                mask = causal_mask(x.shape[1], x.device)
                loss = model(x, mask).sum()
                loss.backward()
                opt.step()
                if args.debug:
                    debug_dump(x)
        """
    attention = """\
        import torch
        from torch import nn
        import utils.masks as M

        class Attention(nn.Module):
            def forward(self, q, k):
                scores = q @ k.transpose(-2, -1)
                return scores.masked_fill(M.ProbMask(scores).mask == 0, -1e9)
        """
    messages = _reveal_in(tmp_path, {"utils/__init__.py": "", "utils/masks.py": _MASKS, "train.py": train,
                                     "models/attention.py": attention}, "utils/masks.py")
    assert messages == [
        "is called from the training loop on line 5 in train.py",
        "None",
        "sets up a `ProbMask`, which is called from `forward` in attention.py, which is a module's `forward`, "
        "run on every step",
    ]


def test_a_default_made_under_its_own_is_none_test_runs_every_step(tmp_path):
    """`if attn_mask is None: attn_mask = ProbMask(scores)` in a `forward`: which branch runs is the
    caller's choice, the same on every call, so the default is made on every step of a caller that
    passes none. A parameter the function also rebinds elsewhere is data of the call."""
    attention = """\
        import torch
        from torch import nn
        from masks import ProbMask

        class Attention(nn.Module):
            def forward(self, q, k, attn_mask=None):
                scores = q @ k.transpose(-2, -1)
                if attn_mask is None:
                    attn_mask = ProbMask(scores)
                return scores.masked_fill(attn_mask.mask == 0, -1e9)
        """
    messages = _reveal_in(tmp_path, {"masks.py": _MASKS, "attention.py": attention}, "masks.py")
    assert messages[2] == ("sets up a `ProbMask`, which is called from `forward` in attention.py, which is a "
                           "module's `forward`, run on every step")
    rebound = attention.replace("scores.masked_fill(attn_mask", "attn_mask = attn_mask.to(q.device)\n"
                                "                return scores.masked_fill(attn_mask")
    assert _reveal_in(tmp_path / "rebound", {"masks.py": _MASKS, "attention.py": rebound}, "masks.py")[2] == "None"


def test_what_no_importer_calls_every_step_does_not_run_every_step(tmp_path):
    """Imported but called once (at set-up, under `if`), not imported at all, or by files that
    import each other: no step, and no endless reading."""
    once = """\
        from masks import causal_mask, ProbMask
        import masks

        MASK = causal_mask(8, "cuda")

        def main(scores):
            if scores is None:
                return masks.ProbMask(scores)
        """
    assert _reveal_in(tmp_path, {"masks.py": _MASKS + "    import main\n", "main.py": once}, "masks.py") == [
        "None", "None", "None"]
    assert _reveal_in(tmp_path / "alone", {"masks.py": _MASKS}, "masks.py") == ["None", "None", "None"]


def test_a_star_import_of_the_module_counts_its_calls(tmp_path):
    train = """\
        from masks import *

        for x, y in train_loader:
            loss = model(x, causal_mask(4, "cuda")).sum()
            loss.backward()
        """
    assert _reveal_in(tmp_path, {"masks.py": _MASKS, "train.py": train}, "masks.py")[0] == (
        "is called from the training loop on line 3 in train.py")


def test_a_helper_under_a_configuration_switch_runs_every_step_of_that_configuration(tmp_path):
    """`if args.clip_grad:` and `if scaler is None:` test the run's configuration: the helper
    under them runs on every step. A logging switch (`args.log_every`) or an argument's value
    (`if done:`) is not configuration."""
    helpers = """\
        def clip_gradients(model, clip):
            reveal()

        def log_stats(model):
            reveal()

        def on_done(model):
            reveal()
        """
    train = """\
        from helpers import clip_gradients, log_stats, on_done

        def train_one_epoch(model, loader, opt, args, scaler, done):
            for x, y in loader:
                loss = model(x).sum()
                if scaler is None:
                    loss.backward()
                    if args.clip_grad:
                        clip_gradients(model, args.clip_grad)
                if args.log_every:
                    log_stats(model)
                if done:
                    on_done(model)
                opt.step()
        """
    assert _reveal_in(tmp_path, {"helpers.py": helpers, "train.py": train}, "helpers.py") == [
        "is called from the training loop on line 4 in train.py", "None", "None"]


def test_a_modules_loss_method_runs_on_every_training_step():
    """A VAE's `loss_function(*results)`, called by a trainer elsewhere: a module's method named
    for the loss computes every training step's loss; what it calls runs every step too."""
    assert steps("""
        import torch.nn as nn
        class VAE(nn.Module):
            def loss_function(self, recons, x, mu, log_var):
                reveal()
                return self.kld(mu, log_var)
            def kld(self, mu, log_var):
                reveal()
            def load_loss_weights(self):
                reveal()
        """) == ["is `loss_function` of a module, the loss of every training step",
                 "is called from `loss_function`, which is `loss_function` of a module, the loss of every training step",
                 "None"]


_AGENT = """\
    import numpy as np
    import torch
    import torch.nn as nn

    class Agent:
        def __init__(self, n):
            self.device = torch.device("cuda")
            self.actor = nn.Linear(n, 2).to(self.device)
            self.opt = torch.optim.Adam(self.actor.parameters())

        def choose_action(self, observation):
            reveal()
            state = torch.tensor(observation, dtype=torch.float).to(self.device)
            mu = self.actor(state)
            return mu.cpu().detach().numpy()

        def value(self, observation):
            reveal()
            return self.actor(torch.tensor(observation).to(self.device)).sum().item()

        def learn(self, batch):
            loss = self.actor(batch).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

        def update_many(self, batches):
            for batch in batches:
                self.learn(batch)
    """

_ENV_LOOP = """\
    import gym
    from agent import Agent

    if __name__ == "__main__":
        env = gym.make("Pendulum-v1")
        agent = Agent(3)
        for episode in range(100):
            obs, done = env.reset(), False
            while not done:
                action = agent.choose_action(obs)
                print(agent.value(obs))
                obs, reward, done, info = env.step(action)
                agent.learn(obs)
    """


def test_an_agents_methods_called_from_a_loop_that_trains_through_it_run_every_step(tmp_path):
    """main.py's loop (in its `__main__` block) calls `agent.learn(...)`, one update a pass: the
    methods of the `Agent` it calls there run every step. The action the environment needs is the
    host's; a value only printed is not."""
    files = {"agent.py": _AGENT, "main.py": _ENV_LOOP}
    why = "is called from the loop on line 9, which trains on each pass through `agent.learn()` in main.py"
    assert _reveal_in(tmp_path, files, "agent.py") == [why, why]
    assert _mat502_rows(tmp_path, files, "agent.py") == [19]
    # a loop whose update runs a training loop of its own makes no step of each pass
    many = _ENV_LOOP.replace("agent.learn(obs)", "agent.update_many([obs])")
    assert _reveal_in(tmp_path / "many", {"agent.py": _AGENT, "main.py": many}, "agent.py") == ["None", "None"]


def test_an_instance_of_a_class_of_the_file_runs_its_methods_where_a_step_loop_calls_them(tmp_path):
    single = _AGENT + textwrap.indent(textwrap.dedent(_ENV_LOOP).replace("from agent import Agent\n", ""), "    ")
    assert _reveal_in(tmp_path, {"single.py": single}, "single.py") == [
        "is called from the loop on line 37, which trains on each pass through `agent.learn()`"] * 2


def test_a_method_that_calls_an_inherited_training_step_is_one(tmp_path):
    """`learn` of an agent whose base class, in another project module, holds the optimisation
    step (`self.take_optimisation_step(...)`: backward and the optimizer's step) is a training
    step. A method that calls only an inherited helper that does not train is not."""
    base = """
        class Base_Agent:
            def take_optimisation_step(self, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            def log(self, loss):
                print(loss)
        """
    agent = """
        from base_agent import Base_Agent

        class DQN(Base_Agent):
            def learn(self, batch):
                loss = self.compute_loss(batch)
                self.take_optimisation_step(self.optimizer, loss)
                reveal()
            def report(self, loss):
                self.log(loss)
                reveal()
        """
    assert _reveal_in(tmp_path, {"base_agent.py": base, "dqn.py": agent}, "dqn.py") == [
        "runs a training step through `take_optimisation_step()`", "None"]


_METRICS = """
    import torch

    def accuracy(mu, labels):
        zero = labels != 0
        return torch.abs(mu[zero] - labels[zero]).sum().item()
    """


def test_a_helper_two_files_away_runs_every_step_where_a_relay_calls_it_from_the_loop(tmp_path):
    """evaluate.py's loop over batches calls `update_metrics` of utils.py on every pass (on both
    arms of `if sample:`), which calls `accuracy` of metrics.py: its boolean masks and `.item()`
    sync on every batch. A relay that calls it only under its own test, or a loop that does not
    call the relay, says nothing."""
    utils = """
        import metrics

        def update_metrics(raw, mu, labels):
            raw.append(metrics.accuracy(mu, labels))
            return raw

        def maybe_update(raw, mu, labels, every):
            if every:
                raw.append(metrics.accuracy(mu, labels))
        """
    evaluate = """
        import utils

        def evaluate(model, loader, device, sample):
            raw = []
            for x, labels in loader:
                x, labels = x.to(device), labels.to(device)
                if sample:
                    raw = utils.update_metrics(raw, model(x, True), labels)
                else:
                    raw = utils.update_metrics(raw, model(x), labels)
            return raw

        if __name__ == "__main__":
            evaluate(None, [], "cuda", True)
        """
    relayed = tmp_path / "relayed"
    relayed.mkdir()
    files = {"metrics.py": _METRICS, "utils.py": utils, "evaluate.py": evaluate}
    assert _mat502_rows(relayed, files, "metrics.py") == [6]
    conditional = tmp_path / "conditional"
    conditional.mkdir()
    only_maybe = evaluate.replace("utils.update_metrics(raw, model(x), labels)", "utils.maybe_update(raw, model(x), labels, 0)") \
        .replace("utils.update_metrics(raw, model(x, True), labels)", "utils.maybe_update(raw, model(x, True), labels, 1)")
    assert _mat502_rows(conditional, {**files, "evaluate.py": only_maybe}, "metrics.py") == []


def test_a_relay_that_calls_the_helper_on_every_call_configured_so_relays_it(tmp_path):
    """`update_metrics(..., samples=None)` calls `accuracy` under `if samples is not None:`: the
    caller's choice, the same on every call from one place, so a loop that passes `samples` runs
    `accuracy` on every batch. A test of the data itself (`if every:` with the value a call
    passes) still says nothing (the test above)."""
    utils = """
        import metrics

        def update_metrics(raw, mu, labels, samples=None):
            if samples is not None:
                raw.append(metrics.accuracy(samples, labels))
            return raw
        """
    evaluate = """
        import utils

        def evaluate(model, loader, device):
            raw = []
            for x, labels in loader:
                x, labels = x.to(device), labels.to(device)
                samples = model(x, True)
                raw = utils.update_metrics(raw, model(x), labels, samples)
            return raw

        if __name__ == "__main__":
            evaluate(None, [], "cuda")
        """
    files = {"metrics.py": _METRICS, "utils.py": utils, "evaluate.py": evaluate}
    assert _mat502_rows(tmp_path, files, "metrics.py") == [6]


def test_an_assert_in_a_helper_that_a_modules_forward_calls_from_another_file_is_reported(tmp_path):
    """`assert torch.max(idx).item() < n` in a project helper that a model's `forward` calls, in a
    program that trains on the GPU: a check that is no part of the computation, on every step
    (syncs of the computation a forward needs stay the model's own)."""
    utils = """\
        import torch

        def idx2onehot(idx, n):
            assert torch.max(idx).item() < n
            onehot = torch.zeros(idx.size(0), n, device=idx.device)
            return onehot.scatter_(1, idx.unsqueeze(1), 1)

        def lengths_of(mask):
            return int(mask.sum().item())
        """
    models = """\
        import torch
        import torch.nn as nn
        from utils import idx2onehot, lengths_of

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(794, 256)
            def forward(self, x, c, mask):
                n = lengths_of(mask)
                return self.fc(torch.cat((x[:, :n], idx2onehot(c, 10)), dim=-1))
        """
    train = """\
        import torch
        from models import Encoder

        model = Encoder().cuda()
        opt = torch.optim.Adam(model.parameters())
        for x, c, mask in loader:
            loss = model(x.cuda(), c.cuda(), mask.cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    assert _mat502_rows(tmp_path, {"utils.py": utils, "models.py": models, "train.py": train}, "utils.py") == [4]


def test_methods_called_through_a_parameter_that_every_call_passes_one_instance_run_every_step(tmp_path):
    """`def train_pg(g, opt): for ...: s = g.sample(n) ... opt.step()`, called only as
    `train_pg(gen, opt)` after `gen = generator.Generator(...)` (then `gen = gen.cuda()`): the
    loop runs `Generator.sample` on every step. A parameter the calls fill with something else
    too says nothing."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    generator = """\
        import torch
        import torch.nn as nn

        class Generator(nn.Module):
            def sample(self, n):
                samples = torch.zeros(n, 20).type(torch.LongTensor)
                return samples.cuda()
        """
    main = """\
        import torch
        import generator

        def train_pg(g, opt, batches):
            for _ in range(batches):
                s = g.sample(64)
                loss = g(s).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            gen = generator.Generator()
            gen = gen.cuda()
            opt = torch.optim.Adam(gen.parameters())
            train_pg(gen, opt, 100)
        """
    (tmp_path / "generator.py").write_text(textwrap.dedent(generator))
    rows = lambda: [f.row for f in lint_source((tmp_path / "generator.py").read_text(), str(tmp_path / "generator.py"),
                                              [get_rule("MAT503")])]
    (tmp_path / "main.py").write_text(textwrap.dedent(main))
    assert rows() == [6]
    both = textwrap.dedent(main).replace("    train_pg(gen, opt, 100)", "    train_pg(gen, opt, 100)\n    train_pg(other, opt, 1)")
    assert both != textwrap.dedent(main)
    (tmp_path / "main.py").write_text(both)
    later = (tmp_path / "main.py").stat().st_mtime + 10  # the project's files are read again once changed
    os.utime(tmp_path / "main.py", (later, later))
    assert rows() == []


def test_a_file_that_has_torch_only_from_a_star_import_is_checked(tmp_path):
    """network.py never names torch: `from module import *` brings `t` (torch) and `nn` from the
    project's module.py. The engine's pre-filter lets it through and the aliases resolve."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    (tmp_path / "module.py").write_text("import torch as t\nimport torch.nn as nn\n")
    network = textwrap.dedent("""
        from module import *

        class Decoder(nn.Module):
            def forward(self, x):
                n = x.size(1)
                return x + t.ones(n, n).cuda()
        """)
    (tmp_path / "network.py").write_text(network)
    found = lint_source(network, str(tmp_path / "network.py"), [get_rule("MAT503")])
    assert [(f.code, f.row) for f in found] == [("MAT503", 7)]


_UPDATE_PARAMS = """
    def update_params(optim, loss):
        optim.zero_grad()
        loss.backward()
        optim.step()
    """


def test_a_method_that_trains_through_a_project_helper_is_a_step_and_so_are_its_helpers(tmp_path):
    """fqf-iqn's `learn()` trains through `update_params(optim, loss)` of utils.py and never spells
    `.step(` itself: a sync in the loss method it calls runs on every training step."""
    agent = """
        import torch
        from utils import update_params

        class Agent:
            def learn(self, states, targets):
                loss, mean_q = self.calculate_loss(states, targets)
                update_params(self.optim, loss)
                if self.steps % 100 == 0:
                    print(mean_q)

            def calculate_loss(self, states, targets):
                q = self.net(states.cuda())
                return (q - targets).pow(2).mean(), q.detach().mean().item()
        """
    assert _mat502_rows(tmp_path, {"utils.py": _UPDATE_PARAMS, "agent.py": agent}, "agent.py") == [14]
    # A helper that only evaluates (no backward pass) makes no training step of its caller.
    evaluate = _UPDATE_PARAMS.replace("loss.backward()", "pass").replace("optim.step()", "pass")
    (tmp_path / "evaluates").mkdir()
    assert _mat502_rows(tmp_path / "evaluates", {"utils.py": evaluate, "agent.py": agent}, "agent.py") == []


def test_a_method_that_trains_through_an_object_it_holds_is_a_step(tmp_path):
    """dreamer: the world model keeps `self._model_opt = tools.Optimizer(...)`, whose `__call__`
    runs the backward pass and the optimizer's step; the method that calls it is a training step,
    and the metrics it copies to the host with a lambda the module binds sync on every step."""
    tools = """
        import torch
        class Optimizer:
            def __init__(self, params, lr):
                self._opt = torch.optim.Adam(params, lr)
            def __call__(self, loss):
                self._opt.zero_grad()
                loss.backward()
                self._opt.step()
        """
    models = """
        import torch
        import tools
        to_np = lambda x: x.detach().cpu().numpy()

        class WorldModel(torch.nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net.cuda()
                self._model_opt = tools.Optimizer(self.net.parameters(), 1e-3)

            def train_step(self, x, y):
                loss = (self.net(x.cuda()) - y.cuda()).pow(2).mean()
                self._model_opt(loss)
                return {"loss": to_np(loss)}
        """
    assert _mat502_rows(tmp_path, {"tools.py": tools, "models.py": models}, "models.py") == [15]
    # An object whose `__call__` only evaluates makes no training step of its caller.
    evaluates = tools.replace("loss.backward()", "pass").replace("self._opt.step()", "pass")
    (tmp_path / "evaluates").mkdir()
    assert _mat502_rows(tmp_path / "evaluates", {"tools.py": evaluates, "models.py": models}, "models.py") == []


def test_a_sampling_loop_of_a_function_imported_inside_a_method_is_an_evaluation_loop(tmp_path):
    """ddim: runner.py imports `ddpm` inside the method that calls it with a model; the loop runs
    that model with gradients off on each step's `t`, made on `x.device` before `x` is rebound:
    where `x` is placed says nothing of the pass before, so the loop evaluates, and its copies to
    the host sync on every step."""
    sampling = """
        import torch
        def ddpm(x, seq, model):
            with torch.no_grad():
                n = x.size(0)
                xs = [x]
                for i in seq:
                    t = (torch.ones(n) * i).to(x.device)
                    x = xs[-1].to("cuda")
                    out = model(x, t.float())
                    xs.append(out.to("cpu"))
            return xs
        """
    runner = """
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def forward(self, x, t):
                return x * t

        class Runner:
            def sample(self, x):
                model = Net().cuda()
                from sampling import ddpm
                return ddpm(x, range(10), model)
        """
    assert _mat502_rows(tmp_path, {"sampling.py": sampling, "runner.py": runner}, "sampling.py") == [11]


def test_a_trainer_that_draws_batches_over_a_range_is_a_training_loop_not_one_step(tmp_path):
    """N-BEATS: `trainer()` moves its model with `.to(default_device())` (a CUDA device a project
    helper gives) and runs `for i in range(...)` drawing `next(training_set)` each pass: its own
    per-step `float(loss)` syncs; the loop over seasonal patterns that calls it once per model is
    no training loop, and its one copy of each model's forecast is not per step."""
    ops = """
        import torch as t
        def default_device():
            return t.device("cuda") if t.cuda.is_available() else t.device("cpu")
        """
    trainer = """
        import torch as t
        from ops import default_device

        def trainer(model, training_set, iterations):
            model = model.to(default_device())
            optimizer = t.optim.Adam(model.parameters())
            for i in range(iterations):
                x, y = next(training_set)
                optimizer.zero_grad()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                optimizer.step()
                print(float(loss))
            return model
        """
    main = """
        import torch as t
        from trainer import trainer

        def run(patterns, sets, make_model, inputs):
            forecasts = []
            for pattern in patterns:
                model = trainer(make_model(), iter(sets[pattern]), 1000)
                with t.no_grad():
                    forecasts.extend(model(inputs[pattern]).cpu().numpy())
            return forecasts
        """
    files = {"ops.py": ops, "trainer.py": trainer, "main.py": main}
    assert _mat502_rows(tmp_path, files, "trainer.py") == [14]
    assert _mat502_rows(tmp_path, files, "main.py") == []


def test_a_lambda_the_module_binds_to_a_name_is_a_helper_its_importers_steps_run(tmp_path):
    """`zeros = lambda *x: torch.zeros(*x).cuda()` in utils.py, called through a star import
    from a module's `forward`: the lambda runs on every step, as a `def` would; the finding
    names it. Rebound (`zeros = ...` twice), the name is no one helper."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    utils = """
        import torch
        CUDA = torch.cuda.is_available()
        zeros = lambda *x: torch.zeros(*x).cuda() if CUDA else torch.zeros
        """
    model = """
        import torch.nn as nn
        from utils import *

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(8, 8)

            def forward(self, x):
                return self.rnn(x, (zeros(1, x.size(1), 8), zeros(1, x.size(1), 8)))
        """
    (tmp_path / "model.py").write_text(textwrap.dedent(model))

    def findings(text):
        (tmp_path / "utils.py").write_text(textwrap.dedent(text))
        return [(f.row, f.message) for f in lint_source((tmp_path / "utils.py").read_text(), str(tmp_path / "utils.py"),
                                                        [get_rule("MAT503")])]

    found = findings(utils)
    assert [row for row, _ in found] == [4]
    assert "on every call of `zeros`, which is called from `forward` in model.py" in found[0][1]
    assert findings(utils + "zeros = torch.zeros\n") == []


def test_an_evaluation_over_a_loader_every_caller_builds_as_one_batch_is_one_pass(tmp_path):
    """models/net.py's `train_model` goes over the `test_loader` it is given; train.py, the only
    caller, builds it with the whole test split as its batch size and calls the method on a model
    bound to one of two classes (or on the subclass alone, which inherits it): the evaluation runs
    once per epoch. With a batch size of 32 it runs per batch, and its copies are reported."""
    net = """
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

            def train_model(self, train_loader, test_loader, opt, epochs):
                for epoch in range(epochs):
                    for x, y in train_loader:
                        loss = ((self(x) - y) ** 2).mean()
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                    with torch.no_grad():
                        for x, y in test_loader:
                            print(self(x).detach().cpu().numpy())

        class Wide(Net):
            pass
        """
    train = """
        import torch
        from torch.utils.data import DataLoader, random_split
        from models.net import Net, Wide

        def main(dataset, wide):
            if wide:
                model = Wide().to("cuda")
            else:
                model = Net().to("cuda")
            train_size = int(len(dataset) * 0.8)
            test_size = len(dataset) - train_size
            train_set, test_set = random_split(dataset, [train_size, test_size])
            train_loader = DataLoader(train_set, batch_size=64)
            test_loader = DataLoader(test_set, batch_size=test_size)
            model.train_model(train_loader, test_loader, torch.optim.Adam(model.parameters()), 10)
        """
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    assert _mat502_rows(tmp_path, {"models/net.py": net, "train.py": train}, "models/net.py") == []
    per_batch = train.replace("batch_size=test_size", "batch_size=32")
    assert _mat502_rows(tmp_path, {"models/net.py": net, "train.py": per_batch}, "models/net.py") == [22]
    # a subclass that inherits the method: `Wide().train_model(...)` runs `Net.train_model`
    wide_only = train.replace('''            if wide:
                model = Wide().to("cuda")
            else:
                model = Net().to("cuda")''', '''            model = Wide().to("cuda")''')
    assert wide_only != train
    assert _mat502_rows(tmp_path, {"models/net.py": net, "train.py": wide_only}, "models/net.py") == []
    assert _mat502_rows(tmp_path, {"models/net.py": net, "train.py": wide_only.replace(
        "batch_size=test_size", "batch_size=32")}, "models/net.py") == [22]


def test_a_step_reaches_a_helper_through_a_package_that_re_exports_it(tmp_path):
    """train.py takes `run_iter` from the package (`from nerf import run_iter`, re-exported by
    `nerf/__init__.py` with `from .train_utils import *`); `run_iter` calls `predict`, which calls
    render.py's `render` on every call: `render` runs on every training step. Without the
    package's star import, nothing binds `run_iter` there and no step is known."""
    from matlint.engine import lint_source
    from matlint.registry import get_rule

    files = {
        "nerf/__init__.py": "from .render import *\nfrom .train_utils import *\n",
        "nerf/render.py": """
            import torch

            def render(raw, dists):
                far = torch.tensor([1e10], dtype=dists.dtype, device=dists.device)
                return raw * torch.cat((dists, far.expand(dists[..., :1].shape)), -1)
            """,
        "nerf/train_utils.py": """
            from .render import render

            def predict(model, x, dists):
                return render(model(x), dists)

            def run_iter(model, x, dists):
                return predict(model, x, dists)
            """,
        "train.py": """
            import torch
            from nerf import run_iter

            def main(model, batches):
                model = model.cuda()
                opt = torch.optim.Adam(model.parameters())
                for x, dists in batches:
                    loss = run_iter(model, x.cuda(), dists.cuda()).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()

            if __name__ == "__main__":
                main(None, [])
            """,
    }
    (tmp_path / "nerf").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))

    def rows():
        path = tmp_path / "nerf" / "render.py"
        return [f.row for f in lint_source(path.read_text(), str(path), [get_rule("MAT503")])]

    assert rows() == [5]
    (tmp_path / "nerf" / "__init__.py").write_text("from .render import *\n")
    assert rows() == []
