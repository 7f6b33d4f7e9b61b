"""MAT301 at run time: a `.contiguous()` copy that a GEMM on another line reads, where the GEMM
would have read the tensor as it was (a transpose of the last two dims, batch dims that fold);
copies of layouts a GEMM cannot read stay quiet (MAT302's ground)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from matlint.runtime_guard.session import Guard  # noqa: E402


def test_a_needless_contiguous_before_a_gemm_is_found_at_its_line():
    a = torch.randn(64, 128)
    w = torch.nn.Parameter(torch.randn(32, 128))
    opt = torch.optim.SGD([w], lr=0.01)
    x3 = torch.randn(4, 8, 16, 32)
    with Guard(json_path=None, report=False, estimate_savings=False, select="MAT301") as g:
        for _ in range(5):
            opt.zero_grad()
            wt = w.t().contiguous()                       # 2-D transpose: mm reads it as is
            y = torch.mm(a, wt)
            kt = x3.transpose(-2, -1).contiguous()        # 4-D, last two dims swapped: bmm reads it
            s = torch.matmul(x3, kt)
            p = x3.permute(1, 0, 2, 3).contiguous()       # batch dims swapped: the copy is needed
            r = torch.matmul(p, p.transpose(-2, -1))
            (y.sum() + s.sum() + r.sum()).backward()
            opt.step()
    source = open(__file__).read().splitlines()
    found = {source[f.row - 1].strip().split(" =")[0]: f for f in g.findings}
    assert set(found) == {"wt", "kt"}, [(f.row, f.message) for f in g.findings]
    assert found["wt"].evidence["per_step"] == 1 and "drop the `.contiguous()`" in found["wt"].message
    assert found["kt"].evidence["shapes"] == ["(4, 8, 32, 16)"]
