"""Parameter values that only the full run (`make test`) covers; the fast tier (`make test-fast`) keeps
the bfloat16 cases of the kernel tests, whose float32 twins check the same code paths, and one or two
values of each other axis of a kernel test's grid (the smaller head_dim, a partial tile, the first and
last row counts). Under TRITON_INTERPRET=1 every case costs a tenth of a second or more, so the grids'
products are what the full run is for."""
import pytest
import torch

FLOAT32_IN_FULL_RUN = pytest.param(torch.float32, marks=pytest.mark.slow, id="float32")


def in_full_run(*values, ids=None):
    """The values as parameters marked slow: `[1, *in_full_run(3), 16]`. A tuple is the values of a
    parametrize over several names. Without ids they keep the test ids that the bare values get."""
    ids = ids or [None] * len(values)
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow, id=i)
            for v, i in zip(values, ids)]
