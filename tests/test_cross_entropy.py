"""fastnorm.cross_entropy (softmax over the classes, then the target's negative log-likelihood): loss and
gradient against F.cross_entropy in float64, on odd sizes, views at any offset, offsets, masked classes,
ignored rows, bad targets and bad input; on the CPU (ATen ops) and CUDA (softmax_loss.cu)."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
# Worst error relative to the largest |reference| (at least 1 for the loss): the loss is computed in float32
# (float64) from the logits as stored, so it is as exact for every dtype; the gradient is rounded once to
# the logits' dtype. Plus the input's terms: x - lse rounds to ulps of max |x| in the accumulator type
# (logits near 1000 hold only 4 decimals past the point in float32, in PyTorch's loss too).
LOSS_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}
GRAD_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
# (rows, classes): one class, tiny rows (a warp a row, several rows a block), odd vocabularies (GPT-2's
# 50257), a row of 256 threads and more, one long row.
SHAPES = [(1, 1), (5, 3), (64, 129), (300, 1000), (7, 50257), (33, 32000), (2, 100001)]


def rel(got, ref):
    return ((got.double() - ref).abs().max() / max(ref.abs().max().item(), 1e-300)).item()


def compare(logits, target, reduction="mean", ignore_index=-100):
    """Loss and gradient of fastnorm.cross_entropy against F.cross_entropy on the float64 logits, for an
    upstream gradient that keeps the logits' gradient in the normal range of their dtype."""
    x = logits.detach().requires_grad_()
    loss = fastnorm.cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction)
    x64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, ignore_index=ignore_index, reduction=reduction)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    finite = logits[logits.isfinite()]
    terms = 4 * torch.finfo(acc).eps * (finite.double().abs().max().item() if finite.numel() else 0.0)
    assert loss.dtype == acc and loss.shape == ref.shape
    scale = max(ref.abs().max().item(), 1.0)
    assert (loss.double() - ref).abs().max().item() / scale <= LOSS_TOL[logits.dtype] + terms / scale
    rows = max(target.numel(), 1)
    upstream = torch.rand_like(ref) + 0.5
    if reduction == "mean":
        upstream = upstream * rows  # the mean divides each row's gradient by the rows: fp16 would go subnormal
    (loss * upstream.to(acc)).sum().backward()
    (ref * upstream).sum().backward()
    assert x.grad.dtype == logits.dtype and x.grad.shape == logits.shape
    assert rel(x.grad, x64.grad) <= GRAD_TOL[logits.dtype] + terms, rel(x.grad, x64.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(device, dtype, shape):
    rows, classes = shape
    logits = (torch.randn(shape, device=device) * 3).to(dtype)
    target = torch.randint(0, classes, (rows,), device=device)
    target[rows // 2] = -100 if rows > 1 else target[0]
    compare(logits, target)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(37, 1001), (40000, 7)], ids=["reduced-in-kernel", "reduced-by-aten"])
