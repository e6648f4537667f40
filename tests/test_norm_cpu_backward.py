"""The CPU backward kernels (kernels/norm_cpu_backward.cpp) against float64 autograd of PyTorch's own
norms, through a test-only binding (cpu_backward_ext.cpp): the package does not call them yet."""
import hashlib
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import assert_matches_reference, reference_layer_norm, reference_rms_norm
from fastnorm import kernels

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HERE = Path(__file__).resolve().parent


def build_ext():
    """The test binding, built once per source version (cached like the package's own extension)."""
    from torch.utils import cpp_extension

    sources = [HERE / "cpu_backward_ext.cpp", kernels.KERNELS_DIR / "norm_cpu_backward.cpp"]
    headers = [kernels.KERNELS_DIR / h for h in ("cpu_vec.h", "norm_backward_params.h", "norm_params.h")]
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sources + headers:
        digest.update(path.read_bytes())
    name = f"fastnorm_cpu_backward_test_{digest.hexdigest()[:12]}"
    openmp = [] if sys.platform == "darwin" else ["-fopenmp"]
    build_dir = None
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        build_dir = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / name
        build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=["-O3"] + openmp,
                              extra_ldflags=openmp, extra_include_paths=[str(kernels.KERNELS_DIR)],
                              build_directory=None if build_dir is None else str(build_dir))


@pytest.fixture(scope="module")
def ext():
    return build_ext()


CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}  # FastnormDtype


