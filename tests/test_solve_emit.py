"""The generated solution file: self-contained, the reference's API and state_dict, readable kernel block."""
import ast
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

from fastnorm.solve import UnsupportedProblem, plan_solution
from fastnorm.solve.emit import _string_literal, extension_name, kernel_block
from test_solve_support import (PROBLEMS_DIR, SUPPORTED_PROBLEMS, check_solution_matches_reference, emit_with_stub,
                                import_file, write_problem)

STDLIB = set(sys.stdlib_module_names)


def imported_modules(source: str) -> set:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
    return found


@pytest.mark.parametrize("problem", SUPPORTED_PROBLEMS)
def test_solution_imports_only_torch_and_the_standard_library(problem, tmp_path):
    plan = plan_solution(problem)
    source = plan.render("cpu", kernel_sources=("// cpp\n", None))
    assert imported_modules(source) <= {"torch"} | STDLIB
    tree = ast.parse(source)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes == ["ModelNew"]  # the reference's Model is not carried along
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert not functions & {"get_inputs", "get_init_inputs"}


@pytest.mark.parametrize("problem", SUPPORTED_PROBLEMS)
def test_model_new_has_the_reference_constructor(problem, tmp_path):
    plan = plan_solution(problem)
    solution = import_file(emit_with_stub(plan, tmp_path))
    reference = import_file(problem)
    assert inspect.signature(solution.ModelNew.__init__) == inspect.signature(reference.Model.__init__)
    assert issubclass(solution.ModelNew, torch.nn.Module)


def test_state_dict_keys_are_the_reference_ones(tmp_path):
    model, model_new = check_solution_matches_reference(
        PROBLEMS_DIR / "linear_norm_linear.py", emit_with_stub(plan_solution(PROBLEMS_DIR / "linear_norm_linear.py"), tmp_path))
    assert set(model_new.state_dict()) == {"fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"}
    assert isinstance(model_new.fc1, torch.nn.Linear) and isinstance(model_new.fc2, torch.nn.Linear)


def test_constructor_eps_is_honoured(tmp_path):
    problem = PROBLEMS_DIR / "layer_norm_eps.py"
    solution = emit_with_stub(plan_solution(problem), tmp_path)
    model, model_new = check_solution_matches_reference(problem, solution, init_inputs=[77, 0.5])
    assert model_new.eps == 0.5
    x = torch.rand(10, 77) * 1e-2
    default = import_file(problem).Model(77)
    default.load_state_dict(model.state_dict())
    with torch.no_grad():  # eps 0.5 vs 1e-5 on inputs of scale 1e-2: clearly different outputs
        assert not torch.allclose(model_new(x), default(x), atol=1e-3)


def test_module_level_helpers_and_constants_come_along(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent('''\
        import math
        import torch
        import torch.nn as nn

        HIDDEN = 24
        batch_size = 1000  # used by get_inputs only: not carried along


        def make_scale(n):
            return nn.Parameter(torch.full((n,), 1.0 / math.sqrt(n)))


        class Model(nn.Module):
            def __init__(self):
                super(Model, self).__init__()
                self.scale = make_scale(HIDDEN)
                self.eps = 1e-6

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


        def get_inputs():
            return [torch.randn(4, HIDDEN)]


        def get_init_inputs():
            return []
        '''))
    plan = plan_solution(problem)
    source = plan.render("cpu", kernel_sources=("// cpp\n", None))
    assert "HIDDEN = 24" in source and "def make_scale(n):" in source and "import math" in source
    assert "batch_size" not in source
    assert "super(ModelNew, self).__init__()" in source
    check_solution_matches_reference(problem, emit_with_stub(plan, tmp_path))


def test_reference_needing_a_third_party_module_is_refused(tmp_path):
    problem = write_problem(tmp_path, "x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps)",
                            init="self.tag = pytest.__name__")
    problem.write_text("import pytest\n" + problem.read_text())
    with pytest.raises(UnsupportedProblem, match="import only torch"):
        plan_solution(problem).render("cpu", kernel_sources=("// cpp\n", None))


def test_solution_runs_in_a_fresh_process_without_fastnorm(tmp_path):
    problem = PROBLEMS_DIR / "rms_norm_rsqrt_weight.py"
    solution = emit_with_stub(plan_solution(problem), tmp_path)
    script = textwrap.dedent(f'''
        import sys
        sys.modules["fastnorm"] = None  # any `import fastnorm` now fails
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("solution", {str(solution)!r})
        solution = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(solution)
        x = torch.randn(7, 11, 160)
        y = solution.ModelNew(160)(x)
        assert y.shape == x.shape and torch.isfinite(y).all()
        print("ok", "fastnorm" in sys.modules and sys.modules["fastnorm"] is not None)
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "False"]


# ----------------------------------------------------------------------------------------------
# The kernel block


@pytest.mark.parametrize("text", ['plain\n', 'quotes """ inside\n', 'ends with a backslash \\', 'a "quoted" end"',
                                  '#define X(a) \\\n  a\nprintf("%d\\n", 1);\n', "carriage\r\nreturn\n"])
def test_source_literals_read_back_exactly(text):
    assert eval(_string_literal(text)) == text


def test_extension_name_follows_the_sources():
    a = extension_name("cpu", "int f();", None)
    assert a == extension_name("cpu", "int f();", None)
    assert a != extension_name("cpu", "int g();", None)
    assert a != extension_name("cuda", "int f();", "")
    assert a.startswith("fastnorm_solution_cpu_")


# ids without the word "cuda": conftest skips tests with that keyword on machines without a GPU
@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["cpu_sources", "gpu_sources"])
def test_kernel_block_embeds_the_real_sources(device_type):
    from fastnorm.kernels import inline_sources

    cpp, cuda = inline_sources(device_type)
    block = kernel_block(device_type, functions=["norm_forward"])
    namespace = {"load_inline": lambda **kwargs: kwargs}
    exec(compile(block, "<kernel block>", "exec"), namespace)  # load_inline replaced: nothing is built
    call = namespace["_ext"]
    assert call["cpp_sources"] == [cpp]
    assert call["cuda_sources"] == ([cuda] if cuda else [])
    assert call["functions"] == ["norm_forward"]
    assert call["name"] == extension_name(device_type, cpp, cuda, ["norm_forward"])
    assert call["name"] != extension_name(device_type, cpp, cuda)  # all functions: another build
    assert "#include \"" not in cpp + (cuda or "")  # local headers inlined
