"""Parameter values that only the full run (`make test`) covers; the fast tier (`make test-fast`) keeps
the bfloat16 cases of the kernel tests, whose float32 twins check the same code paths."""
import pytest
import torch

FLOAT32_IN_FULL_RUN = pytest.param(torch.float32, marks=pytest.mark.slow, id="float32")
