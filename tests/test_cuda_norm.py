"""CUDA kernels against float64 references: every dtype, layout and kernel path (needs a GPU)."""
import math

import pytest
import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import extension
from fastnorm.ops.validate import default_rms_eps
from profiled import kernels_of

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DEV = "cuda"
# Max |out - ref| allowed, relative to max(1, |ref|): rounding of the output dtype plus fp32 statistics.
TOL = {torch.float32: 2e-5, torch.float64: 1e-10, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(x, begin, end, weight=None, bias=None, eps=1e-5, rms=False):
    """float64 result of LayerNorm / RMSNorm over dims [begin, end)."""
    xd = x.double()
    dims = tuple(range(begin, end))
    if rms:
        y = xd * torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    else:
        mean = xd.mean(dims, keepdim=True)
        y = (xd - mean) * torch.rsqrt((xd - mean).pow(2).mean(dims, keepdim=True) + eps)
    shape = tuple(x.shape[begin:end]) + (1,) * (x.dim() - end)
    if weight is not None:
        y = y * weight.double().reshape(shape)
    if bias is not None:
        y = y + bias.double().reshape(shape)
    return y


def poison_allocator(like):
    """Leave a NaN-filled block in the caching allocator, so an unwritten output element shows as NaN."""
    junk = torch.full((like.numel(),), float("nan"), dtype=like.dtype, device=DEV)
    del junk


def check(out, ref, dtype, x=None):
    """Scaled error within TOL. Inputs far from zero (x + 1000) must meet the same bound: statistics are
    taken relative to a shift, so the offset costs no precision (a naive sum/sum-of-squares variance is
    off by ~1e-2 there); only beyond |x| ~ 1000 does the bound grow with max|x|."""
    assert out.dtype == dtype
    assert out.shape == ref.shape
    assert torch.isfinite(out).all(), "output has NaN/Inf (unwritten or overflowed elements)"
    tol = TOL[dtype] * (max(1.0, x.abs().max().item() / 1000) if x is not None else 1.0)
    err = (out.double() - ref).abs() / ref.abs().clamp(min=1.0)
    assert err.max().item() <= tol, f"max scaled error {err.max().item():.3g} > {tol:.3g}"


def run_op(x, begin, end, weight, bias, eps, rms):
    poison_allocator(x)
    if rms:
        return fastnorm.rms_norm(x, None, weight, eps, dim=tuple(range(begin, end)))
    return fastnorm.layer_norm(x, None, weight, bias, eps, dim=tuple(range(begin, end)))


def make(shape, dtype, kind, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    if kind == "rand":
        x = torch.rand(shape, device=DEV, generator=g, dtype=torch.float32)
    else:
        x = torch.randn(shape, device=DEV, generator=g, dtype=torch.float32)
        if kind == "offset":
            x = x + 1000.0
    return x.to(dtype)


def params(n_shape, dtype, affine, seed):
    if not affine:
        return None, None
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    w = (torch.rand(n_shape, device=DEV, generator=g) + 0.5).to(dtype)
    b = torch.randn(n_shape, device=DEV, generator=g).to(dtype)
    return w, b


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ROW_SHAPES = [(1, 1), (3, 7), (5, 33), (64, 64), (7, 1000), (300, 1024), (17, 4096), (8, 4097),
              (4, 12288), (2, 65536), (3, 100003), (1, 262144), (33, 8192), (130, 2048),
              (150, 65536), (40, 262152), (140, 50001), (600, 24584),  # these four: cluster rows
              (300, 257), (1000, 3), (200, 1023), (2000, 513), (140, 33),  # scalar rows: the offset-row kernel
              (300, 1429), (40, 4973), (3, 8185), (3, 8189), (2, 8191), (1000, 32), (700, 35),  # (to its limits)
              (5000, 1), (3001, 5), (999, 17), (700, 31),  # many tiny rows: the thread-row kernel (float64
              (300001, 7), (200, 16), (200, 24),  # 17-31: the row kernel); more rows than its grid covers
              (1, 366452), (11, 22150), (50, 40001), (2, 2**22 + 3),  # scalar split, cached-row, streamed rows
              (1000, 1000), (2000, 512), (4000, 64)]  # more rows than SMs in one wave: the few-rows kernel


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_last_dim(shape, dtype, rms):
    for i, kind in enumerate(["randn", "rand", "offset"]):
        if kind == "offset" and (rms or dtype in (torch.float16, torch.bfloat16)):
            continue  # RMS of x+1000 is ~1 everywhere; half types cannot hold 1000 + small noise
        x = make(shape, dtype, kind, seed=hash((shape, i)) % 1000)
        w, b = params(shape[-1:], dtype, affine=i != 1, seed=i)
        b = None if rms else b
        out = run_op(x, x.dim() - 1, x.dim(), w, b, 1e-5, rms)
        check(out, reference(x, x.dim() - 1, x.dim(), w, b, 1e-5, rms), dtype, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 5, 17, 31, 32, 100, 256, 1000, 1024, 1429, 4097, 8185])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("kernel", ["chunked", "chunked_fewest_threads", "warp"])
@pytest.mark.parametrize("rows", [400, 40])
def test_misaligned_rows_of_any_length(n, dtype, rms, kernel, rows, monkeypatch):
    """Row starts off a 16-byte boundary (x a view one element into its storage, rows n + 3 apart, so x's
    rows and y's start at different offsets): the thread-row kernel below 32 elements, the offset-row kernel
    from 32, chunked (a group of threads a row, 16-byte chunks) or a warp a row (up to 1024; each forced
    by FASTNORM_OFFSET_ROWS; chunked also without its fill rule), with many rows (past the few-rows kernel)
    and fewer than SMs, every parameter case."""
    monkeypatch.setenv("FASTNORM_OFFSET_ROWS", kernel.split("_")[0])
    monkeypatch.setenv("FASTNORM_STRIDED_ROWS", "0")  # rows of 1025+: test_strided_rows
    if kernel == "chunked_fewest_threads":  # small calls get more threads a row (the fill rule): not here
        monkeypatch.setenv("FASTNORM_OFFSET_ROW_FILL", "0")
    base = make((rows, n + 3), dtype, "randn", seed=n)
    x = base[:, 1:n + 1]
    for w, b in [params((n,), dtype, True, n), (None, None)]:
        out = run_op(x, 1, 2, w, None if rms else b, 1e-5, rms)
        check(out, reference(x, 1, 2, w, None if rms else b, 1e-5, rms), dtype, x)
    if dtype == torch.float32 and not rms:
        x = (base + 1000.0)[:, 1:n + 1]
        check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype, x)


