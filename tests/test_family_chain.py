"""GroupNorm's chained-sets kernel (family_chain_kernel.cuh: sets of 256 KB - 16 MB in one kernel, the
statistics chunks of later sets ticketed ahead of the output pieces of earlier ones) against float64:
the three ticket stretches (the first sets' statistics, alternating statistics and outputs, the last sets'
outputs), pieces spanning planes, every dtype, SiLU, missing or float32 parameters, offsets, repeat bits,
and the calls it must leave to the multi-kernel path (misaligned, set path, off by variable). Then the
backward's chain (family_backward.cuh chain_backward_kernel): gradients against float64, repeat bits, SiLU
left to the plane kernels.
"""
import pytest
import torch

from fastnorm.ops import extension
from profiled import kernels_of
from test_family_kernels import TOL, affine, assert_stats, make, rel_err

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# (shape, groups), each with sets of 256 KB or more in every dtype and fewer sets than 3/4 of the SMs
# where a set is 1 MB or less: one plane per piece (65536), planes that pieces span (2056: not a multiple
# of a piece), 80 sets (lag 32 sets of 512 KB: all three stretches), a set of 8 MB (16 MB in float64).
CASES = [((2, 8, 256, 256), 2), ((2, 80, 2056), 1), ((40, 4, 256, 256), 2), ((1, 2, 1024, 1024), 1)]


def ext():
    return extension.load("cuda")


def reference(x, w, b, groups, eps, silu=False):
    xg = x.double().reshape(x.shape[0], groups, -1)
    m, v = xg.mean(-1), xg.var(-1, unbiased=False)
    y = affine(((xg - m[..., None]) / torch.sqrt(v[..., None] + eps)).reshape(x.shape), w, b, x)
    return (y * torch.sigmoid(y) if silu else y), m, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-g{c[1]}")
def test_chain_matches_float64(dtype, case):
    shape, groups = case
    torch.manual_seed(0)
    names = kernels_of(lambda: ext().group_norm_forward(make(shape, dtype, "cuda"), None, None, groups, 1e-5))
    assert any("chain_kernel" in n for n in names), names
    for kind, offset in (("randn", 0.0), ("rand", 0.0), ("randn", 1000.0)):
        if offset and dtype in (torch.float16, torch.bfloat16):
            continue  # x + 1000 is not representable to the unit there
        x = make(shape, dtype, "cuda", kind, offset)
        w = torch.randn(shape[1], dtype=dtype, device="cuda")
        b = torch.randn(shape[1], dtype=dtype, device="cuda")
        y, mean, var = ext().group_norm_forward(x, w, b, groups, 1e-5)
        ref, m, v = reference(x, w, b, groups, 1e-5)
        tol = TOL[dtype] * (1 + offset) if dtype == torch.float64 else TOL[dtype]
        assert rel_err(y, ref) <= tol, (kind, offset)
        assert_stats(mean, var, m, v, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_chain_silu_and_parameters(dtype):
    shape, groups = (2, 80, 2056), 2 if dtype == torch.float32 else 1
    x = make(shape, dtype, "cuda")
    c = shape[1]
    for w, b in ((None, None), (torch.randn(c, device="cuda"), None), (None, torch.randn(c, device="cuda")),
                 (torch.randn(c, device="cuda"), torch.randn(c, device="cuda"))):  # float32 parameters
        for act in (0, 1):
            y = ext().group_norm_forward(x, w, b, groups, 1e-3, act)[0]
            ref = reference(x, w, b, groups, 1e-3, silu=act == 1)[0]
            assert rel_err(y, ref) <= TOL[dtype] * 2, (w is None, b is None, act)


def test_chain_repeats_bitwise_and_agrees_with_the_multi_kernel_path(monkeypatch):
    x = make((40, 4, 256, 256), torch.float32, "cuda", offset=3.0)
    w, b = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
    first = ext().group_norm_forward(x, w, b, 2, 1e-5)
    for _ in range(3):
        again = ext().group_norm_forward(x, w, b, 2, 1e-5)
        assert all(torch.equal(a, f) for a, f in zip(again, first))
    monkeypatch.setenv("FASTNORM_FAMILY_CHAIN_KB", "0")
    names = kernels_of(lambda: ext().group_norm_forward(x, w, b, 2, 1e-5))
    assert not any("chain_kernel" in n for n in names), names
    other = ext().group_norm_forward(x, w, b, 2, 1e-5)
    assert rel_err(first[0], other[0].double()) <= 4e-6
    assert rel_err(first[2], other[2].double()) <= 1e-5


@pytest.mark.parametrize("case", ["misaligned", "set_path", "small_sets"])
def test_calls_left_to_other_paths_stay_right(case):
    if case == "misaligned":  # x one element past a 16-byte boundary: the multi-kernel path
        x = make((2 * 8 * 256 * 256 + 1,), torch.float32, "cuda")[1:].view(2, 8, 256, 256)
        shape, groups = x.shape, 2
    elif case == "set_path":  # sets of 1 MB for every SM: a block a set
        shape, groups = (132, 4, 256, 256), 1
        x = make(shape, torch.float32, "cuda")
    else:  # 128 KB sets, few of them: below the chain's 256 KB
        shape, groups = (2, 8, 128, 128), 4
        x = make(shape, torch.float32, "cuda")
    names = kernels_of(lambda: ext().group_norm_forward(x, None, None, groups, 1e-5))
    assert not any("chain_kernel" in n for n in names), names
    y, mean, var = ext().group_norm_forward(x, None, None, groups, 1e-5)
    ref, m, v = reference(x, None, None, groups, 1e-5)
    assert rel_err(y, ref) <= TOL[torch.float32]
    assert_stats(mean, var, m, v, torch.float32)


def test_chain_nan_set_stays_nan():
    x = make((2, 8, 256, 256), torch.float32, "cuda")
    x[1, 5, 7, 9] = float("nan")
    y, mean, var = ext().group_norm_forward(x, None, None, 2, 1e-5)
    assert torch.isnan(y[1, 4:]).all() and torch.isnan(mean[1, 1]) and torch.isnan(var[1, 1])
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[1, :4]).all()


