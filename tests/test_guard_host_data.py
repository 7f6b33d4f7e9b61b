"""Runtime checks and data the program keeps on the host, real torch on CPU: batch indices drawn on
the host, a rollout whose next input the host makes from the action it read, and the layouts and
broadcasts that look alike on the model's tensors."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint_helpers import lines, this_line  # noqa: E402


def observe(fn, steps=3):
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1)
    with g:
        for _ in range(steps):
            fn()
            g.step()
    return g


# -- host-side batch assembly (MAT502, MAT501) -------------------------------------------------
def test_slicing_a_host_corpus_with_host_indices_is_no_sync_nor_loop_over_elements():
    """`torch.stack([data[i:i + n] for i in ix])` with `ix` drawn by `torch.randint` on the host: the
    slice bounds are read on the host from host tensors, which stay on the CPU on a GPU too."""
    data = torch.arange(1000)
    model = nn.Linear(8, 8)

    def step():
        ix = torch.randint(0, 900, (16,))
        x = torch.stack([data[i:i + 8] for i in ix]).float()
        y = torch.stack([data[i + 1:i + 9] for i in ix]).float()
        return nn.functional.mse_loss(model(x), y)

    g = observe(step)
    assert lines(g, "MAT502") == [] and lines(g, "MAT501") == []


def test_reading_the_models_values_element_by_element_is_still_found():
    """The same loop over elements of the model's output: each read would wait for the GPU."""
    model = nn.Linear(8, 16)
    x = torch.randn(4, 8)

    def step():
        scores = model(x)[0]
        return [int(s > 0) for s in scores]  # <- here

    g = observe(step)
    assert lines(g, "MAT502") == this_line(step)


def test_host_indices_written_into_with_the_models_values_are_no_longer_host_data():
    model = nn.Linear(8, 40)
    x = torch.randn(1, 8)

    def step():
        picks = torch.zeros(40, dtype=torch.long)  # made on the host ...
        picks[:] = model(x)[0].argmax()            # ... then holds a value the model computed
        return [p.item() for p in picks]  # <- here

    g = observe(step)
    assert lines(g, "MAT502") == this_line(step)


# -- a rollout through the host (MAT101, MAT502) -------------------------------------------------
class Walk:
    def __init__(self):
        self.pos = 0

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        return [self.pos / 10.0, 0.5]


def test_a_rollout_whose_next_input_the_host_makes_from_the_action_is_no_loop_to_batch():
    """Each step's input is made (torch.tensor) from the environment's state after the host read the
    previous action: a dependency chain through the host, and reads the environment needs."""
    policy = nn.Linear(2, 2)  # one layer: a stack of them on one line feeds itself anyway
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)

    def step():
        env, state, log_probs = Walk(), [0.0, 0.0], []
        for _ in range(12):
            probs = policy(torch.tensor(state)).softmax(-1)
            action = torch.multinomial(probs, 1)
            state = env.step(action.item())
            log_probs.append(probs.log()[action])
        opt.zero_grad()
        torch.cat(log_probs).sum().backward()
        opt.step()

    g = observe(step)
    assert lines(g, "MAT101") == [] and lines(g, "MAT502") == []


def test_the_sync_detector_counts_the_read_the_environment_needs_as_its_design():
    """On CUDA torch's sync detector also counts `action.item()`'s read, with whatever else waits on
    that line: the read makes a round trip through the host, on either count."""
    policy = nn.Linear(2, 2)

    def step():
        env, state = Walk(), [0.0, 0.0]
        for _ in range(12):
            probs = policy(torch.tensor(state)).softmax(-1)
            action = torch.multinomial(probs, 1)
            state = env.step(action.item())  # <- here

    g = observe(step)
    rec = g.recorder.rec
    [site] = {k.site for k in rec.ops if k.op == "_local_scalar_dense"}
    assert site.lineno == this_line(step)[0]
    rec.syncs[site] = 12 * rec.steps  # what the detector sees there on CUDA: each read
    assert _as_cuda_findings(g, "MAT502") == []


def test_independent_inputs_read_one_by_one_are_still_a_loop_and_syncs():
    """The look-alike: the inputs were there before the reads (no tensor made from Python data after
    them), so the calls are independent and each read is a sync the loop could do without."""
    policy = nn.Linear(2, 2)
    states = torch.randn(12, 2)

    def step():
        actions = []
        for i in range(12):
            probs = policy(states[i:i + 1]).softmax(-1)[0]  # <- here
            actions.append(torch.multinomial(probs, 1).item())  # <- here
        return actions

    g = observe(step)
    here = this_line(step)
    assert here[0] in lines(g, "MAT101")
    assert lines(g, "MAT502") == [here[1]]


