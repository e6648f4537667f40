"""The family's extension functions (group_norm_forward, batch_norm_forward, p_normalize), CPU and CUDA,
against float64 references: every piece layout of the statistics (a run cut into pieces, short runs
grouped, one run per piece), both output passes (long rows in vectors, short rows element by element),
misaligned starts, offsets, every dtype, given statistics, and the errors of bad calls.
"""
import math

import pytest
import torch

from fastnorm.ops import extension

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # -m cuda selects the CUDA cases
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Max error relative to the reference's largest value: one rounding of the output dtype, a little more.
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
STAT_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}


def ext(device):
    return extension.load(device)


def rel_err(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_stats(mean, var, m, v, dtype):
    """The mean to within the data's spread (a mean near 0 has no relative precision), var relative."""
    scale = (m.abs() + v.sqrt()).max().item()
    assert (mean.double() - m).abs().max().item() <= STAT_TOL[dtype] * scale
    assert rel_err(var, v) <= STAT_TOL[dtype] * 10


def make(shape, dtype, device, kind="randn", offset=0.0):
    base = torch.randn(shape, dtype=torch.float64) if kind == "randn" else torch.rand(shape, dtype=torch.float64)
    return (base + offset).to(dtype).to(device)


def channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


def affine(y, weight, bias, x):
    if weight is not None:
        y = y * weight.double().reshape(channel_shape(x))
    if bias is not None:
        y = y + bias.double().reshape(channel_shape(x))
    return y


# (shape, groups): short runs of one set (spatial 1), a few long runs, odd sizes, one group of all
# channels, instance norm (groups = C), a set longer than one piece, a set of 1024+ pieces (their
# partials merged by a block, not a warp).
GROUP_CASES = [((4, 6), 3), ((2, 6, 5, 7), 3), ((3, 8, 3001), 2), ((2, 64, 33, 33), 8), ((1, 4, 70001), 1),
               ((3, 5, 9), 5), ((2, 3, 4, 5, 6), 3), ((1, 4, 1048577), 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GROUP_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-g{c[1]}")
def test_group_norm(device, dtype, case):
    shape, groups = case
    for kind, offset in (("randn", 0.0), ("rand", 0.0), ("randn", 1000.0)):
        if offset and dtype in (torch.float16, torch.bfloat16):
            continue  # x + 1000 is not representable to the unit there
        x = make(shape, dtype, device, kind, offset)
        c = shape[1]
        w = torch.randn(c, dtype=dtype, device=device)
        b = torch.randn(c, dtype=dtype, device=device)
        y, mean, var = ext(device).group_norm_forward(x, w, b, groups, 1e-5)
        xg = x.double().reshape(shape[0], groups, -1)
        m, v = xg.mean(-1), xg.var(-1, unbiased=False)
        ref = affine(((xg - m[..., None]) / torch.sqrt(v[..., None] + 1e-5)).reshape(shape), w, b, x)
        assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
        # float64: the reference's own rounding at x + 1000 (ulp 1e-13) over a small group spread
        tol = TOL[dtype] * (1 + offset) if dtype == torch.float64 else TOL[dtype]
        assert rel_err(y, ref) <= tol, (kind, offset)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        assert mean.dtype == acc and mean.shape == (shape[0], groups)
        assert_stats(mean, var, m, v, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(16, 7), (4, 3, 5, 5), (2, 5, 3001), (64, 3, 40, 40), (3, 2, 2, 3, 4)],
                         ids=lambda s: "x".join(map(str, s)))
def test_batch_norm(device, dtype, shape):
    x = make(shape, dtype, device, offset=3.0)
    c = shape[1]
    w = torch.rand(c, dtype=dtype, device=device)
    b = torch.randn(c, dtype=dtype, device=device)
    y, mean, var = ext(device).batch_norm_forward(x, w, b, None, None, 1e-5)
    dims = [0] + list(range(2, x.dim()))
    m, v = x.double().mean(dims), x.double().var(dims, unbiased=False)
    s = channel_shape(x)
    ref = affine((x.double() - m.reshape(s)) / torch.sqrt(v.reshape(s) + 1e-5), w, b, x)
    assert rel_err(y, ref) <= TOL[dtype]
    assert_stats(mean, var, m, v, dtype)
    # Given statistics (eval): used as they are and returned unchanged.
    acc = mean.dtype
    rm, rv = torch.randn(c, dtype=acc, device=device), torch.rand(c, dtype=acc, device=device) + 0.5
    y2, m2, v2 = ext(device).batch_norm_forward(x, w, b, rm, rv, 1e-3)
    ref2 = affine((x.double() - rm.double().reshape(s)) / torch.sqrt(rv.double().reshape(s) + 1e-3), w, b, x)
    assert rel_err(y2, ref2) <= TOL[dtype]
    assert m2 is rm and v2 is rv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", [((8, 65535), 1, 2), ((3, 4, 5, 6), 1, 2), ((5, 7), 0, 2), ((2, 3, 4), 0, 3),
                                    ((3, 9000), 1, 2), ((2, 3, 4), 1, 3), ((300, 5), 1, 2), ((1025, 4097), 0, 2)],
                         ids=lambda l: f"{'x'.join(map(str, l[0]))}-d{l[1]}{l[2]}")
