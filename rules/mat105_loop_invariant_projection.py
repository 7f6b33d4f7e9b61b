"""MAT105 loop-invariant-projection: in a time-step recurrence, the input projection that does
not depend on the recurrent state, issued once per step instead of once for all steps."""
from __future__ import annotations

import ast

from matlint.rule import Rule, bad, good

from matlint.semantic.loops import updates_weights
from matlint.rule import GemmVisitor
from matlint.semantic.torch_api import as_gemm
from .mat101_python_loop_matmul import PythonLoopMatmul


class LoopInvariantProjection(GemmVisitor, Rule):
    code = "MAT105"
    name = "loop-invariant-projection"
    summary = "An input projection recomputed at every step of a recurrence although it does not depend on the state; do all steps in one GEMM before the loop."
    docs = """
    ## What it does
    In a recurrence (a loop where some GEMM reads a value the previous iteration produced, such
    as an RNN's `h @ W_hh` or `self.h @ W_hh`, or where an RNN cell such as `nn.LSTMCell`, or a
    module class of the file, is called on it), flags each GEMM that reads the step's slice of
    a tensor fixed before the loop (`x[t] @ W_xh`, `x[:, t] @ W`, `self.W_ih(x[:, t])`,
    `F.linear(x_t, w, b)` with `x_t = x[t]`, `torch.einsum("bd,dh->bh", x[:, t], W)`, `x_t @ W`
    for `x_t` in `x`, `x.unbind(1)`, `torch.unbind(x, 1)` or `x.split(1, dim=1)`, `inputs[i]`
    after `inputs = x.unbind(0)`, or such a slice through the steps MAT101 follows, as in
    `self.in_proj(self.embed(tgt[:, t]))`) and a loop-invariant weight, and nothing from the
    recurrent state. The
    message gives the hoisted call and how the loop reads it (`proj[t]`, with the loop's own
    counter, or iterating over `proj` in place of `x`).
    MAT101 stays quiet on recurrences; this rule covers the part of them that is not sequential.

    ## Why is this bad?
    Only `h @ W_hh` has to wait for the previous step. The input projection of every step can
    be computed up front as one large GEMM (`x @ W_xh` over all T steps), which runs at full
    matrix-unit throughput instead of T small GEMMs with T launches; cuDNN's RNNs do exactly this.

    ## Example
    ```python
    for t in range(T):
        h = torch.tanh(x[t] @ W_xh + h @ W_hh + b)
    ```

    ## Use instead
    ```python
    xw = x @ W_xh                      # all steps at once
    for t in range(T):
        h = torch.tanh(xw[t] + h @ W_hh + b)
    ```

    ## Stays quiet on
    - Loops that are not recurrences (MAT101 reports their GEMMs), and GEMMs that read the state
      (`h @ W_hh`) or anything derived from it in the step.
    - Inputs that are not a per-step slice of one tensor (a list of steps, a value fed
      back from the previous prediction, `x[t:t + k]` or `x.split(k, 1)` chunks), tensors rebound or written in
      place inside the loop (`ys[:, t + 1].copy_(h)`, also through another name for the same
      memory: `buf = x` then `buf[t + 1] = h @ Wo`), and weights that change per step
      (`self.W_x.data.mul_(0.99)`, an optimizer step in the loop, a call that may run one:
      `train_step(loss, opt)`, `self.training_step(batch)`; logging a loss, `print(loss)` or
      `losses.append(float(loss))` steps nothing).

    ## Fix safety
    No automatic fix: hoisting adds a tensor of all steps' projections and changes the loop body.
    """
    examples = [
        bad("""
            import torch
            def rnn(x, h, W_xh, W_hh, b):
                outputs = []
                for t in range(x.size(0)):
                    h = torch.tanh(x[t] @ W_xh + h @ W_hh + b)
                    outputs.append(h)
                return torch.stack(outputs), h
            """, (5, 24), message_contains="x @ W_xh"),
        bad("""
            import torch
            import torch.nn as nn
            class RNN(nn.Module):
                def __init__(self, d, hidden):
                    super().__init__()
                    self.W_ih = nn.Linear(d, hidden)
                    self.W_hh = nn.Linear(hidden, hidden, bias=False)
                def forward(self, x, h):
                    for t in range(x.shape[1]):
                        h = torch.tanh(self.W_ih(x[:, t]) + self.W_hh(h))
                    return h
            """, (10, 28), message_contains="self.W_ih(x)"),
        bad("""
            import torch as T
            import torch.nn.functional as F
            def gru_like(inputs: T.Tensor, state, w_in, b_in, w_rec):
                for step in range(len(inputs)):
                    x_t = inputs[step]
                    gates = F.linear(x_t, w_in, b_in) + T.mm(state, w_rec)
                    state = T.sigmoid(gates) * state
                return state
            """, (6, 17), message_contains="F.linear(inputs, w_in, b_in)"),
        good("""
            import torch
            def not_a_recurrence(x, W):
                outs = []
                for t in range(x.size(0)):
                    outs.append(x[t] @ W)
                return outs
            """),
        good("""
            import torch
            import torch.nn as nn
            class ARDecoder(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.w_in = nn.Linear(d, d)
                    self.w_h = nn.Linear(d, d)
                    self.out = nn.Linear(d, d)
                def forward(self, x0: torch.Tensor, h: torch.Tensor, steps: int):
                    ys = x0.new_zeros(x0.size(0), steps + 1, x0.size(-1))
                    ys[:, 0] = x0
                    for t in range(steps):
                        h = torch.tanh(self.w_in(ys[:, t]) + self.w_h(h))  # ys[:, t] is the step before's output
                        ys[:, t + 1] = self.out(h)
                    return ys
            """),
        good("""
            import torch
            def decode(emb, h, W_xh, W_hh, y0, T):
                y = y0
                for t in range(T):
                    h = torch.tanh(emb(y) @ W_xh + h @ W_hh)
                    y = h.argmax(-1)
                return h
            """),
        good("""
            import torch
            def f(x, h, W_xh, W_hh, Ws):
                for t in range(x.size(0)):
                    z = h @ W_hh
                    h = torch.tanh(z @ W_xh + x[t] @ Ws[t])
                    x = x * 0.5
                return h
            """),
        good("""
            import torch
            from torch import nn
            class ARDecoder(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.w_in = nn.Linear(d, d)
                    self.w_h = nn.Linear(d, d)
                    self.out = nn.Linear(d, d)
                def forward(self, x0: torch.Tensor, h: torch.Tensor, steps: int):
                    ys = x0.new_zeros(x0.size(0), steps + 1, x0.size(-1))
                    ys[:, 0] = x0
                    for t in range(steps):
                        prev = ys[:, t]
                        h = torch.tanh(self.w_in(prev) + self.w_h(h))
                        ys[:, t + 1] = self.out(h)
                    return ys
            def tbptt(x: torch.Tensor, h: torch.Tensor, W_xh, W_hh, opt, loss_fn):
                for t in range(x.size(0)):
                    h = torch.tanh(x[t] @ W_xh + h.detach() @ W_hh)
                    loss_fn(h).backward()
                    opt.step()
                return h
            """),
        good("""
            import torch
            from torch import nn
            class AR(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.w_in = nn.Linear(d, d)
                    self.w_h = nn.Linear(d, d)
                def forward(self, ys: torch.Tensor, h: torch.Tensor):
                    for t in range(ys.size(1) - 1):
                        h = torch.tanh(self.w_in(ys[:, t]) + self.w_h(h))  # ys[:, t] was written last step
                        ys[:, t + 1].copy_(h)
                    return ys
            class FastWeights(nn.Module):
                def forward(self, x: torch.Tensor, h: torch.Tensor):
                    for t in range(x.size(0)):
                        h = torch.tanh(x[t] @ self.W_x + h @ self.W_h)
                        self.W_x.data.mul_(0.99)  # the weight changes per step
                    return h
            """),
        bad("""
            import torch
            from torch import nn
            class RNN(nn.Module):
                def forward(self, x: torch.Tensor):
                    self.h = torch.zeros(x.size(1), x.size(2))
                    for t in range(x.size(0)):
                        self.h = torch.tanh(x[t] @ self.W_xh + self.h @ self.W_hh)
                    return self.h
            class Dec(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.inp = nn.Linear(d, d)
                    self.cell = nn.LSTMCell(d, d)
                def forward(self, x):
                    h = c = x.new_zeros(x.size(0), x.size(2))
                    for t in range(x.size(1)):
                        h, c = self.cell(self.inp(x[:, t]), (h, c))
                    return h
            """, (7, 33), (17, 30), message_contains="proj = "),
        bad("""
            import torch
            from torch import einsum
            def rnn(x: torch.Tensor, h: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor):
                for t in range(x.shape[1]):
                    h = torch.tanh(einsum("bd,dh->bh", x[:, t], W_xh) + torch.einsum("bh,hk->bk", h, W_hh))
                return h
            """, (5, 24), message_contains='`proj = einsum("bnd,dh->nbh", x, W_xh)`) and read `proj[t]`'),
        bad("""
            import torch
            def rnn(x: torch.Tensor, h: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor):
                for step in range(x.size(0)):
                    h = torch.tanh(x[step] @ W_xh + h @ W_hh)
                return h
            """, (4, 24), message_contains="read `proj[step]` in the loop"),
        bad("""
            import torch
            def rnn(x: torch.Tensor, h: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor):
                for x_t in x:
                    h = torch.tanh(x_t @ W_xh + h @ W_hh)
                return h
            """, (4, 24), message_contains="and iterate over `proj` in place of `x`"),
        bad("""
            import torch
            def rnn(x: torch.Tensor, h: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor):
                outs = []
                for i, x_t in enumerate(x.unbind(0)):
                    h = torch.tanh(x_t @ W_xh + h @ W_hh)
                    outs.append(h)
                return outs
            """, (5, 24), message_contains="read `proj[i]` in the loop"),
        bad("""
            import torch
            import torch.nn.functional as F
            from torch import nn
            class Seq(nn.Module):
                def __init__(self, d=32, h=64):
                    super().__init__()
                    self.W_xh = nn.Linear(d, h)
                    self.W_hh = nn.Linear(h, h)
                    self.head = nn.Linear(h, d)
                def forward(self, x, y):
                    h = x.new_zeros(x.size(0), 64)
                    total = 0.0
                    for t in range(x.size(1)):
                        h = torch.tanh(self.W_xh(x[:, t]) + self.W_hh(h))
                        step_loss = F.mse_loss(self.head(h), y[:, t])
                        total = total + step_loss
                        self.log_metric(f"loss_t{t}", step_loss)  # logging steps no weights
                        self.loss_tracker.update(step_loss)
                    return total
            """, (14, 28), message_contains="`proj = self.W_xh(x)`"),
        good("""
            import torch
            import torch.nn.functional as F
            from torch import nn
            class TBPTT(nn.Module):
                def fit(self, x, y):
                    h = x.new_zeros(x.size(0), 64)
                    for t in range(x.size(1)):
                        h = torch.tanh(self.W_xh(x[:, t]) + self.W_hh(h.detach()))
                        self.train_step(F.mse_loss(self.head(h), y[:, t]))  # steps the weights
                    return h
            """),
        good("""
            import torch
            from torch import nn
            class Scheduled(nn.Module):
                def forward(self, x: torch.Tensor, h: torch.Tensor):
                    for t in range(x.size(0)):
                        self.W_x = self.bank[t % 4]  # other weights each step
                        h = torch.tanh(x[t] @ self.W_x + h @ self.W_h)
                    return h
            """),
        good("""
            import torch
            def closed_loop(x: torch.Tensor, Wx: torch.Tensor, Wh: torch.Tensor, Wo: torch.Tensor):
                buf = x  # each next input is overwritten with the prediction, through the alias
                h = torch.zeros(x.shape[1], Wh.shape[0])
                for t in range(x.shape[0] - 1):
                    h = torch.tanh(x[t] @ Wx + h @ Wh)
                    buf[t + 1] = h @ Wo
                return h
            def shifted(x: torch.Tensor, Wx: torch.Tensor, Wh: torch.Tensor, Wo: torch.Tensor):
                h = torch.zeros(x.shape[1], Wh.shape[0])
                nxt = x[1:]
                for t in range(x.shape[0] - 1):
                    h = torch.tanh(x[t] @ Wx + h @ Wh)
                    nxt[t].copy_(h @ Wo)
                return h
            """),
        bad("""
            import torch
            import torch.nn as nn
            class RNN(nn.Module):
                def __init__(self, d, h):
                    super().__init__()
                    self.ih = nn.Linear(d, h)
                    self.hh = nn.Linear(h, h)
                def forward(self, x: torch.Tensor, h: torch.Tensor):
                    for xt in x.unbind(1):
                        h = torch.tanh(self.ih(xt) + self.hh(h))
                    for xt in torch.unbind(x, 1):
                        h = torch.tanh(self.ih(xt) + self.hh(h))
                    for xt in x.split(1, dim=1):
                        h = torch.tanh(self.ih(xt.squeeze(1)) + self.hh(h))
                    return h
            """, (10, 28), (12, 28), (14, 28), message_contains="proj = self.ih(x)"),
        bad("""
            import torch
            import torch.nn as nn
            class LSTMLayer(nn.Module):
                def __init__(self, d, h):
                    super().__init__()
                    self.weight_ih = nn.Parameter(torch.randn(4 * h, d))
                    self.weight_hh = nn.Parameter(torch.randn(4 * h, h))
                def forward(self, input: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor):
                    inputs = input.unbind(0)
                    outputs = []
                    for i in range(len(inputs)):
                        gates = torch.mm(inputs[i], self.weight_ih.t()) + torch.mm(hx, self.weight_hh.t())
                        ig, fg, cg, og = gates.chunk(4, 1)
                        cx = torch.sigmoid(fg) * cx + torch.sigmoid(ig) * torch.tanh(cg)
                        hx = torch.sigmoid(og) * torch.tanh(cx)
                        outputs.append(hx)
                    return torch.stack(outputs), (hx, cx)
            class Decoder(nn.Module):
                def __init__(self, v, d):
                    super().__init__()
                    self.embed = nn.Embedding(v, d)
                    self.in_proj = nn.Linear(d, d)
                    self.cell = nn.GRUCell(d, d)
                def forward(self, tgt: torch.Tensor, h: torch.Tensor):
                    for t in range(tgt.size(1)):
                        h = self.cell(self.in_proj(self.embed(tgt[:, t])), h)  # teacher forcing
                    return h
            """, (12, 21), (26, 27), message_contains="compute it for all steps in one GEMM before the loop"),
        good("""
            import torch
            import torch.nn as nn
            class RNN(nn.Module):
                def __init__(self, d, h):
                    super().__init__()
                    self.ih = nn.Linear(d, h)
                    self.hh = nn.Linear(h, h)
                def forward(self, x: torch.Tensor, h: torch.Tensor):
                    for xt in x.split(4, dim=1):  # chunks of steps, not steps
                        h = torch.tanh(self.ih(xt).mean(1) + self.hh(h))
                    inputs = x.unbind(1)
                    for i in range(len(inputs)):
                        h = torch.tanh(self.ih(inputs[i] + h) + self.hh(h))  # reads the state
                    return h
            """),
    ]

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        # MAT101's loop analysis (per-step items, recurrences), reused rather than copied.
        self._loop_gemms = PythonLoopMatmul(ctx)

    gemms_in_loops_only = True

    def check_gemm(self, node: ast.AST) -> None:
        gemm = as_gemm(self.ctx, node)
        if gemm is None or not gemm.operands:
            return
        loop = self.ctx.loops[-1]
        if loop.is_comprehension or not self._loop_gemms._is_recurrence(loop) or updates_weights(self.ctx, loop):
            return  # no recurrence, or the weights change between steps (`opt.step()` in the loop)
        stepped = [op for op in gemm.operands if loop.depends_on_iteration(op) or loop.reads_carried(op)]
        if len(stepped) != 1:
            return
        step_input = stepped[0]
        if isinstance(step_input, ast.Name) and step_input.id not in loop.targets:
            # `x_t = x[t]` then `x_t @ W`: judge the assigned value.
            assigned = self._loop_gemms._single_assignment(loop, step_input.id)
            item = self._loop_gemms._batched(loop, assigned, 0, transforms=True) if assigned is not None else None
        else:
            item = self._loop_gemms._batched(loop, step_input, 0, transforms=True)
        if (item is None or any(loop.changes(source) for source in item.sources)
                or loop.reads_carried(step_input)):
            return
        others = [op for op in gemm.operands if op is not step_input]
        extra = [a for a in getattr(node, "args", [])[len(gemm.operands):]] if gemm.op == "linear" else []
        if any(loop.changes(op) for op in others + extra):
            return
        if gemm.op == "nn.Linear" and loop.changes(node.func):
            return
        self.report(node, f"this projection reads only the step's input, not the recurrent state: "
                          f"{self._suggestion(gemm, item, step_input, loop)}")

    def _suggestion(self, gemm, item, step_input, loop) -> str:
        seg = self.ctx.segment
        base = seg(item.base)
        dim = item.dim
        whole = None
        if item.keeps_dim:
            pass  # `x.split(1, 1)`: the hoisted result is indexed differently
        elif item.plain and gemm.op == "nn.Linear":
            whole = f"{gemm.spelling}({base})"
        elif item.plain and gemm.op == "linear":
            whole = f"{seg(gemm.node.func)}({', '.join([base] + [seg(a) for a in gemm.node.args[1:]])})"
        elif item.plain and item.dim == 0 and gemm.op in ("@", "matmul") and gemm.operands[0] is step_input:
            whole = f"{base} @ {seg(gemm.operands[1])}"
        elif item.plain and gemm.op == "einsum":
            batched = [item if op is step_input else None for op in gemm.operands]
            eq = PythonLoopMatmul._batched_einsum(gemm.subscripts, batched)
            if eq:  # the steps' letter leads the output
                operands = ", ".join(base if b else seg(op) for b, op in zip(batched, gemm.operands))
                whole = f'{seg(gemm.node.func)}("{eq}", {operands})'
                dim = 0
        if whole is None:
            return "compute it for all steps in one GEMM before the loop and index the result per step"
        hoist = f"compute all steps in one GEMM before the loop (`proj = {whole}`)"
        index = self._step_index(loop, item)
        if index is None:
            if dim != 0:
                return f"{hoist} and index it per step"
            return f"{hoist} and iterate over `proj` in place of `{base}`"
        return f"{hoist} and read `proj[{', '.join([':'] * dim + [index])}]` in the loop"

    def _step_index(self, loop, item):
        """The loop's counter of steps: `t` in `x[t]`, `i` in `for i, x_t in enumerate(x)`; None
        for `for x_t in x`."""
        if self._loop_gemms._index_var(loop, item.index):
            return item.index
        target = self._loop_gemms._target_node(loop)
        if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
            if self._loop_gemms._index_var(loop, target.elts[0].id):
                return target.elts[0].id
        return None
