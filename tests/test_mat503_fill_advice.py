"""MAT503's fill advice for a nest of lists of one repeated number makes the same tensor as the
code it replaces: same values, shape and dtype (the device set aside)."""
import re
import textwrap

import pytest

from matlint.engine import lint_source
from matlint.registry import get_rule

torch = pytest.importorskip("torch")

_SOURCE = textwrap.dedent("""\
    import torch
    SOS = 3
    def train_step(model, opt, batch, b, device):
        out = model(batch.to(device))
        start = torch.LongTensor([[SOS for _ in range(b)]]).to(device)
        col = torch.tensor([[SOS]] * b).to(device)
        rows = torch.Tensor([SOS] * b).cuda()
        half = torch.tensor([2.5] * b).to(device)
        loss = (out + start + col + rows + half).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    """)


def test_each_fill_makes_the_tensor_the_list_made():
    findings = lint_source(_SOURCE, "train.py", [get_rule("MAT503")])
    lines = _SOURCE.splitlines()
    assert [f.row for f in findings] == [5, 6, 7, 8]
    scope = {"torch": torch, "SOS": 3, "b": 4, "device": "cpu"}
    for finding in findings:
        made = lines[finding.row - 1].split("=", 1)[1].strip()
        made = re.sub(r"\.(to\(device\)|cuda\(\))$", "", made)
        advised = re.search(r"`(torch\.full\(.*?\))`", finding.message).group(1)
        advised = advised.replace('device="cuda"', 'device="cpu"')
        want, got = eval(made, scope), eval(advised, scope)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), (made, advised)
