"""`fastnorm solve` recognition: which norms are found in a traced reference, and what they become.

No kernels are built here: each supported variant is also run through the generated ModelNew on the
PyTorch stand-in extension (test_solve_support.STUB_EXTENSION) and compared with the reference.
"""
import re
import textwrap

import pytest
import torch

from conftest import needs_torch_rms_norm, needs_torch_rms_norm_for
from fastnorm.solve import UnsupportedProblem, plan_solution
from test_solve_support import (MAIN_PROBLEMS_DIR, PROBLEMS_DIR, check_solution_matches_reference, emit_with_stub,
                                write_problem)


def only_match(plan):
    assert len(plan.matches) == 1, [m.describe() for m in plan.matches]
    return plan.matches[0]


def solve_and_check(tmp_path, problem):
    """Plan the problem, emit it on the stand-in extension, compare with the reference; the plan."""
    plan = plan_solution(problem)
    check_solution_matches_reference(problem, emit_with_stub(plan, tmp_path))
    return plan


# ----------------------------------------------------------------------------------------------
# The problem files

PROBLEM_EXPECTATIONS = {
    # file: (kind, begin, end, weight, bias, eps, helper)
    "layer_norm_last_dim.py": ("LayerNorm", 2, 3, True, True, 1e-5, "fused_layer_norm"),
    "layer_norm_last_two_dims.py": ("LayerNorm", 2, 4, False, False, 1e-5, "fused_layer_norm"),
    "layer_norm_eps.py": ("LayerNorm", 1, 2, True, True, 0.25, "fused_layer_norm"),
    "linear_norm_linear.py": ("LayerNorm", 1, 2, True, True, 1e-5, "fused_layer_norm"),
    "rms_norm_module_weight.py": ("RMSNorm", 2, 3, True, False, 1e-6, "fused_rms_norm"),
    "rms_norm_rsqrt_weight.py": ("RMSNorm", 2, 3, True, False, 1e-6, "fused_rms_norm_over_dims"),
    "rms_norm_bf16.py": ("RMSNorm", 1, 2, False, False, 1e-5, "fused_rms_norm_over_dims"),
    "rms_norm_channels.py": ("RMSNorm", 1, 2, False, False, 1e-5, "fused_rms_norm_over_dims"),
    "rms_norm_fp32_cast.py": ("RMSNorm", 2, 3, False, False, 1e-6, "fused_rms_norm_over_dims"),
    # small copies of the family's problems/ files (issue 21)
    "batch_norm_4x6x9x11.py": ("BatchNorm", 0, 4, True, True, 1e-5, "fused_batch_norm_module"),
    "instance_norm_3x6x9x11.py": ("InstanceNorm", 2, 4, False, False, 1e-5, "fused_instance_norm_module"),
    "group_norm_3x12x9x11.py": ("GroupNorm", 1, 4, True, True, 1e-5, "fused_group_norm"),
    "frobenius_norm_3x5x9x11.py": ("FrobeniusNorm", 0, 4, False, False, 0.0, "fused_normalize"),
    "l1_norm_13x257.py": ("L1Norm", 1, 2, False, False, 0.0, "fused_normalize"),
    "l2_norm_13x257.py": ("L2Norm", 1, 2, False, False, 0.0, "fused_normalize"),
}


def test_every_supported_problem_file_has_expectations():
    files = {p.name for p in PROBLEMS_DIR.glob("*.py") if not p.name.startswith("unsupported_")}
    assert files == set(PROBLEM_EXPECTATIONS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_torch_rms_norm_for((PROBLEMS_DIR / n).read_text()))
                                  for n in sorted(PROBLEM_EXPECTATIONS)])
def test_problem_file_recognized_and_equivalent(name, tmp_path):
    kind, begin, end, weight, bias, eps, helper = PROBLEM_EXPECTATIONS[name]
    plan = solve_and_check(tmp_path, PROBLEMS_DIR / name)
    match = only_match(plan)
    assert (match.kind, match.begin, match.end, match.weight, match.bias, match.helper) == \
        (kind, begin, end, weight, bias, helper)
    assert match.eps == pytest.approx(eps)
    assert plan.forward.helpers == [helper]


