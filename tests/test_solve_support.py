"""Helpers shared by the solver tests, and the check that the stand-in extension they use is right.

Most solver tests run the generated file on STUB_EXTENSION, a PyTorch-ops stand-in for the compiled
kernels with the same `norm_forward` call, so that they test recognition, rewriting and emission
without a one-minute C++ build each. The stand-in itself is checked here against torch.nn.functional.
"""
import importlib.util
import itertools
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import needs_torch_rms_norm_for, rms_norm_definition

PROBLEMS_DIR = Path(__file__).resolve().parent / "solve_problems"
MAIN_PROBLEMS_DIR = Path(__file__).resolve().parents[1] / "problems"
SUPPORTED_PROBLEMS = [pytest.param(p, marks=needs_torch_rms_norm_for(p.read_text()), id=p.stem)
                      for p in sorted(PROBLEMS_DIR.glob("*.py")) if not p.name.startswith("unsupported_")]
UNSUPPORTED_PROBLEMS = sorted(PROBLEMS_DIR.glob("unsupported_*.py"))

STUB_EXTENSION = textwrap.dedent('''
    class _ReferenceNormExtension:
        """Stand-in for the compiled kernels (tests only): the same call, computed in float64 with PyTorch."""

        @staticmethod
        def norm_forward(x, weight, bias, begin_dim, end_dim, eps, rms, threads, blocks_per_row):
            assert 0 <= begin_dim < end_dim <= x.dim() and isinstance(eps, float) and isinstance(rms, bool)
            dims = tuple(range(begin_dim, end_dim))
            n = 1
            for d in dims:
                n *= x.shape[d]
            xf = x.double()
            if rms:
                y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
            else:
                mean = xf.mean(dims, keepdim=True)
                y = (xf - mean) * torch.rsqrt(((xf - mean) ** 2).mean(dims, keepdim=True) + eps)
            param_shape = tuple(x.shape[begin_dim:end_dim]) + (1,) * (x.dim() - end_dim)
            for p in (weight, bias):
                assert p is None or p.numel() == n, "weight/bias must hold one value per normalized element"
            return _ReferenceNormExtension._affine(y, weight, bias, param_shape, x.dtype)

        @staticmethod
        def _affine(y, weight, bias, shape, dtype):
            """y * weight + bias (either may be None), the parameters reshaped to `shape`, rounded to dtype."""
            if weight is not None:
                y = y * weight.double().reshape(shape)
            if bias is not None:
                y = y + bias.double().reshape(shape)
            return y.to(dtype)

        # The three family functions of issue 21's contract (FAMILY_CONTRACT.md), statistics returned in
        # the accumulator dtype (float64 for double x, else float32).
        @classmethod
        def _channel_affine(cls, y, weight, bias, x):
            return cls._affine(y, weight, bias, (1, x.shape[1]) + (1,) * (x.dim() - 2), x.dtype)

        @staticmethod
        def _acc(x):
            return torch.float64 if x.dtype == torch.float64 else torch.float32

        @classmethod
        def group_norm_forward(cls, x, weight, bias, groups, eps, activation=0):
            assert x.dim() >= 2 and x.shape[1] % groups == 0 and isinstance(eps, float) and activation in (0, 1)
            n = x.shape[0]
            xg = x.double().reshape(n, groups, -1)
            mean, var = xg.mean(-1), xg.var(-1, unbiased=False)
            y = ((xg - mean[..., None]) * torch.rsqrt(var[..., None] + eps)).reshape(x.shape)
            z = cls._channel_affine(y, weight, bias, x.double())  # 1: SiLU on the float64 result
            out = (torch.nn.functional.silu(z) if activation else z).to(x.dtype)
            return [out, mean.to(cls._acc(x)), var.to(cls._acc(x))]

        @classmethod
        def batch_norm_forward(cls, x, weight, bias, mean, var, eps):
            assert x.dim() >= 2 and isinstance(eps, float) and (mean is None) == (var is None)
            dims = [0] + list(range(2, x.dim()))
            if mean is None:
                mean = x.double().mean(dims).to(cls._acc(x))
                var = x.double().var(dims, unbiased=False).to(cls._acc(x))
            shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
            y = (x.double() - mean.double().reshape(shape)) * torch.rsqrt(var.double().reshape(shape) + eps)
            return [cls._channel_affine(y, weight, bias, x), mean, var]

        @staticmethod
        def p_normalize(x, p, begin_dim, end_dim, eps, mean):
            assert p in (1.0, 2.0) and 0 <= begin_dim < end_dim <= x.dim() and isinstance(eps, float)
            assert isinstance(mean, bool)
            dims = list(range(begin_dim, end_dim))
            a = x.double()
            s = a.abs().sum(dims, keepdim=True) if p == 1.0 else a.pow(2).sum(dims, keepdim=True)
            if mean:
                count = 1
                for d in dims:
                    count *= x.shape[d]
                s = s / count
            norm = s if p == 1.0 else s.sqrt()
            return (a / norm.clamp_min(eps)).to(x.dtype)


    _ext = _ReferenceNormExtension()
''')

