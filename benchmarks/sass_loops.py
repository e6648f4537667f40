"""Static SASS of the kernels of one translation unit, compiled here as torch's build compiles it (sm_90):
each matching kernel's instruction count and the size of each loop (a backward branch), for comparing the
instructions a change leaves in a kernel's hot loop before spending device time on it.

The row backward was issue-bound on the H200 (ncu: issue slots 70% busy, ALU the busiest pipe); cutting its
per-row instructions (session 37) made it 15% faster. This CPU machine has no cuobjdump: the wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry it (`pip download --no-deps` both, unzip, put their
nvidia/cu13/bin on PATH or point CUOBJDUMP_DIR at it).

Usage: python benchmarks/sass_loops.py src/fastnorm/kernels/backward_bf16.cu 'row_backward_kernelI13__nv_bfloat16S1_Li8ELi1E'
"""
import os
import re
import subprocess
import sys
import tempfile

FLAGS = ["-std=c++17", "-O3", "-arch=sm_90", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
         "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def sass_of(source):
    env = dict(os.environ)
    if env.get("CUOBJDUMP_DIR"):
        env["PATH"] = env["CUOBJDUMP_DIR"] + os.pathsep + env["PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "unit.cubin")
        subprocess.run(["nvcc", *FLAGS, "-cubin", "-o", cubin, source], check=True, stderr=subprocess.DEVNULL)
        return subprocess.run(["cuobjdump", "-sass", cubin], env=env, check=True, capture_output=True, text=True).stdout


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    source, pattern = sys.argv[1:]
    for function in re.split(r"\n\s*Function : ", sass_of(source))[1:]:
        name = function.split("\n", 1)[0].strip()
        if pattern not in name:
            continue
        instructions = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", function)
        print(f"{name}: {len(instructions)} instructions")
        for address, text in instructions:
            target = re.search(r"BRA (0x[0-9a-f]+)", text)
            if target and int(target.group(1), 16) < int(address, 16):
                size = (int(address, 16) - int(target.group(1), 16)) // 16 + 1
                print(f"  loop {target.group(1)}..0x{address}: {size} instructions")


if __name__ == "__main__":
    main()
