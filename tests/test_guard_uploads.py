"""MAT503 at runtime, real torch on CPU: tensors a step makes on the host and copies to a device.
The meta device stands in for the GPU (a copy to it is the same `_to_copy` a copy to CUDA is; on
the CPU a move to the CPU is no op, so nothing is copied)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint_helpers import lines, this_line  # noqa: E402

DEVICE = "meta"


def observe(fn, steps=3, mark_steps=True):
    """`fn` run `steps` times under the guard; `mark_steps`: a `guard.step()` after each (a
    function that steps an optimizer marks its own steps)."""
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1)
    with g:
        for _ in range(steps):
            fn()
            if mark_steps:
                g.step()
    return g


def uploads(g):
    return sorted((f for f in g.findings if f.code == "MAT503"), key=lambda f: f.row)


def discriminator_step():
    """A GAN's discriminator step: real and fake labels and noise each step."""
    net = nn.Linear(8, 1).to(DEVICE)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    criterion = nn.BCEWithLogitsLoss()

    def step():
        real = torch.randn(16, 8, device=DEVICE)
        real_label = torch.ones(16, 1).to(DEVICE)  # <- here
        fake_label = torch.zeros(16, 1).to(DEVICE)  # <- here
        noise = torch.randn(16, 8, device=DEVICE)  # made on the device: fine
        loss = criterion(net(real), real_label) + criterion(net(noise), fake_label)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def test_fills_made_on_the_host_and_moved_each_step_are_found():
    step = discriminator_step()
    g = observe(step, mark_steps=False)
    assert lines(g, "MAT503") == this_line(step)
    found = uploads(g)
    assert "by `aten::ones`" in found[0].message and "torch.ones(..., device=...)" in found[0].message
    assert "by `aten::zeros`" in found[1].message
    assert found[0].evidence["per_step"] == 1 and found[0].evidence["shapes"] == ["(16, 1)"]


def test_a_fill_computed_on_and_a_draw_made_on_the_host_are_found():
    net = nn.Linear(8, 1).to(DEVICE)

    def step():
        smooth = (torch.ones(16, 1) * 0.9).to(DEVICE)  # <- here
        noise = torch.randn(16, 8).to(DEVICE)  # <- here
        return nn.functional.mse_loss(net(noise), smooth)

    g = observe(step)
    assert lines(g, "MAT503") == this_line(step)
    assert "`aten::ones`" in uploads(g)[0].message and "`aten::randn`" in uploads(g)[1].message


def test_the_same_python_values_copied_each_step_are_found_and_changing_ones_are_not():
    net = nn.Linear(2, 2).to(DEVICE)
    states = iter(range(1000))

    def step():
        weights = torch.tensor([0.25, 0.75]).to(DEVICE)  # <- here
        s = next(states)
        state = torch.tensor([float(s), s / 2.0]).to(DEVICE)  # an environment's state: data to copy
        return (net(state) * weights).sum()

    g = observe(step)
    assert lines(g, "MAT503") == this_line(step)
    assert "make it once before the loop" in uploads(g)[0].message


def test_tensors_made_on_the_device_or_copied_into_a_kept_buffer_are_fine():
    net = nn.Linear(8, 1).to(DEVICE)
    buffer = torch.empty(16, 8, device=DEVICE)

    def step():
        label = torch.ones(16, 1, device=DEVICE)
        buffer.copy_(torch.randn(16, 8))
        return nn.functional.mse_loss(net(buffer), label)

    g = observe(step)
    assert lines(g, "MAT503") == []


def test_a_move_on_the_cpu_copies_nothing():
    net = nn.Linear(8, 1)

    def step():
        label = torch.ones(16, 1).to("cpu")
        return nn.functional.mse_loss(net(torch.randn(16, 8)), label)

    g = observe(step)
    assert lines(g, "MAT503") == []


def test_labels_made_once_an_iteration_of_two_optimizer_steps_are_found_and_a_one_off_is_not():
    """A GAN's iteration steps the discriminator's optimizer and then the generator's: the labels
    its first half makes on the host come once every two steps. A buffer made on the host and
    moved on the first call only is set-up."""
    netD, netG = nn.Linear(8, 1).to(DEVICE), nn.Linear(4, 8).to(DEVICE)
    optD = torch.optim.SGD(netD.parameters(), lr=0.1)
    optG = torch.optim.SGD(netG.parameters(), lr=0.1)
    cache = {}

    def iteration():
        if "buffer" not in cache:
            cache["buffer"] = torch.zeros(16, 8).to(DEVICE)
        real_label = torch.ones(16, 1).to(DEVICE)  # <- here
        fake = netG(torch.randn(16, 4, device=DEVICE))
        lossD = nn.functional.mse_loss(netD(fake.detach() + cache["buffer"]), real_label)
        lossD.backward()
        optD.step()
        optD.zero_grad()
        lossG = netD(fake).mean()
        lossG.backward()
        optG.step()
        optG.zero_grad()

    g = observe(iteration, steps=6, mark_steps=False)
    assert lines(g, "MAT503") == this_line(iteration)
