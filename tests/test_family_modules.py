"""fastnorm.BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d and GroupNorm are drop-ins for torch.nn's: same
attributes and state_dict, same outputs and running statistics over training / eval sequences, and
fastnorm.patch swaps them in."""
import pytest
import torch
from torch import nn

import fastnorm
from conftest import assert_matches_reference
from family_reference import family_kernels  # noqa: F401  (autouse: the extension's kernels or a stand-in)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# (fastnorm class, torch class, constructor kwargs, input shape)
CASES = [
    (fastnorm.BatchNorm1d, nn.BatchNorm1d, dict(num_features=5), (8, 5)),
    (fastnorm.BatchNorm1d, nn.BatchNorm1d, dict(num_features=5, affine=False), (4, 5, 7)),
    (fastnorm.BatchNorm2d, nn.BatchNorm2d, dict(num_features=6), (4, 6, 5, 3)),
    (fastnorm.BatchNorm2d, nn.BatchNorm2d, dict(num_features=6, momentum=None), (3, 6, 4, 4)),
    (fastnorm.BatchNorm2d, nn.BatchNorm2d, dict(num_features=3, track_running_stats=False), (2, 3, 5, 5)),
    (fastnorm.BatchNorm3d, nn.BatchNorm3d, dict(num_features=3, eps=1e-3, momentum=0.3), (2, 3, 4, 3, 2)),
    (fastnorm.InstanceNorm1d, nn.InstanceNorm1d, dict(num_features=5), (3, 5, 9)),
    (fastnorm.InstanceNorm1d, nn.InstanceNorm1d, dict(num_features=5, affine=True, track_running_stats=True), (5, 9)),
    (fastnorm.InstanceNorm2d, nn.InstanceNorm2d, dict(num_features=4, affine=True, track_running_stats=True),
     (2, 4, 5, 6)),
    (fastnorm.InstanceNorm2d, nn.InstanceNorm2d, dict(num_features=4, track_running_stats=True, momentum=None),
     (4, 5, 6)),
    (fastnorm.InstanceNorm3d, nn.InstanceNorm3d, dict(num_features=3, affine=True), (2, 3, 3, 4, 2)),
    (fastnorm.GroupNorm, nn.GroupNorm, dict(num_groups=3, num_channels=6), (2, 6, 5, 4)),
    (fastnorm.GroupNorm, nn.GroupNorm, dict(num_groups=5, num_channels=15, affine=False), (3, 15, 7)),
    (fastnorm.GroupNorm, nn.GroupNorm, dict(num_groups=1, num_channels=7, eps=1e-3), (2, 7)),
]
IDS = [f"{ours.__name__}-{i}" for i, (ours, _, _, _) in enumerate(CASES)]