def test_norm_only_models_get_a_one_line_forward():
    plan = plan_solution(PROBLEMS_DIR / "layer_norm_last_dim.py")
    assert plan.forward.direct
    assert plan.forward.source.splitlines() == [
        "def forward(self, x: torch.Tensor) -> torch.Tensor:",
        "    return fused_layer_norm(x, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps)"]


def test_other_ops_stay_pytorch_calls_in_the_fx_forward():
    plan = plan_solution(PROBLEMS_DIR / "linear_norm_linear.py")
    source = plan.forward.source
    assert not plan.forward.direct
    assert "self.fc1(x)" in source and "self.fc2(" in source and "torch.nn.functional.gelu(" in source
    assert "fused_layer_norm(fc1, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps)" in source
    assert "self.norm(" not in source


def test_fp32_cast_pattern_keeps_the_casts_and_the_weight_multiply():
    plan = plan_solution(PROBLEMS_DIR / "rms_norm_fp32_cast.py")
    match = only_match(plan)
    assert match.x.dtype == torch.float32 and not match.weight
    assert "to(torch.float32)" in plan.forward.source and "self.weight *" in plan.forward.source


def test_real_problems_are_traced_on_the_meta_device():
    """The 7.5 GB RMS input must never be allocated to learn its shape."""
    ln = plan_solution(MAIN_PROBLEMS_DIR / "layer_norm_16x64x256x256.py")
    rms = plan_solution(MAIN_PROBLEMS_DIR / "rms_norm_112x64x512x512.py")
    assert ln.traced.shapes_on == "meta" and rms.traced.shapes_on == "meta"
    m = only_match(ln)
    assert (m.kind, m.begin, m.end, m.weight, m.bias, m.x.shape) == ("LayerNorm", 1, 4, True, True, (16, 64, 256, 256))
    m = only_match(rms)
    assert (m.kind, m.begin, m.end, m.weight, m.x.shape) == ("RMSNorm", 1, 2, False, (112, 64, 512, 512))
    assert rms.forward.source.splitlines()[-1] == "    return fused_rms_norm_over_dims(x, dim=1, eps=self.eps)"


# ----------------------------------------------------------------------------------------------
# Hand-written RMSNorm, however it is spelled (x is (3, 5, 7, 9))

HAND_WRITTEN = [
    # (forward expression, begin, end, eps)
    ("x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps)", 3, 4, 1e-5),
    ("x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)", 3, 4, 1e-5),
    ("x / (x.square().mean(dim=-1, keepdim=True) + self.eps).sqrt()", 3, 4, 1e-5),
    ("x * (torch.mean(x * x, -1, True) + self.eps) ** -0.5", 3, 4, 1e-5),
    ("x / (torch.mean(torch.pow(x, 2), dim=(-2, -1), keepdim=True) + self.eps) ** 0.5", 2, 4, 1e-5),
    ("x * (1.0 / torch.sqrt(self.eps + x.pow(2).mean(1, keepdim=True)))", 1, 2, 1e-5),
    ("x * torch.reciprocal(torch.sqrt(torch.square(x).mean(dim=1, keepdim=True)))", 1, 2, 0.0),
    ("torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-3) * x", 3, 4, 1e-3),
    ("x / torch.sqrt(torch.mean(x ** 2) + self.eps)", 0, 4, 1e-5),
    ("torch.div(x, torch.sqrt(torch.add(torch.mean(torch.mul(x, x), [1, 2], keepdim=True), self.eps)))", 1, 3, 1e-5),
]