def scalar_rows(rows, n, dtype, layout, seed):
    """rows x n scalar rows (VEC 1) as the row-kernel tests lay them out: contiguous rows of odd n (one element into
    their storage where n is a multiple of 8), x shifted one element (x's rows and y's at other offsets) or padded
    rows (stride n + 5); and far(), which makes the same rows of x + 1000."""
    offset = 0 if layout == "padded" else 1 if layout == "shifted" or n % 8 == 0 else 0
    stride = n + 5 if layout == "padded" else n
    base = make((rows * stride + offset + 5,), dtype, "randn", seed=seed)
    def view(t):
        return t[offset:offset + rows * stride].view(rows, stride)[:, :n]
    return view(base), lambda: view(base + 1000.0)


def check_parameter_cases(x, far, n, dtype, w, b):
    """x's LayerNorm and RMSNorm with weight and bias, none, bias alone and float32 weights for the half types;
    float32 LayerNorm also far from zero."""
    cases = [(w, b), (None, None), (None, b)] + ([(w.float(), b.float())] if dtype != torch.float32 else [])
    for w_, b_ in cases:
        for rms in (False, True):
            if rms and w_ is None and b_ is not None:
                continue
            out = run_op(x, 1, 2, w_, None if rms else b_, 1e-5, rms)
            check(out, reference(x, 1, 2, w_, None if rms else b_, 1e-5, rms), dtype, x)
    if dtype == torch.float32:
        x1000 = far()
        check(run_op(x1000, 1, 2, w, b, 1e-5, False), reference(x1000, 1, 2, w, b), dtype, x1000)


def check_saved_statistics(x, n, dtype, w, b):
    """A training forward of x (the view itself, and an aligned copy) saves the statistics its backward reads:
    gradients against float64."""
    dy = make(tuple(x.shape), dtype, "randn", seed=3)
    for xin in (x.detach().clone().requires_grad_(True), x.detach().requires_grad_(True)):
        out = fastnorm.layer_norm(xin, (n,), w, b, 1e-5)
        (gx,) = torch.autograd.grad(out, xin, dy)
        xd = xin.detach().double().requires_grad_(True)
        (gd,) = torch.autograd.grad(F.layer_norm(xd, (n,), w.double(), b.double(), 1e-5), xd, dy.double())
        scale = gd.abs().max().item()
        grad_tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}[dtype]  # as test_backward.py
        assert (gx.double() - gd).abs().max().item() <= grad_tol * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1025, 1429, 2048, 2049, 4097, 8192, 8193, 12001, 16384])
@pytest.mark.parametrize("layout", ["contiguous", "shifted", "padded"])
@pytest.mark.parametrize("rows", [1200, 600, 40])
@pytest.mark.parametrize("k", ["planned", "8", "16"])
def test_strided_rows(n, dtype, layout, rows, k, monkeypatch):
    """The strided-row kernel (scalar rows of 1025-16384, a block a row, element j in thread j % B), forced
    (FASTNORM_STRIDED_ROWS=1), each of its instances: 1200 rows (8+ an SM) take 16 elements a thread on 256
    threads for rows of up to 4096, on 512 up to 8192, on 1024 past that; 600 rows 8 on up to 1024 threads up to 4096 (a
    latency-bound call), 40 rows (fewer than SMs) up to 8192; on scalar_rows' layouts and every parameter case.
    FASTNORM_STRIDED_ROW_K (A/B switches): =8, 8 elements a thread on up to 512 threads for rows of up to 4096
    in 1200 rows; =16, 16 a thread in every call."""
    monkeypatch.setenv("FASTNORM_STRIDED_ROWS", "1")
    if k != "planned":
        monkeypatch.setenv("FASTNORM_STRIDED_ROW_K", k)
    x, far = scalar_rows(rows, n, dtype, layout, seed=n + rows)
    w, b = params((n,), dtype, True, n)
    check_parameter_cases(x, far, n, dtype, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [256, 257, 1025, 2048, 4097, 8192, 12001])
@pytest.mark.parametrize("layout", ["contiguous", "shifted", "padded"])
@pytest.mark.parametrize("k", ["1", "2", "4", "planned"])
def test_granule_rows(n, dtype, layout, k, monkeypatch):
    """The granule-row kernel (a block a row, each thread 1, 2 or 4 16-byte granules of x's grid, the output in
    y's grid), forced (FASTNORM_GRANULE_ROWS=1) on 300 rows, or as planned on 1200 (8+ an SM: not latency-bound;
    it takes float16 rows of 1025+, the others of 2048+, up to 24 KB, and leaves the others to other kernels), on
    scalar_rows' layouts, every parameter case and the statistics a training forward saves. Float32 rows up to
    8189 that it would take go to the strided kernel's fixed blocks instead."""
    if k != "planned":
        monkeypatch.setenv("FASTNORM_GRANULE_ROWS", "1")
        monkeypatch.setenv("FASTNORM_GRANULE_ROW_K", k)
    rows = 300 if k != "planned" else 1200
    x, far = scalar_rows(rows, n, dtype, layout, seed=n + (int(k) if k != "planned" else 9))
    w, b = params((n,), dtype, True, n)
    if k == "planned":
        names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, False))
        # float32 rows whose x starts at y's offsets in their 16 bytes (y: new, contiguous, its rows r * n apart)
        # stay on the chunked offset-row kernel
        elem = x.element_size()
        shifted = elem != 4 or any((x[r].data_ptr() - r * n * elem) % 16 for r in range(16 // elem))
        takes = n >= (1025 if dtype == torch.float16 else 2048) and n * elem <= 24 * 1024 and shifted
        strided = dtype == torch.float32 and 2048 <= n <= 8189 and shifted  # the strided kernel's fixed blocks
        assert any("granule_rows_kernel" in name for name in names) == (takes and not strided), names
        assert any("strided_rows_kernel" in name for name in names) == strided, names
    check_parameter_cases(x, far, n, dtype, w, b)
    check_saved_statistics(x, n, dtype, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n", [(140, 50001), (300, 98305), (150, 65536), (40, 131071), (3, 300001)])
@pytest.mark.parametrize("layout", ["contiguous", "shifted", "padded"])
def test_long_scalar_rows(rows, n, dtype, layout, monkeypatch):
    """Scalar rows past the row kernel's cache (100 KB-1.2 MB): slices of a thread-block cluster (rows of up to 8
    slices of 64 KB, a block for each SM or more; each slice copied as the 16-byte granules that hold it, 2-byte
    ones with 2-byte parameters stored in y's grid) or of the split kernel (3 rows, the streamed kernels off;
    element by element), on scalar_rows' layouts and every parameter case; the kernel asserted."""
    monkeypatch.setenv("FASTNORM_STREAMED", "0")
    x, far = scalar_rows(rows, n, dtype, layout, seed=n + rows)
    w, b = params((n,), dtype, True, n)
    names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, False))
    want = "split_slice_kernel" if rows == 3 else "cluster_row_norm_kernel"
    assert any(want in name for name in names), names
    check_parameter_cases(x, far, n, dtype, w, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("fused", ["1", "0"])
@pytest.mark.parametrize("shape", [(1, 1000), (3, 4097), (11, 22150), (5, 40000), (2, 65544), (1, 300001),
                                   (2, 600000)])
def test_streamed_rows(shape, dtype, rms, fused, monkeypatch):
    """The streamed kernels (forced) on few rows, aligned and one element into their storage, every
    parameter case (float32 parameters of the half types too): the finalize step in its own launch
    (FASTNORM_STREAM_FUSE=0) or in each apply block, the apply kernel sweeping every row (one row; 2 x 600000 but
    in the 2-byte types' aligned rows) or a block a row's column chunk (the others); scalar rows (odd n, the
    shifted views) in 16-byte granules but where the apply blocks sweep several rows; float32 and float64
    LayerNorm also at x + 1000."""
    monkeypatch.setenv("FASTNORM_STREAMED", "1")
    monkeypatch.setenv("FASTNORM_STREAM_FUSE", fused)
    m, n = shape
    base = make((m, n + 1), dtype, "randn", seed=n)
    w0, b0 = params((n,), dtype, True, n)
    cases = [(w0, b0), (None, None)] + ([(w0.float(), b0.float())] if dtype in (torch.float16, torch.bfloat16) else [])
    for x in (base[:, :n].contiguous(), base[:, 1:]):
        for w, b in cases:
            out = run_op(x, 1, 2, w, None if rms else b, 1e-5, rms)
            check(out, reference(x, 1, 2, w, None if rms else b, 1e-5, rms), dtype, x)
        if dtype in (torch.float32, torch.float64) and not rms:
            x = x + 1000.0
            check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype, x)


WARP_ROW_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)  # kWarpRowKs (offset_rows_kernel.cuh)


