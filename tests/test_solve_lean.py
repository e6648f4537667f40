"""A lean solution: the calls its ModelNew makes on the traced shapes, the kernels they need, the launch
configurations worth timing, and the file that comes out (at most 40 KB for every problem in problems/).

Test names avoid the word "cuda" (conftest skips those without a GPU): the GPU target is only rendered
here, and its device code compiled where nvcc is installed.
"""
import ast
import re
import shutil
import subprocess
import sys

import pytest
import torch

from fastnorm.kernels.selection import KernelSelection
from fastnorm.solve import kernel_needs
from fastnorm.solve.extension_calls import ExtensionCall, record_calls
from fastnorm.solve.planner_rules import CudaDevice, family_paths, launch_key, norm_family
from fastnorm.solve.solver import plan_solution
from fastnorm.solve.tune import candidate_configs
from test_solve_support import MAIN_PROBLEMS_DIR, PROBLEMS_DIR

PROBLEMS = sorted(p.name for p in MAIN_PROBLEMS_DIR.glob("*.py"))
MAX_BYTES = 40_000
H100 = CudaDevice()

# What each problem's ModelNew calls on its traced shapes (training and eval mode), and the norm_forward
# kernel family the GPU planner gives the call.
EXPECTED = {
    "batch_norm_64x64x512x512.py": ("batch_norm_forward", None),
    "frobenius_norm_112x64x512x512.py": ("p_normalize", None),
    "group_norm_112x64x512x512.py": ("group_norm_forward", None),
    "group_norm_silu_8x512x64x64.py": ("group_norm_forward", None),
    "instance_norm_112x64x512x512.py": ("norm_forward", "split"),  # no parameters: each plane a LayerNorm row
    "l1_norm_32768x65535.py": ("p_normalize", None),
    "l2_norm_32768x65535.py": ("p_normalize", None),
    "layer_norm_16x64x256x256.py": ("norm_forward", "resident"),
    "rms_norm_112x64x512x512.py": ("norm_forward", "channel"),
}


@pytest.fixture(scope="module")
def plans():
    return {name: plan_solution(MAIN_PROBLEMS_DIR / name) for name in PROBLEMS}


def test_every_problem_has_an_expectation():
    assert sorted(EXPECTED) == PROBLEMS


@pytest.mark.parametrize("name", PROBLEMS)
def test_calls_are_recorded_on_the_traced_shapes(name, plans):
    calls = record_calls(plans[name])
    function, family = EXPECTED[name]
    assert [c.function for c in calls] == [function]
    assert calls[0].dtype == "float32"
    if family:
        assert norm_family(calls[0], "cuda", H100) == family
        assert norm_family(calls[0], "cpu") == ("channel" if family == "channel" else "row")


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_the_emitted_file_is_small_and_imports_only_torch(name, device_type, plans):
    plan = plans[name]
    selection = kernel_needs.selection_for(record_calls(plan), device_type, H100)
    source = plan.render(device_type, selection=selection, threads=512, blocks_per_row=64,
                         tuned_on="NVIDIA H100 80GB HBM3" if device_type == "cuda" else "CPU (x86_64, 128 cores)")
    assert len(source.encode()) <= MAX_BYTES, f"{len(source.encode())} bytes"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(m.split(".")[0] in ("torch", "inspect") or m in sys.stdlib_module_names for m in modules)
    assert f"functions={list(selection.functions)!r}" in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", PROBLEMS)
def test_the_emitted_device_code_compiles_for_sm90(name, plans, tmp_path):
    plan = plans[name]
    source = plan.render("cuda", selection=kernel_needs.selection_for(record_calls(plan), "cuda", H100))
    namespace = {}
    for node in ast.parse(source).body:  # the source strings only; nothing is built
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("_SHARED_SOURCE", "_CUDA_SOURCE"):
            exec(compile(ast.Module([node], []), "<solution>", "exec"), namespace)
    (tmp_path / "kernels.cu").write_text(namespace["_CUDA_SOURCE"])
    done = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", "-Xptxas", "-v",
                           "-c", str(tmp_path / "kernels.cu"), "-o", str(tmp_path / "kernels.o")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert " bytes spill" not in done.stderr.replace(" 0 bytes spill", "")


def _call(shape, begin, end, dtype="float32", rms=False):
    return ExtensionCall("norm_forward", shape, dtype, "float32", begin, end, rms=rms)


