"""The family's set path on CUDA (kernels/family_set_kernels.cuh: one block a set of statistics, forward and
backward): GroupNorm / InstanceNorm (a set is a (sample, group)) and BatchNorm in training (a set is a
channel across the batch) against float64 references at shapes with sets for 3/4 of the SMs or more, the
run-segment units (one run a set, runs of odd vector counts), offsets, SiLU, every dtype; the same answers
as the multi-kernel path (FASTNORM_FAMILY_SET_KB=0); deterministic."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GRAD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 2e-2}
FWD_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# (shape, groups), 256+ sets each: 16 channels of 64 a set; one channel a set (InstanceNorm) of 24 x 24
# (576 = 72 bf16 vectors over 32 segments: partial segments); 2 channels of 40 x 40; 64 channels a set.
CASES = [((16, 64, 8, 8), 16), ((8, 32, 24, 24), 32), ((4, 128, 40, 40), 64), ((2, 8192, 16), 128)]
# BatchNorm: channels of 40 samples x 4 x 4 (more runs than warps) and of 4 x 24 x 24 (runs in segments).
BATCH_SHAPES = [(40, 160, 4, 4), (4, 128, 24, 24)]


def sets_of(shape, groups):
    return shape[0] * groups


def make_x(shape, dist, dtype):
    x = torch.rand(shape, dtype=torch.float64) if dist == "rand" else torch.randn(shape, dtype=torch.float64)
    return (x + 1000 if dist == "offset1000" else x).to("cuda", dtype)


def rel_err(got, expected):
    return (got.double() - expected).abs().max().item() / max(1.0, expected.abs().max().item())


def test_cases_take_the_set_path():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sets = [sets_of(s, g) for s, g in CASES] + [s[1] for s in BATCH_SHAPES]
    assert all(4 * n >= 3 * sms for n in sets), "the set path needs sets for 3/4 of the SMs"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", CASES, ids=str)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_forward_and_backward_against_float64(shape, groups, activation, dtype):
    act = F.silu if activation else (lambda t: t)
    for dist in ("randn", "rand", "offset1000"):
        x = make_x(shape, dist, dtype).requires_grad_()
        w = (torch.rand(shape[1], dtype=torch.float64) + 0.5).to("cuda", dtype).requires_grad_()
        b = torch.randn(shape[1], dtype=torch.float64).to("cuda", dtype).requires_grad_()
        dy = torch.randn(shape, device="cuda").to(dtype)
        y = fastnorm.group_norm(x, groups, w, b, activation=activation)
        got = torch.autograd.grad(y, (x, w, b), dy)
        xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
        yd = act(F.group_norm(xd, groups, wd, bd))
        expected = torch.autograd.grad(yd, (xd, wd, bd), dy.double())
        assert rel_err(y, yd) <= FWD_TOL[dtype], dist
        for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
            assert g.dtype == dtype
            assert rel_err(g, e) <= GRAD_TOL[dtype], (dist, name, rel_err(g, e))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BATCH_SHAPES, ids=str)
def test_batch_norm_training_against_float64(shape, dtype):
    for dist in ("randn", "offset1000"):
        x = make_x(shape, dist, dtype).requires_grad_()
        w = (torch.rand(shape[1], dtype=torch.float64) + 0.5).to("cuda", dtype).requires_grad_()
        b = torch.randn(shape[1], dtype=torch.float64).to("cuda", dtype).requires_grad_()
        dy = torch.randn(shape, device="cuda").to(dtype)
        running = [torch.zeros(shape[1], device="cuda"), torch.ones(shape[1], device="cuda")]
        y = fastnorm.batch_norm(x, *running, w, b, training=True)
        got = torch.autograd.grad(y, (x, w, b), dy)
        xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
        expected_running = [torch.zeros(shape[1], device="cuda", dtype=torch.float64),
                            torch.ones(shape[1], device="cuda", dtype=torch.float64)]
        yd = F.batch_norm(xd, *expected_running, wd, bd, training=True)
        expected = torch.autograd.grad(yd, (xd, wd, bd), dy.double())
        assert rel_err(y, yd) <= FWD_TOL[dtype], dist
        for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
            assert rel_err(g, e) <= GRAD_TOL[dtype], (dist, name, rel_err(g, e))
        for r, e in zip(running, expected_running):  # the batch statistics the set kernel wrote
            assert rel_err(r, e) <= 1e-5 * max(1.0, e.abs().max().item()), dist


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_statistics_match_the_multi_kernel_path(dtype, monkeypatch):
    x = make_x((16, 64, 8, 8), "offset1000", dtype)
    dy = torch.randn_like(x)
    w = torch.rand(64, device="cuda", dtype=dtype, requires_grad=True)
    outs = {}
    for knob in ("", "0"):
        monkeypatch.setenv("FASTNORM_FAMILY_SET_KB", knob)
        y, mean, var = torch.ops.fastnorm.group_norm(x, w, None, 16, 1e-5)
        xg = x.clone().requires_grad_()
        grads = torch.autograd.grad(fastnorm.group_norm(xg, 16, w), (xg, w), dy)
        outs[knob] = (y, mean, var, *grads)
    for name, a, b in zip(("y", "mean", "var", "dx", "dweight"), outs[""], outs["0"]):
        tol = 1e-5 if name in ("mean", "var") else GRAD_TOL[dtype]
        assert rel_err(a, b.double()) <= tol, name


def test_deterministic():
    x = torch.randn(8, 32, 24, 24, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.rand(32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    runs = []
    for _ in range(3):
        xg = x.clone().requires_grad_()
        y = fastnorm.group_norm(xg, 32, w, b, activation="silu")
        runs.append((y, *torch.autograd.grad(y, (xg, w, b), dy)))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_odd_channels_and_few_sets_take_the_other_paths():
    # 7 x 7 = 49 elements a channel: no whole vectors (the set path needs them); 2 sets: fewer than SMs
    for shape, groups in [((16, 64, 7, 7), 16), ((2, 8, 64, 64), 1)]:
        x = torch.randn(shape, device="cuda", requires_grad=True)
        w = torch.rand(shape[1], device="cuda", requires_grad=True)
        dy = torch.randn(shape, device="cuda")
        got = torch.autograd.grad(fastnorm.group_norm(x, groups, w), (x, w), dy)
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        expected = torch.autograd.grad(F.group_norm(xd, groups, wd), (xd, wd), dy.double())
        assert all(rel_err(g, e) <= GRAD_TOL[torch.float32] for g, e in zip(got, expected))