def check_view_rows(rows, n, dtype, rms, seed):
    """Rows of n in a view one element into their storage, against float64: weight and bias, none, weight
    alone; float32 LayerNorm also at x + 1000."""
    base = make((rows, n + 1), dtype, "randn", seed=seed)
    x = base[:, 1:]
    w, b = params((n,), dtype, True, n)
    for w_, b_ in [(w, b), (None, None), (w, None)]:
        b_ = None if rms else b_
        check(run_op(x, 1, 2, w_, b_, 1e-5, rms), reference(x, 1, 2, w_, b_, 1e-5, rms), dtype, x)
    if dtype == torch.float32 and not rms:
        x = (base + 1000.0)[:, 1:]
        check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True])
def test_warp_rows_at_every_width(dtype, rms, monkeypatch):
    """The warp-row kernel (forced) at the limit of each instance (K elements a lane of a row) and one past
    it, on 1001 rows of a view one element in: R rows a warp at once (8 at K = 1 down to 1 from K = 8), the
    last warp's rows partial; every parameter case (float32 rows of 5+ a lane load the parameters 4 columns
    at a time, the last batch partial at K = 5, 6, 10); float32 LayerNorm also at x + 1000."""
    monkeypatch.setenv("FASTNORM_OFFSET_ROWS", "warp")
    for n in sorted({w for k in WARP_ROW_KS for w in (32 * k, 32 * k + 1) if w <= 1024}):
        check_view_rows(rows=1001, n=n, dtype=dtype, rms=rms, seed=n)


@pytest.mark.parametrize("extra", [-8, 8])
def test_float32_short_rows_take_warps_from_a_row_an_sm(extra):
    """Float32 rows of 128-640 at an offset take the warp-row kernel from as many rows as SMs, other kernels
    below; both right."""
    rows = torch.cuda.get_device_properties(0).multi_processor_count + extra
    for n, rms in [(257, True), (301, False), (640, False)]:
        x = make((rows, n + 1), torch.float32, "randn", seed=n + rows)[:, 1:]
        w, b = params((n,), torch.float32, True, n)
        b = None if rms else b
        names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, rms))
        assert any("warp_rows_kernel" in name for name in names) is (extra > 0), names
        check(run_op(x, 1, 2, w, b, 1e-5, rms), reference(x, 1, 2, w, b, 1e-5, rms), torch.float32, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("rows", [1001, 7])
@pytest.mark.parametrize("lanes", ["planned", "8"])
def test_warp_rows_in_lane_groups(dtype, rms, rows, lanes, monkeypatch):
    """Rows of 32-48 elements take 8 or 16 lanes a row, 4 or 2 rows side by side in a warp, 2-byte rows of 49-64
    8 lanes (8 elements a lane) and float32 ones a warp each (warp_row_lanes): every width of 32-64, the warp's
    last rows partial (1001) or fewer rows than one warp takes (7), a view one element in, each parameter case;
    float32 LayerNorm also at x + 1000. FASTNORM_WARP_ROW_LANES=8 (A/B switch): 8 lanes a row wherever an
    instance has them."""
    monkeypatch.setenv("FASTNORM_OFFSET_ROWS", "warp")
    if lanes != "planned":
        monkeypatch.setenv("FASTNORM_WARP_ROW_LANES", lanes)
    for n in range(32, 65):
        check_view_rows(rows=rows, n=n, dtype=dtype, rms=rms, seed=n + rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("k24", ["1", "0"])
@pytest.mark.parametrize("rows", [1001, 200001])
def test_thread_rows_of_17_to_24(dtype, rms, k24, rows, monkeypatch):
    """Rows of 16-25 elements around the thread-row kernel's K = 24 instance (or K = 32, FASTNORM_THREAD_ROW_K24=0),
    in a small call (parameters loaded first) and a large one, a view one element in, each parameter case."""
    monkeypatch.setenv("FASTNORM_THREAD_ROW_K24", k24)
    for n in range(16, 26):
        check_view_rows(rows=rows, n=n, dtype=dtype, rms=rms, seed=n + rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 31, 33, 257, 1429, 5000])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_row_kernel_scalar_rows(n, dtype, offset, monkeypatch):
    """The row kernel on scalar rows (FASTNORM_OFFSET_ROWS=0 leaves them all to it), which caches the 16-byte
    granules that hold each row and reads the row at its offset in them: several rows a block (a barrier
    pair a row), rows n apart from a view `offset` elements in (each row at another offset), the last block
    partial; the output in y's 16-byte grid (parameters read as realigned granules: also as views one element
    into their storage, and float32 for the half types, read one by one); every parameter case, float32
    LayerNorm also at x + 1000."""
    monkeypatch.setenv("FASTNORM_OFFSET_ROWS", "0")
    rows = 1003
    flat = make((rows * n + offset,), dtype, "randn", seed=n + offset)
    x = flat[offset:].view(rows, n)
    w, b = params((n,), dtype, True, n)
    wb, bb = params((n + 1,), dtype, True, n + 1)
    cases = [(w, b), (None, None), (w, None), (wb[1:], bb[1:])]
    if dtype in (torch.float16, torch.bfloat16):
        cases.append((w.float(), b.float()))
    for w_, b_ in cases:
        for rms in (False, True):
            b2 = None if rms else b_
            check(run_op(x, 1, 2, w_, b2, 1e-5, rms), reference(x, 1, 2, w_, b2, 1e-5, rms), dtype, x)
    if dtype == torch.float32:
        x = (flat + 1000.0)[offset:].view(rows, n)
        check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [33, 1000, 1025, 4744, 8189, 8190, 12001, 16377, 16382, 25000, 26000, 32761, 32762])
