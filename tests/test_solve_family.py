"""`fastnorm solve` on the normalization family of issue 21: BatchNorm, InstanceNorm, GroupNorm, hand-written
LayerNorm, L1 / L2 / Frobenius normalization, as modules, functions and hand-written expressions.

No kernels are built here: each generated ModelNew runs on the PyTorch stand-in extension
(test_solve_support.STUB_EXTENSION, the contract's three functions included) and is compared with the
reference, in training mode (KernelBench's, as a model is built) and, where it differs, in eval mode.
The end-to-end solves on the real kernels are in test_solve_family_e2e.py.
"""
import ast
import re
import textwrap

import pytest
import torch

from fastnorm.solve import UnsupportedProblem, plan_solution
from fastnorm.solve.cli import main
from test_solve_support import (MAIN_PROBLEMS_DIR, check_sequence, check_solution_matches_reference, emit_with_stub,
                                write_problem)


def only_match(plan):
    assert len(plan.matches) == 1, [m.describe() for m in plan.matches]
    return plan.matches[0]


def solve_and_check(tmp_path, problem, **kwargs):
    plan = plan_solution(problem)
    check_solution_matches_reference(problem, emit_with_stub(plan, tmp_path), **kwargs)
    return plan


def unsupported_message(problem) -> str:
    with pytest.raises(UnsupportedProblem) as err:
        plan_solution(problem)
    return str(err.value)


# ----------------------------------------------------------------------------------------------
# KernelBench's eight level-1 norm problems, written here with the published expressions (the
# constructors, forwards and torch.rand inputs of 33_BatchNorm ... 40_LayerNorm) at small shapes.

KERNELBENCH_FORMS = {
    # name: (constructor signature, constructor body, forward, input shape, init inputs, (kind, helper))
    "33_BatchNorm": ("num_features: int", "self.bn = nn.BatchNorm2d(num_features=num_features)",
                     "return self.bn(x)", (4, 6, 9, 11), [6], ("BatchNorm", "fused_batch_norm_module")),
    "34_InstanceNorm": ("num_features: int", "self.inorm = nn.InstanceNorm2d(num_features=num_features)",
                        "return self.inorm(x)", (3, 6, 9, 11), [6], ("InstanceNorm", "fused_instance_norm_module")),
    "35_GroupNorm_": ("num_features: int, num_groups: int",
                      "self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_features)",
                      "return self.gn(x)", (3, 12, 9, 11), [12, 4], ("GroupNorm", "fused_group_norm")),
    "36_RMSNorm_": ("num_features: int, eps: float = 1e-5", "self.num_features = num_features\nself.eps = eps",
                    "rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)\nreturn x / rms",
                    (3, 6, 9, 11), [6], ("RMSNorm", "fused_rms_norm_over_dims")),
    "37_FrobeniusNorm_": ("", "", "norm = torch.norm(x, p='fro')\nreturn x / norm", (3, 6, 9, 11), [],
                          ("FrobeniusNorm", "fused_normalize")),
    "38_L1Norm_": ("", "", "return x / torch.mean(torch.abs(x), dim=1, keepdim=True)", (13, 257), [],
                   ("L1Norm", "fused_normalize")),
    "38_L1Norm_ (first release: a sum)": ("", "", "return x / torch.sum(torch.abs(x), dim=1, keepdim=True)",
                                          (13, 257), [], ("L1Norm", "fused_normalize")),
    "39_L2Norm_": ("", "", "return x / torch.norm(x, p=2, dim=1, keepdim=True)", (13, 257), [],
                   ("L2Norm", "fused_normalize")),
    "40_LayerNorm": ("normalized_shape: tuple", "self.ln = nn.LayerNorm(normalized_shape=normalized_shape)",
                     "return self.ln(x)", (3, 6, 9, 11), [(6, 9, 11)], ("LayerNorm", "fused_layer_norm")),
}


