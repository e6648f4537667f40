"""Selected kernel sources (what a single-file solution carries): the guards resolved, the code no entry
point reaches dropped, the package's own build still holding everything.

Test names avoid the word "cuda": conftest skips such tests on machines without a GPU, and nothing
here runs a kernel (CUDA sources are only generated, and compiled where nvcc is installed).
"""
import re
import shutil
import subprocess

import pytest

from fastnorm.kernels import KERNELS_DIR, inline_sources
from fastnorm.kernels.conditionals import ConditionalError, resolve
from fastnorm.kernels.reachable import keep_reachable
from fastnorm.kernels.selection import FAMILIES, KernelSelection
from fastnorm.kernels.source_text import drop_repeated_includes, mask_literals, strip_comments

KNOWN = {"FASTNORM_WANT_A": True, "FASTNORM_WANT_B": False}


def test_known_conditionals_are_resolved_and_their_directives_dropped():
    text = "\n".join(["a", "#ifdef FASTNORM_WANT_A", "b", "#else", "c", "#endif",
                      "#if defined(FASTNORM_WANT_B) || defined(FASTNORM_WANT_A)", "d", "#endif",
                      "#ifndef FASTNORM_WANT_A", "e", "#endif",
                      "#if !defined(FASTNORM_WANT_B) && defined(FASTNORM_WANT_A)", "f", "#endif"])
    assert resolve(text, KNOWN).split("\n") == ["a", "b", "d", "f"]


def test_other_conditionals_stay_with_the_known_ones_inside_resolved():
    text = "\n".join(["#if __CUDA_ARCH__ >= 900", "#ifdef FASTNORM_WANT_B", "x", "#endif", "y", "#else", "z",
                      "#endif"])
    assert resolve(text, KNOWN).split("\n") == ["#if __CUDA_ARCH__ >= 900", "y", "#else", "z", "#endif"]
    # a known symbol that decides the condition alone is enough; an open mix is refused
    assert resolve("#if defined(FASTNORM_WANT_B) && X > 1\nq\n#endif", KNOWN) == ""
    with pytest.raises(ConditionalError):
        resolve("#if defined(FASTNORM_WANT_A) && X > 1\nq\n#endif", KNOWN)
    with pytest.raises(ConditionalError):
        resolve("#ifdef FASTNORM_WANT_A\nq\n", KNOWN)


def test_comments_go_and_literals_stay():
    text = ('int a; // note\n/* block\n comment */ int b = 1;\n\nconst char* s = "// not a comment /* */";\n'
            'char c = \'"\';\n')
    assert strip_comments(text) == 'int a;\n  int b = 1;\nconst char* s = "// not a comment /* */";\nchar c = \'"\';\n'
    assert mask_literals('f("{;}") + \'}\';') == 'f("   ") + \' \';'
    text = "#include <a>\n#ifdef X\n#include <a>\n#include <b>\n#endif\n#include <b>\n#include <a>\n"
    assert drop_repeated_includes(text) == "#include <a>\n#ifdef X\n#include <a>\n#include <b>\n#endif\n#include <b>\n"


SOURCE = """#include <vector>
#define HELPER_SCALE 2
#define UNUSED_MACRO 3
#define FASTNORM_SCALE 4
#define FASTNORM_UNUSED "not read"
#if !defined(SOME_ARCH)
#define FASTNORM_HAS_FEATURE 1
#endif
#ifdef FASTNORM_HAS_FEATURE
__device__ int feature() { return FASTNORM_SCALE; }
#endif
namespace outer {
struct Used { int v; };
struct Unused { int v; };
template <typename T> constexpr int kWidth = sizeof(T) == 4 ? 8 : 4;
constexpr int kA = 1, kB = 2;
template <typename T> __global__ void __launch_bounds__(256, kB) kernel(T* p) { p[0] = kWidth<T> * HELPER_SCALE; }
static inline int helper(const Used& u) { return u.v; }
static inline int dead(const Unused& u) { return u.v + kA; }
}  // namespace outer
namespace gone {
int never();
}
#ifdef ARCH_FEATURE
__device__ int arch_only() { return 1; }
#endif
#ifdef OTHER_FEATURE
__device__ int other() { return 2; }
#endif
int entry(outer::Used u) { return outer::helper(u) + arch_only() + feature(); }
INSTANCE_MACRO(kernel, float)
"""