@pytest.mark.parametrize("call,family", [
    (_call((4096, 1024), 1, 2), "row"),
    (_call((8, 4096), 1, 2), "few_rows"),                # fewer rows than SMs, a vector a thread
    (_call((100000, 257), 1, 2), "offset_rows"),           # scalar rows of 32-8189 elements
    (_call((100000, 17), 1, 2), "offset_rows"),            # scalar rows shorter than a warp: a thread a row
    (_call((100000, 12001), 1, 2, "float16"), "offset_rows"),  # float16 rows of 1025-16384: strided, a block a row
    (_call((100, 6001), 1, 2), "offset_rows"),             # a latency-bound call of rows of 1025-8192: strided
    (_call((100000, 12001), 1, 2), "row"),               # float32 rows past 8189: the row kernel
    (_call((100, 6001), 1, 2, "float64"), "row"),        # (float64: never strided)
    (_call((100000, 17), 1, 2, "float64"), "row"),       # float64 rows of 17-31: the row kernel
    (_call((100000, 2), 1, 2), "offset_rows"),             # rows of bytes dividing 16: packed in vectors
    (_call((100000, 8), 1, 2, "bfloat16"), "offset_rows"),  # 16-byte rows too
    (_call((100000, 8), 1, 2), "row"),                   # 32-byte rows: the row kernel
    (_call((1024, 65536), 1, 2), "cluster"),             # 256 KB rows filling the chip
    (_call((7168, 262144), 1, 2), "split"),              # 1 MB rows: 16 cached slices
    (_call((16, 4194304), 1, 2), "resident"),            # 16 MB rows on chip
    (_call((64, 1048576), 1, 2), "held_rows"),           # 4 MB rows, a wave of 80 KB chunks and more
    (_call((8, 1048576), 1, 2), "resident"),             # 4 MB rows, too few for a wave: two groups of SMs
    (_call((64, 1048576), 1, 2, "float64"), "resident"),  # never held
    (_call((64, 1048576), 1, 2, rms=True), "resident"),  # RMSNorm rows: not held
    (_call((4, 1800001), 1, 2), "streamed"),             # 7.2 MB rows of an odd length: no vectors
    (_call((8, 64, 32, 32), 1, 2), "channel"),
])
def test_planner_rules(call, family):
    assert norm_family(call, "cuda", H100) == family


def _family_call(function, shape, groups=0, dtype="float32"):
    return ExtensionCall(function, shape, dtype, "float32", groups=groups)


@pytest.mark.parametrize("call,paths", [
    (_family_call("group_norm_forward", (112, 64, 512, 512), 8), {"group_held"}),      # 8 MB sets, 896 of them
    (_family_call("group_norm_forward", (112, 64, 512, 512), 8, "float64"), {"group_chain"}),  # never held
    (_family_call("group_norm_forward", (3, 4, 512, 1100), 2, "bfloat16"), {"group_held"}),  # 2.1 MB sets
    (_family_call("group_norm_forward", (1, 4, 1024, 1024), 4), {"group_held"}),       # 4 MB
    (_family_call("group_norm_forward", (8, 512, 64, 64), 32), {"family_sets"}),       # 256 KB sets for every SM
    (_family_call("group_norm_forward", (4, 64, 256, 256), 16), {"group_chain"}),      # 1 MB sets, too few
    (_family_call("group_norm_forward", (2, 8, 128, 128), 4), {"family_passes"}),      # 128 KB sets, too few
    (_family_call("group_norm_forward", (1, 8, 1024, 1024), 1), {"family_passes"}),    # 32 MB sets
    (_family_call("group_norm_forward", (2, 80, 1000), 1), {"family_passes"}),         # planes under kLongRow
    (_family_call("batch_norm_forward", (64, 64, 512, 512)), {"family_passes"}),       # 64 MB channels
    (_family_call("batch_norm_forward", (40, 160, 4, 4)), {"family_passes", "family_sets"}),
    (_family_call("p_normalize", (32768, 65535)), {"family_passes"}),
])
def test_family_path_rules(call, paths):
    """planner_rules.family_paths against family.cu's choices (tests/test_family_chain.py checks the same
    shapes' kernels on a GPU)."""
    assert family_paths(call, "cuda", H100) == paths
    assert family_paths(call, "cpu", H100) == frozenset()