# The backward's chain (family_backward.cuh chain_backward_kernel: sets of 256 KB - 16 MB of x and dy, planes
# of 16K+ elements, no SiLU): planes of 65536, planes starting misaligned with a partial last piece
# (16411), 80 sets (all three ticket stretches), one plane a set (InstanceNorm's layout), sets of 2-4 MB
# (the held chain but in float64, pieces of 9216 elements a partial one a plane).
BACKWARD_CASES = [((2, 8, 256, 256), 2), ((2, 6, 16411), 1), ((40, 4, 128, 512), 2), ((4, 8, 256, 256), 8),
                  ((1, 4, 512, 1024), 2)]
GRAD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 2e-2}


def gn_grads(x, w, b, groups, dy, activation=None):
    import fastnorm

    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    fastnorm.group_norm(leaves[0], groups, leaves[1], leaves[2], activation=activation).backward(dy)
    return [t.grad for t in leaves]


def reference_grads(x, w, b, groups, dy, silu=False):
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y = torch.nn.functional.group_norm(leaves[0], groups, leaves[1], leaves[2])
    (torch.nn.functional.silu(y) if silu else y).backward(dy.double())
    return [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-g{c[1]}")
def test_chain_backward_matches_float64(dtype, case):
    shape, groups = case
    torch.manual_seed(1)
    for offset in (0.0, 1000.0):
        if offset and dtype in (torch.float16, torch.bfloat16):
            continue
        x = make(shape, dtype, "cuda", offset=offset)
        w = (torch.rand(shape[1], dtype=torch.float64) + 0.5).to("cuda", dtype)
        b = torch.randn(shape[1], dtype=torch.float64).to("cuda", dtype)
        dy = torch.randn(shape, device="cuda").to(dtype)
        names = kernels_of(lambda: gn_grads(x, w, b, groups, dy))
        assert any("chain_backward_kernel" in n for n in names), names
        got = gn_grads(x, w, b, groups, dy)
        expected = reference_grads(x, w, b, groups, dy)
        for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
            err = (g.double() - e).abs().max().item() / max(1.0, e.abs().max().item())
            assert err <= GRAD_TOL[dtype], (name, offset, err)


def test_chain_backward_repeats_bitwise_and_leaves_silu_to_the_planes():
    x = make((40, 4, 128, 512), torch.bfloat16, "cuda")
    w = torch.rand(4, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(4, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    first = gn_grads(x, w, b, 2, dy)
    for _ in range(2):
        assert all(torch.equal(g, f) for g, f in zip(gn_grads(x, w, b, 2, dy), first))
    names = kernels_of(lambda: gn_grads(x, w, b, 2, dy, "silu"))
    assert not any("chain_backward_kernel" in n for n in names), names
    got, expected = gn_grads(x, w, b, 2, dy, "silu"), reference_grads(x, w, b, 2, dy, silu=True)
    for g, e in zip(got, expected):
        assert (g.double() - e).abs().max().item() / max(1.0, e.abs().max().item()) <= GRAD_TOL[torch.bfloat16]


# The held chains (sets of 2 MB of x or more, not float64): the forward's held_chain_kernel and the
# backward's held_chain_backward_kernel hold a chunk or piece on chip across the set's barrier. Against the
# lag chains they replace (FASTNORM_FAMILY_CHAIN_HOLD=0, FASTNORM_FAMILY_BWD_HOLD=0), with SiLU in the
# forward, repeat bits, and the kernels each call takes.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_held_chains_agree_with_the_lag_chains(dtype, monkeypatch):
    shape, groups = (3, 4, 512, 1100), 2  # sets of 2.1-4.3 MB; chunks and pieces span planes or end short
    x = make(shape, dtype, "cuda", offset=2.0)
    w = (torch.rand(shape[1], dtype=torch.float64) + 0.5).to("cuda", dtype)
    b = torch.randn(shape[1], dtype=torch.float64).to("cuda", dtype)
    dy = torch.randn(shape, device="cuda").to(dtype)
    held = {}
    for act in (0, 1):
        names = kernels_of(lambda: ext().group_norm_forward(x, w, b, groups, 1e-5, act))
        assert any("held_chain_kernel" in n for n in names), names
        held[act] = ext().group_norm_forward(x, w, b, groups, 1e-5, act)
        again = ext().group_norm_forward(x, w, b, groups, 1e-5, act)
        assert all(torch.equal(a, h) for a, h in zip(again, held[act]))
        ref = reference(x, w, b, groups, 1e-5, silu=act == 1)
        assert rel_err(held[act][0], ref[0]) <= TOL[dtype] * 2
        assert_stats(held[act][1], held[act][2], ref[1], ref[2], dtype)
    names = kernels_of(lambda: gn_grads(x, w, b, groups, dy))
    assert any("held_chain_backward_kernel" in n for n in names), names
    grads = gn_grads(x, w, b, groups, dy)
    assert all(torch.equal(g, h) for g, h in zip(gn_grads(x, w, b, groups, dy), grads))
    expected = reference_grads(x, w, b, groups, dy)
    for name, g, e in zip(("dx", "dweight", "dbias"), grads, expected):
        assert (g.double() - e).abs().max().item() / max(1.0, e.abs().max().item()) <= GRAD_TOL[dtype], name
    monkeypatch.setenv("FASTNORM_FAMILY_CHAIN_HOLD", "0")
    monkeypatch.setenv("FASTNORM_FAMILY_BWD_HOLD", "0")
    names = kernels_of(lambda: (ext().group_norm_forward(x, w, b, groups, 1e-5), gn_grads(x, w, b, groups, dy)))
    assert not any("held_chain" in n for n in names) and any("chain_kernel" in n for n in names), names
    lag = ext().group_norm_forward(x, w, b, groups, 1e-5)
    assert rel_err(held[0][0], lag[0].double()) <= TOL[dtype]
    for g, h in zip(gn_grads(x, w, b, groups, dy), grads):
        assert (g.double() - h.double()).abs().max().item() / max(1.0, h.abs().max().item()) <= GRAD_TOL[dtype]
