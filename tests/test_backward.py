"""Backward kernels (CPU and CUDA) against float64 autograd: every layout, kernel path and dtype.

dx, dweight and dbias of fastnorm's ops are compared with torch.autograd on a float64 reference
(x, dy, weight, bias upcast), relative to each gradient's scale; dweight / dbias must also be bitwise
reproducible from run to run.
"""
import pytest
import torch

import fastnorm

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # -m cuda selects the CUDA cases
# Max |grad - ref| relative to max |ref| (at least 1e-3 of it: tiny gradients are all rounding).
TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}


def _dims(x, begin, end):
    return tuple(range(begin, end))


def reference_grads(x, dy, begin, end, weight, bias, eps, rms):
    """(dx, dweight, dbias) of LayerNorm / RMSNorm over dims [begin, end), by float64 autograd."""
    xd = x.detach().double().requires_grad_()
    wd = None if weight is None else weight.detach().double().requires_grad_()
    bd = None if bias is None else bias.detach().double().requires_grad_()
    dims = _dims(x, begin, end)
    shape = tuple(x.shape[begin:end]) + (1,) * (x.dim() - end)
    if rms:
        y = xd * torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    else:
        centered = xd - xd.mean(dims, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + eps)
    if wd is not None:
        y = y * wd.reshape(shape)
    if bd is not None:
        y = y + bd.reshape(shape)
    inputs = [t for t in (xd, wd, bd) if t is not None]
    grads = list(torch.autograd.grad(y, inputs, dy.double()))
    dx = grads.pop(0)
    dw = grads.pop(0) if wd is not None else None
    db = grads.pop(0) if bd is not None else None
    return dx, dw, db


def fastnorm_grads(x, dy, begin, end, weight, bias, eps, rms):
    x = x.detach().requires_grad_()
    params = [t.detach().requires_grad_() if t is not None else None for t in (weight, bias)]
    dims = _dims(x, begin, end)
    if rms:
        y = fastnorm.rms_norm(x, None, params[0], eps, dim=dims)
    else:
        y = fastnorm.layer_norm(x, None, params[0], params[1], eps, dim=dims)
    y.backward(dy)
    return x.grad, params[0].grad if params[0] is not None else None, params[1].grad if params[1] is not None else None


def dx_term_scale(x, dy, begin, end, weight, eps, rms):
    """max of rstd * |weight * dy|: the size of the terms dx is the difference of. Rows where they
    cancel (n = 2 in LayerNorm: y is +-1 whatever x is, so dx is an eps effect 1e-3 of the terms) are
    held to it, since any float32 evaluation of the backward, PyTorch's included, rounds at that scale."""
    xd = x.detach().double()
    dims = _dims(x, begin, end)
    if not rms:
        xd = xd - xd.mean(dims, keepdim=True)
    rstd = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    g = dy.double()
    if weight is not None:
        g = g * weight.double().reshape(tuple(x.shape[begin:end]) + (1,) * (x.dim() - end))
    return (rstd * g.abs()).max().item() if g.numel() else 0.0


def assert_close(name, got, ref, dtype, floor=0.0):
    assert got is not None and ref is not None, f"{name}: missing gradient"
    assert got.shape == ref.shape and got.dtype == dtype, f"{name}: {got.shape} {got.dtype}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    scale = max(ref.abs().max().item(), floor)
    err = (got.double() - ref).abs().max().item() / max(scale, 1e-30)
    assert err <= TOL[dtype], f"{name}: max error {err:.3g} relative to {scale:.3g} > {TOL[dtype]:g}"