def test_the_family_files_hold_only_their_paths(plans):
    sources = {}
    for name in ("group_norm_112x64x512x512.py", "group_norm_silu_8x512x64x64.py", "batch_norm_64x64x512x512.py"):
        selection = kernel_needs.selection_for(record_calls(plans[name]), "cuda", H100)
        sources[name] = plans[name].render("cuda", selection=selection)
    assert "held_chain_kernel" in sources["group_norm_112x64x512x512.py"]  # the held chain only
    assert re.search(r"\bchain_kernel\b", sources["group_norm_112x64x512x512.py"]) is None
    assert "piece_stats_kernel" not in sources["group_norm_112x64x512x512.py"]
    assert "set_forward_kernel" in sources["group_norm_silu_8x512x64x64.py"]
    assert "piece_stats_kernel" not in sources["group_norm_silu_8x512x64x64.py"]
    assert "piece_stats_kernel" in sources["batch_norm_64x64x512x512.py"]
    assert "set_forward_kernel" not in sources["batch_norm_64x64x512x512.py"]
    assert not any("chain_kernel" in sources[n] for n in sources if n != "group_norm_112x64x512x512.py")


def test_tuning_grid_keeps_distinct_launches_on_built_families():
    grid = candidate_configs("cuda")
    split = _call((7168, 262144), 1, 2)
    selection = kernel_needs.selection_for([split], "cuda", H100)
    configs = kernel_needs.tune_configs([split], selection, grid, H100)
    assert configs[0] == (0, 0) and len(configs) < len(grid)
    keys = [launch_key(split, "cuda", H100, t, b) for t, b in configs]
    assert len(set(keys)) == len(keys)  # no two launch the same kernels
    assert all(b not in (1, 2, 4) for _, b in configs)  # one block a row (row kernel) or uncached slices: not built
    assert (1024, 0) not in configs  # the split kernel takes 512 threads at most: the same as (512, 0)
    for kernel_chooses_alone in (_call((16, 4194304), 1, 2), _call((8, 64, 32, 32), 1, 2)):
        selection = kernel_needs.selection_for([kernel_chooses_alone], "cuda", H100)
        assert kernel_needs.tune_configs([kernel_chooses_alone], selection, grid, H100) == [(0, 0)]
    everything = KernelSelection.everything("cuda")
    assert len(kernel_needs.tune_configs([split], everything, grid, H100)) > len(configs)


def test_no_recorded_calls_build_every_kernel_of_the_helpers_functions():
    selection = kernel_needs.selection_for([], "cuda", H100, ["p_normalize"])
    assert selection == KernelSelection.everything("cuda", ("p_normalize",))


def test_a_call_whose_kernels_were_left_out_fails_clearly(tmp_path, monkeypatch):
    """A build of last-dim rows in float32 asked for a channel norm or for float64: an error that says so,
    not a wrong result."""
    from torch.utils.cpp_extension import load_inline

    from fastnorm.kernels import inline_sources
    from fastnorm.solve.emit import CFLAGS, LDFLAGS, extension_name

    selection = KernelSelection("cpu", ("norm_forward",), frozenset({"f32"}), frozenset({"row"}))
    cpp, _ = inline_sources("cpu", selection)
    ext = load_inline(name=extension_name("cpu", cpp, None, ["norm_forward"]), cpp_sources=[cpp],
                      functions=["norm_forward"], extra_cflags=CFLAGS["cpu"], extra_ldflags=LDFLAGS["cpu"])
    x = torch.randn(4, 6, 5)
    y = ext.norm_forward(x, None, None, 2, 3, 1e-5, False, 0, 0)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (5,)), rtol=1e-5, atol=1e-5)
    for args in ((x, None, None, 1, 2), (x.double(), None, None, 2, 3)):
        with pytest.raises(RuntimeError, match="not in this build"):
            ext.norm_forward(*args, 1e-5, False, 0, 0)


def test_solver_rebuilds_with_every_family_when_the_planner_takes_one_left_out(tmp_path, monkeypatch):
    """The solver's planner rules wrong for once (a channel family for last-dim rows): every candidate
    answers "not in this build", and the solver rebuilds with every family and goes on."""
    from fastnorm.solve import solve, solver
    from fastnorm.solve.solver import Verification

    real = kernel_needs.selection_for

    def wrong(calls, device_type, *args, **kwargs):
        return KernelSelection(device_type, ("norm_forward",), real(calls, device_type, *args, **kwargs).dtypes,
                               frozenset({"channel"}))

    monkeypatch.setattr(solver.kernel_needs, "selection_for", wrong)
    lines = []
    out = tmp_path / "solution.py"
    result = solve(PROBLEMS_DIR / "layer_norm_last_dim.py", out, device="cpu", tune_trials=2, log=lines.append,
                   verify=lambda *a, **k: Verification(True, "not verified here", speedup=1.0))
    text = "\n".join(lines)
    assert "not in this build" in text and "rebuilding with every family" in text, text
    assert result.chosen.error is None and "kernel families row, channel" in out.read_text()
