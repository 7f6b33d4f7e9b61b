"""MAT101 at run time from dataflow, not counts: many same-shape GEMMs from one line are a loop
to batch only when the calls do not feed each other (a layer stack, a recurrence or a decode loop
does), and the advice follows what the calls share. A step without an optimizer is one top-level
module call run without grad (or what guard.step() marks)."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402


def observe(fn, steps=3, explicit_steps=True, **options):
    g = guard(**{"json_path": None, "report": False, "estimate_savings": False, "warmup": 1,
                 "window": steps - 1, **options})
    with g:
        for _ in range(steps):
            fn()
            if explicit_steps:
                g.step()
    return g


def mat101(g):
    return [f for f in g.findings if f.code == "MAT101"]


def marked_line(fn):
    src, start = inspect.getsourcelines(fn)
    [line] = [start + i for i, text in enumerate(src) if "# <- here" in text]
    return line


# -- independent calls: reported, with the fix that fits what they share ---------------------------
def test_one_shared_linear_on_independent_inputs_is_one_call_on_the_stacked_inputs():
    lin = nn.Linear(16, 24)
    xs = [torch.randn(4, 16) for _ in range(25)]

    def step():
        outs = [lin(x) for x in xs]  # <- here
        torch.stack(outs).sum().backward()

    g = observe(step, estimate_savings=True)
    [f] = mat101(g)
    assert f.row == marked_line(step)
    assert f.evidence["shared_operand"] == "second" and f.evidence["per_step"] == 25
    assert "stack the inputs" in f.message and "bmm" not in f.message
    assert "stacked inputs" in f.evidence["estimate_method"]
    # the fix it describes computes the same
    with torch.no_grad():
        torch.testing.assert_close(lin(torch.cat(xs)).split(4), tuple(lin(x) for x in xs))


def test_different_weights_on_different_inputs_are_one_bmm():
    w = torch.randn(8, 16, 16, requires_grad=True)
    x = torch.randn(8, 4, 16)

    def step():
        torch.stack([x[h] @ w[h] for h in range(8)]).sum().backward()  # <- here

    [f] = mat101(observe(step, estimate_savings=True))
    assert f.evidence["shared_operand"] is None
    assert "(8, 4, 16) @ (8, 16, 16)" in f.message and "one bmm" in f.evidence["estimate_method"]


class Heads(nn.Module):
    """Independent heads, one nn.Linear each, applied to one input or to one input each."""

    def __init__(self, n=6, shared_input=True):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(32, 32) for _ in range(n))
        self.shared_input = shared_input

    def forward(self, x):
        xs = [x] * len(self.heads) if self.shared_input else x.unbind(0)
        return torch.stack([head(xi) for head, xi in zip(self.heads, xs)])  # <- here


def test_independent_heads_on_one_input_are_one_gemm_on_the_concatenated_weights():
    model = Heads(shared_input=True)
    x = torch.randn(5, 32)
    [f] = mat101(observe(lambda: model(x).sum().backward()))
    assert f.row == marked_line(Heads.forward)
    assert f.evidence["shared_operand"] == "first" and "concatenate the weights" in f.message
    assert "torch.cat(weights, dim=0)" in f.message  # nn.Linear weights are (out, in)
    assert len(f.evidence["module"]) == 6
    with torch.no_grad():  # the described fix computes the same
        w = torch.cat([h.weight for h in model.heads], dim=0)
        b = torch.cat([h.bias for h in model.heads], dim=0)
        torch.testing.assert_close(F.linear(x, w, b).view(5, 6, 32).transpose(0, 1), model(x))


def test_one_input_on_different_matrices_concatenates_their_columns():
    w = torch.randn(6, 32, 24)  # (in, out) matrices used as x @ w[h]
    x = torch.randn(5, 32)

    def step():
        return torch.stack([x @ w[h] for h in range(6)])  # <- here

    [f] = mat101(observe(step))
    assert f.evidence["shared_operand"] == "first" and "torch.cat(weights, dim=-1)" in f.message
    torch.testing.assert_close((x @ torch.cat(list(w), dim=-1)).view(5, 6, 24).transpose(0, 1), step())


def test_independent_heads_on_their_own_inputs_are_a_batched_call():
    model = Heads(shared_input=False)
    x = torch.randn(6, 5, 32)
    [f] = mat101(observe(lambda: model(x).sum().backward()))
    assert f.evidence["shared_operand"] is None and "stack_module_state" in f.message


def test_an_input_updated_in_place_between_calls_is_a_new_operand_each_time():
    lin = nn.Linear(32, 32)
    x = torch.randn(10, 8, 32)

    def step():
        h = torch.zeros(8, 32)
        outs = []
        with torch.no_grad():
            for t in range(10):
                h.add_(x[t])  # a running sum updated in place: one tensor, a new value for each call
                outs.append(lin(h))  # <- here
        return torch.stack(outs)

    [f] = mat101(observe(step))
    assert f.row == marked_line(step)
    assert f.evidence["shared_operand"] == "second" and "stack the inputs" in f.message
    assert "compute it once" not in f.message
    with torch.no_grad():  # the described fix (one call on the stacked inputs) computes the same
        torch.testing.assert_close(lin(x.cumsum(0).reshape(80, 32)).view(10, 8, 32), step())


# -- calls that feed each other: never a loop to batch ----------------------------------------------
class Block(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.o(a)
        return x + self.mlp(x)


class Decoder(nn.Module):
    def __init__(self, layers=8, vocab=50, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_per_layer_projections_of_a_stack_are_not_a_loop():
    model = Decoder()
    tokens = torch.randint(0, 50, (2, 16))
    opt = torch.optim.AdamW(model.parameters())

    def step():
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad()

    g = observe(step, explicit_steps=False)
    assert g.recorder.rec.steps == 2
    k_proj = [k for k in g.recorder.rec.ops if k.op == "addmm" and k.module.endswith(".k")]
    assert len({k.module for k in k_proj}) == 8  # 8 layers' k projections, one line
    assert mat101(g) == []


def test_autoregressive_decode_loop_is_not_a_loop_to_batch():
    model = Decoder(layers=2).eval()
    prompt = torch.randint(0, 50, (1, 4))

    def generate():
        tokens = prompt
        with torch.no_grad():
            for _ in range(12):  # each new token feeds the next call, on a context of the last 4
                nxt = model(tokens[:, -4:])[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], 1)
        return tokens

    g = observe(generate)
    rec = g.recorder.rec
    # the whole decode loop was observed: 12 same-shape calls of each projection line per layer and step
    q_proj = [(k, s) for k, s in rec.ops.items() if k.op == "addmm" and k.module.endswith(".q")]
    assert rec.steps == 2 and sum(s.count for _, s in q_proj) == 2 * 2 * 12
    assert {k.site for k, _ in q_proj} <= rec.chained_gemm_sites  # each call fed by the one before
    assert mat101(g) == []


def test_a_state_updated_in_place_from_the_gemm_is_a_recurrence():
    lin = nn.Linear(32, 32)
    x = torch.randn(10, 8, 32)

    def step():
        h = torch.zeros(8, 32)
        with torch.no_grad():
            for t in range(10):
                h[:] = torch.tanh(lin(h) + x[t])  # the recurrent state, updated in place
        return h

    g = observe(step)
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm") == 20  # 10 per kept step
    assert mat101(g) == []


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("grad", [True, False])
def test_recurrent_layers_are_not_a_loop(kind, grad):
    rnn = getattr(nn, kind)(16, 32, batch_first=True)
    x = torch.randn(4, 20, 16)

    def step():
        with torch.set_grad_enabled(grad):
            out = rnn(x)[0].sum()
        if grad:
            out.backward()

    assert mat101(observe(step)) == []


def test_rnn_cell_loop_is_not_a_loop():
    cell = nn.RNNCell(16, 32)
    x = torch.randn(20, 4, 16)

    def step():
        h = torch.zeros(4, 32)
        for t in range(20):
            h = cell(x[t], h)
        h.sum().backward()

    assert mat101(observe(step)) == []


# -- what a step is without an optimizer --------------------------------------------------------------
class Loopy(nn.Module):
    """A real loop finding: 8 independent calls of one Linear per forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, xs):
        return torch.stack([self.lin(x) for x in xs])


