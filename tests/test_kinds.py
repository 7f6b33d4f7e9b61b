"""The shared kinds analysis (`matlint/semantic/kinds.py`) read through its public helpers, at the engine's
position of each `reveal(expr)` call of a snippet."""
import textwrap

import pytest

from matlint.engine import lint_source
from matlint.registry import _handlers
from matlint.rule import Rule
from matlint.semantic import kinds as _kinds


class _Reveal(Rule):
    """Reports the kind of the argument of every `reveal(...)` call."""
    code = "MAT999"
    name = "reveal-kind"
    summary = docs = ""

    def visit_Call(self, node):
        if getattr(node.func, "id", None) == "reveal":
            self.report(node, str(_kinds.kind_of(self.ctx, node.args[0])))


_Reveal._handlers = _handlers(_Reveal)


class _RevealReaching(_Reveal):
    """Reports the kind that the assignments reaching the argument of every `reveal(name)` give."""
    code = "MAT998"

    def visit_Call(self, node):
        if getattr(node.func, "id", None) == "reveal":
            self.report(node, str(_kinds.reaching_kind(self.ctx, node.args[0])))


_RevealReaching._handlers = _handlers(_RevealReaching)


def kinds(source: str) -> list:
    findings = lint_source(textwrap.dedent(source), "example.py", [_Reveal], prefilter=False)
    assert not [f for f in findings if f.code == "MAT000"], findings
    return [f.message for f in findings]


@pytest.mark.parametrize("move", ["x, y = x.to(device), y.to(device)",
                                  "x, y = x.cuda(), y.cuda(non_blocking=True)",
                                  "x = x.to(device); y = y.to(device, non_blocking=True)",
                                  "x, y = x.to(device).float(), y.to(batch.device)"])
def test_a_loader_batch_moved_to_the_device_under_its_own_name_is_a_device_tensor(move):
    assert kinds(f"""
        import torch
        def evaluate(model, test_loader, device, batch):
            for x, y in test_loader:
                {move}
                reveal(x)
                reveal(y)
        """) == ["tensor", "tensor"]


def test_a_tensor_moved_to_the_cpu_under_its_own_name_is_a_host_tensor():
    assert kinds("""
        import torch
        def f(loader):
            for x in loader:
                x = x.cpu()
                y = torch.zeros(3)
                y = y.to("cpu")
                reveal(x)
                reveal(y)
        """) == ["cpu_tensor", "cpu_tensor"]


def test_pythons_sum_and_abs_of_tensors_are_tensors():
    assert kinds("""
        import torch
        def f(params, losses, n):
            for p in params:
                p = p.cuda()
            reveal(sum(p.grad.norm() ** 2 for p in params))
            reveal(abs(torch.zeros(3)))
            reveal(sum(n for n in range(3)))
            reveal(abs(n))
        """) == ["tensor", "cpu_tensor", "None", "None"]


def test_a_move_to_another_tensors_device_follows_that_tensor():
    assert kinds("""
        import torch
        def f(x: torch.Tensor, device):
            w = torch.arange(4).to(x.device)
            c = torch.ones(3).to(torch.zeros(2).device)
            d = torch.ones(3).to(device)
            reveal(w)
            reveal(c)
            reveal(d)
        """) == ["tensor", "cpu_tensor", "tensor"]


@pytest.mark.parametrize("moves", ["model = model.to(device)", "model = model.cuda()",
                                   "model = model.to(device, dtype=torch.float64)",
                                   "model = model.double().to(device)",
                                   "model = model.cuda(); model = model.double()"])
def test_a_module_moved_under_its_own_name_stays_a_module(moves):
    assert kinds(f"""
        import torch
        from torch import nn
        class Net(nn.Module):
            pass
        def main(device):
            model = Net()
            {moves}
            reveal(model)
            head = nn.Linear(4, 4)
            head = head.to(device)
            reveal(head)
        """) == ["user_module", "linear"]


def test_a_move_of_a_name_of_unknown_or_mixed_kind_stays_unknown():
    assert kinds("""
        import torch
        def f(batch, device, flag):
            batch = batch.to(device)
            reveal(batch)
            v = [1, 2] if flag else torch.zeros(2)
            v = v.to(device)
            reveal(v)
            a, b = b, a
            reveal(a)
        """) == ["None", "None", "None"]


@pytest.mark.parametrize("keep", ["y = y.clone()", "y = y.detach()", "y = y.contiguous()",
                                  "y = y.detach().clone()", "y = y.clone(); y = y.contiguous()"])
def test_a_copy_or_view_under_its_own_name_keeps_the_device(keep):
    # lightly's embedding loop: `y = y.clone()` of a batch straight from the loader stays on the host
    assert kinds(f"""
        import torch
        def embed(model, dataloader, device):
            for x, y in dataloader:
                x = x.to(device)
                {keep.replace("y", "x")}
                {keep}
                reveal(x)
                reveal(y)
        """) == ["tensor", "cpu_tensor"]


def test_an_item_of_a_module_container_taken_by_a_fixed_key_has_the_kind_its_construction_gives():
    assert kinds("""
        import copy
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self, d, names):
                super().__init__()
                self.blocks = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])
                self.layers = nn.ModuleDict({"proj": nn.Linear(d, d), "act": nn.ReLU()})
                self.heads = nn.ModuleDict({name: nn.Linear(d, 1) for name in names})
                self.net = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 1))
                self.copies = nn.ModuleList([copy.deepcopy(self.net[0]) for _ in range(3)])
            def forward(self, x):
                reveal(self.blocks[0])
                reveal(self.blocks[-1])
                reveal(self.layers["proj"])
                reveal(self.layers["act"])
                reveal(self.heads["a"])
                reveal(self.net[0])
                reveal(self.net[1])
                reveal(self.net[-1])
                reveal(self.copies[1])
        """) == ["linear", "linear", "linear", "module", "linear", "linear", "module", "linear", "linear"]


