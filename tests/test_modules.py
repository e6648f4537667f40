"""fastnorm.LayerNorm / RMSNorm are drop-ins for torch.nn.LayerNorm / RMSNorm."""
import pytest
import torch
from torch import nn

import fastnorm
from conftest import HAS_TORCH_RMS_NORM, assert_matches_reference, needs_torch_rms_norm, reference_rms_norm

LAYER_NORM_ARGS = [
    dict(normalized_shape=8),
    dict(normalized_shape=(8,)),
    dict(normalized_shape=[3, 8], eps=1e-3),
    dict(normalized_shape=(2, 3, 8), elementwise_affine=False),
    dict(normalized_shape=8, bias=False),
    dict(normalized_shape=8, elementwise_affine=False, bias=False),
    dict(normalized_shape=8, dtype=torch.float64, device="cpu"),
]
RMS_NORM_ARGS = [
    dict(normalized_shape=8),
    dict(normalized_shape=(3, 8), eps=1e-6),
    dict(normalized_shape=[8], elementwise_affine=False),
    dict(normalized_shape=8, eps=None, dtype=torch.float64, device="cpu"),
]
PAIRS = [(fastnorm.LayerNorm, nn.LayerNorm, a) for a in LAYER_NORM_ARGS] + \
        [(fastnorm.RMSNorm, nn.RMSNorm, a) for a in RMS_NORM_ARGS if HAS_TORCH_RMS_NORM]
IDS = [f"{ours.__name__}-{i}" for i, (ours, _, _) in enumerate(PAIRS)]


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))


@pytest.mark.parametrize("ours,theirs,kwargs", PAIRS, ids=IDS)
def test_same_attributes(ours, theirs, kwargs):
    a, b = ours(**kwargs), theirs(**kwargs)
    assert a.normalized_shape == b.normalized_shape and isinstance(a.normalized_shape, tuple)
    assert a.eps == b.eps
    assert a.elementwise_affine == b.elementwise_affine
    for name in ("weight", "bias"):
        pa, pb = getattr(a, name, None), getattr(b, name, None)
        assert (pa is None) == (pb is None), name
        if pb is not None:
            assert isinstance(pa, nn.Parameter)
            assert pa.shape == pb.shape and pa.dtype == pb.dtype and pa.device == pb.device
            assert torch.equal(pa, pb)  # same initialization (ones / zeros)


@pytest.mark.parametrize("ours,theirs,kwargs", PAIRS, ids=IDS)
def test_state_dict_round_trip(ours, theirs, kwargs):
    a, b = ours(**kwargs), theirs(**kwargs)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype for k in sa)
    _randomize(b)
    a.load_state_dict(b.state_dict())  # strict: torch -> fastnorm
    for k, v in b.state_dict().items():
        assert torch.equal(a.state_dict()[k], v)
    _randomize(a)
    b.load_state_dict(a.state_dict())  # strict: fastnorm -> torch
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v)


@pytest.mark.parametrize("ours,theirs,kwargs", PAIRS, ids=IDS)
def test_outputs_match(ours, theirs, kwargs):
    a, b = ours(**kwargs), theirs(**kwargs)
    _randomize(b)
    a.load_state_dict(b.state_dict())
    shape = tuple(a.normalized_shape)
    dtype = kwargs.get("dtype", torch.float32)
    x = torch.randn((4, 5) + shape, dtype=torch.float64).add_(3).to(dtype)
    expected = b.double()(x.double())
    y = a(x)
    assert y.dtype == dtype
    assert_matches_reference(y, expected)


@pytest.mark.parametrize("ours,theirs,kwargs", PAIRS, ids=IDS)
def test_repr_like_torch(ours, theirs, kwargs):
    assert repr(ours(**kwargs)) == repr(theirs(**kwargs))


def test_module_dtype_conversion():
    m = fastnorm.LayerNorm(16)
    _randomize(m)
    x = torch.randn(3, 16).bfloat16()
    m = m.to(torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16
    y = m(x)
    assert y.dtype == torch.bfloat16
    ref = nn.LayerNorm(16, dtype=torch.float64)
    ref.load_state_dict(m.state_dict())  # copies the bf16-rounded parameters exactly
    assert_matches_reference(y, ref(x.double()).detach())


@needs_torch_rms_norm
def test_rms_norm_channel_axis_module():
    m = fastnorm.RMSNorm(12, eps=1e-5, dim=1)
    _randomize(m)
    assert "dim=1" in repr(m)
    assert list(m.state_dict()) == ["weight"] and m.weight.shape == (12,)
    x = torch.randn(2, 12, 7, 5)
    y = m(x)
    assert y.shape == x.shape
    assert_matches_reference(y, reference_rms_norm(x, None, m.weight.detach(), 1e-5, dim=1))
    # Same weights as a channels-last torch.nn.RMSNorm.
    torch_m = nn.RMSNorm(12, eps=1e-5)
    torch_m.load_state_dict(m.state_dict())
    expected = torch_m.double()(x.double().movedim(1, -1)).movedim(-1, 1)
    assert_matches_reference(y, expected.detach())


def test_layer_norm_channel_axis_module():
    m = fastnorm.LayerNorm(6, dim=1)
    _randomize(m)
    x = torch.randn(3, 6, 4, 4)
    torch_m = nn.LayerNorm(6)
    torch_m.load_state_dict(m.state_dict())
    expected = torch_m.double()(x.double().movedim(1, -1)).movedim(-1, 1)
    assert_matches_reference(m(x), expected.detach())


@needs_torch_rms_norm
def test_modules_train_like_torch():
    """One optimizer step gives the same parameters as with torch's modules."""
    ours = nn.Sequential(nn.Linear(10, 16), fastnorm.LayerNorm(16), nn.Linear(16, 16), fastnorm.RMSNorm(16))
    theirs = nn.Sequential(nn.Linear(10, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.RMSNorm(16))
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(32, 10)
    for model in (ours, theirs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).square().mean().backward()
        opt.step()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rms_norm_reference_the_compiled_path_traces(dtype):
    """What patched RMSNorm modules trace to under torch.compile (under_compile="inductor"): RMSNorm in
    float32 or wider against float64, with Gemma's offset, rounded once to the asked dtype."""
    from fastnorm.modules import rms_norm_reference

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 7, 16, generator=gen) * 3 + 1).to(dtype)
    w = torch.randn(7, 16, generator=gen).to(dtype)
    xd, wd = x.double(), w.double()
    expected = xd / torch.sqrt(xd.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * (wd + 1.0)
    y = rms_norm_reference(x, (7, 16), w, 1e-6, weight_offset=1.0)
    assert y.dtype == dtype
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    assert (y.double() - expected).abs().max().item() <= tol * expected.abs().max().item()
    assert rms_norm_reference(x, (7, 16), None, None, out_dtype=torch.float64).dtype == torch.float64