def test_p_normalize(device, dtype, layout):
    shape, begin, end = layout
    x = make(shape, dtype, device)
    dims = list(range(begin, end))
    count = math.prod(shape[d] for d in dims)
    for p in (1.0, 2.0):
        for mean in (False, True):
            if dtype == torch.float16 and p == 1 and not mean and count > 2**20:
                continue  # |y| ~ 1 / count: subnormal in float16, no relative precision left
            y = ext(device).p_normalize(x, p, begin, end, 0.0, mean)
            xd = x.double()
            s = xd.abs().sum(dims, keepdim=True) if p == 1 else xd.pow(2).sum(dims, keepdim=True)
            s = s / count if mean else s
            ref = xd / (s if p == 1 else s.sqrt())
            assert y.shape == x.shape and rel_err(y, ref) <= TOL[dtype], (p, mean)


@pytest.mark.parametrize("device", DEVICES)
def test_p_normalize_eps_clamps_and_zero_rows(device):
    x = torch.zeros(3, 8, device=device)
    x[1] = 1e-20
    x[2] = torch.randn(8, device=device)
    y = ext(device).p_normalize(x, 2.0, 1, 2, 1e-12, False)
    ref = torch.nn.functional.normalize(x.double(), 2.0, 1, 1e-12)
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=0)
    plain = ext(device).p_normalize(x, 2.0, 1, 2, 0.0, False)
    assert torch.isnan(plain[0]).all()  # 0 / 0, as x / torch.norm(x) gives


# L1 / L2 rows that fit L2 (p_norm_row_kernel: a block a row, rows for 3/4 of the SMs or more, 16 KB to 1 MB a
# row): odd lengths (rows at every 4-byte offset), a storage offset (x and y at different 16-byte offsets:
# scalar), every dtype, p_mean.
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(132, 65535), (300, 8195), (200, 16384)], ids=lambda s: "x".join(map(str, s)))
def test_p_normalize_rows_read_once(dtype, shape):
    rows, n = shape
    base = make((rows * n + 3,), dtype, "cuda")
    for x in (base[: rows * n].view(shape), base[3:].view(shape)):
        for p in (1.0, 2.0):
            for mean in (False, True):
                if dtype == torch.float16 and p == 1 and not mean and n > 2**12:
                    continue  # |y| ~ 1 / n: subnormal in float16
                y = ext("cuda").p_normalize(x, p, 1, 2, 0.0, mean)
                xd = x.double()
                s = xd.abs().sum(1, keepdim=True) if p == 1 else xd.pow(2).sum(1, keepdim=True)
                s = s / n if mean else s
                ref = xd / (s if p == 1 else s.sqrt())
                assert rel_err(y, ref) <= TOL[dtype], (p, mean, x.storage_offset())