def test_an_item_of_a_module_container_is_unknown_where_its_construction_does_not_say():
    assert kinds("""
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self, d, layers, n):
                super().__init__()
                self.mixed = nn.ModuleList([nn.Linear(d, d) if i else nn.ReLU() for i in range(n)])
                self.given = nn.ModuleList(layers)
                self.grown = nn.ModuleList([nn.Linear(d, d)])
                self.grown.append(nn.ReLU())
                self.replaced = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])
                self.replaced[1] = nn.ReLU()
                self.starred = nn.Sequential(nn.Linear(d, d), *layers)
                self.pairs = nn.ModuleDict({"proj": nn.Linear(d, d), **layers})
            def forward(self, x, i):
                reveal(self.mixed[0])
                reveal(self.given[0])
                reveal(self.grown[0])
                reveal(self.replaced[0])
                reveal(self.starred[0])
                reveal(self.pairs["proj"])
                reveal(self.mixed[i])
                reveal(self.grown[5])
        """) == ["None"] * 8


def test_a_device_held_in_a_name_moves_a_tensor_and_a_dtype_held_in_a_name_does_not():
    assert kinds("""
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        cpu = "cpu"
        half = torch.float16
        def f(loader):
            for x, y in loader:
                reveal(x.to(device))
                reveal(x.to(cpu))
                reveal(x.to(half))
                reveal(x.to(f"cuda:{0}"))
        """) == ["tensor", "cpu_tensor", "cpu_tensor", "tensor"]


def test_a_parameter_takes_the_kind_every_call_of_the_file_passes():
    assert kinds("""
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x
        def train(model, loader, scale, other):
            reveal(model)
            reveal(loader)
            reveal(scale)
            reveal(other)
        train(Net(), torch.utils.data.DataLoader([]), 2.0, [1])
        train(Net(), torch.utils.data.DataLoader([]), 3.0, torch.zeros(2))
        """) == ["user_module", "loader", "scalar", "None"]


def test_a_name_takes_the_kind_its_uses_give_evidence_of():
    assert kinds("""
        import numpy as np
        import torch
        def f(a, b, c, d, e, g, model):
            a.backward()
            torch.matmul(b, b)
            c.astype(np.float32)
            d.permute(0, 2, 1)
            d.astype(np.float32)
            e.append(1)
            g.size()
            model.parameters()
            reveal(a)
            reveal(b)
            reveal(c)
            reveal(d)
            reveal(e)
            reveal(g)
            reveal(model(a))
        """) == ["tensor", "tensor", "numpy", "None", "list", "tensor", "tensor"]


def test_a_tensor_method_on_a_names_data_is_evidence_for_the_name():
    """`x_mask.data.eq(0).masked_fill_(...)`: `.data` of a numpy array is a memoryview, which
    has no tensor methods; what `x.data` is, `x` is."""
    assert kinds("""
        def f(x_mask, scores, arr):
            scores.data.masked_fill_(x_mask, 0.0)
            arr.data.tobytes()
            reveal(scores)
            reveal(arr)
        """) == ["tensor", "numpy"]


def test_the_argument_a_tensor_method_takes_as_a_tensor_is_one():
    assert kinds("""
        def f(x, target, mask, index, n, value):
            x.expand_as(target)
            x.masked_fill(mask, value)
            x.gather(n, index)
            reveal(target)
            reveal(mask)
            reveal(index)
            reveal(n)
            reveal(value)
        """) == ["tensor", "tensor", "tensor", "None", "None"]


def test_the_items_of_a_list_that_torch_joins_are_tensors():
    assert kinds("""
        import torch
        def f(ys, sos_id, rows, extra):
            sos = ys[0].new([sos_id])
            out = [torch.cat([sos, y], dim=0) for y in ys]
            torch.stack((rows, extra))
            reveal(sos)
            reveal(rows)
            reveal(extra)
            reveal(sos_id)
        """) == ["tensor", "tensor", "tensor", "None"]


def test_a_comparison_with_a_container_display_or_a_string_is_a_python_bool():
    assert kinds("""
        import torch
        def f(x):
            preds = torch.zeros(3).cuda()
            reveal(preds == [])
            reveal(preds != "none")
            reveal(preds == 0)
        """) == ["scalar", "scalar", "tensor"]


def test_max_with_no_argument_is_one_value_and_with_a_dim_a_pair():
    assert kinds("""
        import torch
        def f():
            hr = torch.zeros(3).cuda()
            reveal(hr.max())
            reveal(hr.min() ** 2)
            reveal(hr.max(1))
            reveal(hr.max(dim=0))
        """) == ["tensor", "tensor", "None", "None"]


def test_a_method_calling_its_submodules_gives_no_evidence_about_self():
    assert kinds("""
        import torch.nn as nn
        class Block(nn.Module):
            def forward(self, x):
                y = self.norm(x)
                reveal(self)
                return y
        """) == ["None"]