@pytest.mark.parametrize("offset", [1, 3])
@pytest.mark.parametrize("rows", [400, 9])
def test_shifted_rows(n, dtype, offset, rows):
    """x a view `offset` elements into a contiguous buffer (rows n apart: every row starts at another offset in
    its 16 bytes than y's, the sweep's "off3"): the chunked kernel reads each chunk of y as the two chunks of x
    that hold it, realigned (2-byte types; 4- and 8-byte types only with fewer rows than SMs, else the row
    kernel). Rows past 512 threads of 4 chunks: bfloat16 takes 8 chunks a thread (with float32 weights up to
    3200 chunks: n 25000 yes, 26000 no), past that and for the other types the row kernel. Weights in x's
    dtype and, for the half types, in float32."""
    flat = make((rows * n + offset,), dtype, "randn", seed=n + offset)
    x = flat[offset:].view(rows, n)
    w, b = params((n,), dtype, True, n)
    cases = [(w, b), (None, None)] + ([(w.float(), b.float())] if dtype in (torch.float16, torch.bfloat16) else [])
    for w, b in cases:
        for rms in (False, True):
            out = run_op(x, 1, 2, w, None if rms else b, 1e-5, rms)
            check(out, reference(x, 1, 2, w, None if rms else b, 1e-5, rms), dtype, x)
    if dtype == torch.float32:
        x = (flat + 1000.0)[offset:].view(rows, n)
        check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [33, 1000, 3378, 8189])
@pytest.mark.parametrize("param_offset", [0, 1, 5])
def test_offset_rows_parameters(n, param_offset, dtype):
    """The chunked offset-row kernel copies 16-byte-aligned parameters of x's dtype as vectors and
    realigns them to y's chunks (x at each offset from its 16 bytes: each residue of rows); parameters
    off a 16-byte boundary (views param_offset elements in) are gathered element by element."""
    base = make((40, n + 3), dtype, "randn", seed=n)
    wb = make((2, n + param_offset), dtype, "rand", seed=n + 1) + 0.5
    w, b = wb[0, param_offset:], wb[1, param_offset:] - 1
    for x in (base[:, 1:n + 1], base.flatten()[3:3 + 40 * n].view(40, n), base[:, :n]):
        check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b), dtype, x)
        check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype, x)
        check(run_op(x, 1, 2, None, b, 1e-5, False), reference(x, 1, 2, None, b), dtype, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", ["expand", "every_other_row", "padded", "offset", "padded_offset"])
def test_tiny_row_views(view, dtype):
    """Rows under 32 elements as views: the thread-row kernel reads rows at most K elements apart (K: the
    register count, a power of two >= n) through shared memory in 16-byte chunks from any offset, and rows
    farther apart (every other row, an expanded row: 0 apart) element by element."""
    base = make((2 * 777 + 1, 9), dtype, "randn", seed=len(view))
    x = {"expand": lambda: base[:1, :5].expand(333, 5), "every_other_row": lambda: base[::2, :7],
         "padded": lambda: base[:, :7], "offset": lambda: base.flatten()[3:3 + 555 * 6].view(555, 6),
         "padded_offset": lambda: base[:, 1:6]}[view]()
    n = x.shape[-1]
    w, b = params((n,), dtype, True, seed=3)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b), dtype)
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1_000_003, 1), (70001, 2), (50003, 4), (20001, 8), (4099, 3), (129, 26), (257, 31),
                                   (3000, 16)])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("packed", ["1", "2", "0"], ids=["packed", "packed_two_vectors", "unpacked"])
def test_tiny_contiguous_rows(shape, offset, dtype, packed, monkeypatch):
    """Contiguous rows under 32 elements, x at a 16-byte boundary or not (offset): rows of bytes that divide 16
    at a boundary take the packed-row kernel (whole rows in a vector, 1 or 2 vectors a thread; the rows after
    the last whole vector one by one), FASTNORM_PACKED_ROWS=0 the thread-row kernel (16-byte rows: the row
    kernel); other rows the thread-row kernel (rows of 16 fp32 at a boundary: the row kernel), the last
    block partial."""
    if packed == "0":
        monkeypatch.setenv("FASTNORM_PACKED_ROWS", "0")
    else:
        monkeypatch.setenv("FASTNORM_PACKED_ROW_VECTORS", packed)
    rows, n = shape
    x = make((rows * n + offset,), dtype, "randn", seed=rows + n)[offset:].view(rows, n)
    w, b = params((n,), dtype, True, seed=n)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b), dtype)
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype)
    check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2), dtype)
    if dtype in (torch.float32, torch.float64):  # LayerNorm's sums about a row's first element
        check(run_op(x + 1000, 1, 2, w, b, 1e-5, False), reference(x + 1000, 1, 2, w, b), dtype)