@pytest.mark.parametrize("forward,begin,end,eps", HAND_WRITTEN)
def test_hand_written_rms_norm_spellings(forward, begin, end, eps, tmp_path):
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, inputs="[torch.randn(3, 5, 7, 9) + 3]"))
    match = only_match(plan)
    assert (match.kind, match.helper, match.begin, match.end, match.weight) == \
        ("RMSNorm", "fused_rms_norm_over_dims", begin, end, False)
    assert match.eps == pytest.approx(eps)
    assert plan.forward.direct and "torch.sqrt" not in plan.forward.source


@pytest.mark.parametrize("forward,reason", [
    ("x / torch.sqrt(torch.mean(x ** 2, dim=(1, 3), keepdim=True) + self.eps)", "not consecutive"),
    ("x / (torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True)) + self.eps)", "not followed by sqrt/rsqrt"),
    ("x / torch.sqrt(torch.mean(x ** 2, dim=-1) + self.eps)", "keepdim=False"),
])
def test_near_misses_are_reported_not_fused(forward, reason, tmp_path):
    inputs = "[torch.randn(9, 9)]" if "dim=-1)" in forward else "[torch.randn(3, 5, 7, 9)]"
    with pytest.raises(UnsupportedProblem) as err:
        plan_solution(write_problem(tmp_path, forward, inputs=inputs))
    assert reason in str(err.value) and "supported:" in str(err.value)


def test_rms_of_another_tensor_is_not_a_norm(tmp_path):
    forward = "x / torch.sqrt(torch.mean((x + 1) ** 2, dim=-1, keepdim=True) + self.eps)"
    with pytest.raises(UnsupportedProblem):
        plan_solution(write_problem(tmp_path, forward))


# ----------------------------------------------------------------------------------------------
# The weight of a hand-written RMSNorm


@pytest.mark.parametrize("init,forward,fused", [
    ("self.weight = nn.Parameter(torch.randn(9))",
     "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight", True),
    ("self.weight = nn.Parameter(torch.randn(5, 1, 1))",
     "self.weight * (x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps))", True),
    ("self.weight = nn.Parameter(torch.randn(5))",
     "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps) * self.weight.view(1, -1, 1, 1)", True),
    # float64 weight: the product is float64, which the fused norm of a float32 x would not be
    ("self.weight = nn.Parameter(torch.randn(9, dtype=torch.float64))",
     "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight", False),
    # varies along a dim that is not normalized
    ("self.weight = nn.Parameter(torch.randn(7, 1))",
     "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight", False),
])
def test_hand_written_weight_fused_only_when_equivalent(init, forward, fused, tmp_path):
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init))
    match = only_match(plan)
    assert match.weight is fused
    assert bool(re.search(r"\bweight ?= ?", plan.forward.source)) is fused


def test_weight_computed_from_the_input_is_not_fused(tmp_path):
    forward = "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * x[:1, :1, :1, :]"
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward))
    assert not only_match(plan).weight


# ----------------------------------------------------------------------------------------------
# Library spellings


LIBRARY_NORM_CASES = [
    ("self.weight = nn.Parameter(torch.randn(9))", "F.rms_norm(x, (9,), self.weight, self.eps)",
     ("RMSNorm", "fused_rms_norm", 3, 4, True, False)),
    ("", "torch.layer_norm(x, [7, 9])", ("LayerNorm", "fused_layer_norm", 2, 4, False, False)),
    ("", "F.layer_norm(x, x.shape[-2:], eps=self.eps)", ("LayerNorm", "fused_layer_norm", 2, 4, False, False)),
    ("self.ln = nn.LayerNorm(9, bias=False)", "self.ln(x)", ("LayerNorm", "fused_layer_norm", 3, 4, True, False)),
    ("self.rms = nn.RMSNorm([7, 9], elementwise_affine=False)", "self.rms(x)",
     ("RMSNorm", "fused_rms_norm", 2, 4, False, False)),
]


@pytest.mark.parametrize("init,forward,expected", [pytest.param(*case, marks=needs_torch_rms_norm_for(*case[:2]))
                                                   for case in LIBRARY_NORM_CASES])