def _as_cuda_findings(g, code):
    """The window's findings as if its ops ran on an sm_90 GPU, where MAT504 counts launches and
    every read of the device's values is a sync."""
    from matlint.runtime_guard.checks import DeviceContext, run_checks

    rec = g.recorder.rec
    rec.ops = {k._replace(device="cuda"): v for k, v in rec.ops.items()}
    rec.device_types = {"cuda"}
    return sorted({f.row for f in run_checks(rec, ctx=DeviceContext("cuda", (9, 0))) if f.code == code})


def test_the_launches_and_syncs_of_a_rollout_iteration_are_the_loops_design():
    """Each environment step launches a few small kernels and syncs once besides reading the action
    (a check on the probabilities): the loop runs through the host anyway, so neither is reported.
    The same work on inputs that were there before the loop is reported."""
    policy = nn.Linear(2, 2)
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    states = torch.randn(40, 2)

    def rollout():
        env, state, log_probs = Walk(), [0.0, 0.0], []
        for _ in range(40):
            probs = policy(torch.tensor(state)).softmax(-1).clamp(1e-6, 1.0)
            if probs.max() > 0.999:
                probs = probs * 0.5
            action = torch.multinomial(probs, 1)
            state = env.step(action.item())
            log_probs.append(probs.log()[action])
        opt.zero_grad()
        torch.cat(log_probs).sum().backward()
        opt.step()

    def replay():
        log_probs = []
        for i in range(40):
            probs = policy(states[i]).softmax(-1).clamp(1e-6, 1.0)  # <- here
            if probs.max() > 0.999:  # <- here
                probs = probs * 0.5
            log_probs.append(probs.log()[torch.multinomial(probs, 1)])
        opt.zero_grad()
        torch.cat(log_probs).sum().backward()
        opt.step()

    g = observe(rollout)
    assert _as_cuda_findings(g, "MAT502") == [] and _as_cuda_findings(g, "MAT504") == []
    g = observe(replay)
    launches, sync = this_line(replay)
    assert sync in _as_cuda_findings(g, "MAT502") and launches in _as_cuda_findings(g, "MAT504")


# -- MAT201: a tensor set against itself ---------------------------------------------------------
def test_a_tensor_compared_with_itself_through_two_views_is_a_pairwise_matrix():
    model = nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    other = torch.randn(32)

    def step():
        pref = (y.squeeze(1).unsqueeze(1) > y.squeeze(1)).float()  # (N, 1) vs (N,) of the same values
        err = model(x) - other  # <- here: (N, 1) vs another tensor's (N,)
        return pref.sum() + err.sum()

    assert lines(observe(step), "MAT201") == this_line(step)


# -- MAT301 / MAT302: copies on the GEMM's own line ----------------------------------------------
def test_a_contiguous_written_inside_the_gemm_is_found_and_the_plain_transpose_is_not():
    q = torch.randn(64, 32)
    index = torch.randn(500, 32)

    def copied():
        return q @ index.T.contiguous()  # <- here

    def plain():
        return q @ index.T

    g = observe(copied)
    assert lines(g, "MAT301") == this_line(copied)
    assert "on this line" in next(f.message for f in g.findings if f.code == "MAT301")
    assert lines(observe(plain), "MAT301") == []


def test_a_linear_on_a_permuted_input_is_found_and_its_look_alikes_are_not():
    """nn.Linear on (T, B, H).permute(1, 0, 2) copies the input to fold (B, T) into the GEMM's rows;
    the layer applied first and its output permuted gives the same values without the copy."""
    head = nn.Linear(48, 10)
    rnn = nn.GRU(16, 48, batch_first=True)   # permutes its (B, T, H) input inside: not the user's
    proj = nn.Linear(48, 48)
    out = torch.randn(20, 6, 48)             # (T, B, H)
    seq = torch.randn(6, 20, 16)
    heads = torch.randn(6, 4, 20, 12)        # (B, heads, T, d)

    def permuted():
        return head(out.permute(1, 0, 2))  # <- here

    def fixed():
        return head(out).permute(1, 0, 2)

    def look_alikes():
        merged = proj(heads.transpose(1, 2).contiguous().view(6, 20, 48))  # the copy the view needs
        return rnn(seq)[0].sum() + merged.sum()

    g = observe(permuted)
    assert lines(g, "MAT302") == this_line(permuted)
    assert "before the permute" in next(f.message for f in g.findings if f.code == "MAT302")
    assert torch.equal(head(out.permute(1, 0, 2)), fixed())
    assert lines(observe(fixed), "MAT302") == []
    assert lines(observe(look_alikes), "MAT302") == []


