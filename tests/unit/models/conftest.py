"""The compiled CPU kernels, for the tests that call them directly."""

import pytest

from sluice.models.kernels import kernel_ops
from tests.cpu import has_avx2


@pytest.fixture(scope="module")
def ops():
    if not has_avx2():
        pytest.skip("the CPU lacks AVX2/FMA/F16C, so the kernels cannot run here")
    mod = kernel_ops()
    assert mod is not None, "the kernels failed to build or load on a CPU with AVX2 (see the log)"
    yield mod
    mod.set_isa("auto")  # a test may have pinned an ISA