def test_declarations_no_entry_point_reaches_are_dropped():
    kept = keep_reachable([SOURCE], ["entry"])[0]
    for name in ("struct Used", "helper(", "entry(", "#include <vector>", "INSTANCE_MACRO(kernel, float)",
                 "kernel(T* p)", "kWidth", "HELPER_SCALE 2", "kA = 1, kB = 2", "#ifdef ARCH_FEATURE", "arch_only"):
        assert name in kept, name
    assert "UNUSED_MACRO 3" in kept  # a later header may read a macro: every #define stays, but our own
    # FASTNORM_* macros, kept where a kept declaration or an open conditional reads them
    for name in ("FASTNORM_SCALE 4", "#define FASTNORM_HAS_FEATURE 1", "#ifdef FASTNORM_HAS_FEATURE", "feature()"):
        assert name in kept, name
    for name in ("Unused", "dead", "namespace gone", "never", "OTHER_FEATURE", "other()", "FASTNORM_UNUSED"):
        assert name not in kept, name
    dropped = keep_reachable([SOURCE.replace("+ feature()", "")], ["entry"])[0]
    assert "FASTNORM_HAS_FEATURE" not in dropped and "FASTNORM_SCALE" not in dropped and "SOME_ARCH" not in dropped
    assert kept.count("namespace outer {") == 1 and kept.rstrip().endswith("INSTANCE_MACRO(kernel, float)")


def test_template_heads_with_operators_in_default_arguments_declare_their_names():
    """`>=`, `<<` and parenthesized `>` in a template's default arguments are operators, not the list's end: the
    declaration still declares its name (a misread one was kept whatever reached it: session 45's InstanceNorm
    solution grew past 40 KB by a kernel it never launches)."""
    defaults = ("K >= 24 ? 1 : 2", "(K > 8 ? 1 : 2)", "K <= 8 ? 1 : 2", "1 << 4", "K >= 24 ? 1 : 2, int kB = 1 << 4")
    for default in defaults:
        source = f"""template <typename T, int K, int kMin = {default}>
__global__ void __launch_bounds__(256, kMin) unused_kernel(T* a) {{ a[0] = T(K); }}
template <typename T, int K = 3>
__global__ void used_kernel(T* a) {{ a[0] = T(K); }}
void entry(float* a) {{ used_kernel<float><<<1, 1>>>(a); }}
"""
        kept = keep_reachable([source], ["entry"])[0]
        assert "used_kernel(T* a)" in kept and "entry(" in kept, default
        assert "unused_kernel" not in kept, default


def _all_want_symbols_in_sources() -> set:
    found = set()
    for path in list(KERNELS_DIR.glob("*.c*")) + list(KERNELS_DIR.glob("*.h")):
        found |= set(re.findall(r"FASTNORM_WANT_\w+", path.read_text()))
    return found


def test_the_package_build_defines_every_guard_and_the_selection_knows_them_all():
    defaults = set(re.findall(r"#define (FASTNORM_WANT_\w+)", (KERNELS_DIR / "kernel_wants.h").read_text()))
    assert _all_want_symbols_in_sources() == defaults
    for device_type in ("cpu", "cuda"):
        symbols = KernelSelection.everything(device_type).symbols()
        assert {s for s in symbols if s.startswith("FASTNORM_WANT_")} == defaults


SELECTIONS = [
    KernelSelection("cpu", ("norm_forward",), frozenset({"f32"}), frozenset({"row"})),
    KernelSelection("cpu", ("batch_norm_forward", "p_normalize"), frozenset({"f32", "bf16"}), frozenset()),
    KernelSelection("cuda", ("norm_forward",), frozenset({"f32"}), frozenset({"resident"})),
    KernelSelection("cuda", ("norm_forward",), frozenset({"f32", "bf16"}), frozenset({"held_rows", "split"})),
    KernelSelection("cuda", ("norm_forward",), frozenset({"bf16"}), frozenset({"split", "row"})),
    KernelSelection("cuda", ("norm_forward", "group_norm_forward"), frozenset({"f16"}), frozenset({"channel"})),
    KernelSelection("cuda", ("p_normalize",), frozenset({"f32"}), frozenset({"family_passes"})),
    KernelSelection("cuda", ("group_norm_forward",), frozenset({"bf16"}), frozenset({"group_chain"})),
    KernelSelection("cuda", ("group_norm_forward",), frozenset({"f32"}), frozenset({"group_held"})),
]