# -- MAT601: attention with the keys in the scores' rows (Luong) ----------------------------------
def test_luong_attention_with_keys_in_the_rows_is_attention_and_sdpa_computes_it():
    """`bmm(keys, h.unsqueeze(2))` gives (B, S, 1) scores, keys in the rows; the softmax over them
    and `bmm(attn.unsqueeze(1), keys)` are attention: SDPA(q=h.unsqueeze(1), k=keys, v=keys, scale=1)."""
    keys = torch.randn(8, 12, 32)
    h = torch.randn(8, 32)

    def luong():
        scores = torch.bmm(keys, h.unsqueeze(2)).squeeze(2)  # <- here
        attn = torch.softmax(scores, dim=1)
        return torch.bmm(attn.unsqueeze(1), keys).squeeze(1)

    def softmax_over_the_batch():
        scores = torch.bmm(keys, h.unsqueeze(2)).squeeze(2)
        return torch.bmm(torch.softmax(scores, dim=0).unsqueeze(1), keys).squeeze(1)

    g = observe(luong)
    [f] = [f for f in g.findings if f.code == "MAT601"]
    assert f.row == this_line(luong)[0]
    assert f.evidence["shapes"] == ["(8, 1, 32)", "(8, 32, 12)", "(8, 12, 32)"]
    assert f.evidence["sdpa_kwargs"] == {"scale": 1.0}
    fused = torch.nn.functional.scaled_dot_product_attention(h.unsqueeze(1), keys, keys, scale=1.0).squeeze(1)
    torch.testing.assert_close(fused, luong())
    assert lines(observe(softmax_over_the_batch), "MAT601") == []


# -- MAT501: values computed from picked elements -------------------------------------------------
def test_values_computed_only_from_picked_elements_are_a_loop_over_elements_too():
    """The overlap of box i is computed from the 0-d values of the lines before, which came from
    single elements of `pred` and `target`: the line is element-by-element work like them."""
    pred, target = torch.rand(48, 4), torch.rand(48, 4)

    def step():
        out = torch.zeros(48)
        for i in range(48):
            lo = torch.max(pred[i, 0], target[i, 0])
            hi = torch.min(pred[i, 2], target[i, 2])
            inter = (hi - lo).clamp(min=0) * 2  # <- here: no element of pred or target read here
            out[i] = inter
        return out

    columns = [torch.rand(48) for _ in range(4)]  # tensors of their own, not parts of one

    def norms():  # single values of their own (reductions of whole tensors), then arithmetic on them
        total = torch.zeros(())
        for i in range(48):
            n = columns[i % 4].norm()
            total = (total + n * 0.5) - n.sqrt()
        return total

    g = observe(step)
    assert this_line(step)[0] in lines(g, "MAT501")
    assert lines(observe(norms), "MAT501") == []


def test_a_loop_over_a_tensors_rows_is_reported_and_a_recurrence_over_them_is_not():
    """Each row picked (`probs[row]`, `x[:, t]`) and computed on alone: a loop the whole tensor could do
    in one op. A recurrence reads its state besides the row, a layer its weight: not a loop over
    items. Rows larger than a launch-bound kernel's (TINY_NUMEL) are work, not launches."""
    probs = torch.rand(100, 5)
    x, w = torch.rand(4, 40, 8), torch.rand(8)
    big = torch.rand(40, 70000)

    def rows():
        low = []
        for row in range(probs.shape[0]):
            low.append(probs[row].max() < 0.22)  # <- here
        return low

    def recurrence():
        h = torch.zeros(4, 8)
        for t in range(40):
            h = torch.tanh(x[:, t] * w + h)
        return h

    def big_rows():
        return [big[i].sum() for i in range(40)]

    g = observe(rows)
    [f] = [f for f in g.findings if f.code == "MAT501"]
    assert f.row == this_line(rows)[0] and f.evidence["items"] == "rows"
    assert f.evidence["per_step"] == 200 and "loop over a tensor's rows" in f.message  # max and lt per row
    assert lines(observe(recurrence), "MAT501") == []
    assert lines(observe(big_rows), "MAT501") == []