def write_kernelbench_form(directory, name: str, dtype: str = "") -> object:
    signature, body, forward, shape, init_inputs, _ = KERNELBENCH_FORMS[name]
    init_body = "".join(f"\n        {line}" for line in body.splitlines())
    if dtype and "nn." in body:  # the module built in that dtype too, as KernelBench's bf16 variants do
        init_body = init_body.replace(")", f", dtype=torch.{dtype})", 1)
    path = directory / "kernelbench_form.py"
    path.write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self{signature}):
                super(Model, self).__init__(){body}

            def forward(self, x: torch.Tensor) -> torch.Tensor:
        {forward}


        def get_inputs():
            return [torch.rand({shape}{dtype})]


        def get_init_inputs():
            return {init}
        ''').format(signature=", " + signature if signature else "", body=init_body,
                    forward=textwrap.indent(forward, " " * 8), shape=", ".join(map(str, shape)),
                    dtype=f", dtype=torch.{dtype}" if dtype else "", init=repr(init_inputs)))
    return path


@pytest.mark.parametrize("name", sorted(KERNELBENCH_FORMS))
def test_kernelbench_published_forms_are_recognized_and_equivalent(name, tmp_path):
    plan = solve_and_check(tmp_path, write_kernelbench_form(tmp_path, name))
    match = only_match(plan)
    assert (match.kind, match.helper) == KERNELBENCH_FORMS[name][5]
    assert plan.forward.direct and plan.forward.helpers == [match.helper]


@pytest.mark.parametrize("name", ["33_BatchNorm", "35_GroupNorm_", "37_FrobeniusNorm_", "39_L2Norm_"])
def test_kernelbench_bf16_variants(name, tmp_path):
    """The bfloat16 versions of the problems (module and input in bf16) go through the same helpers."""
    plan = solve_and_check(tmp_path, write_kernelbench_form(tmp_path, name, dtype="bfloat16"))
    assert only_match(plan).x.dtype == torch.bfloat16


FAMILY_PROBLEMS = {
    # problems/ file: (kind, helper, traced shape)
    "batch_norm_64x64x512x512.py": ("BatchNorm", "fused_batch_norm_module", (64, 64, 512, 512)),
    "instance_norm_112x64x512x512.py": ("InstanceNorm", "fused_instance_norm_module", (112, 64, 512, 512)),
    "group_norm_112x64x512x512.py": ("GroupNorm", "fused_group_norm", (112, 64, 512, 512)),
    "frobenius_norm_112x64x512x512.py": ("FrobeniusNorm", "fused_normalize", (112, 64, 512, 512)),
    "l1_norm_32768x65535.py": ("L1Norm", "fused_normalize", (32768, 65535)),
    "l2_norm_32768x65535.py": ("L2Norm", "fused_normalize", (32768, 65535)),
    # the SiLU after it becomes the GroupNorm kernel's epilogue (fuse_activations, after the match)
    "group_norm_silu_8x512x64x64.py": ("GroupNorm", "fused_group_norm", (8, 512, 64, 64)),
}


@pytest.mark.parametrize("name", sorted(FAMILY_PROBLEMS))
def test_family_problems_are_traced_on_the_meta_device(name):
    """The real problems (up to 8.6 GB inputs) are understood without allocating them."""
    plan = plan_solution(MAIN_PROBLEMS_DIR / name)
    match = only_match(plan)
    assert plan.traced.shapes_on == "meta"
    assert (match.kind, match.helper, match.x.shape) == FAMILY_PROBLEMS[name]


def test_every_family_problem_is_listed():
    listed = {p.name for p in MAIN_PROBLEMS_DIR.glob("*.py")} - {"layer_norm_16x64x256x256.py",
                                                                  "rms_norm_112x64x512x512.py"}
    assert listed == set(FAMILY_PROBLEMS)


# ----------------------------------------------------------------------------------------------
# Modules: outputs and every buffer (running statistics, num_batches_tracked) over a sequence of
# calls in training and eval mode


MODULES = [
    # (constructor statement, input shape)
    ("nn.BatchNorm2d(6)", (4, 6, 9, 11)),
    ("nn.BatchNorm2d(6, momentum=None)", (4, 6, 9, 11)),
    ("nn.BatchNorm2d(6, momentum=0.3, eps=1e-3, affine=False)", (4, 6, 9, 11)),
    ("nn.BatchNorm2d(6, track_running_stats=False)", (4, 6, 9, 11)),
    ("nn.BatchNorm1d(7)", (10, 7)),
    ("nn.BatchNorm1d(7, momentum=None)", (5, 7, 13)),
    ("nn.BatchNorm3d(3)", (2, 3, 4, 5, 6)),
    ("nn.InstanceNorm2d(6)", (3, 6, 9, 11)),
    ("nn.InstanceNorm1d(5, affine=True, track_running_stats=True)", (4, 5, 17)),
    pytest.param("nn.InstanceNorm2d(6, track_running_stats=True, momentum=None)", (3, 6, 9, 11),
                 marks=pytest.mark.skipif(not hasattr(torch.library, "register_autograd"),
                                          reason="torch < 2.4's InstanceNorm does not take momentum=None")),
    ("nn.InstanceNorm3d(3, affine=True, momentum=0.5, track_running_stats=True)", (2, 3, 4, 5, 6)),
    ("nn.GroupNorm(3, 12)", (3, 12, 9, 11)),
    ("nn.GroupNorm(12, 12, eps=1e-3, affine=False)", (3, 12, 5)),
    ("nn.GroupNorm(1, 5)", (2, 5, 4, 3, 2)),
]


@pytest.mark.parametrize("module,shape", MODULES)
def test_modules_match_over_train_and_eval_calls(module, shape, tmp_path):
    """Three training calls (BatchNorm: the running statistics and num_batches_tracked after each, momentum
    None's cumulative average included), then eval, then training again."""
    problem = write_problem(tmp_path, "self.norm(x)", init=f"self.norm = {module}",
                            inputs=f"[torch.rand{shape} * 4 - 1]")
    plan = plan_solution(problem)
    match = only_match(plan)
    assert match.written_as == f"nn.{module.split('(')[0].split('.')[1]} (self.norm)"
    emit_with_stub(plan, tmp_path)
    check_sequence(problem, problem.with_name("solution.py"), ["train", "train", "train", "eval", "train", "eval"])


def test_batch_norm_running_statistics_after_three_training_calls(tmp_path):
    """Issue 21's target: outputs and running statistics equal PyTorch's after 3 consecutive calls."""
    problem = write_problem(tmp_path, "self.bn(x)", init="self.bn = nn.BatchNorm2d(6)",
                            inputs="[torch.rand(4, 6, 9, 11)]")
    emit_with_stub(plan_solution(problem), tmp_path)
    model, model_new = check_sequence(problem, problem.with_name("solution.py"), ["train"] * 3)
    assert model_new.bn.num_batches_tracked.item() == 3
    assert not torch.equal(model_new.bn.running_mean, torch.zeros(6))  # they did move
    assert torch.allclose(model_new.bn.running_var, model.bn.running_var, rtol=1e-5)


def test_unbatched_instance_norm_input_is_reported(tmp_path):
    problem = write_problem(tmp_path, "self.norm(x)", init="self.norm = nn.InstanceNorm1d(5)",
                            inputs="[torch.rand(5, 17)]")
    assert "InstanceNorm1d (self.norm): input of 2 dims" in unsupported_message(problem)


def test_other_layers_stay_around_a_batch_norm(tmp_path):
    init = """
        self.conv = nn.Conv2d(5, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
    """
    plan = plan_solution(write_problem(tmp_path, "torch.relu(self.bn(self.conv(x)))", init=init,
                                       inputs="[torch.rand(2, 5, 7, 9)]"))
    assert not plan.forward.direct
    assert "self.conv(x)" in plan.forward.source and "fused_batch_norm_module(conv, self.bn)" in plan.forward.source
    emit_with_stub(plan, tmp_path)
    check_sequence(tmp_path / "problem.py", tmp_path / "solution.py", ["train", "eval"])


@pytest.mark.parametrize("silu", ["self.act(self.norm(x))", "F.silu(self.norm(x))", "F.silu(self.norm(x), inplace=True)"])
def test_group_norm_then_silu_is_one_kernel_pass(silu, tmp_path):
    """GroupNorm -> SiLU (module, function, in place) leaves one fused call with the activation;
    the emitted solution matches the reference."""
    init = """
        self.norm = nn.GroupNorm(4, 8)
        self.act = nn.SiLU()
    """
    problem = write_problem(tmp_path, silu, init=init, inputs="[torch.randn(3, 8, 5, 7) * 2 + 1]")
    plan = solve_and_check(tmp_path, problem)
    assert "activation='silu'" in plan.forward.source and "silu(" not in plan.forward.source.replace(
        "activation='silu'", ""), plan.forward.source


def test_silu_with_another_use_of_the_norm_stays_apart(tmp_path):
    init = """
        self.norm = nn.GroupNorm(4, 8)
        self.act = nn.SiLU()
    """
    problem = write_problem(tmp_path, "y = self.norm(x)\nself.act(y) + y", init=init,
                            inputs="[torch.randn(3, 8, 5, 7)]")
    plan = solve_and_check(tmp_path, problem)
    assert "activation" not in plan.forward.source, plan.forward.source


# ----------------------------------------------------------------------------------------------
# Functions


BUFFERS = """
    self.register_buffer("rm", torch.zeros(5))
    self.register_buffer("rv", torch.ones(5))
    self.w = nn.Parameter(torch.randn(5))
    self.b = nn.Parameter(torch.randn(5))
"""
FUNCTIONS = [
    # (forward, kind, helper)
    ("F.batch_norm(x, self.rm, self.rv, self.w, self.b, training=True, momentum=0.2, eps=self.eps)",
     "BatchNorm", "fused_batch_norm"),
    ("F.batch_norm(x, self.rm, self.rv)", "BatchNorm", "fused_batch_norm"),
    ("torch.batch_norm(x, self.w, None, None, None, True, 0.1, 1e-5, False)", "BatchNorm", "fused_batch_norm"),
    ("F.instance_norm(x, self.rm, self.rv, use_input_stats=True, momentum=0.3)", "InstanceNorm",
     "fused_instance_norm"),
    ("F.instance_norm(x, self.rm, self.rv, self.w, self.b, use_input_stats=False)", "InstanceNorm",
     "fused_instance_norm"),
    ("torch.instance_norm(x, None, self.b, None, None, True, 0.1, 1e-5, False)", "InstanceNorm",
     "fused_instance_norm"),
    ("F.group_norm(x, 5, self.w, self.b, eps=self.eps)", "GroupNorm", "fused_group_norm"),
    ("torch.group_norm(x, 1)", "GroupNorm", "fused_group_norm"),
    ("F.normalize(x)", "L2Norm", "fused_normalize"),
    ("F.normalize(x, p=1.0, dim=-1, eps=self.eps)", "L1Norm", "fused_normalize"),
    ("F.normalize(x, 2, (2, 3))", "L2Norm", "fused_normalize"),
]


@pytest.mark.parametrize("forward,kind,helper", FUNCTIONS)
def test_library_functions(forward, kind, helper, tmp_path):
    """Each call, three times (running statistics given to the function are updated in place alike)."""
    problem = write_problem(tmp_path, forward, init=BUFFERS, inputs="[torch.rand(3, 5, 7, 9) * 4 - 1]")
    plan = plan_solution(problem)
    match = only_match(plan)
    assert (match.kind, match.helper, match.written_as) == (kind, helper, forward.split("(")[0])
    emit_with_stub(plan, tmp_path)
    check_sequence(problem, problem.with_name("solution.py"), ["train"] * 3)


def test_normalize_p_from_the_constructor_is_read_at_forward_time(tmp_path):
    """p as an attribute: fused for the traced p=2; a ModelNew built with p=3 takes F.normalize's own path."""
    problem = write_problem(tmp_path, "F.normalize(x, p=self.p, dim=1)", init="self.p = p",
                            signature="p: int = 2, eps: float = 1e-5", init_inputs="[2]")
    plan = solve_and_check(tmp_path, problem)
    assert "p=self.p" in plan.forward.source
    check_solution_matches_reference(problem, tmp_path / "solution.py", init_inputs=[3])


# ----------------------------------------------------------------------------------------------
# Hand-written LayerNorm (x is (3, 5, 7, 9))

HAND_WRITTEN_LAYER_NORMS = [
    # (forward, init, begin, end, weight, bias, eps)
    ("(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)",
     "", 3, 4, False, False, 1e-5),
    ("(x - x.mean((2, 3), keepdim=True)) * torch.rsqrt(x.var((2, 3), keepdim=True, correction=0) + self.eps)",
     "", 2, 4, False, False, 1e-5),
    ("var, mean = torch.var_mean(x, dim=1, keepdim=True, unbiased=False)\n(x - mean) / (var + self.eps).sqrt()",
     "", 1, 2, False, False, 1e-5),
    ("mean = torch.mean(x, dim=(1, 2, 3), keepdim=True)\nc = x - mean\n"
     "c / torch.sqrt((c ** 2).mean(dim=(1, 2, 3), keepdim=True) + 1e-6)", "", 1, 4, False, False, 1e-6),
    ("(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)"
     " * self.weight + self.bias",
     "self.weight = nn.Parameter(torch.randn(9))\nself.bias = nn.Parameter(torch.randn(9))", 3, 4, True, True, 1e-5),
    ("u = x.mean(1, keepdim=True)\ns = (x - u).pow(2).mean(1, keepdim=True)\ny = (x - u) / torch.sqrt(s + self.eps)\n"
     "self.weight * y + self.bias",  # ConvNeXt's channels-first LayerNorm
     "self.weight = nn.Parameter(torch.randn(5, 1, 1))\nself.bias = nn.Parameter(torch.randn(5, 1, 1))",
     1, 2, True, True, 1e-5),
    ("(x - x.mean()) / torch.sqrt(x.var(unbiased=False) + self.eps)", "", 0, 4, False, False, 1e-5),
    ("(x - x.mean(-1, keepdim=True)) * (1.0 / torch.sqrt(torch.var(x, -1, keepdim=True, unbiased=False)"
     " + self.eps)) + self.bias", "self.bias = nn.Parameter(torch.randn(9))", 3, 4, False, True, 1e-5),
    ("torch.layer_norm(x, (9,)) + (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, "
     "unbiased=False))", "", None, None, False, False, 0.0),
]


@pytest.mark.parametrize("forward,init,begin,end,weight,bias,eps", HAND_WRITTEN_LAYER_NORMS)
def test_hand_written_layer_norm(forward, init, begin, end, weight, bias, eps, tmp_path):
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init,
                                                   inputs="[torch.randn(3, 5, 7, 9) * 2 + 3]"))
    hand = [m for m in plan.matches if m.written_as.startswith("hand-written")]
    assert len(hand) == 1, [m.describe() for m in plan.matches]
    match = hand[0]
    assert (match.kind, match.helper, match.weight, match.bias) == ("LayerNorm", "fused_layer_norm_over_dims",
                                                                    weight, bias)
    if begin is not None:
        assert (match.begin, match.end) == (begin, end)
    assert match.eps == pytest.approx(eps)
    assert ".var(" not in plan.forward.source and "sqrt" not in plan.forward.source


@pytest.mark.parametrize("forward,inputs,reason", [
    ("(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + self.eps)", None, "unbiased"),
    ("(x - x.mean((1, 3), keepdim=True)) / torch.sqrt(x.var((1, 3), keepdim=True, unbiased=False) + self.eps)",
     None, "not consecutive"),
    ("(x - x.mean(-1, keepdim=True)) / (torch.sqrt(x.var(-1, keepdim=True, unbiased=False)) + self.eps)",
     None, "not divided by sqrt(var + eps)"),
    # var without keepdim on a square x broadcasts along the wrong dim: not a LayerNorm
    ("(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False) + self.eps)", "[torch.randn(8, 8)]",
     "not divided by sqrt(var + eps)"),
])
def test_layer_norm_near_misses_are_reported(forward, inputs, reason, tmp_path):
    message = unsupported_message(write_problem(tmp_path, forward, inputs=inputs or "[torch.randn(3, 5, 7, 9)]"))
    assert reason in message and "looks like a LayerNorm" in message


@pytest.mark.parametrize("forward", [
    "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + self.eps)",
    "(x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps)",
    "x - x.mean(-1, keepdim=True)",
])
def test_not_layer_norms(forward, tmp_path):
    message = unsupported_message(write_problem(tmp_path, forward))
    assert "no normalization fastnorm can fuse" in message


# ----------------------------------------------------------------------------------------------
# L1 / L2 / Frobenius (x is (3, 5, 7, 9))

P_NORMS = [
    # (forward, kind, begin, end, eps, mean)
    ("x / torch.mean(torch.abs(x), dim=1, keepdim=True)", "L1Norm", 1, 2, 0.0, True),
    ("x / x.abs().sum(dim=-1, keepdim=True)", "L1Norm", 3, 4, 0.0, False),
    ("x / torch.norm(x, p=1, dim=(2, 3), keepdim=True)", "L1Norm", 2, 4, 0.0, False),
    ("x / torch.sum(torch.abs(x))", "L1Norm", 0, 4, 0.0, False),
    ("x / torch.norm(x, p=2, dim=1, keepdim=True)", "L2Norm", 1, 2, 0.0, False),
    ("x / x.norm(p=2, dim=-1, keepdim=True)", "L2Norm", 3, 4, 0.0, False),
    ("x / torch.linalg.norm(x, dim=1, keepdim=True)", "L2Norm", 1, 2, 0.0, False),
    ("x / torch.linalg.vector_norm(x, ord=1, dim=(1, 2), keepdim=True)", "L1Norm", 1, 3, 0.0, False),
    ("x / torch.linalg.vector_norm(x, 2, -1, True)", "L2Norm", 3, 4, 0.0, False),
    ("x / torch.sqrt((x * x).sum(dim=1, keepdim=True))", "L2Norm", 1, 2, 0.0, False),
    ("x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True))", "L2Norm", 3, 4, 0.0, False),
    ("x / torch.norm(x, p=2, dim=0)", "L2Norm", 0, 1, 0.0, False),  # leading dim: broadcasts without keepdim
    ("x / x.norm(p=2, dim=1, keepdim=True).clamp_min(1e-12)", "L2Norm", 1, 2, 1e-12, False),
    ("x / torch.clamp(torch.norm(x, 2, 1, True), min=self.eps)", "L2Norm", 1, 2, 1e-5, False),
    ("x * (1 / torch.norm(x, p='fro'))", "FrobeniusNorm", 0, 4, 0.0, False),
    ("x / x.norm()", "FrobeniusNorm", 0, 4, 0.0, False),
    ("x / torch.linalg.norm(x)", "FrobeniusNorm", 0, 4, 0.0, False),
    ("x / torch.norm(x, p='fro', dim=(2, 3), keepdim=True)", "L2Norm", 2, 4, 0.0, False),
]


@pytest.mark.parametrize("forward,kind,begin,end,eps,mean", P_NORMS)
def test_p_norm_spellings(forward, kind, begin, end, eps, mean, tmp_path):
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, inputs="[torch.rand(3, 5, 7, 9) - 0.3]"))
    match = only_match(plan)
    assert (match.kind, match.helper, match.begin, match.end) == (kind, "fused_normalize", begin, end)
    assert match.eps == pytest.approx(eps)
    assert ("mean=True" in plan.forward.source) is mean
    assert plan.forward.direct and "norm(" not in plan.forward.source.replace("fused_normalize(", "")


@pytest.mark.parametrize("forward,inputs,reason", [
    ("x / torch.norm(x, p=3, dim=1, keepdim=True)", None, "p=3"),
    ("F.normalize(x, p=float('inf'))", None, "p=inf"),
    ("x / torch.norm(x, p=2, dim=(1, 3), keepdim=True)", None, "not consecutive"),
    ("x / torch.norm(x, p=2, dim=1)", "[torch.rand(4, 4)]", "keepdim=False"),
    ("x / torch.linalg.norm(x, ord=2, dim=(2, 3), keepdim=True)", None, "matrix norm"),
    ("x / (torch.norm(x, p=2, dim=1, keepdim=True) + self.eps)", None, "x is not divided by it"),
    ("torch.norm(x, p=2, dim=1, keepdim=True)", None, "x is not divided by it"),
])
def test_p_norm_near_misses_are_reported(forward, inputs, reason, tmp_path):
    message = unsupported_message(write_problem(tmp_path, forward, inputs=inputs or "[torch.rand(3, 5, 7, 9)]"))
    assert reason in message and "supported:" in message


def test_sum_of_abs_that_is_not_a_division_is_not_a_norm(tmp_path):
    message = unsupported_message(write_problem(tmp_path, "x - x.abs().sum(dim=1, keepdim=True)"))
    assert "normalizations not supported" not in message  # a plain reduction, nothing to report


# ----------------------------------------------------------------------------------------------
# The generated file


def load_inline_call(source: str) -> dict:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_inline":
            return {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg == "functions"}
    raise AssertionError("no load_inline call")


@pytest.mark.parametrize("forward,init,functions,launch_config", [
    ("self.bn(x)", "self.bn = nn.BatchNorm2d(5)", ["batch_norm_forward"], False),
    # InstanceNorm without parameters: the LayerNorm kernel (norm_forward), the family's otherwise
    ("self.inorm(x)", "self.inorm = nn.InstanceNorm2d(5)",
     ["norm_forward", "group_norm_forward", "batch_norm_forward"], True),
    ("x / torch.norm(x, p='fro')", "", ["p_normalize"], False),
    ("self.ln(F.group_norm(x, 5))", "self.ln = nn.LayerNorm(9)", ["norm_forward", "group_norm_forward"], True),
])
def test_solution_builds_only_the_kernels_it_calls(forward, init, functions, launch_config, tmp_path):
    plan = plan_solution(write_problem(tmp_path, forward, init=init, inputs="[torch.rand(3, 5, 7, 9)]"))
    source = plan.render("cpu", kernel_sources=("// cpp\n", None))
    assert load_inline_call(source)["functions"] == functions
    assert bool(re.search(r"^THREADS = ", source, re.M)) is launch_config
    # the private functions the helpers call come along (a missing one would fail on the stub run)
    check_solution_matches_reference(tmp_path / "problem.py", emit_with_stub(plan, tmp_path))


def test_several_family_norms_in_one_model(tmp_path):
    init = """
        self.bn = nn.BatchNorm2d(5)
        self.gn = nn.GroupNorm(5, 5)
    """
    forward = ("y = self.gn(self.bn(x))\n"
               "z = (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, keepdim=True, unbiased=False) + 1e-5)\n"
               "z / torch.norm(z, p='fro')")
    plan = solve_and_check(tmp_path, write_problem(tmp_path, forward, init=init, inputs="[torch.rand(3, 5, 7, 9)]"))
    assert [m.kind for m in plan.matches] == ["BatchNorm", "GroupNorm", "LayerNorm", "FrobeniusNorm"]


def test_near_miss_exits_2_from_the_command_line(tmp_path, capsys):
    problem = write_problem(tmp_path, "x / torch.norm(x, p=3, dim=1, keepdim=True)")
    out = tmp_path / "out.py"
    assert main([str(problem), "-o", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "p=3" in err and "nothing written" in err and "nn.BatchNorm1d/2d/3d" in err
    assert not out.exists()