def wide(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def outer_view(t, begin):
    """t and the stride between its outer indices when dims [begin, ndim) are dense and the outer dims
    collapse into one index (the layout the kernels read in place), else a contiguous copy."""
    tail = math.prod(t.shape[begin:])
    expected = 1
    for d in reversed(range(begin, t.dim())):
        if t.size(d) != 1 and t.stride(d) != expected:
            return t.contiguous(), tail
        expected *= t.size(d)
    outer_dims = [d for d in range(begin) if t.size(d) != 1]
    if not outer_dims:
        return t, tail
    stride, span = t.stride(outer_dims[-1]), t.size(outer_dims[-1])
    for d in reversed(outer_dims[:-1]):
        if t.stride(d) != stride * span:
            return t.contiguous(), tail
        span *= t.size(d)
    return (t, stride) if stride >= tail else (t.contiguous(), tail)


def run_backward(ext, x, dy, weight, want_bias, rms, dims, eps=1e-5, saved=None, workspace_bytes=-1,
                 param_dtype=None, want_dx=True, want_dw=True):
    """dx, dweight, dbias (dbias None unless wanted) from the kernels, over dims [begin, end)."""
    begin, end = dims
    param_dtype = param_dtype or (weight.dtype if weight is not None else wide(x.dtype))
    outer, n = x.shape[:begin].numel(), x.shape[begin:end].numel()
    inner = x.shape[end:].numel()
    xv, xs = outer_view(x, begin)
    dyv, dys = outer_view(dy, begin)
    dx = torch.empty(x.shape, dtype=x.dtype) if want_dx else None
    dw = torch.full((n,), 12345.0, dtype=param_dtype) if want_dw else None  # must be overwritten
    db = torch.full((n,), 12345.0, dtype=param_dtype) if want_bias else None
    mean, rstd = saved if saved is not None else (None, None)
    ext.norm_backward(xv, dyv, weight, dx, dw, db, mean, rstd, [outer, n, inner, xs, dys],
                      [CODES[x.dtype], CODES[param_dtype]], rms, eps, workspace_bytes)
    return dx, dw, db


def reference_grads(x, dy, weight, bias, rms, dims, eps=1e-5):
    """dx, dweight, dbias of sum(norm(x) * dy) by float64 autograd over dims [begin, end)."""
    begin, end = dims
    x64 = x.detach().double().clone().requires_grad_()  # a copy: x itself when float64
    w64 = None if weight is None else weight.detach().double().clone().requires_grad_()
    b64 = None if bias is None else bias.detach().double().clone().requires_grad_()
    dim = tuple(range(begin, end))
    if rms:
        y = reference_rms_norm(x64, None, w64, eps, dim=dim)
    else:
        y = reference_layer_norm(x64, None, w64, b64, eps, dim=dim)
    (y * dy.double()).sum().backward()
    shape = x.shape[begin:end]
    dw = x64.new_zeros(shape) if w64 is None else w64.grad
    if w64 is None:  # dweight without a weight: the gradient a weight of ones would get
        ones = torch.ones(shape, dtype=torch.float64, requires_grad=True)
        x1 = x.detach().double()
        y1 = (reference_rms_norm(x1, None, ones, eps, dim=dim) if rms
              else reference_layer_norm(x1, None, ones, None, eps, dim=dim))
        (y1 * dy.double()).sum().backward()
        dw = ones.grad
    db = None if rms else dy.double().sum(tuple(d for d in range(x.dim()) if not begin <= d < end))
    return x64.grad, dw.reshape(-1), None if db is None else db.reshape(-1)


# (shape, normalized dims [begin, end)): rows (inner == 1) and the channel axis (inner > 1), with
# tails, several statistics chunks (n > 2048 / many channels), > 64 rows (several groups, fp32 flushes).
CASES = [
    ((5, 33), (1, 2)),
    ((3, 2500), (1, 2)),
    ((70, 7), (1, 2)),
    ((2, 1, 5), (1, 2)),
    ((2, 12, 3, 5), (1, 2)),
    ((2, 300, 9), (1, 2)),
    ((3, 5, 70), (1, 2)),
    ((4, 3, 2, 2), (1, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dims", CASES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("affine", ["plain", "w", "wb"])
def test_backward_matches_float64_autograd(ext, shape, dims, rms, affine, dtype):
    if rms and affine == "wb":
        pytest.skip("RMSNorm has no bias")
    x = (torch.randn(shape, dtype=torch.float64) * 2 + (0 if rms else 1000 if dtype == torch.float64 else 3)).to(dtype)
    dy = torch.randn(shape, dtype=torch.float64).to(dtype)
    pshape = shape[dims[0]:dims[1]]
    weight = torch.randn(pshape, dtype=dtype) if affine != "plain" else None
    bias = torch.randn(pshape, dtype=dtype) if affine == "wb" else None
    dx, dw, db = run_backward(ext, x, dy, weight, not rms, rms, dims)
    ref_dx, ref_dw, ref_db = reference_grads(x, dy, weight, bias, rms, dims)
    assert dx.dtype == dtype and dw.dtype == (dtype if weight is not None else wide(dtype))
    assert_matches_reference(dx, ref_dx)
    assert_matches_reference(dw, ref_dw, dw.dtype)
    if not rms:
        assert_matches_reference(db, ref_db, db.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_weight_with_half_input(ext, dtype):
    x = torch.randn(6, 129).to(dtype)
    dy = torch.randn(6, 129).to(dtype)
    w = torch.randn(129)
    dx, dw, db = run_backward(ext, x, dy, w, True, False, (1, 2))
    ref_dx, ref_dw, ref_db = reference_grads(x, dy, w, torch.zeros(129), False, (1, 2))
    assert dx.dtype == dtype and dw.dtype == torch.float32
    assert_matches_reference(dx, ref_dx)
    assert_matches_reference(dw, ref_dw)
    assert_matches_reference(db, ref_db)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,dims", [((9, 40), (1, 2)), ((3, 20, 7), (1, 2)), ((5, 4100), (1, 2))], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_saved_statistics(ext, shape, dims, rms, dtype):
    """Given the forward's mean / rstd (float32, float64 for double), the same gradients as recomputing."""
    x = torch.randn(shape, dtype=dtype)
    dy = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[dims[0]:dims[1]], dtype=dtype)
    x64 = x.double().movedim(1, -1)
    mean = torch.zeros(x64.shape[:-1], dtype=torch.float64) if rms else x64.mean(-1)
    var = (x64 ** 2).mean(-1) if rms else x64.var(-1, unbiased=False)
    saved = (mean.to(wide(dtype)), torch.rsqrt(var + 1e-5).to(wide(dtype)))
    dx, dw, db = run_backward(ext, x, dy, w, not rms, rms, dims, saved=saved)
    ref_dx, ref_dw, ref_db = reference_grads(x, dy, w, None if rms else torch.zeros_like(w), rms, dims)
    assert_matches_reference(dx, ref_dx)
    assert_matches_reference(dw, ref_dw)
    if not rms:
        assert_matches_reference(db, ref_db)


@pytest.mark.parametrize("shape,dims", [((200, 65), (1, 2)), ((3, 5000), (1, 2)), ((32, 2100), (1, 2)),
                                        ((40, 3000), (1, 2)), ((6, 40, 33), (1, 2))], ids=str)
def test_thread_count_does_not_change_the_bits(ext, shape, dims):
    x = torch.randn(shape) + 5
    dy = torch.randn(shape)
    w = torch.randn(shape[dims[0]:dims[1]])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_backward(ext, x, dy, w, True, False, dims)
        torch.set_num_threads(max(2, threads))
        many = run_backward(ext, x, dy, w, True, False, dims)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


# A few long rows go by blocks of columns (<= 32 rows of >= 2048 with dweight / dbias: 2 and 32 rows,
# a short last block, a tail step); more rows, groups of at least 16384 elements (40 x 3000: 7 groups).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(2, 2051), (32, 3077), (40, 3000)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("wanted", ["all", "no_dx", "dbias_only"])
def test_few_long_rows(ext, shape, rms, wanted, dtype):
    if rms and wanted == "dbias_only":
        pytest.skip("RMSNorm has no bias")
    x = (torch.rand(shape, dtype=torch.float64) * 4 + (0 if rms else 1000)).to(dtype)
    dy = torch.randn(shape, dtype=torch.float64).to(dtype)
    w = torch.randn(shape[1], dtype=dtype)
    weight = None if wanted == "dbias_only" else w
    dx, dw, db = run_backward(ext, x, dy, weight, not rms, rms, (1, 2), param_dtype=dtype,
                              want_dx=wanted == "all", want_dw=wanted != "dbias_only")
    ref_dx, ref_dw, ref_db = reference_grads(x, dy, weight, None if rms else torch.zeros_like(w), rms, (1, 2))
    if wanted == "all":
        assert_matches_reference(dx, ref_dx)
    if wanted != "dbias_only":
        assert_matches_reference(dw, ref_dw, dw.dtype)
    if not rms:
        assert_matches_reference(db, ref_db, db.dtype)


def test_external_workspace_and_strided_views(ext):
    """A caller's workspace (garbage-filled) gives the same bits; x / dy with padded rows (outer
    stride > n) and a view starting one element into its buffer are read in place."""
    assert outer_view(torch.randn(81, 50)[:, 5:38], 1)[1] == 50
    base = torch.randn(81 * 40 + 1)
    x = base[1:].view(81, 40)[:, :33]
    dy = torch.randn(81, 50)[:, 5:38]
    w = torch.randn(33)
    inside = run_backward(ext, x, dy, w, True, False, (1, 2))
    outside = run_backward(ext, x, dy, w, True, False, (1, 2), workspace_bytes=0)
    for a, b in zip(inside, outside):
        assert torch.equal(a, b)
    ref_dx, ref_dw, ref_db = reference_grads(x, dy, w, torch.zeros(33), False, (1, 2))
    assert_matches_reference(inside[0], ref_dx)
    assert_matches_reference(inside[1], ref_dw)
    assert_matches_reference(inside[2], ref_db)
    xc = torch.randn(2, 9, 4, 5)[:, 2:8]  # channel axis, outer stride 9 * 20 > 6 * 20
    dyc = torch.randn(2, 6, 4, 5)
    wc = torch.randn(6)
    dx, dw, _ = run_backward(ext, xc, dyc, wc, False, True, (1, 2))
    ref_dx, ref_dw, _ = reference_grads(xc, dyc, wc, None, True, (1, 2))
    assert_matches_reference(dx, ref_dx)
    assert_matches_reference(dw, ref_dw)


def test_empty_inputs(ext):
    x = torch.randn(0, 7)
    dx, dw, db = run_backward(ext, x, x.clone(), torch.randn(7), True, False, (1, 2))
    assert dx.shape == (0, 7) and torch.equal(dw, torch.zeros(7)) and torch.equal(db, torch.zeros(7))


def test_bad_calls_get_clear_errors(ext):
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="both saved mean and rstd"):
        run_backward(ext, x, x, None, False, False, (1, 2), saved=(None, torch.ones(4)))
    with pytest.raises(RuntimeError, match="input's dtype or float32"):
        run_backward(ext, x, x, torch.randn(8, dtype=torch.float16), False, False, (1, 2))
    with pytest.raises(RuntimeError, match="workspace smaller"):
        run_backward(ext, x, x, None, True, False, (1, 2), workspace_bytes=8)


def test_scalar_kernels_without_simd(ext):
    """FASTNORM_CPU_SIMD=0 runs the portable scalar backward (what a CPU without AVX2 gets)."""
    script = textwrap.dedent("""
        import torch
        from conftest import assert_matches_reference
        from test_norm_cpu_backward import build_ext, reference_grads, run_backward
        ext = build_ext()
        torch.manual_seed(0)
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            for shape, rms in (((6, 37), False), ((2, 5, 9), True), ((3, 2100), False)):  # 3 x 2100: few long rows
                x = (torch.randn(shape, dtype=torch.float64) + 3).to(dtype)
                dy = torch.randn(shape, dtype=torch.float64).to(dtype)
                w = torch.randn(shape[1], dtype=dtype)
                got = run_backward(ext, x, dy, w, not rms, rms, (1, 2))
                want = reference_grads(x, dy, w, None if rms else torch.zeros_like(w), rms, (1, 2))
                for g, r in zip(got, want):
                    if r is not None:
                        assert_matches_reference(g, r, g.dtype)
        print("scalar ok")
    """)
    env = dict(os.environ, FASTNORM_CPU_SIMD="0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + sys.path)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "scalar ok" in result.stdout, result.stderr[-3000:]