def test_library_norms(init, forward, expected, tmp_path):
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init))
    m = only_match(plan)
    assert (m.kind, m.helper, m.begin, m.end, m.weight, m.bias) == expected


def test_several_norms_in_graph_order(tmp_path):
    init = """
        self.ln = nn.LayerNorm(9)
        self.proj = nn.Linear(9, 9)
    """
    forward = ("F.layer_norm(self.proj(self.ln(x) * 2), (9,)) + "
               "x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)")
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init))
    assert [(m.written_as.split()[0], m.begin) for m in plan.matches] == [("nn.LayerNorm", 3), ("F.layer_norm", 3),
                                                                          ("hand-written", 1)]
    assert "self.proj(" in plan.forward.source


def test_constructor_numbers_are_read_at_forward_time(tmp_path):
    init = """
        self.features = features
        self.weight = nn.Parameter(torch.randn(features))
    """
    problem = write_problem(tmp_path, "F.layer_norm(x, (self.features,), self.weight, None, self.eps)", init=init,
                            signature="features: int, eps: float = 1e-5", init_inputs="[9]")
    plan = solve_and_check(tmp_path, problem)
    assert plan.traced.attrs_traced == (float, int)
    assert "(self.features,)" in plan.forward.source and "self.eps" in plan.forward.source
    # A ModelNew built for another size and eps works and matches the reference built the same way.
    solution = emit_with_stub(plan, tmp_path, "solution_other.py")
    check_solution_matches_reference(problem, solution, init_inputs=[9, 0.5])


def test_number_attributes_in_control_flow_fall_back_to_constants(tmp_path):
    init = "self.repeats = 2"
    forward = "x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps) + sum(range(self.repeats))"
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init))
    assert plan.traced.attrs_traced == (float,)  # ints baked, floats still read from self
    assert "self.eps" in plan.forward.source


# ----------------------------------------------------------------------------------------------
# What cannot be solved


@pytest.mark.parametrize("name,found", [
    ("unsupported_softmax.py", ["found: Linear (self.fc), softmax"]),
    ("unsupported_local_response_norm.py", ["LocalResponseNorm (self.lrn)", "normalizations not supported"]),
    ("unsupported_control_flow.py", ["torch.fx", "control flow"]),
])
def test_unsupported_problems_say_what_they_found(name, found):
    with pytest.raises(UnsupportedProblem) as err:
        plan_solution(PROBLEMS_DIR / name)
    message = str(err.value)
    for text in found:
        assert text in message
    if name != "unsupported_control_flow.py":
        assert "supported: nn.LayerNorm" in message


def test_not_a_problem_file(tmp_path):
    path = tmp_path / "not_a_problem.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
    with pytest.raises(UnsupportedProblem, match="lacks get_inputs, get_init_inputs"):
        plan_solution(path)


@needs_torch_rms_norm
def test_norms_inside_containers_and_custom_submodules(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm = nn.RMSNorm(d)
                self.eps = 1e-6

            def forward(self, x):
                return self.norm(x) + x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


        class Model(nn.Module):
            def __init__(self, d: int):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d))
                self.blocks = nn.ModuleList([Block(d) for _ in range(2)])

            def forward(self, x):
                x = self.net(x)
                for block in self.blocks:
                    x = block(x)
                return x


        def get_inputs():
            return [torch.randn(4, 16)]


        def get_init_inputs():
            return [16]
        '''))
    plan = solve_and_check(tmp_path, problem)
    assert [m.written_as.split(" (")[0] for m in plan.matches] == [
        "nn.LayerNorm", "nn.RMSNorm", "hand-written x * rsqrt(mean(x**2) + eps)", "nn.RMSNorm",
        "hand-written x * rsqrt(mean(x**2) + eps)"]
    assert 'getattr(self.blocks, "1").eps' in plan.forward.source