def test_reductions(device, reduction, dtype, shape):
    """The sum or mean comes from the kernels' own launch up to 32768 rows on CUDA, from ATen's sums past
    that; either way the same bits on every call."""
    logits = torch.randn(shape, device=device).to(dtype)
    target = torch.randint(0, shape[1], (shape[0],), device=device)
    target[::5] = -100
    compare(logits, target, reduction)
    again = [fastnorm.cross_entropy(logits, target, reduction=reduction) for _ in range(2)]
    assert torch.equal(again[0], again[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("view", ["start+1", "start+3", "every-other-row", "offset+1000", "rand", "-inf classes"])
def test_views_and_values(device, dtype, view):
    """Rows that start at any offset in their 16 bytes take the scalar head; large offsets and uniform
    values keep the float32 sums exact; masked classes (-inf) get probability 0."""
    base = (torch.randn(40, 1011, device=device) * 2).to(dtype)
    logits = {"start+1": base[:, 1:1001], "start+3": base[:, 3:1003], "every-other-row": base[::2, :1000],
              "offset+1000": (base.double() + 1000).to(dtype)[:, :1000],
              "rand": torch.rand(40, 1000, device=device).to(dtype),
              "-inf classes": base[:, :1000].masked_fill(torch.arange(1000, device=device) % 3 == 1, float("-inf"))}[view]
    target = torch.randint(0, 1000, (logits.shape[0],), device=device)
    if view == "-inf classes":
        target = target - target % 3  # a class that is not masked
    compare(logits, target)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = torch.randn(6, 9, device=device, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, -100, 8, 0, 4, 4], device=device)
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(lambda t: fastnorm.cross_entropy(t, target, reduction=reduction), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_ignore_index_and_bad_targets(device):
    logits = torch.randn(5, 10, device=device, requires_grad=True)
    target = torch.tensor([3, 7, 10, -1, 7], device=device)
    loss = fastnorm.cross_entropy(logits, target, ignore_index=7, reduction="none")
    assert loss[1] == 0 and loss[4] == 0, "ignored rows have loss 0"
    assert loss[2].isnan() and loss[3].isnan(), "targets outside the classes give NaN, not a device assert"
    assert loss[0].isfinite()
    loss[0].backward()
    assert logits.grad[[1, 4]].abs().max() == 0
    everything_ignored = fastnorm.cross_entropy(logits.detach(), torch.full((5,), 7, device=device), ignore_index=7)
    assert everything_ignored.isnan(), "mean over no rows is 0 / 0, as in PyTorch"


@pytest.mark.parametrize("device", DEVICES)
def test_one_dimensional_input(device):
    logits = torch.randn(17, device=device, dtype=torch.float64)
    target = torch.tensor(5, device=device)
    for reduction in ("mean", "sum", "none"):
        got = fastnorm.cross_entropy(logits, target, reduction=reduction)
        assert got.shape == () and torch.allclose(got, F.cross_entropy(logits, target, reduction=reduction))


@pytest.mark.parametrize("device", DEVICES)
def test_int32_targets_and_compile_free_fallbacks(device):
    logits = torch.randn(4, 6, device=device)
    target = torch.tensor([0, 5, 2, 1], device=device)
    assert torch.equal(fastnorm.cross_entropy(logits, target.int()), fastnorm.cross_entropy(logits, target))


def test_bad_input_raises_early():
    x, t = torch.randn(4, 6), torch.tensor([0, 1, 2, 3])
    with pytest.raises(TypeError, match="class indices"):
        fastnorm.cross_entropy(x, torch.rand(4, 6))  # class probabilities
    with pytest.raises(ValueError, match="does not match"):
        fastnorm.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="rows, classes"):
        fastnorm.cross_entropy(torch.randn(2, 3, 4), t[:2])
    with pytest.raises(TypeError, match="not supported"):
        fastnorm.cross_entropy(x.int(), t)
    with pytest.raises(ValueError, match="reduction"):
        fastnorm.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="at least one"):
        fastnorm.cross_entropy(torch.randn(4, 0), t)


@pytest.mark.cuda
def test_device_mismatch_raises():
    with pytest.raises(ValueError, match="target on"):
        fastnorm.cross_entropy(torch.randn(4, 6, device="cuda"), torch.tensor([0, 1, 2, 3]))


@pytest.mark.cuda
@pytest.mark.parametrize("under_compile", [False, True])
def test_under_torch_compile(under_compile):
    """The op is opaque to torch.compile (fake tensors, autograd): same loss and gradient as eager."""
    logits = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 3000, (64,), device="cuda")
    fn = torch.compile(fastnorm.cross_entropy, fullgraph=True) if under_compile else fastnorm.cross_entropy
    loss = fn(logits, target)
    loss.backward()
    grad, logits.grad = logits.grad, None
    ref = fastnorm.cross_entropy(logits, target)
    ref.backward()
    assert torch.equal(loss, ref) and torch.equal(grad, logits.grad)


@pytest.mark.cuda
@pytest.mark.slow
def test_over_two_to_the_31_elements():
    """17000 rows of 131072 bf16 classes (2.2e9 elements, 4.5 GB): 64-bit row offsets."""
    logits = torch.randn(17000, 131072, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 131072, (17000,), device="cuda")
    loss = fastnorm.cross_entropy(logits, target, reduction="none")
    for start in (0, 8500, 16000):
        rows = slice(start, start + 1000)
        ref = F.cross_entropy(logits[rows].double(), target[rows], reduction="none")
        assert (loss[rows].double() - ref).abs().max().item() <= 1e-4
