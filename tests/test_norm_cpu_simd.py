"""The CPU forward's vector paths (kernels/cpu_vec.h, norm_cpu.cpp) against float64 references: row
tails (n not a multiple of the vector), channel blocks of every width, starts off the vector grid,
strided rows, several statistics chunks, first elements far from the mean, the thread count, and the
scalar kernels a CPU without AVX2 gets."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fastnorm
from conftest import assert_matches_reference, reference_layer_norm, reference_rms_norm

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TAIL_SIZES = [1, 3, 7, 15, 17, 31, 33, 257, 1000]


def affine(n, dtype):
    return torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)


def check_rows(x, w=None, b=None):
    """LayerNorm (with w, b) and RMSNorm (with w) over the last dim of x against float64."""
    ns = x.shape[-1:]
    assert_matches_reference(fastnorm.layer_norm(x, ns, w, b, 1e-5), reference_layer_norm(x, ns, w, b, 1e-5))
    assert_matches_reference(fastnorm.rms_norm(x, ns, w, 1e-5), reference_rms_norm(x, ns, w, 1e-5))


def check_channels(x, w=None, b=None):
    """The same over dim 1."""
    assert_matches_reference(fastnorm.layer_norm(x, None, w, b, 1e-5, dim=1),
                             reference_layer_norm(x, None, w, b, 1e-5, dim=1))
    assert_matches_reference(fastnorm.rms_norm(x, None, w, 1e-5, dim=1), reference_rms_norm(x, None, w, 1e-5, dim=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", TAIL_SIZES)
def test_row_tails(n, dtype):
    """Every remainder of a row against the vector step (8 floats, 16 halves, 4 doubles)."""
    x = (torch.randn(3, n, dtype=torch.float64) * 3 + 2).to(dtype)
    check_rows(x, *affine(n, dtype))
    check_rows(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [2, 3, 5, 9, 15, 17, 33, 49, 65, 100])
def test_channel_block_widths(inner, dtype):
    """Blocks of 1, 2, 4 and 8 vectors along inner, partial ones, and several blocks per slab."""
    x = (torch.randn(3, 6, inner, dtype=torch.float64) + 1).to(dtype)
    check_channels(x, *affine(6, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_starts(dtype):
    """Views whose first element is one element into their buffer (off every vector boundary)."""
    rows = torch.randn(5 * 257 + 1, dtype=torch.float64).to(dtype)[1:].view(5, 257)
    check_rows(rows, *affine(257, dtype))
    chans = torch.randn(2 * 7 * 45 + 1, dtype=torch.float64).to(dtype)[1:].view(2, 7, 45)
    check_channels(chans, *affine(7, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_rows(dtype):
    """Rows further apart than their length (outer stride > n) and channel slabs the same."""
    rows = torch.randn(9, 300, dtype=torch.float64).to(dtype)[:, 5:262]
    assert rows.stride(0) == 300
    check_rows(rows, *affine(257, dtype))
    chans = torch.randn(3, 10, 6, 7, dtype=torch.float64).to(dtype)[:, 1:9]
    check_channels(chans, *affine(8, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_several_statistics_chunks(dtype):
    """Rows longer than a chunk (2048) and channels deeper than a block's chunk, at an offset."""
    x = (torch.randn(2, 5000, dtype=torch.float64) + 100).to(dtype)
    check_rows(x, *affine(5000, dtype))
    xc = (torch.randn(2, 700, 3, dtype=torch.float64) + 100).to(dtype)
    check_channels(xc, *affine(700, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_first_element_far_from_the_mean(dtype):
    """Statistics centered on a chunk's first element need a second pass when it lies far out."""
    x = torch.randn(4, 3000, dtype=torch.float64) + 1000
    x[:, 0] = 1e5  # first element of the first chunk
    x[:, 2048] = -1e5  # and of the second
    x = x.to(dtype)
    check_rows(x)
    xc = torch.randn(2, 300, 20, dtype=torch.float64) + 1000
    xc[:, 0, 3] = 1e5
    check_channels(xc.to(dtype))


def test_channel_inf_and_nan_columns():
    x = torch.randn(2, 6, 9)
    x[0, 2, 4] = float("nan")
    x[1, 3, 7] = float("inf")
    y = fastnorm.layer_norm(x, dim=1)
    assert y[0, :, 4].isnan().all() and y[1, :, 7].isnan().all()
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 4] = mask[1, 7] = False
    ref = reference_layer_norm(x.nan_to_num(0.0, 0.0, 0.0), dim=1)
    assert_matches_reference(y.permute(0, 2, 1)[mask], ref.permute(0, 2, 1)[mask])


@pytest.mark.parametrize("shape,dim", [((2, 70000), -1), ((3, 2**14 + 3), -1), ((300, 65), -1),
                                       ((4, 40, 33, 17), 1), ((2, 3, 100, 100), 1), ((64, 256, 2, 3), 1)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bitwise_same_for_any_thread_count(shape, dim, dtype):
    """Few long rows (split across threads), many rows, and channel blocks: the same bits."""
    x = (torch.randn(shape) * 2 + 7).to(dtype)
    threads = torch.get_num_threads()
    try:
        out = []
        for t in (1, max(2, threads), 3):
            torch.set_num_threads(t)
            out.append((fastnorm.layer_norm(x, dim=dim), fastnorm.rms_norm(x, dim=dim)))
    finally:
        torch.set_num_threads(threads)
    for other in out[1:]:
        assert torch.equal(out[0][0], other[0]) and torch.equal(out[0][1], other[1])


def test_scalar_kernels_without_simd():
    """FASTNORM_CPU_SIMD=0 runs the portable scalar kernels (what a CPU without AVX2 gets)."""
    script = textwrap.dedent("""
        import torch, fastnorm
        from conftest import assert_matches_reference, reference_layer_norm, reference_rms_norm
        torch.manual_seed(0)
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            x = (torch.randn(5, 37, dtype=torch.float64) + 1000).to(dtype)
            w, b = torch.randn(37, dtype=dtype), torch.randn(37, dtype=dtype)
            assert_matches_reference(fastnorm.layer_norm(x, (37,), w, b), reference_layer_norm(x, (37,), w, b))
            assert_matches_reference(fastnorm.rms_norm(x, (37,), w), reference_rms_norm(x, (37,), w))
            xc = torch.randn(2, 5, 3, dtype=torch.float64).to(dtype)
            assert_matches_reference(fastnorm.layer_norm(xc, dim=1), reference_layer_norm(xc, dim=1))
        print("scalar ok")
    """)
    env = dict(os.environ, FASTNORM_CPU_SIMD="0")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__)] + sys.path)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "scalar ok" in result.stdout, result.stderr[-3000:]