@pytest.mark.parametrize("selection", SELECTIONS, ids=lambda s: f"{s.device_type.replace('cuda', 'gpu')}-"
                         f"{'+'.join(s.functions)}-{'+'.join(sorted(s.families)) or 'family'}")
def test_selected_sources_hold_what_was_selected_only(selection):
    cpp, device_code = inline_sources(selection.device_type, selection)
    text = cpp + (device_code or "")
    assert "FASTNORM_WANT" not in text and "FASTNORM_SELECTED_KERNELS" not in text and '#include "' not in text
    for source in filter(None, (cpp, device_code)):  # comments stripped, but for each source's first line
        assert "//" not in mask_literals(source.split("\n", 1)[1])
    for backward in ("norm_backward", "add_norm_forward", "residual_row"):
        assert backward not in text
    if device_code and selection.needs_family:  # the family's paths that were selected, and only those
        paths = {"group_chain": "chain_kernel", "group_held": "held_chain_kernel", "family_sets": "set_forward_kernel",
                 "family_passes": "piece_stats_kernel"}
        for path, kernel in paths.items():
            wanted = path in selection.families and (
                not path.startswith("group_") or "group_norm_forward" in selection.functions)
            assert (re.search(rf"\b{kernel}\b", device_code) is not None) is wanted, kernel
        # the |x| and x^2 statistics of the multi-kernel path only where p_normalize is
        assert ("run_passes<T, FN_STAT_ABS_SUM>" in device_code) is (
            "p_normalize" in selection.functions and "family_passes" in selection.families)
    for function in ("norm_forward", "group_norm_forward", "batch_norm_forward", "p_normalize"):
        assert (re.search(rf"\b{function}\(const at::Tensor", text) is not None) is (function in selection.functions)
    if selection.device_type == "cpu":  # read by at::vec's headers, not by these sources: kept all the same
        assert "#define CPU_CAPABILITY_AVX2" in cpp
    if selection.device_type == "cuda":
        kernels = {"held_rows": "held_rows_kernel", "resident": "resident_row_norm_kernel", "split": "split_slice_kernel",
                   "split_uncached": "split_row_norm_kernel", "row": "row_norm_kernel", "few_rows": "few_rows_kernel",
                   "offset_rows": "offset_rows_kernel",
                   "cluster": "cluster_row_norm_kernel", "streamed": "stream_apply_kernel",
                   "channel": "strided_tile_kernel"}
        for family, kernel in kernels.items():
            wanted = family in selection.families and selection.needs_norm_forward
            assert (re.search(rf"\b{kernel}\b", device_code) is not None) is wanted, kernel
        instances = set(re.findall(r"^FASTNORM_FORWARD_INSTANCE\((\w+),", device_code, re.M))
        assert instances == ({f"forward_{d}" for d in selection.dtypes} | {f"forward_{d}_wf32" for d in selection.dtypes
                                                                             if d in ("f16", "bf16")}
                             if selection.needs_norm_forward else set())


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["cpu_sources", "gpu_sources"])
def test_everything_selected_is_still_every_kernel(device_type):
    selection = KernelSelection.everything(device_type)
    cpp, device_code = inline_sources(device_type, selection)
    text = cpp + (device_code or "")
    for family in FAMILIES[device_type]:  # all but the residual add, which no solution calls
        assert selection.symbols()[f"FASTNORM_WANT_{family.upper()}"] is (family != "residual")
    for name in ("forward_f64", "forward_bf16_wf32", "resident_row_norm_kernel", "cluster_row_norm_kernel",
                 "strided_norm_kernel") if device_type == "cuda" else ("forward_channels", "forward_rows"):
        assert name in text, name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("selection", [s for s in SELECTIONS if s.device_type == "cuda"] + [
    KernelSelection.everything("cuda", ("norm_forward",))], ids=lambda s: "+".join(sorted(s.families)))
def test_selected_device_code_compiles_for_sm90(selection, tmp_path):
    _, device_code = inline_sources("cuda", selection)
    source = tmp_path / "kernels.cu"
    source.write_text(device_code)
    done = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", "-c", str(source),
                           "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