def test_a_names_uses_in_one_comprehension_say_nothing_of_another():
    assert kinds("""
        def f(pairs, attentions):
            firsts = [t.permute(1, 0) for t in pairs]
            return [reveal(t) for t in attentions]
        """) == ["None"]


def test_calling_a_module_class_of_the_file_gives_a_tensor_only_where_its_forward_returns_one():
    assert kinds("""
        import torch.nn as nn
        class Head(nn.Module):
            def forward(self, x):
                return self.fc(x)
        class Backbone(nn.Module):
            def forward(self, x):
                return x, [x]
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = Head()
                self.backbone = Backbone().cuda()
            def forward(self, x):
                reveal(self.head(x))
                reveal(self.backbone(x))
                return x
        """) == ["tensor", "None"]


def test_a_parameter_takes_what_the_name_holds_at_the_call_not_all_it_ever_holds():
    assert kinds("""
        import torch
        def pack(features):
            return reveal(features)
        def run(model, x, sizes):
            features = model.proj(x)
            features = torch.split(features, sizes)
            return pack(features)
        """) == ["list"]


def test_a_name_reused_for_host_and_device_tensors_has_the_kind_of_the_assignments_reaching_it():
    findings = lint_source(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(data)
        x = torch.randn(3, device="cuda")
        reveal(x)
        for x, y in loader:
            reveal(x)
            x = x.cuda()
            reveal(x)
        reveal(x)
        z = [reveal(x) for x in loader]
        """), "example.py", [_RevealReaching], prefilter=False)
    # after the loop, `x` is its target or the moved batch; in the comprehension, the whole name's kind
    assert [f.message for f in findings] == ["tensor", "cpu_tensor", "tensor", "tensor", "tensor"]


def test_a_store_in_one_arm_of_an_if_does_not_reach_a_read_in_the_other():
    import ast
    from matlint.semantic.flow import FunctionFlow

    function = ast.parse(textwrap.dedent("""
        def f(s, mask, xs):
            s = s * 2
            if mask is not None:
                s = s + mask
                a = s
            else:
                b = s
            c = s
            for x in xs:
                if x:
                    t = x
                else:
                    d = t
        """)).body[0]
    flow = FunctionFlow(function)
    loads = {n.lineno: n for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
             and n.id in ("s", "t")}
    stored_at = lambda load: sorted(stmt.lineno if stmt is not None else 0 for stmt, _ in flow.reaching_all(load))
    assert stored_at(loads[8]) == [3]        # the else arm reads what came before the if, not the other arm
    assert stored_at(loads[9]) == [3, 5]     # after the if, either
    assert stored_at(loads[14]) == [12]      # in a loop, the other arm stored it on an earlier pass


def test_a_store_at_the_end_of_a_loop_pass_does_not_reach_a_read_after_an_if_that_stores_on_both_arms():
    import ast
    from matlint.semantic.flow import FunctionFlow

    function = ast.parse(textwrap.dedent("""
        def f(steps, cuda):
            for done in steps:
                if done:
                    bit = 0
                else:
                    bit = 1
                if cuda:
                    bit = bit + 1
                use(bit)
        """)).body[0]
    flow = FunctionFlow(function)
    loads = {n.lineno: n for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
             and n.id == "bit"}
    stored_at = lambda load: sorted(stmt.lineno for stmt, _ in flow.reaching_all(load))
    assert stored_at(loads[9]) == [5, 7]       # the previous pass's `bit + 1` is overwritten by either arm
    assert stored_at(loads[10]) == [5, 7, 9]


def test_a_comprehension_reads_the_names_of_its_scope_where_it_runs():
    findings = lint_source(textwrap.dedent("""
        import torch
        def learn(n):
            q = torch.randn(n, 4, device="cuda")
            q = torch.stack([reveal(q) for i in range(n)])
            q = q.cpu().numpy()
            return [reveal(q) for i in range(n)], [reveal(q) for q in range(n)]
        """), "example.py", [_RevealReaching], prefilter=False)
    # the device tensor where the first comprehension runs (the name's whole kind mixes it with
    # the numpy copy); the comprehension's own variable, an int, is no tensor
    assert findings[0].message == "tensor"
    assert findings[1].message != "tensor" and findings[2].message != "tensor"


def test_a_variable_wrapper_is_the_tensor_it_wraps():
    """`torch.autograd.Variable(x)` (old tutorials) is `x` itself: a host tensor stays one, and a
    target moved to the GPU under a setting, then wrapped, may be on the device."""
    assert kinds("""
        import torch
        from torch.autograd import Variable
        def loss(pred, num, use_gpu):
            host = Variable(torch.zeros(3))
            conf_t = torch.LongTensor(num, 8)
            if use_gpu:
                conf_t = conf_t.cuda()
            conf_t = Variable(conf_t, requires_grad=False)
            reveal(host)
            reveal(conf_t)
            reveal(conf_t > 0)
        """) == ["cpu_tensor", "tensor", "tensor"]


def test_the_parameters_of_a_module_are_tensors():
    assert kinds("""
        import torch
        def clip(model, clip):
            for name, p in model.named_parameters():
                reveal(name)
                reveal(p.grad.data.norm(2))
            for q in model.parameters():
                reveal(q)
        """) == ["scalar", "tensor", "tensor"]


def test_a_number_converted_to_a_tensor_later_is_not_a_tensor_before():
    """`beta = torch.tensor(beta, ...)` in one branch: the tensor uses after it are of the
    converted value, no evidence that the parameter held a tensor (trl's `generalized_jsd_loss`)."""
    assert kinds("""
        import torch
        def jsd(p, q, beta=0.5):
            reveal(beta)
            if beta == 0:
                return p
            beta = torch.tensor(beta, device=p.device)
            return torch.log(beta) + q
        """) == ["None"]


def test_a_value_converted_to_a_tensor_in_one_arm_is_a_tensor():
    """`if isinstance(x, np.ndarray): x = torch.from_numpy(x); y = torch.from_numpy(y)`: the
    function makes sure its inputs are tensors, whatever it was given. A conversion in the
    function's own body (every call runs it), or in an arm of a test of the value rather than of
    its type (trl's `generalized_jsd_loss`), says nothing of what the parameter held before it."""
    assert kinds("""
        import numpy as np
        import torch
        def forward(x, y, beta, gamma):
            if isinstance(x, np.ndarray):
                x = torch.from_numpy(x).float()
                y = torch.from_numpy(y).float()
            reveal(y)
            reveal(beta)
            reveal(gamma)
            beta = torch.tensor(beta)
            if gamma == 0:
                return x
            else:
                gamma = torch.tensor(gamma, device=x.device)
            return x * gamma
        """) == ["tensor", "None", "None"]


def test_an_item_of_a_python_list_of_modules_is_that_module():
    """Per-agent networks kept in a plain list (`[Critic(d) for _ in range(n)]`), a copy of it
    (`deepcopy(self.critics)`) and a list filled by `append`: an item is the module, and calling
    it gives what its `forward` returns, a tensor (`self.FC4(h)` is a layer of the module, not an
    output record, whatever its capitals). A list of numbers gives numbers."""
    assert kinds("""
        import copy
        import torch
        from torch import nn
        class Critic(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.FC4 = nn.Linear(d, 1)
            def forward(self, s):
                return self.FC4(s)
        class Agents:
            def __init__(self, d, n):
                self.critics = [Critic(d) for _ in range(n)]
                self.critics_target = copy.deepcopy(self.critics)
                self.actors = []
                for _ in range(n):
                    self.actors.append(Critic(d))
                self.var = [1.0 for _ in range(n)]
            def update(self, s, i):
                reveal(self.critics[i])
                reveal(self.critics_target[i](s))
                reveal(self.actors[i](s))
                reveal(self.var[i])
        """) == ["user_module", "tensor", "tensor", "scalar"]


def test_a_name_moved_in_place_is_a_module():
    """`model.to(device)` as a statement of its own: a tensor's move returns a copy and leaves the
    name as it was, so the name holds a module (a model loaded by a library's `from_pretrained`),
    and calling it runs a model. A tensor moved and rebound (`x = x.to(device)`) is no module."""
    assert kinds("""
        import torch
        from transformers import GPT2LMHeadModel
        def evaluate(device, batches):
            model = GPT2LMHeadModel.from_pretrained("gpt2")
            model.to(device)
            for x in batches:
                x = x.to(device)
                reveal(model)
                reveal(x)
        """) == ["module", "None"]


def test_what_a_function_passes_an_instance_of_a_class_of_the_file_flows_into_its_forward():
    """`criterion(pred, boxes)` in the training function, `criterion = YoloLoss()`: the loss's
    `forward` gets device tensors; a call in the module's `__main__` smoke test says nothing."""
    assert kinds("""
        import torch
        from torch import nn
        class YoloLoss(nn.Module):
            def forward(self, pred, labels=None):
                reveal(labels)
                return pred.sum()
        def train(model, loader, device):
            criterion = YoloLoss()
            for images, boxes in loader:
                boxes = boxes.to(device)
                loss = criterion(model(images.to(device)), boxes)
        """) == ["tensor"]
    assert kinds("""
        import torch
        from torch import nn
        class YoloLoss(nn.Module):
            def forward(self, pred, labels=None):
                reveal(labels)
                return pred.sum()
        if __name__ == "__main__":
            crit = YoloLoss()
            crit(torch.zeros(2), torch.LongTensor([1, 2]))
        """) == ["None"]


def test_pairs_unpacked_and_element_wise_extrema_are_tensors_where_their_operands_are():
    """`values, order = t.sort(...)` and `v, i = t.max(1)` unpack tensors of `t`'s kind;
    `torch.min(a, b)` of two tensors is their element-wise minimum and `torch.max(t)` one value,
    not a pair; `t.max(1)[0]` is the values half; `torch.max(t, 1)` stays a pair."""
    assert kinds("""
        import torch
        def f(net, lengths):
            x = torch.randn(8, 4, device="cuda")
            q1, q2 = net(x), net(x * 2)
            ordered, order = q1.sort(dim=0, descending=True)
            best, where = q2.max(1)
            reveal(ordered); reveal(where)
            reveal(torch.min(q1, q2)); reveal(torch.max(q1)); reveal(q1.max(1)[0])
            reveal(torch.max(q1, 1))
            host = torch.zeros(3)
            reveal(torch.min(host, torch.ones(3)))
        """) == ["tensor", "tensor", "tensor", "tensor", "tensor", "list", "cpu_tensor"]


def test_a_name_rebound_to_a_reduction_of_itself_keeps_its_kind():
    assert kinds("""
        import torch
        def f(net, loader):
            net.train()
            for data in loader:
                loss, aux = net([data["img"].cuda(), data["annot"]])
                loss = loss.mean()
                reveal(loss); reveal(aux)
        """) == ["tensor", "tensor"]


def test_a_parameter_takes_the_kind_that_the_importing_files_pass_and_an_imported_function_returns(tmp_path):
    """A helper module's function that no call in its own file reaches takes its parameters' kinds
    from the calls of the project files that import it, and what a function of a project module
    returns is what its `return`s give there. A name bound to `None` on one path and to a tensor
    on another is a tensor where it is used as one."""
    from matlint.registry import get_rule

    (tmp_path / "losses.py").write_text(textwrap.dedent("""\
        import torch
        def policy_loss(logp, adv):
            return -(logp * adv).mean()
        """))
    (tmp_path / "logger.py").write_text(textwrap.dedent("""\
        import torch

        class Logger:
            def __init__(self, writer):
                self.writer = writer

            def log_data(self, step, loss, entropy):
                if loss:
                    self.writer.add_scalar("loss", loss.item(), step)
                self.writer.add_scalar("entropy", entropy, step)

        if __name__ == "__main__":
            Logger(None).log_data(0, None, 0.0)
        """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        import torch
        from logger import Logger
        from losses import policy_loss

        def train(net, opt, env, writer, device):
            logger = Logger(writer)
            for step in range(1000):
                loss = None
                if step > 10:
                    logp, adv = net(torch.as_tensor(env.state(), device=device))
                    loss = policy_loss(logp, adv)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                logger.log_data(step, loss, 0.0)
        """))
    source = (tmp_path / "logger.py").read_text()
    found = lint_source(source, str(tmp_path / "logger.py"), [get_rule("MAT502")])
    # `if loss:` tests the tensor's value; its branch reads the loss it tested, on every step
    # that passes one
    assert [(f.row, f.column) for f in found] == [(8, 12), (9, 44)]
    assert "`bool()` of `loss`" in found[0].message and "called from the training loop" in found[0].message
    assert "`.item()` of `loss`" in found[1].message
    # The same importer on the CPU: no device to wait for.
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace(", device=device", ""))
    assert lint_source(source, str(tmp_path / "logger.py"), [get_rule("MAT502")]) == []


def test_an_instance_of_a_module_class_of_a_project_module_is_a_module(tmp_path):
    """`net = QNetwork(...)` after `from networks import QNetwork`, where networks.py derives it
    from `nn.Module`: a module (what it computes lies on its device); a plain class imported the
    same way is not."""
    (tmp_path / "networks.py").write_text(textwrap.dedent("""\
        import torch.nn as nn

        class QNetwork(nn.Module):
            def forward(self, x):
                return x

        class Table:
            pass
        """))
    source = textwrap.dedent("""\
        import torch
        from networks import QNetwork, Table

        def act(n):
            net = QNetwork(n)
            table = Table()
            reveal(net); reveal(table)
        """)
    (tmp_path / "agent.py").write_text(source)
    findings = lint_source(source, str(tmp_path / "agent.py"), [_Reveal], prefilter=False)
    assert [f.message for f in findings] == ["user_module", "None"]


def test_a_call_of_a_function_of_the_file_is_what_its_returns_give_for_the_arguments_it_passes():
    assert kinds("""
        import torch
        def calc_loss(x, y, model, device):
            x, y = x.to(device), y.to(device)
            return torch.nn.functional.cross_entropy(model(x), y)
        def make_mask(n):
            return torch.ones(n, n).tril()
        def normalise(t):
            return t / t.norm()
        def evaluate(model, loader, device):
            for x, y in loader:
                reveal(calc_loss(x, y, model, device))
            reveal(make_mask(4))
            reveal(normalise(torch.zeros(3)))
            reveal(normalise(torch.zeros(3, device="cuda")))
        """) == ["tensor", "cpu_tensor", "cpu_tensor", "tensor"]


def test_a_method_called_on_self_and_the_items_of_a_returned_tuple_have_the_returns_kinds():
    assert kinds("""
        import torch
        from torch.utils.data import DataLoader
        class Runner:
            def __init__(self):
                self.device = torch.device("cuda")
                self.net, self.steps = self.build()
            def build(self):
                return torch.nn.Linear(3, 3), 10
            def loader(self):
                return DataLoader(range(10))
            def run(self):
                for x in self.loader():
                    out = self.net(x.to(self.device))
                    reveal(out)
                reveal(self.loader())
                reveal(self.steps)
                net, steps = self.build()
                reveal(net)
                reveal(self.build()[1])
        """) == ["tensor", "loader", "scalar", "linear", "scalar"]


def test_a_return_kind_needs_every_return_to_agree():
    assert kinds("""
        import numpy as np
        import torch
        def either(flag):
            if flag:
                return torch.zeros(3)
            return np.zeros(3)
        def gen(n):
            yield torch.zeros(n)
        def recurse(n):
            return recurse(n - 1) if n else torch.zeros(1)
        reveal(either(True))
        reveal(gen(3))
        reveal(recurse(3))
        """) == ["None", "None", "None"]  # a recursive call's own kind is not known while it is read


def test_a_returned_name_is_read_from_the_assignments_that_reach_the_return():
    assert kinds("""
        import numpy as np
        import torch
        class Agent:
            def __init__(self, net, cuda):
                self.net, self.cuda = net, cuda
            def _get_tensors(self, obs):
                obs = np.transpose(obs, (2, 0, 1))
                obs = torch.tensor(obs, dtype=torch.float32)
                if self.cuda:
                    obs = obs.cuda()
                return obs
            def _on_host(self, obs):
                obs = np.asarray(obs)
                obs = torch.tensor(obs).float()
                return obs
            def act(self, obs):
                reveal(self._get_tensors(obs))
                reveal(self._on_host(obs))
        """) == ["tensor", "cpu_tensor"]


def test_a_gradient_is_a_tensor_whatever_its_parameter_is():
    assert kinds("""
        def clip(params):
            for p in params:
                reveal(p.grad)
                reveal(p.grad.data.norm())
        """) == ["tensor", "tensor"]


def test_an_item_of_a_list_the_name_is_bound_to_once_has_the_kind_its_element_gives():
    assert kinds("""
        import torch
        def f(batch):
            x = torch.zeros(3, device="cuda")
            rows = [r * 2 for r in x]
            pair = [x, 3]
            reveal(rows[0])
            reveal(pair[0])
            reveal(pair[1])
        """) == ["tensor", "tensor", "scalar"]


def test_a_name_a_project_module_binds_once_to_a_number_is_a_number_where_it_is_imported(tmp_path):
    """`from load import SOS_token` where load.py binds `SOS_token = 0` once: a Python number. A
    name the module rebinds, binds to something else, or a module that is not the project's, is
    not known to be one."""
    (tmp_path / "load.py").write_text(textwrap.dedent("""\
        SOS_token = 0
        GAMMA = 0.99
        PAD = 0
        NAME = "pad"

        def reset():
            global PAD
            PAD = 1
        """))
    source = textwrap.dedent("""\
        import torch
        from load import SOS_token, GAMMA, PAD, NAME

        def step(n):
            reveal(SOS_token); reveal(GAMMA); reveal(PAD); reveal(NAME)
        """)
    (tmp_path / "train.py").write_text(source)
    findings = lint_source(source, str(tmp_path / "train.py"), [_Reveal], prefilter=False)
    assert [f.message for f in findings] == ["scalar", "scalar", "None", "None"]


@pytest.mark.parametrize("move, kind", [("self.h = self.h.cuda()", "tensor"), ("self.h = self.h.float()", "cpu_tensor"),
                                        ("self.h = self.h.cpu()", "cpu_tensor")])
def test_an_attribute_moved_where_it_is_stored_keeps_its_kind_on_the_device_it_was_moved_to(move, kind):
    assert kinds(f"""
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.fc = nn.Linear(d, d)
                self.fc = self.fc.cuda()
                self.h = torch.zeros(d)
                {move}
            def forward(self, x):
                reveal(self.fc)
                reveal(self.h)
        """) == ["linear", kind]


def test_a_loader_batch_whose_items_the_loop_stores_into_is_not_known_to_stay_on_the_host():
    assert kinds('''
        import torch
        from torch.utils.data import DataLoader
        def train(dataset, to_var):
            for batch in DataLoader(dataset):
                reveal(batch)
                for k in ("input", "target"):
                    batch[k] = to_var(batch[k])
            for other in DataLoader(dataset):
                reveal(other)
        ''') == ["None", "cpu_tensor"]


def test_a_module_made_and_called_at_once_or_called_through_forward_gives_a_tensor():
    """`nn.L1Loss()(pred, y)` calls the loss module it makes; `m.forward(x)` is what `m(x)` runs;
    a method of a module other than `forward` says nothing by itself."""
    assert kinds("""
        import torch.nn as nn
        class Head(nn.Module):
            def forward(self, x):
                return self.fc(x)
        def step(pred, y, x):
            m = nn.Linear(4, 4)
            h = Head()
            reveal(nn.L1Loss()(pred, y))
            reveal(m.forward(x))
            reveal(h.forward(x))
            reveal(h.extra_repr())
        """) == ["tensor", "tensor", "tensor", "None"]


def test_the_items_torchs_pair_functions_unpack_into_are_tensors_where_the_input_is():
    """`_, pred = torch.max(out, 1)` as `out.max(1)` unpacks: tensors on `out`'s device; of a
    host tensor, host tensors."""
    assert kinds("""
        import torch
        def f(x):
            out = torch.zeros(3, 4).cuda()
            _, pred = torch.max(out, 1)
            values, order = torch.sort(torch.zeros(3), descending=True)
            reveal(pred)
            reveal(order)
        """) == ["tensor", "cpu_tensor"]


def test_the_items_of_a_parameter_are_what_every_call_passes_at_the_call():
    """`seq` is a range in one branch of the caller and a list of ints in the other (its numpy
    value replaced in the same branch before the call): the loop goes over numbers; so does one
    over `[-1] + list(seq[:-1])`. A branch that passes the numpy array itself says nothing."""
    source = """
        import numpy as np
        def steps(x, seq):
            seq_next = [-1] + list(seq[:-1])
            for i, j in zip(seq, seq_next):
                reveal(i)
                reveal(j)
        def main(cfg, x):
            if cfg.uniform:
                seq = range(10)
            else:
                seq = np.linspace(0, 3, 10) ** 2
                seq = [int(s) for s in list(seq)]
            steps(x, seq)
        """
    assert kinds(source) == ["scalar", "scalar"]
    assert kinds(source.replace("seq = [int(s) for s in list(seq)]", "pass")) == ["None", "None"]


def test_an_rnn_layers_output_and_hidden_state_are_tensors_and_an_lstms_state_a_pair():
    assert kinds("""
        import torch.nn as nn
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = nn.GRU(8, 16)
                self.lstm = nn.LSTM(8, 16)
            def forward(self, x):
                out, h = self.gru(x)
                seq, state = self.lstm(x)
                reveal(out)
                reveal(h)
                reveal(seq)
                reveal(state)
                return out
        """) == ["tensor", "tensor", "tensor", "None"]


def test_tensors_made_on_a_cpu_device_held_in_a_name_and_a_layers_output_on_them_stay_on_the_host():
    """`device = torch.device('cpu')` (the cuda line commented out): what the factories make there
    and what a torch.nn layer computes from it stay on the host; a layer given a device tensor
    gives one."""
    assert kinds("""
        import torch
        device = torch.device('cpu')
        gpu = torch.device('cuda')
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        x = torch.randn(8, 4, device=device)
        z = torch.randn(8, 4, device=gpu)
        reveal(x)
        reveal(model(x))
        reveal(model(z))
        """) == ["cpu_tensor", "cpu_tensor", "tensor"]


def test_a_device_string_passed_for_a_parameter_moves_what_is_moved_to_it():
    """`train(..., device)` after `device = 'cuda'`: `top.to(device)` is on the device, and so is
    what a loss module computes from it; passed 'cpu', the host."""
    source = """
        import torch
        from torch import nn
        def train(loader, model, device):
            criterion = nn.CrossEntropyLoss()
            for top, label in loader:
                top = top.to(device)
                reveal(top)
                reveal(criterion(top, top))
        def main(loader, model):
            device = 'cuda'
            train(loader, model, device)
        """
    assert kinds(source) == ["tensor", "tensor"]
    assert kinds(source.replace("'cuda'", "'cpu'")) == ["cpu_tensor", "cpu_tensor"]


def test_type_as_puts_the_tensor_where_the_other_one_is():
    """`y_true.type_as(x)` takes x's dtype and device: a host target moved next to the model's
    output; of a host tensor, the host; of something unknown, unknown."""
    assert kinds("""
        import torch
        def loss(x, unknown):
            out = x.cuda()
            y_true = torch.zeros(4, 3)
            if torch.cuda.is_available():
                y_true = y_true.type_as(out)
            reveal(y_true[..., 2] == 1)
            reveal(torch.zeros(2).type_as(torch.ones(2)))
            reveal(torch.zeros(2).type_as(unknown.foo))
        """) == ["tensor", "cpu_tensor", "None"]


def test_a_store_passed_over_by_a_break_still_reaches_past_the_loop():
    """`x = np.zeros(3)`, then `break` on a condition, then `x = [1, 2]` in one pass: after the loop
    `x` may hold either, so its items are not known to be numbers; without the break, only the
    list reaches."""
    source = """
        import numpy as np
        def steps(seq):
            for i in seq:
                reveal(i)
        def main(cfg):
            for _ in range(3):
                seq = np.zeros((3, 3))
                if cfg.stop:
                    break
                seq = [1, 2]
            steps(seq)
        """
    assert kinds(source) == ["None"]
    assert kinds(source.replace("                if cfg.stop:\n                    break\n", "")) == ["scalar"]


def test_a_project_loss_module_moved_to_the_device_and_passed_as_a_parameter_returns_a_tensor(tmp_path):
    """pytorch-semantic-segmentation: `criterion = CrossEntropyLoss2d(...).cuda()` (a class of the
    project's `utils` package, re-exported by its `__init__`) is passed to `train`, whose
    `main_loss = criterion(outputs, gts)` is a tensor: its `.data[0]` handed to a meter syncs."""
    from matlint.registry import get_rule

    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("from .misc import *\n")
    (tmp_path / "utils" / "misc.py").write_text(textwrap.dedent("""\
        import torch.nn as nn
        import torch.nn.functional as F

        class CrossEntropyLoss2d(nn.Module):
            def __init__(self, ignore_index=255):
                super().__init__()
                self.nll_loss = nn.NLLLoss(ignore_index=ignore_index)

            def forward(self, inputs, targets):
                return self.nll_loss(F.log_softmax(inputs, 1), targets)
        """))
    train = textwrap.dedent("""\
        import torch
        from utils import CrossEntropyLoss2d

        def train(loader, net, criterion, optimizer, meter):
            for inputs, gts in loader:
                inputs, gts = inputs.cuda(), gts.cuda()
                optimizer.zero_grad()
                outputs, aux = net(inputs)
                main_loss = criterion(outputs, gts)
                loss = main_loss + 0.4 * criterion(aux, gts)
                loss.backward()
                optimizer.step()
                meter.update(main_loss.data[0], inputs.size(0))
                reveal(main_loss)

        def main(loader, net, optimizer, meter):
            criterion = CrossEntropyLoss2d(ignore_index=255).cuda()
            train(loader, net, criterion, optimizer, meter)
        """)
    (tmp_path / "train.py").write_text(train)
    found = lint_source(train, str(tmp_path / "train.py"), [get_rule("MAT502"), _Reveal], prefilter=False)
    assert [(f.code, f.row, f.column) for f in found] == [("MAT502", 13, 22), ("MAT999", 14, 9)]
    assert "`.data[0]` of `main_loss`" in found[0].message
    assert found[1].message == "tensor"


def test_a_star_imported_function_returns_what_its_body_gives_for_the_kinds_the_call_passes(tmp_path):
    """NRI: `from utils import *`, then `loss_nll = nll_gaussian(output, target, var)`, whose body
    adds a numpy number to its tensor on one path (`neg_log_p += const`): a tensor."""
    (tmp_path / "utils.py").write_text(textwrap.dedent("""\
        import numpy as np
        import torch

        def nll_gaussian(preds, target, variance, add_const=False):
            neg_log_p = (preds - target) ** 2 / (2 * variance)
            if add_const:
                const = 0.5 * np.log(2 * np.pi * variance)
                neg_log_p += const
            return neg_log_p.sum() / target.size(0)
        """))
    train = textwrap.dedent("""\
        import torch
        from utils import *

        def train(model, loader, var):
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                reveal(nll_gaussian(model(x), y, var))
        """)
    (tmp_path / "train.py").write_text(train)
    found = lint_source(train, str(tmp_path / "train.py"), [_Reveal], prefilter=False)
    assert [f.message for f in found] == ["tensor"]


def test_the_items_of_a_project_module_whose_forward_returns_a_tuple_take_its_returns_kinds(tmp_path):
    """Yolo-v2: `loss, loss_coord, loss_cls = criterion(logits, label)` of a loss module imported
    from the project, whose `forward` returns the losses it keeps on `self`: each is a tensor."""
    (tmp_path / "loss.py").write_text(textwrap.dedent("""\
        import torch.nn as nn

        class YoloLoss(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.scale = scale

            def forward(self, output, target):
                self.loss_coord = self.scale * nn.MSELoss()(output[:, :4], target[:, :4])
                self.loss_cls = nn.CrossEntropyLoss()(output[:, 4:], target[:, 4].long())
                self.loss_tot = self.loss_coord + self.loss_cls
                return self.loss_tot, self.loss_coord, self.loss_cls
        """))
    train = textwrap.dedent("""\
        import torch
        from loss import YoloLoss

        def train(model, loader):
            criterion = YoloLoss(5.0)
            for x, y in loader:
                loss, loss_coord, loss_cls = criterion(model(x.cuda()), y.cuda())
                reveal(loss_coord)
                reveal(loss_cls)
        """)
    (tmp_path / "train.py").write_text(train)
    found = lint_source(train, str(tmp_path / "train.py"), [_Reveal], prefilter=False)
    assert [f.message for f in found] == ["tensor", "tensor"]


@pytest.mark.parametrize("text, bound", [
    ("agent = Agent(4)\n", [("agent", "Agent")]),
    ("    self.memory = buffers.Replay(n)\n", [("self.memory", "buffers.Replay")]),
    ("a, b = f(x)\n", [("b", "f")]),
    ("a = b = Net()\n", [("b", "Net")]),
    ("x: int = f(1)\n", [("int", "f")]),
    ("if a == f(1) or a <= g(2) or a != h(3):\n    a += k(4)\n    a //= m(5)\n", []),
    ("(n := f(1))\nx[i] = f(2)\nobj.attr = f(3)\nself.a.b = f(4)\n", []),
    ("g(x = f(1))\n", [("x", "f")]),
])
def test_the_assignment_scan_finds_the_names_bound_to_a_call(text, bound):
    """`_assignments` starts at each `=` and reads the name bound back from its line: the names
    of `name = call(...)` and `self.attr = call(...)`; not comparisons, augmented assignments,
    subscripts or attributes of other objects."""
    from matlint.semantic.calls import _INSTANCE, _assignments
    assert [(name, match.group(1)) for name, match in _assignments(text, _INSTANCE)] == bound


@pytest.mark.parametrize("text, moves", [
    ("def f(x):\n    return x.cuda()\n", True),
    ("def f(x):\n    return torch.as_tensor(x).to(device)\n", True),
    ("x = x.cuda()\n", True),
    ("    self.net = self.net.to(d)\n", False),  # an attribute, not a name bound to itself
    ("ax = x.cuda()\n", False),
    ("y = x.cuda()\n", False),
    ("returned = x.cuda()\n", False),
    ("x = x.x.cuda()\n", False),
    ("return x\ny = z.to(d)\n", False),  # the move is not on the `return` line
])
def test_the_mover_scan_finds_a_returned_or_rebound_move(text, moves):
    """MAT503's gate for helpers that return their argument moved: a `.cuda(`/`.to(` after
    `return` on its line, or `x = x.cuda(`."""
    from matlint.rules.mat503_tensor_creation_in_loop.factories import _returns_moved
    assert _returns_moved(text) is moves


def test_the_input_and_target_of_a_loss_function_are_tensors_and_so_is_what_a_target_indexes():
    """`F.cross_entropy(out, labels[mask])` takes tensors only: `labels` is one (a comparison of
    it makes a mask), and so is `y` of `F.mse_loss(pred, y)`."""
    assert kinds("""
        import torch.nn.functional as F
        def loss_fn(out, labels, mask, pred, y):
            loss = F.cross_entropy(out, labels[mask]) + F.mse_loss(pred, y)
            reveal(labels)
            reveal(labels > 0)
            reveal(y)
        """) == ["tensor", "tensor", "tensor"]


def test_a_model_passed_in_called_on_host_batches_gives_what_it_may_have_moved():
    """A model handed to the function may move host inputs itself (`nn.DataParallel` scatters them
    to the GPUs): its output on the loader's batch is unknown. A built-in layer the function
    makes computes where its input is: on the host."""
    assert kinds("""
        import torch
        def train_epoch(data_loader, model, layer_size):
            model.train()
            layer = torch.nn.Linear(layer_size, 2)
            for inputs, targets in data_loader:
                reveal(model(inputs))
                reveal(layer(inputs))
        """) == ["None", "cpu_tensor"]