def _randomize(module):
    """Random parameters and running statistics (variances positive); num_batches_tracked stays."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
        for name, buf in module.named_buffers():
            if buf.is_floating_point():
                buf.copy_(torch.rand_like(buf) + 0.5 if "var" in name else torch.randn_like(buf))


@pytest.mark.parametrize("ours,theirs,kwargs,shape", CASES, ids=IDS)
def test_same_class_attributes_and_state_dict(ours, theirs, kwargs, shape):
    a, b = ours(**kwargs), theirs(**kwargs)
    assert isinstance(a, theirs) and repr(a) == repr(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)
    _randomize(b)
    a.load_state_dict(b.state_dict())  # strict: torch -> fastnorm
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    _randomize(a)
    b.load_state_dict(a.state_dict())  # strict: fastnorm -> torch
    assert all(torch.equal(b.state_dict()[k], v) for k, v in a.state_dict().items())


def _assert_same_state(ours, reference):
    for (name, got), (_, want) in zip(ours.state_dict().items(), reference.state_dict().items()):
        if name.endswith("num_batches_tracked"):
            assert torch.equal(got, want), name
        else:
            assert_matches_reference(got, want, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ours,theirs,kwargs,shape", CASES, ids=IDS)
def test_training_eval_sequence(ours, theirs, kwargs, shape, device):
    """3 training calls (outputs, gradients, running statistics, num_batches_tracked), 2 in eval mode
    (running statistics used, untouched), one more in training: against torch's module in float64."""
    if issubclass(theirs, nn.modules.instancenorm._InstanceNorm) and kwargs.get("momentum", 0.1) is None and \
            not hasattr(torch.library, "register_autograd"):
        pytest.skip("torch < 2.4's InstanceNorm does not take momentum=None (ours does, as 2.4+ does)")
    a = ours(**kwargs, device=device)
    b = theirs(**kwargs, device=device, dtype=torch.float64)
    _randomize(b)
    a.load_state_dict(b.state_dict())
    for step, training in enumerate([True, True, True, False, False, True]):
        a.train(training)
        b.train(training)
        x = torch.randn(shape, dtype=torch.float64, device=device) * (step + 1) + (100.0 if step == 1 else step)
        dy = torch.randn(shape, dtype=torch.float64, device=device)
        xa = x.float().requires_grad_()
        xb = x.clone().requires_grad_()
        ya, yb = a(xa), b(xb)
        assert ya.dtype == torch.float32 and ya.shape == yb.shape
        assert_matches_reference(ya, yb, torch.float32)
        ya.backward(dy.float())
        yb.backward(dy)
        assert_matches_reference(xa.grad, xb.grad, torch.float32)
        _assert_same_state(a, b)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert_matches_reference(pa.grad, pb.grad, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_input_with_float32_module(dtype):
    """Autocast-style: float32 parameters and buffers, half input; the output keeps the input's dtype."""
    cases = [(fastnorm.BatchNorm2d(6), nn.BatchNorm2d(6), (4, 6, 3, 3)),
             (fastnorm.GroupNorm(2, 6), nn.GroupNorm(2, 6), (4, 6, 3, 3)),
             (fastnorm.InstanceNorm1d(6, affine=True), nn.InstanceNorm1d(6, affine=True), (4, 6, 9))]
    for ours, theirs, shape in cases:
        _randomize(theirs)
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(shape).to(dtype)
        y = ours(x)
        assert y.dtype == dtype
        assert_matches_reference(y, theirs.double()(x.double()))
        _assert_same_state(ours, theirs)


def test_module_in_bfloat16():
    a, b = fastnorm.BatchNorm1d(4).bfloat16(), nn.BatchNorm1d(4).bfloat16()
    x = torch.randn(16, 4, 3).bfloat16()
    assert_matches_reference(a(x), b.double()(x.double()))
    assert a.running_mean.dtype == torch.bfloat16
    torch.testing.assert_close(a.running_var, b.running_var.bfloat16(), rtol=1e-2, atol=1e-2)


BAD_INPUTS = [  # (fastnorm class, torch class, constructor kwargs, input)
    (fastnorm.BatchNorm2d, nn.BatchNorm2d, dict(num_features=3), (2, 3, 4)),  # 3-d input to a 2d norm
    (fastnorm.BatchNorm1d, nn.BatchNorm1d, dict(num_features=3), (2, 3, 4, 4)),
    (fastnorm.BatchNorm3d, nn.BatchNorm3d, dict(num_features=3), (2, 3, 4, 4)),
    (fastnorm.InstanceNorm1d, nn.InstanceNorm1d, dict(num_features=3), (3,)),
    (fastnorm.InstanceNorm2d, nn.InstanceNorm2d, dict(num_features=3, affine=True), (2, 4, 5, 5)),  # channels
    (fastnorm.BatchNorm1d, nn.BatchNorm1d, dict(num_features=3), (1, 3)),  # one value per channel, training
    (fastnorm.InstanceNorm2d, nn.InstanceNorm2d, dict(num_features=3), (2, 3, 1, 1)),  # one spatial element
]


@pytest.mark.parametrize("ours,theirs,kwargs,shape", BAD_INPUTS, ids=[str(c[3]) for c in BAD_INPUTS])
def test_bad_input_raises_as_torch(ours, theirs, kwargs, shape):
    """The exception type torch's module raises on the same input (its own input checks are inherited)."""
    x = torch.randn(shape)
    with pytest.raises(Exception) as expected:
        theirs(**kwargs)(x)
    with pytest.raises(expected.type):
        ours(**kwargs)(x)


def test_group_norm_bad_groups():
    with pytest.raises(ValueError, match="num_groups=2 must be positive and divide the 5 channels"):
        fastnorm.GroupNorm(2, 4, affine=False)(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"weight has shape \[4\], expected \[6\]"):
        fastnorm.GroupNorm(2, 4)(torch.randn(2, 6, 3))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, momentum=None)
        self.gn = nn.GroupNorm(3, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True, track_running_stats=True)
        self.bn1 = nn.BatchNorm1d(6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        h = self.inorm(self.gn(self.bn(self.conv(x)).relu()))
        return self.ln(self.bn1(h.amax((2, 3))))


def test_patch_swaps_the_family():
    model, reference = _Net(), _Net()
    reference.load_state_dict(model.state_dict())
    tensors = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    report = fastnorm.patch(model)
    assert {r.path: r.replacement for r in report.replaced} == {
        "bn": "fastnorm.family_modules.BatchNorm2d", "gn": "fastnorm.family_modules.GroupNorm",
        "inorm": "fastnorm.family_modules.InstanceNorm2d", "bn1": "fastnorm.family_modules.BatchNorm1d",
        "ln": "fastnorm.LayerNorm"}
    assert all(v is tensors[k] for k, v in model.state_dict(keep_vars=True).items())  # the same objects
    for _ in range(2):
        x = torch.randn(4, 3, 5, 5)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)
    assert model.bn.num_batches_tracked.item() == 2
    assert fastnorm.unpatch(model) == ["bn", "gn", "inorm", "bn1", "ln"]
    assert type(model.bn) is nn.BatchNorm2d and model.bn.running_mean is tensors["bn.running_mean"]
    assert fastnorm.patch(model, family=False).replaced[0].path == "ln"


def test_patch_leaves_subclasses():
    class MyBatchNorm(nn.BatchNorm2d):
        pass

    model = nn.Sequential(MyBatchNorm(4), nn.SyncBatchNorm(4))
    assert fastnorm.patch(model).replaced == []



def test_parameters_take_the_direct_call():
    """A module's Parameters are plain tensors to direct_call_ok: under no_grad a family module calls its
    kernel directly (the op's dispatch is host time a small call cannot spare); with autograd it records."""
    from fastnorm.ops.direct import direct_call_ok

    weight = nn.Parameter(torch.ones(4))
    with torch.no_grad():
        assert direct_call_ok(torch.ones(2), weight)
    assert not direct_call_ok(torch.ones(2), weight)  # grad enabled and the Parameter requires grad
    assert direct_call_ok(torch.ones(2), nn.Parameter(torch.ones(4), requires_grad=False))

    class Subclass(torch.Tensor):
        pass

    with torch.no_grad():
        assert not direct_call_ok(torch.ones(2).as_subclass(Subclass))  # subclasses may intercept: dispatch