def test_tiny_rows_past_the_grid():
    """More rows of one element than the thread-row kernel's grid covers (132 SMs x 64 blocks x 128 rows):
    the blocks loop."""
    x = make((40_000_001, 1), torch.bfloat16, "randn", seed=5)
    w = params((1,), torch.bfloat16, True, seed=5)[0]
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 1024), (33, 8192), (5, 100003), (4, 2**20), (2, 2**22)])
def test_constant_rows_near_float_max(shape, dtype):
    """Rows of one huge value: the mean must not overflow (a plain sum of 4096 x 3e37 would), so the
    output is exactly the bias."""
    x = torch.full(shape, 3e37, device=DEV, dtype=dtype)
    w, b = params(shape[-1:], dtype, True, seed=4)
    out = run_op(x, 1, 2, w, b, 1e-5, False)
    assert torch.equal(out, b.expand(shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 4096), (17, 4096), (300, 1024), (2000, 512), (4096, 1024), (64, 8192),
                                   (33, 12288), (200, 40), (600, 37), (600, 999)])
@pytest.mark.parametrize("first", ["outlier", "one_hot", "offset_rows"])
def test_layer_norm_first_element_far_from_mean(shape, dtype, first):
    """Rows whose first element is far from their mean: the outlier, the only nonzero value, or far below
    rows offset by 1000. Kernels that take LayerNorm's sums about a row's first element (warp rows: the
    odd widths here) or about a rough mean (few-rows, row kernels) must stay exact: a one-pass sum of
    squares about that element would cancel. Against float64 at the usual tolerance."""
    x = make(shape, torch.float32, "rand" if first == "offset_rows" else "randn", seed=shape[0] + shape[1])
    if first == "outlier":
        x[:, 0] = 1e4
    elif first == "one_hot":
        x.zero_()
        x[:, 0] = 1e3
    else:
        x += 1000.0
        x[:, 0] = -3000.0
    x = x.to(dtype)
    w, b = params(shape[-1:], dtype, True, seed=5)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b, 1e-5, False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4099, 1024), (1031, 4096), (20011, 64), (4099, 48), (1031, 3000), (1031, 3072)])
@pytest.mark.parametrize("rms", [False, True])
def test_row_kernel_count_bounds(shape, dtype, rms, monkeypatch):
    """Vector rows that give each thread of the row kernel at most 2 or 4 vectors (all of these: exactly 4,
    4, 2 (float64: 4), 1-2, 2-3 and 3) take its variants with that bound built in, rows of exactly 4 the variant with that
    count: the same bits as the bound alone (FASTNORM_ROW_EXACT=0) and the general kernel
    (FASTNORM_ROW_COUNT_BOUND=0), against float64, the groups past the last row included (row counts that
    leave a block part empty). The rough mean is that of each thread's first vector, so rows whose first
    quarter sits far above the rest must stay exact too."""
    exact = shape[1] in (1024, 4096) or (shape[1] == 64 and dtype == torch.float64)  # 64 doubles: 4 vectors of 2 a thread
    for i, kind in enumerate(["randn", "offset", "first_quarter"]):
        if kind == "offset" and (rms or dtype in (torch.float16, torch.bfloat16)):
            continue  # as test_last_dim
        x = make(shape, torch.float32, "randn" if kind == "first_quarter" else kind, seed=shape[1] + i)
        if kind == "first_quarter":
            x[:, : shape[1] // 4] += 1000.0 if dtype in (torch.float32, torch.float64) else 30.0
        x = x.to(dtype)
        w, b = params(shape[-1:], dtype, i != 1, seed=i)
        b = None if rms else b
        runs = []
        for bound, exact_env in [("1", "1"), ("1", "0"), ("0", "1")]:
            monkeypatch.setenv("FASTNORM_ROW_COUNT_BOUND", bound)
            monkeypatch.setenv("FASTNORM_ROW_EXACT", exact_env)
            names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, rms))
            assert any("row_norm_kernel" in k for k in names), names
            runs.append((names, run_op(x, 1, 2, w, b, 1e-5, rms)))
        check(runs[0][1], reference(x, 1, 2, w, b, 1e-5, rms), dtype, x)
        assert all(torch.equal(out, runs[0][1]) for _, out in runs)
        assert runs[1][0] != runs[2][0] and (runs[0][0] != runs[1][0]) == exact, [names for names, _ in runs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 1024), (33, 8192), (5, 100003), (4, 2**20)])
@pytest.mark.parametrize("which", ["weight", "bias"])
def test_layer_norm_weight_or_bias_only(shape, dtype, which):
    """Each kernel has a separate output loop per parameter case: weight alone, bias alone."""
    x = make(shape, dtype, "randn", seed=7)
    w, b = params(shape[-1:], dtype, True, seed=3)
    w, b = (w, None) if which == "weight" else (None, b)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b, 1e-5, False), dtype, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 1024), (150, 65536), (3, 5000)])