def test_validation_before_training_does_not_use_up_the_window():
    model, val = Loopy(), nn.Linear(32, 32)  # the model and, say, a metric head
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = [torch.randn(16, 32) for _ in range(8)]
    g = guard(json_path=None, report=False, estimate_savings=False, slices=1)  # whole steps
    with g:
        with torch.no_grad():  # sanity validation batches before training (Lightning runs 2)
            for _ in range(2):
                model(xs)
                val(xs[0])
        observed = []
        for _ in range(5):
            observed.append(g.recording)
            model(xs).square().mean().backward()
            opt.step()
            opt.zero_grad()
    rec = g.recorder.rec
    assert rec.steps == 2 and observed[1:] == [True, True, False, False]  # training steps 2 and 3
    assert not any(k.module == "Linear" for k in rec.ops)  # nothing of the validation is left
    [f] = mat101(g)
    assert f.evidence["per_step"] == 8 and f.evidence["phase"] == "forward"


def test_a_training_step_that_calls_a_network_without_grad_first_is_one_step():
    policy, target = nn.Linear(16, 4), nn.Linear(16, 4)  # DQN: the target network under no_grad
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    g = guard(json_path=None, report=False, estimate_savings=False)
    with g:
        for _ in range(6):
            with torch.no_grad():
                y = target(x).max(-1).values
            F.mse_loss(policy(x).max(-1).values, y).backward()
            opt.step()
            opt.zero_grad()
    rec = g.recorder.rec
    forward = sum(s.count for k, s in rec.ops.items() if k.op == "addmm" and not k.backward)
    assert rec.steps == 2 and forward == 2 * rec.steps  # both networks' GEMMs in each step