# Outputs of the generated ModelNew against the reference Model (both run here in PyTorch): the
# seeds' own check for float32 (atol 1e-5), a bf16 ulp or two for bfloat16. A float64 output here is a
# float32 norm times a float64 weight, so it is only as exact as float32.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float64: 1e-5}

_counter = itertools.count()


def import_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"solve_test_module_{next(_counter)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_problem(directory: Path, forward: str, *, init: str = "", inputs: str = "[torch.randn(3, 5, 7, 9)]",
                  init_inputs: str = "[]", signature: str = "eps: float = 1e-5", name: str = "problem.py") -> Path:
    """A KernelBench problem file whose Model has `self.eps` plus `init` statements and returns `forward`
    (several lines: statements, then the returned expression)."""
    body = "\n".join("        " + line for line in textwrap.dedent(init).strip().splitlines())
    *statements, returned = forward.strip().splitlines()
    forward = "".join(f"{line.strip()}\n        " for line in statements) + "return " + returned.strip()
    source = textwrap.dedent('''\
        """Generated by a solver test."""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Model(nn.Module):
            def __init__(self, {signature}):
                super().__init__()
                self.eps = eps
        {body}

            def forward(self, x):
                {forward}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return {init_inputs}
        ''').format(signature=signature, body=body, forward=forward, inputs=inputs, init_inputs=init_inputs)
    path = directory / name
    path.write_text(source)
    return path


def emit_with_stub(plan, directory: Path, name: str = "solution.py") -> Path:
    path = directory / name
    path.write_text(plan.render("cpu", extension_code=STUB_EXTENSION))
    return path


def randomize_parameters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand_like(p) + 0.5)


def assert_close(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e)
        return
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    tol = TOLERANCE[expected.dtype]
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), \
        f"max abs difference {(actual.double() - expected.double()).abs().max().item():.3g}"


def check_solution_matches_reference(problem_path: Path, solution_path: Path, init_inputs=None):
    """ModelNew built like the reference Model, loaded with its (randomized) state_dict, same outputs."""
    reference = import_file(problem_path)
    solution = import_file(solution_path)
    init = list(reference.get_init_inputs()) if init_inputs is None else init_inputs
    model = reference.Model(*init)
    randomize_parameters(model)
    model_new = solution.ModelNew(*init)
    assert list(model_new.state_dict()) == list(model.state_dict())
    model_new.load_state_dict(model.state_dict())
    inputs = reference.get_inputs()
    with torch.no_grad():
        assert_close(model_new(*inputs), model(*inputs))
    return model, model_new


def check_sequence(problem: Path, solution_path: Path, modes, tolerance=None):
    """Reference Model and generated ModelNew (same state_dict) called alike in each mode of `modes`
    ("train" / "eval") on fresh inputs: the same outputs and the same state_dict (running statistics,
    num_batches_tracked) after every call. `tolerance`: atol = rtol for outputs and buffers (default:
    assert_close's for outputs, 1e-5 for buffers)."""
    reference = import_file(problem)
    solution = import_file(solution_path)
    init = list(reference.get_init_inputs())
    model = reference.Model(*init)
    randomize_parameters(model)
    model_new = solution.ModelNew(*init)
    model_new.load_state_dict(model.state_dict())
    for mode in modes:
        model.train(mode == "train")
        model_new.train(mode == "train")
        inputs = reference.get_inputs()
        with torch.no_grad():
            actual, expected = model_new(*inputs), model(*inputs)
        if tolerance is None:
            assert_close(actual, expected)
        else:
            assert torch.allclose(actual, expected, atol=tolerance, rtol=tolerance), \
                f"max abs difference {(actual.double() - expected.double()).abs().max().item():.3g}"
        state, state_new = model.state_dict(), model_new.state_dict()
        assert list(state) == list(state_new)
        for key in state:
            assert state_new[key].dtype == state[key].dtype, key
            tol = tolerance or 1e-5
            assert torch.allclose(state_new[key].double(), state[key].double(), rtol=tol, atol=tol), \
                f"{key} after {mode}: {state_new[key]} != {state[key]}"
    return model, model_new


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("dims,affine", [((1, 2), True), ((2, 4), False), ((0, 4), True), ((3, 4), True)])
def test_stub_extension_is_a_correct_norm(rms, dims, affine):
    namespace = {"torch": torch}
    exec(STUB_EXTENSION, namespace)
    x = torch.randn(3, 5, 7, 9) * 2 + 10
    begin, end = dims
    shape = x.shape[begin:end]
    w = torch.randn(shape) if affine else None
    b = torch.randn(shape) if affine and not rms else None
    y = namespace["_ext"].norm_forward(x, w, b, begin, end, 1e-5, rms, 0, 0)
    moved = x.movedim(tuple(range(begin, end)), tuple(range(4 - (end - begin), 4)))
    if rms:
        ref = rms_norm_definition(moved.double(), shape, None if w is None else w.double(), 1e-5)
    else:
        ref = F.layer_norm(moved.double(), shape, None if w is None else w.double(),
                           None if b is None else b.double(), 1e-5)
    ref = ref.movedim(tuple(range(4 - (end - begin), 4)), tuple(range(begin, end))).float()
    assert torch.allclose(y, ref, atol=1e-5, rtol=1e-5)