def test_fast_entry_matches_op(shape, dtype):
    """fastnorm.layer_norm / rms_norm take the C++ fast entry for plain calls: same bits as the op."""
    x = make(shape, dtype, "randn", seed=shape[0])
    w, b = params(shape[-1:], dtype, True, seed=4)
    ext = extension.load("cuda")
    assert ext.try_layer_norm(x, shape[-1:], None, w, b, 1e-5) is not None
    fast, op = fastnorm.layer_norm(x, shape[-1:], w, b, 1e-5), torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5)
    assert torch.equal(fast, op)
    fast, op = fastnorm.rms_norm(x, shape[-1:], w, 1e-5), torch.ops.fastnorm.rms_norm(x, 1, 2, w, 1e-5)
    assert torch.equal(fast, op)
    check(fastnorm.rms_norm(x, dim=1), reference(x, 1, 2, None, None, default_rms_eps(dtype), True), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("n", [2**20, 2**22 + 12, 2**24])
def test_long_rows(n, dtype, rms):
    rows = 3 if n < 2**24 else 2
    x = make((rows, n), dtype, "randn" if rms else "offset" if dtype == torch.float32 else "rand", seed=n % 97)
    w, b = params((n,), dtype, True, seed=3)
    b = None if rms else b
    check(run_op(x, 1, 2, w, b, 1e-5, rms), reference(x, 1, 2, w, b, 1e-5, rms), dtype, x)


@pytest.mark.parametrize("n,dtype", [(2**20 + 8, torch.float32), (2**21 + 16, torch.bfloat16),
                                     (2**19 + 8, torch.float32), (2**20 + 16, torch.bfloat16)])
@pytest.mark.parametrize("rms", [False, True])
def test_many_rows_of_megabytes(n, dtype, rms):
    """40 rows of 4 MB (the resident kernel in two row groups) and of 2 MB (the split kernel with
    cached slices)."""
    x = make((40, n), dtype, "offset" if dtype == torch.float32 else "rand", seed=n % 83)
    w, b = params((n,), dtype, True, seed=4)
    b = None if rms else b
    check(run_op(x, 1, 2, w, b, 1e-5, rms), reference(x, 1, 2, w, b, 1e-5, rms), dtype, x)


RESIDENT_CASES = [  # rows, n, dtype, rms, weighted, kind
    (3, 2**21, torch.float32, True, True, "randn"),  # 8 MB rows (two row groups, as all rows under 8.6 MB)
    (5, 2**22 + 64, torch.float32, True, True, "rand"),  # next-row buffer, some weight vectors re-read from L2
    (2, 2**21 + 4, torch.float32, True, False, "randn"),
    (1, 2**22, torch.float32, True, True, "offset"),  # one row: no next-row buffer
    (3, 2**22 + 12, torch.float32, False, True, "offset"),  # LayerNorm fp32: parameters partly in L2
    (4, 2**21, torch.float32, False, True, "outlier"),  # the shift (first element) 1e4 from the mean
    (3, 2**22 + 8, torch.bfloat16, False, True, "rand"),
    (2, 2**22, torch.bfloat16, True, True, "randn"),
    (2, 2**22 + 24, torch.float16, False, False, "randn"),
    (2, 2**20 + 2, torch.float64, False, True, "offset"),
    # Rows of 4-8 MB: two row groups, each on half the SMs (an odd number of rows leaves one group a
    # row short).
    (5, 2**20 + 4, torch.float32, False, True, "outlier"),  # next-row buffer and the row after in L2
    (3, 2**21 + 4, torch.float32, False, True, "offset"),  # 8 MB: next rows in L2, no buffer
    (2, 2**20, torch.float32, True, True, "rand"),  # one row a group: nothing staged
    (6, 2**21 + 8, torch.bfloat16, False, True, "rand"),
    (3, 2**19 + 2, torch.float64, True, True, "randn"),
]


def check_graph_replay(base, x, w, b, rms):
    """The call over rows x (a view of base) captured in a CUDA graph (no host synchronization inside it: the
    launchers clear their counters on the stream), replayed on new values of base, against float64."""
    n = x.shape[1]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fastnorm.rms_norm(x, (n,), w, 1e-5) if rms else fastnorm.layer_norm(x, (n,), w, b, 1e-5)
    base.copy_(make(tuple(base.shape), base.dtype, "rand", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    check(out, reference(x, 1, 2, w, b, 1e-5, rms), x.dtype, x)


HELD_CASES = [  # rows, n, dtype, parameter dtype (None: none), rms, kind
    (21, 2**19, torch.float32, torch.float32, False, "offset"),  # 2 MB rows, 26 chunks, the last one short
    (4, 2**22 + 12, torch.float32, torch.float32, False, "outlier"),  # 16 MB rows, the shift 1e4 from the mean
    (3, 2**22 + 8, torch.float32, torch.float32, True, "rand"),
    (24, 2**20 + 8, torch.bfloat16, torch.bfloat16, False, "rand"),
    (24, 2**20 + 8, torch.bfloat16, torch.float32, True, "randn"),  # float32 parameters of bfloat16 rows
    (12, 2**21, torch.float16, None, False, "randn"),
    (6, 2**22, torch.bfloat16, torch.float32, False, "offset"),
]


@pytest.mark.parametrize("rows,n,dtype,pdtype,rms,kind", HELD_CASES)
def test_held_rows(rows, n, dtype, pdtype, rms, kind, monkeypatch):
    """Rows of 2-16 MB, a wave of 80 KB chunks or more, on the held rows kernel (held_rows_kernel.cuh; forced
    beyond the 3-8 MB it takes by default): each chunk held on chip from its statistics to its output, rows
    ticketed one after another. Both norms, every dtype but float64, float32 or no parameters, the last chunk
    of a row short, a first element far from the mean, rows of a view (row stride n + 64); the same results
    with the kernel switched off, bit for bit on a repeat, and under CUDA graph capture (the launcher clears
    its counters on the stream)."""
    monkeypatch.setenv("FASTNORM_HELD_ROWS", "2")
    base = make((rows, n + 64), dtype, "randn" if kind == "outlier" else kind, seed=n % 89)
    if kind == "outlier":
        base[:, 64] = 1e4
    x = base[:, 64:]
    w, b = params((n,), pdtype, True, seed=5) if pdtype is not None else (None, None)
    b = None if rms else b
    names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, rms))
    assert any("held_rows_kernel" in k for k in names), names
    out = run_op(x, 1, 2, w, b, 1e-5, rms)
    check(out, reference(x, 1, 2, w, b, 1e-5, rms), dtype, x)
    assert torch.equal(run_op(x, 1, 2, w, b, 1e-5, rms), out)
    monkeypatch.setenv("FASTNORM_HELD_ROWS", "0")
    names = kernels_of(lambda: run_op(x, 1, 2, w, b, 1e-5, rms))
    assert not any("held_rows_kernel" in k for k in names), names
    other = run_op(x, 1, 2, w, b, 1e-5, rms)
    tol = TOL[dtype] * max(1.0, x.abs().max().item() / 1000)
    assert ((other.double() - out.double()).abs() / out.double().abs().clamp(min=1.0)).max().item() <= 2 * tol
    monkeypatch.setenv("FASTNORM_HELD_ROWS", "2")
    check_graph_replay(base, x, w, b, rms)


@pytest.mark.parametrize("rows,n,dtype,rms,takes", [
    (16, 2**20, torch.float32, False, True), (24, 2**21 + 8, torch.bfloat16, False, True),
    (16, 2**22, torch.float32, False, False), (40, 2**19, torch.float32, False, False),
    (8, 2**20, torch.float32, False, False), (16, 2**20, torch.float32, True, False)])
def test_held_rows_window(rows, n, dtype, rms, takes):
    """By default the held rows kernel takes LayerNorm rows of 3-8 MB (4 MB here), a wave of chunks or more:
    not rows of 16 or 2 MB, nor 8 rows of 4 MB (fewer chunks than the blocks an H100 or H200 holds), nor
    RMSNorm rows."""
    x = make((rows, n), dtype, "randn", seed=3)
    w, b = params((n,), dtype, True, seed=5)
    names = kernels_of(lambda: run_op(x, 1, 2, w, None if rms else b, 1e-5, rms))
    assert any("held_rows_kernel" in k for k in names) == takes, names


@pytest.mark.parametrize("rows,n,dtype,rms,weighted,kind", RESIDENT_CASES)
def test_resident_rows(rows, n, dtype, rms, weighted, kind, monkeypatch):
    """A few rows of 4-17 MB: each row held on chip across the SMs, or half of them (resident kernel),
    for both norms and every dtype: next-row buffer, parameters re-read from L2, one row, a first
    element far from the mean (the statistics are moments about it); rows of a view (row stride
    n + 64, 256 bytes in). The held rows kernel, which takes some of these calls, is switched off."""
    monkeypatch.setenv("FASTNORM_HELD_ROWS", "0")
    base = make((rows, n + 64), dtype, "randn" if kind == "outlier" else kind, seed=n % 89)
    if kind == "outlier":
        base[:, 64] = 1e4
    x = base[:, 64:]
    w, b = params((n,), dtype, True, seed=5)
    w, b = (w if weighted else None), (None if rms or not weighted else b)
    check(run_op(x, 1, 2, w, b, 1e-5, rms), reference(x, 1, 2, w, b, 1e-5, rms), dtype, x)
    if rows > 1 and dtype == torch.float32:
        check_graph_replay(base, x, w, b, rms)


@pytest.mark.parametrize("rms", [False, True])
def test_more_resident_rows_than_sms(rms):
    """136 rows of 8 MB (bf16), more rows than an H100 has SMs: the resident kernel in one group, each
    block through 136 rows and barriers; the first and the last rows checked."""
    n = 2**22
    x = make((136, n), torch.bfloat16, "rand", seed=13)
    w, b = params((n,), torch.bfloat16, True, seed=6)
    b = None if rms else b
    out = run_op(x, 1, 2, w, b, 1e-5, rms)
    for rows in (slice(0, 2), slice(-2, None)):
        check(out[rows], reference(x[rows], 1, 2, w, b, 1e-5, rms), torch.bfloat16, x[rows])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (4, 64, 32, 32), (2, 1, 8, 8), (3, 100, 3, 5), (2, 300, 16, 16),
                                   (1, 8, 1, 1), (2, 48, 7, 64), (2, 2000, 4, 4), (2, 1200, 1, 3),
                                   # the column kernel to its limit (16 channels) and the tiles past it; inner
                                   # 196 and 98: 8- and 4-byte accesses for half types (channel_vec)
                                   (2, 16, 5, 6), (3, 17, 4, 4), (2, 5, 14, 14), (3, 6, 7, 14), (2, 40, 7, 14),
                                   # few tiles, narrowed to fill the chip; odd inner with many channels
                                   (2, 701, 14, 14), (8, 113, 31, 33)])