# torch's x / max(norm, eps): a NaN in a row makes the whole row NaN (clamp_min keeps NaN), a zero row with
# eps > 0 gives zeros; on the row kernel (300 rows of 8195) and on the multi-kernel path (4 rows).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [4, 300])
def test_p_normalize_nan_and_zero_rows(device, rows):
    x = torch.randn(rows, 8195, device=device)
    x[0, 7] = float("nan")
    x[1] = 0
    for p in (1.0, 2.0):
        y = ext(device).p_normalize(x, p, 1, 2, 1e-12, False)
        assert torch.isnan(y[0]).all() and (y[1] == 0).all() and torch.isfinite(y[2:]).all()
        ref = torch.nn.functional.normalize(x[2:].double(), p, 1, 1e-12)
        assert rel_err(y[2:], ref) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_and_non_contiguous_inputs(device):
    base = torch.randn(2 * 6 * 301 + 1, device=device)
    x = base[1:].view(2, 6, 301)  # storage offset of one element: no 16-byte aligned start
    y, _, _ = ext(device).group_norm_forward(x, None, None, 2, 1e-5)
    ref, _, _ = ext(device).group_norm_forward(x.clone(), None, None, 2, 1e-5)
    assert torch.equal(y, ref)
    xt = torch.randn(301, 6, 2, device=device).permute(2, 1, 0)
    y = ext(device).batch_norm_forward(xt, None, None, None, None, 1e-5)[0]
    assert torch.equal(y, ext(device).batch_norm_forward(xt.contiguous(), None, None, None, None, 1e-5)[0])
    z = ext(device).p_normalize(base[1:].view(6, 602), 1.0, 1, 2, 0.0, True)
    assert rel_err(z, base[1:].view(6, 602).double() / base[1:].view(6, 602).double().abs().mean(1, keepdim=True)) < 2e-6


@pytest.mark.parametrize("device", DEVICES)
def test_results_repeat_bitwise(device):
    x = torch.randn(4, 16, 4096, device=device)
    first = ext(device).group_norm_forward(x, None, None, 4, 1e-5)
    again = ext(device).group_norm_forward(x, None, None, 4, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    x = torch.randn(1025, 4097, device=device)  # one set of 1024+ partials, merged by a block
    assert torch.equal(ext(device).p_normalize(x, 2.0, 0, 2, 0.0, False), ext(device).p_normalize(x, 2.0, 0, 2, 0.0, False))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    y, mean, var = ext(device).group_norm_forward(torch.empty(0, 4, 3, device=device), None, None, 2, 1e-5)
    assert y.shape == (0, 4, 3) and mean.shape == (0, 2)
    y, mean, var = ext(device).batch_norm_forward(torch.empty(0, 3, device=device), None, None, None, None, 1e-5)
    assert y.shape == (0, 3) and torch.isnan(mean).all()
    assert ext(device).p_normalize(torch.empty(4, 0, device=device), 2.0, 1, 2, 0.0, False).shape == (4, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_calls_raise(device):
    e = ext(device)
    x = torch.randn(2, 6, 5, device=device)
    with pytest.raises(RuntimeError, match="groups do not divide"):
        e.group_norm_forward(x, None, None, 4, 1e-5)
    with pytest.raises(RuntimeError, match="weight has 5 elements"):
        e.group_norm_forward(x, torch.ones(5, device=device), None, 3, 1e-5)
    with pytest.raises(RuntimeError, match=r"shape \(N, C, \*\)"):
        e.batch_norm_forward(torch.randn(5, device=device), None, None, None, None, 1e-5)
    with pytest.raises(RuntimeError, match="both mean and var"):
        e.batch_norm_forward(x, None, None, torch.zeros(6, device=device), None, 1e-5)
    with pytest.raises(RuntimeError, match="p must be 1 or 2"):
        e.p_normalize(x, 3.0, 1, 2, 0.0, False)
    with pytest.raises(RuntimeError, match="bad dims"):
        e.p_normalize(x, 2.0, 2, 2, 0.0, False)
    with pytest.raises(RuntimeError, match="unsupported input dtype"):
        e.p_normalize(x.int(), 2.0, 1, 2, 0.0, False)


@pytest.mark.cuda
@pytest.mark.slow
def test_whole_tensor_norm_over_2_31_elements():
    """Frobenius normalization of 2**31 + 5 float32 elements (8.6 GB): 64-bit indexing throughout."""
    x = torch.rand(2 ** 31 + 5, device="cuda")
    y = ext("cuda").p_normalize(x, 2.0, 0, 1, 0.0, False)
    norm = x.double().pow(2).sum().sqrt()
    for part in (slice(0, 1000), slice(2 ** 31 - 10, 2 ** 31 + 5)):
        assert rel_err(y[part], x[part].double() / norm) < 1e-5
    del y
    y, mean, var = ext("cuda").batch_norm_forward(x.view(1, 1, -1), None, None, None, None, 0.0)
    assert abs(mean.item() - 0.5) < 1e-3 and abs(var.item() - 1 / 12) < 1e-3