def run_case(device, shape, begin, end, dtype, affine, rms, offset=0.0, wdtype=None, eps=1e-5, dy_transposed=False):
    x = torch.randn(shape, device=device, dtype=torch.float64).to(dtype) + offset
    dy = torch.randn(shape, device=device, dtype=dtype)
    if dy_transposed and dy.dim() >= 2:  # a non-contiguous gradient with the same values
        dy = dy.transpose(0, 1).contiguous().transpose(0, 1)
    wshape = tuple(shape[begin:end])
    weight = bias = None
    if affine:
        weight = (1 + 0.5 * torch.randn(wshape, device=device, dtype=torch.float64)).to(wdtype or dtype)
        bias = None if rms else (0.5 * torch.randn(wshape, device=device, dtype=torch.float64)).to(wdtype or dtype)
    got = fastnorm_grads(x, dy, begin, end, weight, bias, eps, rms)
    ref = reference_grads(x, dy, begin, end, weight, bias, eps, rms)
    assert_close("dx", got[0], ref[0], dtype, dx_term_scale(x, dy, begin, end, weight, eps, rms))
    if weight is not None:
        assert_close("dweight", got[1], ref[1], weight.dtype)
    if bias is not None:
        assert_close("dbias", got[2], ref[2], bias.dtype)
    return got