def test_channel_axis(shape, dtype, rms):
    x = make(shape, dtype, "randn", seed=sum(shape))
    w, b = params(shape[1:2], dtype, True, seed=7)
    b = None if rms else b
    check(run_op(x, 1, 2, w, b, 1e-5, rms), reference(x, 1, 2, w, b, 1e-5, rms), dtype)


@pytest.mark.parametrize("shape", [(4, 64, 16, 16), (4, 5, 16, 16)])
def test_channel_axis_offset_fp32(shape):
    x = make(shape, torch.float32, "offset", seed=5)
    check(run_op(x, 1, 2, None, None, 1e-5, False), reference(x, 1, 2, None, None, 1e-5, False), torch.float32, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(3, 7, 8, 8), (3, 70, 8, 8), (2, 9, 6, 6), (2, 72, 31, 33), (3, 616, 7, 7),
                                   (2, 1024, 13, 17)])
def test_channel_axis_misaligned(shape, offset, dtype):
    """x starting `offset` elements into its storage: each access width the address allows (2-byte
    types at offset 2: 4-byte accesses), columns and tiles; 2-byte columns (odd inner, odd offsets) are
    copied as the granules that hold each channel's run: 16 tiles an image, the last one partly past inner
    (1023), two tiles of 32 lanes over 49 columns, 1024 channels in narrow tiles."""
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    base = make((numel + offset,), dtype, "randn", seed=offset + shape[1])
    x = base[offset:].view(shape)
    w, b = params(shape[1:2], dtype, True, seed=offset)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b, 1e-5, False), dtype)
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,pad,start", [((3, 16, 8, 64), 16, 0), ((2, 5, 6, 33), 3, 0), ((2, 4, 7, 40), 8, 1),
                                             ((3, 16, 4, 24), 8, 2), ((2, 3, 1, 3, 8), 8, 0), ((2, 40, 5, 32), 16, 0)])
@pytest.mark.parametrize("copied", ["0", "1"], ids=["in_place", "copied"])
def test_channel_axis_padded_rows(shape, pad, start, dtype, copied, monkeypatch):
    """Channel calls over x[..., start:start + W] of rows W + pad long, x's last dim: the column kernel (n <= 16) reads
    them in place (each access width that W, W + pad and the start allow: 16, 8 or 4 bytes, one element; a size-1 dim
    among the rows), the tile kernels (n = 40) and, with FASTNORM_PADDED_ROWS=0, every call a contiguous copy. The
    padding holds 1e4, which a wrong index picks up; LayerNorm also about x + 100."""
    if copied == "1":
        monkeypatch.setenv("FASTNORM_PADDED_ROWS", "0")
    width = shape[-1]
    base = make(shape[:-1] + (width + pad,), dtype, "randn", seed=width + pad + start)
    base[..., :start] = 1e4
    base[..., start + width:] = 1e4
    x = base[..., start:start + width]
    w, b = params(shape[1:2], dtype, True, seed=pad)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b, 1e-5, False), dtype, x)
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype, x)
    if dtype == torch.float32:
        far = (base + 100)[..., start:start + width]
        check(run_op(far, 1, 2, w, b, 1e-5, False), reference(far, 1, 2, w, b, 1e-5, False), dtype, far)


@pytest.mark.parametrize("params_smem", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_channel_tiles_params(dtype, params_smem, monkeypatch):
    """Channel tiles (odd inner, x one element into its storage: 2-byte columns as granules) with weight and
    bias in shared memory or (FASTNORM_CHANNEL_PARAMS_SMEM=0) loaded at each output; LayerNorm also about
    x + 100, where a wrong shift would lose the deviations."""
    monkeypatch.setenv("FASTNORM_CHANNEL_PARAMS_SMEM", params_smem)
    base = make((3 * 40 * 15 * 17 + 1,), dtype, "randn", seed=21)
    for x in (base[1:].view(3, 40, 15, 17), (base[1:] + 100).view(3, 40, 15, 17)):
        w, b = params((40,), dtype, True, seed=22)
        check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b, 1e-5, False), dtype, x)
        check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), dtype, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_params_with_half_input(dtype):
    x = make((33, 4096), dtype, "randn", seed=11)
    w, b = params((4096,), torch.float32, True, seed=2)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b), dtype)
    xc = make((2, 64, 8, 8), dtype, "randn", seed=12)
    wc, _ = params((64,), torch.float32, True, seed=3)
    check(run_op(xc, 1, 2, wc, None, 1e-6, True), reference(xc, 1, 2, wc, None, 1e-6, True), dtype)