def test_the_decorator_form_is_one_step_per_call_whatever_it_calls_without_grad():
    model = nn.Linear(16, 16)
    x = torch.randn(4, 16)

    @guard(json_path=None, report=False, estimate_savings=False)
    def infer():
        with torch.no_grad():
            return model(model(x).relu())  # <- two top-level module calls

    for _ in range(4):
        infer()
    g = infer.matlint_guard
    assert g.recorder.rec.steps == 2
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm") == 2 * 2


def test_an_explicit_window_counts_steps_only_at_optimizer_steps_or_guard_step():
    model = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=0, window=5)
    with g, torch.no_grad():
        for _ in range(20):
            model(x)
    assert g.recorder.rec.steps == 1  # the whole block, as no step was marked
    assert sum(s.count for k, s in g.recorder.rec.ops.items() if k.op == "addmm") == 20
class Scores(nn.Module):
    def forward(self, q, k):
        return q @ k.transpose(-2, -1)  # already batched: one bmm per call


def test_an_inference_loop_without_optimizer_is_one_step_per_call():
    model = Scores()
    q, k = torch.randn(8, 64, 32), torch.randn(8, 64, 32)
    g = guard(json_path=None, report=False, estimate_savings=False)
    with g, torch.no_grad():
        for _ in range(20):
            model(q, k)
    rec = g.recorder.rec
    assert rec.steps == 2  # steady after two calls: the window closed
    assert sum(s.count for key, s in rec.ops.items() if key.op == "bmm") == 2
    assert mat101(g) == []


def test_a_loop_inside_one_inference_call_is_still_reported():
    class PerItem(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 16, 16))

        def forward(self, x):
            return torch.stack([x[i] @ self.w[i] for i in range(8)])

    model = PerItem()
    x = torch.randn(8, 4, 16)
    g = guard(json_path=None, report=False, estimate_savings=False)
    with g, torch.no_grad():
        for _ in range(5):
            model(x)
    [f] = mat101(g)
    assert f.evidence["per_step"] == 8 and g.recorder.rec.steps == 2


def test_guard_step_marks_steps_in_a_loop_without_modules():
    w = torch.randn(16, 16)
    x = torch.randn(8, 4, 16)
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=0, window=3)
    with g:
        for _ in range(3):
            for i in range(8):
                x[i] @ w[:, :8] if i % 2 else x[i] @ w  # noqa: B018
            g.step()
    assert g.recorder.rec.steps == 3
    assert {f.evidence["per_step"] for f in mat101(g)} == {4}