# (shape, begin, end): last-dim rows through each CUDA path (fused rows: short, tiny, one row a
# block; long rows: beyond 1024 threads x 8 elements, unaligned long rows), and channel axes.
LAYOUTS = [
    ((64, 1024), 1, 2), ((8, 2), 1, 2), ((5, 3), 1, 2), ((33, 257), 1, 2), ((16, 4096), 1, 2),
    ((3, 8192), 1, 2), ((4, 20000), 1, 2), ((2, 3, 1000), 2, 3), ((6, 16384), 1, 2), ((3, 5001), 1, 2),
    ((2, 8, 4, 4), 1, 2), ((3, 5, 7, 9), 1, 2), ((2, 16, 33), 1, 2), ((2, 64, 4, 8), 1, 3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{'x'.join(map(str, l[0]))}-d{l[1]}")
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gradients_match_float64(device, layout, rms, dtype):
    shape, begin, end = layout
    run_case(device, shape, begin, end, dtype, affine=True, rms=rms)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["f16", "f64"])
@pytest.mark.parametrize("layout", [((48, 512), 1, 2), ((3, 9000), 1, 2), ((2, 6, 5, 5), 1, 2)],
                         ids=["rows", "long", "channel"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_other_dtypes(device, dtype, layout, rms):
    shape, begin, end = layout
    run_case(device, shape, begin, end, dtype, affine=True, rms=rms)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [((32, 768), 1, 2), ((4, 12000), 1, 2), ((2, 12, 6, 6), 1, 2)],
                         ids=["rows", "long", "channel"])
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_without_weight_or_bias(device, layout, affine):
    shape, begin, end = layout
    x = torch.randn(shape, device=device)
    dy = torch.randn(shape, device=device)
    wshape = shape[begin:end]
    weight = torch.randn(wshape, device=device) if affine == "weight" else None
    bias = torch.randn(wshape, device=device) if affine == "bias" else None
    got = fastnorm_grads(x, dy, begin, end, weight, bias, 1e-5, False)
    ref = reference_grads(x, dy, begin, end, weight, bias, 1e-5, False)
    assert_close("dx", got[0], ref[0], torch.float32)
    if bias is not None:
        assert_close("dbias", got[2], ref[2], torch.float32)
    if weight is not None:
        assert_close("dweight", got[1], ref[1], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [((64, 1024), 1, 2), ((4, 20000), 1, 2), ((2, 8, 4, 4), 1, 2)],
                         ids=["rows", "long", "channel"])
@pytest.mark.parametrize("offset", [1000.0, "rand"])
def test_offsets_and_uniform_inputs(device, layout, offset):
    """x + 1000 (statistics about a shift must keep their precision) and torch.rand inputs."""
    shape, begin, end = layout
    if offset == "rand":
        x = torch.rand(shape, device=device)
        dy = torch.randn(shape, device=device)
        w = torch.rand(shape[begin:end], device=device)
        got = fastnorm_grads(x, dy, begin, end, w, None, 1e-5, False)
        ref = reference_grads(x, dy, begin, end, w, None, 1e-5, False)
        assert_close("dx", got[0], ref[0], torch.float32)
        assert_close("dweight", got[1], ref[1], torch.float32)
        return
    for rms in (False, True):
        run_case(device, shape, begin, end, torch.float32, affine=True, rms=rms, offset=offset)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_input_float32_weight(device):
    run_case(device, (96, 2048), 1, 2, torch.bfloat16, affine=True, rms=False, wdtype=torch.float32)
    run_case(device, (2, 40000), 1, 2, torch.bfloat16, affine=True, rms=True, wdtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_gradient_and_strided_input(device):
    run_case(device, (64, 96), 1, 2, torch.float32, affine=True, rms=False, dy_transposed=True)
    base = torch.randn(40, 130, device=device)
    x = base[:, 1:129]  # rows 130 elements apart, starting misaligned
    dy = torch.randn(40, 128, device=device)
    w = torch.randn(128, device=device)
    got = fastnorm_grads(x, dy, 1, 2, w, None, 1e-6, True)
    ref = reference_grads(x, dy, 1, 2, w, None, 1e-6, True)
    assert_close("dx", got[0], ref[0], torch.float32)
    assert_close("dweight", got[1], ref[1], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [((1000, 1024), 1, 2), ((8, 65536), 1, 2), ((8, 32, 16, 16), 1, 2)],
                         ids=["rows", "long", "channel"])
def test_weight_gradients_are_reproducible(device, layout):
    shape, begin, end = layout
    x = torch.randn(shape, device=device)
    dy = torch.randn(shape, device=device)
    w = torch.randn(shape[begin:end], device=device)
    b = torch.randn(shape[begin:end], device=device)
    first = fastnorm_grads(x, dy, begin, end, w, b, 1e-5, False)
    for _ in range(2):
        again = fastnorm_grads(x, dy, begin, end, w, b, 1e-5, False)
        for a, b_ in zip(first, again):
            assert torch.equal(a, b_), "gradients differ between identical runs"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [((3, 7), 1, 2), ((2, 3, 4), 1, 3), ((2, 3, 2, 2), 1, 2)], ids=["rows", "2dims", "channel"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("check", [torch.autograd.gradcheck, torch.autograd.gradgradcheck], ids=["grad", "gradgrad"])
def test_gradcheck_float64(device, layout, rms, check):
    """First and second derivatives (create_graph=True: gradient penalties, Hessian-vector products; the
    kernels' backward goes through the norm_backward op, whose own autograd differentiates the torch-op norm)."""
    shape, begin, end = layout
    dims = _dims(torch.empty(shape), begin, end)
    x = torch.randn(shape, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(shape[begin:end], device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shape[begin:end], device=device, dtype=torch.float64, requires_grad=True)
    if rms:
        assert check(lambda x, w: fastnorm.rms_norm(x, None, w, 1e-5, dim=dims), (x, w))
    else:
        assert check(lambda x, w, b: fastnorm.layer_norm(x, None, w, b, 1e-5, dim=dims), (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_penalty_in_float32_matches_torch(device):
    """A WGAN-GP-style penalty, ||d out / d x||^2 differentiated again, in float32 against torch's LayerNorm in
    float64, within 2e-5 of the largest gradient (CPU, 301 seeds: at most 2.4e-6; an elementwise 1e-4 against
    torch's own float32 failed once on a cancelling element, seed 150909218)."""
    x = torch.randn(8, 64, device=device, requires_grad=True)
    w = (torch.rand(64, device=device) + 0.5).requires_grad_()

    def penalty(norm, x, w):
        (gx,) = torch.autograd.grad((norm(x, w) ** 3).sum(), x, create_graph=True)
        return torch.autograd.grad((gx ** 2).sum(), (x, w))

    got = penalty(lambda t, w: fastnorm.layer_norm(t, (64,), w, None), x, w)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = penalty(lambda t, w: torch.nn.functional.layer_norm(t, (64,), w, None), x64, w64)
    for g, e in zip(got, want):
        assert g.dtype == torch.float32
        assert (g.double() - e).abs().max().item() <= 2e-5 * e.abs().max().item()


@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_one_element(device):
    """n = 1: LayerNorm's dx is exactly 0 (the binding writes it: the CUDA kernels' x - mean from the saved
    statistics came to a few ulps of x, times rstd = 1/sqrt(eps), up to 3e-5 of g); RMSNorm's is
    g * eps / (x^2 + eps)^1.5, tiny next to g and all cancellation in float32 (as in PyTorch's kernels),
    so it is held to g's scale, not its own."""
    x = torch.randn(64, 1, device=device)
    dy = torch.randn(64, 1, device=device)
    w = torch.rand(1, device=device) + 0.5
    ln = fastnorm_grads(x, dy, 1, 2, w, torch.randn(1, device=device), 1e-5, False)
    assert torch.equal(ln[0], torch.zeros_like(x))
    got = fastnorm_grads(x, dy, 1, 2, w, None, 1e-5, True)
    ref = reference_grads(x, dy, 1, 2, w, None, 1e-5, True)
    assert (got[0].double() - ref[0]).abs().max().item() <= 1e-4 * dy.abs().max().item()
    assert_close("dweight", got[1], ref[1], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_only_parameter_gradients(device):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    fastnorm.rms_norm(x, (16,), w).sum().backward()
    assert x.grad.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16, device=device))
    x = torch.randn(8, 16, device=device)  # no grad for x: only dweight is computed
    w = torch.randn(16, device=device, requires_grad=True)
    dy = torch.randn(8, 16, device=device)
    fastnorm.rms_norm(x, (16,), w, 1e-6).backward(dy)
    ref = reference_grads(x, dy, 1, 2, w, None, 1e-6, True)[1]
    assert_close("dweight", w.grad, ref, torch.float32)


@pytest.mark.cuda
@pytest.mark.slow
def test_seed_layer_norm_shape_trains():
    """The LayerNorm seed's shape (rows of 4M elements: the long-row backward) in fp32."""
    shape = (16, 64, 256, 256)
    x = torch.randn(shape, device="cuda")
    dy = torch.randn(shape, device="cuda")
    w = torch.randn(shape[1:], device="cuda")
    b = torch.randn(shape[1:], device="cuda")
    got = fastnorm_grads(x, dy, 1, 4, w, b, 1e-5, False)
    ref = reference_grads(x, dy, 1, 4, w, b, 1e-5, False)
    for name, g, r in zip(("dx", "dweight", "dbias"), got, ref):
        assert_close(name, g, r, torch.float32)


# Channel layouts (shape, begin, end) through the fused tile kernel's plans (n <= 32 at 32 lanes, 64 at 16,
# 128 at 8; inner not a multiple of the vector: scalar columns; a few inner positions: narrow tiles)
# and past them (n = 200: the two-kernel path); the last needs several tiles per block.
CHANNEL_LAYOUTS = [
    ((4, 64, 33, 64), 1, 2), ((2, 100, 16, 20), 1, 2), ((3, 7, 5, 9), 1, 2), ((2, 3, 1000), 1, 2),
    ((2, 200, 8, 16), 1, 2), ((5, 40, 3), 1, 2), ((2, 8, 6, 4, 4), 1, 3), ((16, 64, 64, 64), 1, 2),
]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("layout", CHANNEL_LAYOUTS, ids=lambda l: f"{'x'.join(map(str, l[0]))}-d{l[1]}")
@pytest.mark.parametrize("path", ["planned", "two-kernel", "staged", "staged-k2", "staged-k1", "register",
                                  "register-k1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_channel_backward_paths(monkeypatch, layout, path, dtype):
    """Every channel backward path (FASTNORM_CHANNEL_BWD: 0 the two-kernel path, 2 / 1 the fused kernels
    with at most that many channels a thread; FASTNORM_CHANNEL_STAGED: 1 the fused kernel that stages its
    tiles in shared memory, 0 the one holding them in registers) against float64, LayerNorm and RMSNorm,
    x + 100 included."""
    bwd = {"two-kernel": "0", "staged-k2": "2", "staged-k1": "1", "register-k1": "1"}.get(path)
    if bwd is not None:
        monkeypatch.setenv("FASTNORM_CHANNEL_BWD", bwd)
    if path.startswith(("staged", "register")):
        monkeypatch.setenv("FASTNORM_CHANNEL_STAGED", "1" if path.startswith("staged") else "0")
    shape, begin, end = layout
    for rms in (False, True):
        run_case("cuda", shape, begin, end, dtype, affine=True, rms=rms)
    if dtype == torch.float32:
        run_case("cuda", shape, begin, end, dtype, affine=True, rms=False, offset=100.0)
        run_case("cuda", shape, begin, end, dtype, affine=False, rms=True)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("strided", ["1", "0"], ids=["strided", "offset_or_row"])
@pytest.mark.parametrize("shape", [(300, 1429), (200, 4097), (140, 12001)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_scalar_row_forward_saves_statistics(monkeypatch, strided, shape, rms, dtype):
    """Training on scalar rows of 1025+ (odd n, as many rows as SMs: the forward saves each row's affine map
    for the backward) through the strided-row kernel or, with FASTNORM_STRIDED_ROWS=0, the offset-row and row
    kernels: gradients against float64."""
    monkeypatch.setenv("FASTNORM_STRIDED_ROWS", strided)
    run_case("cuda", shape, 1, 2, dtype, True, rms)
    run_case("cuda", shape, 1, 2, dtype, False, rms, offset=1000.0 if dtype == torch.float32 else 0.0)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("stages", ["2", "3", "4"])
@pytest.mark.parametrize("shape", [(300, 1024), (700, 40), (90, 8192)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_row_backward_ring_of_buffers(monkeypatch, stages, shape, dtype):
    """The row backward's ring of (x, dy) buffers (FASTNORM_ROW_BWD_STAGES, LayerNorm at least 3) over
    many rows a block, so that the ring wraps and LayerNorm's rough mean of the next row is used."""
    monkeypatch.setenv("FASTNORM_ROW_BWD_STAGES", stages)
    for rms in (False, True):
        run_case("cuda", shape, len(shape) - 1, len(shape), dtype, affine=True, rms=rms)
    run_case("cuda", shape, len(shape) - 1, len(shape), dtype, affine=True, rms=False, offset=100.0)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", [(64, 5120), (40, 3000), (50, 2056), (20, 14336), (9, 16384), (5, 65536),
                                   (7, 40000), (3, 5001)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_row_backward_block_shapes(shape, dtype):
    """Rows whose block is not a power of two threads (5120 bf16: 640), and rows split over a cluster of
    blocks (past 1024 threads x 8 elements: 14336 and 16384 in two, 65536 fp32 in eight; 5001 and
    40000 unaligned or uneven slices), LayerNorm with and without parameters and RMSNorm."""
    last = len(shape) - 1
    run_case("cuda", shape, last, last + 1, dtype, affine=True, rms=False)
    run_case("cuda", shape, last, last + 1, dtype, affine=True, rms=True)
    run_case("cuda", shape, last, last + 1, dtype, affine=False, rms=False, offset=100.0)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("split", ["2", "3", "8"])
@pytest.mark.parametrize("shape", [(700, 4096), (400, 1000), (300, 10000)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_row_backward_split_over_clusters(monkeypatch, split, shape, dtype):
    """Rows split over clusters of 2-8 blocks (FASTNORM_ROW_BWD_SPLIT), with more rows than resident
    clusters so that the ring of buffers wraps and the cluster's row sums alternate their buffers; the
    dweight / dbias partials stay bitwise reproducible."""
    monkeypatch.setenv("FASTNORM_ROW_BWD_SPLIT", split)
    for rms in (False, True):
        run_case("cuda", shape, 1, 2, dtype, affine=True, rms=rms)
    run_case("cuda", shape, 1, 2, dtype, affine=True, rms=False, offset=100.0)
    torch.manual_seed(0)
    x, dy = torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)
    w, b = torch.randn(shape[1], device="cuda", dtype=dtype), torch.randn(shape[1], device="cuda", dtype=dtype)
    once = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    again = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    assert all(torch.equal(a, b_) for a, b_ in zip(once, again))


def _op_grads(x, dy, w, b, rms, train):
    """(dx, dweight, dbias) through torch.ops.fastnorm's *_train op (the backward reads the saved
    statistics) or the plain op (it recomputes them)."""
    x, w, b = (t.detach().requires_grad_() if t is not None else None for t in (x, w, b))
    ops = torch.ops.fastnorm
    if rms:
        y = ops.rms_norm_train(x, 1, 2, w, 1e-5)[0] if train else ops.rms_norm(x, 1, 2, w, 1e-5)
    else:
        y = ops.layer_norm_train(x, 1, 2, w, b, 1e-5)[0] if train else ops.layer_norm(x, 1, 2, w, b, 1e-5)
    y.backward(dy)
    return x.grad, w.grad, b.grad if b is not None else None


# Rows whose statistics the forward saves (at least as many as SMs, <= 64 KB): small rows several a
# block, one row a block (5120 bf16: 640 threads), split over a cluster in the backward (14336 bf16,
# 16384 fp32: 64 KB), odd widths (the chunked offset-row kernel: 257, 3001; a warp a row: 99, and 33 and 65
# with 4 and 3 rows a warp at once) and tiny
# ones (a thread a row: 7, and 1, 2, 4 (2-byte), rows the packed-row kernel takes where no statistics are saved).
SAVED_SHAPES = [(300, 1024), (700, 40), (2000, 8), (256, 5120), (200, 14336), (150, 16384), (133, 4096),
                (300, 257), (300, 3001), (2000, 99), (3001, 33), (1001, 65), (2000, 7), (1000, 1), (4001, 2),
                (3003, 4)]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", SAVED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("offset", [0.0, 1000.0], ids=["x", "x+1000"])
def test_saved_statistics(shape, dtype, rms, offset):
    """The *_train ops' saved statistics: each row's affine map (center, offset, rstd) matches the float64
    mean and rstd, and gradients through them match float64 as the recomputing backward's do."""
    if offset and dtype != torch.float32:
        pytest.skip("an offset of 1000 leaves half-precision rows a few distinct values")
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda", dtype=torch.float64) + offset).to(dtype)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    w = (1 + 0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(dtype)
    b = None if rms else (0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(dtype)
    ops = torch.ops.fastnorm
    y, stats = ops.rms_norm_train(x, 1, 2, w, 1e-5) if rms else ops.layer_norm_train(x, 1, 2, w, b, 1e-5)
    assert stats.shape == (shape[0], 3) and stats.dtype == torch.float32
    xd = x.double()
    mean = torch.zeros(shape[0], device="cuda", dtype=torch.float64) if rms else xd.mean(1)
    var = (xd * xd).mean(1) if rms else (xd - mean[:, None]).pow(2).mean(1)
    rstd = torch.rsqrt(var + 1e-5)
    s = stats.double()
    torch.testing.assert_close(s[:, 2], rstd, rtol=1e-5, atol=0)
    # mean = center - offset / rstd (Affine: xhat = (x - center) * rstd + offset), to 1e-5 of a std
    torch.testing.assert_close(s[:, 0] - s[:, 1] / s[:, 2], mean, rtol=0, atol=1e-5 / rstd.min().item())
    ref = reference_grads(x, dy, 1, 2, w, b, 1e-5, rms)
    for train in (True, False):
        got = _op_grads(x, dy, w, b, rms, train)
        assert_close("dx", got[0], ref[0], dtype, dx_term_scale(x, dy, 1, 2, w, 1e-5, rms))
        assert_close("dweight", got[1], ref[1], dtype)
        if b is not None:
            assert_close("dbias", got[2], ref[2], dtype)


# 2-byte rows without dbias take kernels of 16 elements a thread (kBias in backward_rows.cuh): several rows a
# block, one row a block of 896 threads (14336), a cluster of two blocks (30000), and a row too short
# for a thread's two vectors (40: 5 vectors).
BIAS_FREE_SHAPES = [(300, 1024), (700, 40), (200, 14336), (70, 30000), (150, 4096)]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", BIAS_FREE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln_no_bias", "rms"])
@pytest.mark.parametrize("saved", ["1", "0"], ids=["saved", "recomputed"])
def test_rows_without_dbias(shape, dtype, rms, saved, monkeypatch):
    """Gradients of 2-byte rows whose call asks no dbias (RMSNorm, LayerNorm without bias) against float64,
    with the forward's saved statistics and without (FASTNORM_ROW_BWD_SAVED=0)."""
    monkeypatch.setenv("FASTNORM_ROW_BWD_SAVED", saved)
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.float64).to(dtype)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    w = (1 + 0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(dtype)
    got = fastnorm_grads(x, dy, 1, 2, w, None, 1e-5, rms)
    ref = reference_grads(x, dy, 1, 2, w, None, 1e-5, rms)
    assert_close("dx", got[0], ref[0], dtype, dx_term_scale(x, dy, 1, 2, w, 1e-5, rms))
    assert_close("dweight", got[1], ref[1], dtype)


# 2-byte LayerNorm rows with a bias keep the dbias sums in shared memory (kDbSmem) where a thread owns two
# vectors: several rows a block (1024), one row a block (4096, 9000, 14336: a cluster split with the sums
# in registers), a 2-block cluster (30000); FASTNORM_ROW_BWD_DBIAS_SMEM=0 keeps them in registers.
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", [(300, 1024), (150, 4096), (150, 9000), (200, 14336), (70, 30000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mode", ["", "0"], ids=["shared", "registers"])
@pytest.mark.parametrize("saved", ["1", "0"], ids=["saved", "recomputed"])
def test_dbias_sums_in_shared_memory(shape, dtype, mode, saved, monkeypatch):
    monkeypatch.setenv("FASTNORM_ROW_BWD_DBIAS_SMEM", mode)
    monkeypatch.setenv("FASTNORM_ROW_BWD_SAVED", saved)
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.float64).to(dtype)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    w = (1 + 0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(dtype)
    b = (0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(dtype)
    got = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    ref = reference_grads(x, dy, 1, 2, w, b, 1e-5, False)
    assert_close("dx", got[0], ref[0], dtype, dx_term_scale(x, dy, 1, 2, w, 1e-5, False))
    assert_close("dweight", got[1], ref[1], dtype)
    assert_close("dbias", got[2], ref[2], dtype)


# Rows of up to 8 elements a thread with saved statistics hold a row's g and xhat in registers (kHold in
# backward_rows.cuh; 2-byte rows take it over the 16-element kernels unless FASTNORM_ROW_BWD_HOLD=0):
# several rows a block (40, 1024), one row a block (4096, 5120, 8192), and 8200 (past the hold limit in
# 2-byte types); with and without weight and bias, x offset by 1000, and a float32 weight of bf16 rows.
HOLD_SHAPES = [(700, 40), (300, 1024), (150, 4096), (90, 5120), (64, 8192), (40, 8200)]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", HOLD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype,wdtype", [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None),
                                          (torch.bfloat16, torch.float32)], ids=["bf16", "f16", "f32", "bf16_wf32"])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("hold", ["1", "0"], ids=["hold", "no_hold"])
def test_rows_hold_g_and_xhat(shape, dtype, wdtype, affine, rms, hold, monkeypatch):
    monkeypatch.setenv("FASTNORM_ROW_BWD_HOLD", hold)
    if rms and affine == "wb":
        pytest.skip("RMSNorm has no bias")
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda", dtype=torch.float64) + 1000).to(dtype)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    pdtype = wdtype or dtype
    w = (1 + 0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(pdtype) if affine != "none" else None
    b = (0.5 * torch.randn(shape[1], device="cuda", dtype=torch.float64)).to(pdtype) if affine == "wb" else None
    got = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, rms)
    ref = reference_grads(x, dy, 1, 2, w, b, 1e-5, rms)
    assert_close("dx", got[0], ref[0], dtype, dx_term_scale(x, dy, 1, 2, w, 1e-5, rms))
    if w is not None:
        assert_close("dweight", got[1], ref[1], pdtype)
    if b is not None:
        assert_close("dbias", got[2], ref[2], pdtype)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("forward_view", [False, True], ids=["aligned_fwd", "view_fwd"])
def test_saved_statistics_do_not_depend_on_alignment(dtype, rms, forward_view):
    """The backward decides whether stats holds the forward's maps by asking the forward's rule again,
    with its own tensors. A backward whose x sits at another address (a view one element in against a
    fresh copy, as a compiled graph might hand it) must get the same answer, or it would read unwritten
    statistics (or ignore written ones)."""
    torch.manual_seed(0)
    base = torch.randn(300, 1025, device="cuda", dtype=torch.float64).to(dtype)
    view, fresh = base[:, 1:], base[:, 1:].contiguous()  # rows of 1024 one element in, and aligned
    fwd_x, bwd_x = (view, fresh) if forward_view else (fresh, view)
    dy = torch.randn(300, 1024, device="cuda", dtype=dtype)
    w = (1 + 0.5 * torch.randn(1024, device="cuda", dtype=torch.float64)).to(dtype)
    b = None if rms else (0.5 * torch.randn(1024, device="cuda", dtype=torch.float64)).to(dtype)
    ops = torch.ops.fastnorm
    stats = (ops.rms_norm_train(fwd_x, 1, 2, w, 1e-5) if rms else ops.layer_norm_train(fwd_x, 1, 2, w, b, 1e-5))[1]
    got = ops.norm_backward(dy, bwd_x, 1, 2, w, b, 1e-5, rms, True, True, not rms, None, stats)
    ref = reference_grads(fresh, dy, 1, 2, w, b, 1e-5, rms)
    assert_close("dx", got[0], ref[0], dtype, dx_term_scale(fresh, dy, 1, 2, w, 1e-5, rms))
    assert_close("dweight", got[1], ref[1], dtype)
    if b is not None:
        assert_close("dbias", got[2], ref[2], dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", ["few_rows", "cluster", "channel"])
def test_statistics_not_saved_are_recomputed(case):
    """Calls whose forward kernel saves no statistics (few rows, long rows, a channel axis) still train
    through the *_train ops: their stats tensor is left unwritten and the backward recomputes.
    fastnorm.layer_norm takes those ops for every CUDA call that records autograd."""
    shapes = {"few_rows": ((64, 1024), 1, 2), "cluster": ((140, 65536), 1, 2), "channel": ((4, 32, 8, 8), 1, 2)}
    shape, begin, end = shapes[case]
    for rms in (False, True):
        run_case("cuda", shape, begin, end, torch.float32, affine=True, rms=rms)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_channel_backward_is_reproducible_and_matches_two_kernels(monkeypatch):
    shape = (8, 64, 40, 40)
    x, dy = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
    w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    first = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    again = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    assert all(torch.equal(a, b_) for a, b_ in zip(first, again))
    monkeypatch.setenv("FASTNORM_CHANNEL_BWD", "0")
    other = fastnorm_grads(x, dy, 1, 2, w, b, 1e-5, False)
    for a, b_ in zip(first, other):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4)


def test_bad_gradient_gets_a_clear_error():
    from fastnorm.ops import extension

    ext = extension.load("cpu")
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="grad has shape"):
        ext.norm_backward(torch.randn(4, 9), x, None, None, 1, 2, 1e-5, True, True, False, False)
    with pytest.raises(RuntimeError, match="grad dtype"):
        ext.norm_backward(torch.randn(4, 8, dtype=torch.float64), x, None, None, 1, 2, 1e-5, True, True, False, False)