def test_multi_dim_trailing_and_middle():
    x = make((3, 4, 5, 6, 7), torch.float32, "randn", seed=1)
    w, b = params((5, 6), torch.float32, True, seed=1)
    check(run_op(x, 2, 4, w, b, 1e-5, False), reference(x, 2, 4, w, b), torch.float32)
    w3, b3 = params((5, 6, 7), torch.float32, True, seed=2)
    out = fastnorm.layer_norm(x, (5, 6, 7), w3, b3)
    check(out, reference(x, 2, 5, w3, b3), torch.float32)


@pytest.mark.parametrize("view", ["transpose", "row_slice", "col_slice", "expand", "offset_storage"])
def test_non_contiguous(view):
    base = make((64, 96), torch.float32, "randn", seed=4)
    x = {"transpose": lambda: base.t(), "row_slice": lambda: base[::3],
         "col_slice": lambda: base[:, 1:81], "expand": lambda: base[:1].expand(16, 96),
         "offset_storage": lambda: base.flatten()[1:1 + 63 * 96].view(63, 96)}[view]()
    n = x.shape[-1]
    w, b = params((n,), torch.float32, True, seed=5)
    check(run_op(x, 1, 2, w, b, 1e-5, False), reference(x, 1, 2, w, b), torch.float32)
    check(run_op(x, 1, 2, w, None, 1e-5, True), reference(x, 1, 2, w, None, 1e-5, True), torch.float32)


def test_channels_last_input():
    x = make((2, 32, 8, 8), torch.float32, "randn", seed=9).to(memory_format=torch.channels_last)
    check(run_op(x, 1, 2, None, None, 1e-5, True), reference(x, 1, 2, None, None, 1e-5, True), torch.float32)


@pytest.mark.parametrize("threads,blocks", [(128, 0), (512, 0), (256, 4), (512, 16), (64, 3), (32, 200), (32, 6000)])
def test_forced_configs(threads, blocks):
    """Tuning overrides (used by the solver) must never change the result. 6000 blocks of 32 threads
    a row are more than the chip holds with a cache: the split kernel without one."""
    ext = extension.load("cuda")
    x = make((6, 50000), torch.float32, "offset", seed=threads + blocks)
    w, b = params((50000,), torch.float32, True, seed=1)
    for rms in (False, True):
        poison_allocator(x)
        out = ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, threads, blocks)
        check(out, reference(x, 1, 2, w, None if rms else b, 1e-5, rms), torch.float32, x)


def test_empty_and_cuda_graph():
    empty = torch.empty(0, 8, device=DEV)
    assert fastnorm.layer_norm(empty, (8,)).shape == (0, 8)
    x = make((16, 1 << 20), torch.float32, "randn", seed=2)  # resident kernel, two row groups (cooperative launch)
    w, b = params((1 << 20,), torch.float32, True, seed=2)
    static_out = fastnorm.layer_norm(x, (1 << 20,), w, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fastnorm.layer_norm(x, (1 << 20,), w, b)
    x.copy_(make((16, 1 << 20), torch.float32, "rand", seed=3))
    graph.replay()
    torch.cuda.synchronize()
    check(static_out, reference(x, 1, 2, w, b), torch.float32)


def test_seed_layer_norm_problem_matches_pytorch():
    """The seeds' own check: torch.allclose(out, ref, atol=1e-5) against nn.LayerNorm."""
    torch.manual_seed(0)
    ref_model = torch.nn.LayerNorm((64, 256, 256)).to(DEV)
    with torch.no_grad():
        ref_model.weight.uniform_(0.5, 1.5)
        ref_model.bias.normal_()
    ours = fastnorm.LayerNorm((64, 256, 256)).to(DEV)
    ours.load_state_dict(ref_model.state_dict())
    for kind in ("randn", "rand"):
        x = make((16, 64, 256, 256), torch.float32, kind, seed=1)
        with torch.no_grad():
            assert torch.allclose(ours(x), ref_model(x), atol=1e-5)


@pytest.mark.slow
def test_seed_rms_norm_problem_matches_pytorch():
    x = make((112, 64, 512, 512), torch.float32, "randn", seed=3)
    out = fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
    ref = x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)
    assert torch.allclose(out, ref, atol=1e-5)
    del ref
    # float64 check on a slice of the batch (the whole float64 copy would not fit)
    check(out[:4], reference(x[:4], 1, 2, None, None, 1e-5, True), torch.float32)


@pytest.mark.slow
def test_over_2_31_elements_bf16():
    rows, n = (1 << 16) + 3, 1 << 15  # 2**31 + 98304 elements, 4.3 GB in bf16
    assert rows * n > 2**31
    x = make((rows, n), torch.bfloat16, "randn", seed=8)
    w, b = params((n,), torch.bfloat16, True, seed=8)
    out = fastnorm.layer_norm(x, (n,), w, b)
    for start in (0, rows // 2, rows - 4096):  # float64 references of pieces, the last rows included
        sl = slice(start, start + 4096)
        check(out[sl], reference(x[sl], 1, 2, w, b), torch.bfloat16)
    del out
    outc = fastnorm.rms_norm(x.view(rows, 32, 1024), None, None, 1e-5, dim=1)  # channel path > 2**31
    for start in (0, rows - 64):
        sl = slice(start, start + 64)
        check(outc[sl], reference(x.view(rows, 32, 1024)[sl], 1, 2, None, None, 1e-5, True), torch.bfloat16)


def test_matches_pytorch_rounding_last_dim():
    """Against PyTorch's own fp32 kernels: the seeds' atol=1e-5 criterion on common shapes."""
    for shape in [(16384 // 64, 4096), (64, 16384)]:
        x = make(shape, torch.float32, "randn", seed=1)
        w, b = params(shape[-1:], torch.float32, True, seed=1)
        assert torch.allclose(fastnorm.layer_norm(x, shape[-1:], w, b), F.layer_norm(x, shape[-1:], w, b), atol=1e-5)
        if hasattr(F, "rms_norm"):
            assert torch.allclose(fastnorm.rms_norm(x, shape[-1:], w, 1e-5),
                                  F.rms_norm(x, shape[-1:], w, 1e-5), atol=1e-5)
