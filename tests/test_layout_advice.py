"""The rewrites MAT302 names compute what the code computed: each is run on random tensors next
to the original, and the hidden copy it avoids is seen in the original's ops."""
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from matlint.engine import lint_source  # noqa: E402
from matlint.registry import get_rule  # noqa: E402

SOURCE = """
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, seq_len, pred_len):
        super().__init__()
        self.Linear = nn.Linear(seq_len, pred_len)
    def forward(self, x):
        return self.Linear(x.permute(0, 2, 1)).permute(0, 2, 1)
"""


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_layer_on_its_input_with_the_last_two_dims_swapped_equals_its_weight_batched_from_the_left():
    [finding] = [f for f in lint_source(SOURCE, "model.py", [get_rule("MAT302")], prefilter=False)]
    assert "`torch.matmul(self.Linear.weight.expand(*x.shape[:-2], -1, -1), x)` (plus `self.Linear.bias[:, None]`" \
        in finding.message
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(7, 5), torch.randn(3, 7, 4)
    with _Ops() as original:
        expected = layer(x.permute(0, 2, 1)).permute(0, 2, 1)
    with _Ops() as advised:
        got = torch.matmul(layer.weight.expand(*x.shape[:-2], -1, -1), x) + layer.bias[:, None]
    with _Ops() as plain:
        layer.weight @ x
    assert torch.allclose(expected, got, atol=1e-6)
    assert "clone" in original.names and "clone" not in advised.names
    assert "clone" in plain.names  # why the advice expands the weight: `weight @ x` folds and copies