def _stub_extension():
    namespace = {"torch": torch}
    exec(STUB_EXTENSION, namespace)
    return namespace["_ext"]


@pytest.mark.parametrize("shape,groups", [((3, 12, 5, 7), 4), ((2, 6, 9), 6), ((4, 5), 1)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_stub_group_norm_forward_is_group_norm(shape, groups, dtype):
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 5).to(dtype)
    w, b = torch.randn(shape[1], dtype=dtype), torch.randn(shape[1], dtype=dtype)
    y, mean, var = _stub_extension().group_norm_forward(x, w, b, groups, 1e-5)
    expected = F.group_norm(x.double(), groups, w.double(), b.double(), 1e-5).to(dtype)
    assert y.dtype == dtype and torch.allclose(y, expected, atol=1e-6, rtol=1e-6)
    grouped = x.double().reshape(shape[0], groups, -1)
    assert mean.dtype == var.dtype == dtype and mean.shape == var.shape == (shape[0], groups)
    assert torch.allclose(mean.double(), grouped.mean(-1))
    assert torch.allclose(var.double(), grouped.var(-1, unbiased=False))


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (8, 3), (2, 3, 4, 5, 2)])
def test_stub_batch_norm_forward_is_batch_norm(shape):
    ext = _stub_extension()
    x = torch.randn(shape, dtype=torch.float64) * 3 - 1
    c = shape[1]
    w, b, rm, rv = torch.randn(c), torch.randn(c), torch.randn(c), torch.rand(c) + 0.5
    y, mean, var = ext.batch_norm_forward(x, w, b, None, None, 1e-5)  # batch statistics
    expected = F.batch_norm(x, None, None, w.double(), b.double(), training=True, eps=1e-5)
    assert torch.allclose(y, expected) and mean.shape == var.shape == (c,)
    dims = [0] + list(range(2, x.dim()))
    assert torch.allclose(var, x.var(dims, unbiased=False))
    y, mean, var = ext.batch_norm_forward(x, w, b, rm, rv, 1e-5)  # given statistics, returned unchanged
    assert torch.allclose(y, F.batch_norm(x, rm.double(), rv.double(), w.double(), b.double(), eps=1e-5))
    assert mean is rm and var is rv


@pytest.mark.parametrize("p", [1.0, 2.0])
@pytest.mark.parametrize("dims", [(1, 2), (0, 3), (2, 3)])
def test_stub_p_normalize_is_normalize(p, dims):
    ext = _stub_extension()
    x = torch.randn(3, 5, 7, dtype=torch.float64)
    dim = tuple(range(*dims))
    assert torch.allclose(ext.p_normalize(x, p, dims[0], dims[1], 1e-12, False), F.normalize(x, p, dim, 1e-12))
    count = 1
    for d in dim:
        count *= x.shape[d]
    mean_norm = x.abs().mean(dim, keepdim=True) if p == 1.0 else x.pow(2).mean(dim, keepdim=True).sqrt()
    assert torch.allclose(ext.p_normalize(x, p, dims[0], dims[1], 0.0, True), x / mean_norm)
    tiny = torch.zeros(2, 3, dtype=torch.float64)
    assert torch.equal(ext.p_normalize(tiny, p, 1, 2, 0.5, False), tiny)  # max(norm, eps), not norm + eps


SEEDS_CHECK = textwrap.dedent('''
    import importlib.util, sys
    sys.modules["fastnorm"] = None  # the solution must not need fastnorm: any import of it fails
    import torch

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    reference, solution = load(sys.argv[1], "reference"), load(sys.argv[2], "solution")
    device = torch.device(sys.argv[3])
    init = reference.get_init_inputs()
    model = reference.Model(*init)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    model_new = solution.ModelNew(*init)
    model_new.load_state_dict(model.state_dict())
    model, model_new = model.to(device), model_new.to(device)
    with torch.device(device):  # created on the GPU directly: a 7.5 GB randn on the host is slow
        inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in reference.get_inputs()]
    with torch.no_grad():
        expected = model(*inputs)
        actual = model_new(*inputs)
        ok = torch.allclose(expected, actual, atol=1e-5)
        print("max_abs_diff", (actual - expected).abs().max().item())
    print("fastnorm imported:", sys.modules["fastnorm"] is not None)
    sys.exit(0 if ok else 1)
''')


def seeds_check_in_fresh_process(problem: Path, solution: Path, device: str = "cpu", timeout: float = 900):
    """The seeds' own check, `torch.allclose(model(x), model_new(x), atol=1e-5)`, in a new Python process
    in which fastnorm cannot be imported. Returns the CompletedProcess (returncode 0 = passed)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", SEEDS_CHECK, str(problem), str(solution), device],
                          capture_output=True, text=True, timeout=timeout)
