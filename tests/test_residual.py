"""Fused residual add + norm (pre-norm blocks): (y, h) = (norm(x + r), x + r), forward and backward,
on the fused CUDA kernel and the unfused paths, against float64 references."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm
from conftest import rms_norm_definition

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # -m cuda selects the CUDA cases
TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}


def rel_err(got, ref, floor=1e-30):
    """Max error over ref's largest value, or over floor where ref is all smaller (a gradient that is 0
    but for float64 rounding: LayerNorm's dweight over one element)."""
    return (got.double() - ref.double()).abs().max().item() / max(ref.double().abs().max().item(), floor)


def reference(x, r, weight, bias, eps, rms, hdtype):
    """float64 y and h for h rounded to hdtype (the norm sees h as stored)."""
    h = (x.double() + r.double()).to(hdtype)
    hd = h.double()
    n = x.shape[-1]
    if rms:
        y = rms_norm_definition(hd, (n,), None if weight is None else weight.double(), eps)
    else:
        y = F.layer_norm(hd, (n,), None if weight is None else weight.double(),
                         None if bias is None else bias.double(), eps)
    return y, h


def call(x, r, weight, bias, eps, rms, residual_in_fp32=False):
    if rms:
        return fastnorm.rms_norm(x, x.shape[-1:], weight, eps, residual=r, residual_in_fp32=residual_in_fp32)
    return fastnorm.layer_norm(x, x.shape[-1:], weight, bias, eps, residual=r, residual_in_fp32=residual_in_fp32)


# Rows of the fused kernel (up to 1024 threads x 4 vectors: 2-byte rows of other than a power of two
# vectors take 4 a thread, 5120 and 1000 in bf16, 24000 fused only in bf16), an odd width (scalar
# path), and rows longer than it fuses (added first).
SHAPES = [(64, 1024), (33, 257), (7, 4096), (3, 16384), (5, 5120), (9, 1000), (4, 24000), (2, 40000), (1, 8)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_forward_matches_reference(device, shape, rms, dtype):
    x = torch.randn(shape, device=device, dtype=dtype)
    r = torch.randn(shape, device=device, dtype=dtype) * 3 + 5  # a residual stream far from zero
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    b = None if rms else torch.randn(shape[-1], device=device, dtype=dtype)
    y, h = call(x, r, w, b, 1e-5, rms)
    y_ref, h_ref = reference(x, r, w, b, 1e-5, rms, dtype)
    assert y.dtype == dtype and h.dtype == dtype and y.shape == x.shape
    assert torch.equal(h, h_ref), "h must be x + r rounded once"
    assert rel_err(y, y_ref) <= TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(16, 2048), (3, 30000)], ids=["fused", "unfused"])
def test_residual_in_fp32(device, shape):
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    r = torch.randn(shape, device=device, dtype=torch.float32)
    w = torch.rand(shape[-1], device=device, dtype=torch.bfloat16) + 0.5
    y, h = call(x, r, w, None, 1e-6, True, residual_in_fp32=True)
    y_ref, h_ref = reference(x, r, w, None, 1e-6, True, torch.float32)
    assert h.dtype == torch.float32 and y.dtype == torch.bfloat16
    assert torch.equal(h, h_ref)
    assert rel_err(y, y_ref) <= TOL[torch.bfloat16]
    # A bf16 residual is accepted too (the first block), and h still comes back in float32.
    y2, h2 = call(x, r.bfloat16(), w, None, 1e-6, True, residual_in_fp32=True)
    assert h2.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(48, 1024), (33, 257), (3, 30000), (64, 1)], ids=["fused", "odd", "unfused", "one"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("use_h", [True, False], ids=["h-used", "h-unused"])
def test_gradients_flow_to_both_inputs(device, shape, rms, use_h):
    x = torch.randn(shape, device=device, requires_grad=True)
    r = torch.randn(shape, device=device, requires_grad=True)
    w = (torch.rand(shape[-1], device=device) + 0.5).requires_grad_()
    b = None if rms else torch.randn(shape[-1], device=device, requires_grad=True)
    dy, dh = torch.randn(shape, device=device), torch.randn(shape, device=device)
    y, h = call(x, r, w, b, 1e-5, rms)
    loss = (y * dy).sum() + ((h * dh).sum() if use_h else 0)
    params = [t for t in (x, r, w, b) if t is not None]
    got = torch.autograd.grad(loss, params)
    xd, rd = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    hd = xd + rd
    yd = rms_norm_definition(hd, shape[-1:], wd, 1e-5) if rms else F.layer_norm(hd, shape[-1:], wd, bd, 1e-5)
    loss_d = (yd * dy.double()).sum() + ((hd * dh.double()).sum() if use_h else 0)
    ref = torch.autograd.grad(loss_d, [t for t in (xd, rd, wd, bd) if t is not None])
    for name, g, rf in zip(("dx", "dr", "dw", "db"), got, ref):
        assert rel_err(g, rf, 1e-3) <= TOL[torch.float32], name  # the terms are O(1): dy, dh, x ~ randn


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    x = torch.randn(4, 6, device=device, dtype=torch.float64, requires_grad=True)
    r = torch.randn(4, 6, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w, b: fastnorm.layer_norm(x, (6,), w, b, residual=r), (x, r, w, b))
    assert torch.autograd.gradcheck(lambda x, r, w: fastnorm.rms_norm(x, (6,), w, 1e-5, residual=r), (x, r, w))
    assert torch.autograd.gradgradcheck(lambda x, r, w, b: fastnorm.layer_norm(x, (6,), w, b, residual=r),
                                        (x, r, w, b))
    assert torch.autograd.gradgradcheck(lambda x, r, w: fastnorm.rms_norm(x, (6,), w, 1e-5, residual=r), (x, r, w))


@pytest.mark.parametrize("device", DEVICES)
def test_modules_take_a_residual(device):
    m = fastnorm.RMSNorm(64, eps=1e-6, residual_in_fp32=True).to(device)
    x = torch.randn(8, 64, device=device)
    r = torch.randn(8, 64, device=device)
    y, h = m(x, r)
    assert torch.equal(h, x + r)
    assert torch.allclose(y, m(h))
    ln = fastnorm.LayerNorm(64).to(device)
    y2, h2 = ln(x, r)
    assert torch.allclose(y2, F.layer_norm(x + r, (64,), ln.weight, ln.bias, 1e-5), atol=1e-5)


def test_bad_residual_gets_a_clear_error():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="residual has shape"):
        fastnorm.rms_norm(x, (8,), residual=torch.randn(4, 9))
    with pytest.raises(TypeError, match="residual dtype"):
        fastnorm.rms_norm(x, (8,), residual=torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        fastnorm.layer_norm(x, (8,), residual=[1.0])


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.cuda
def test_compile_fullgraph_with_residual_trains():
    m = fastnorm.RMSNorm(256).cuda()

    def block(x, r):
        y, h = m(x, r)
        return (y * 2).sum() + h.sum()

    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(16, 256, device="cuda", requires_grad=True)
    r = torch.randn(16, 256, device="cuda", requires_grad=True)
    compiled(x, r).backward()
    gx = x.grad.clone()
    x.grad = None
    block(x, r).backward()
    assert torch.allclose(gx, x.grad, atol=1e-5)
