"""The NEON kernel variants (aarch64) against the portable C one, on an x86 machine: neon_harness.c
and the module's kernel sources cross-compiled with aarch64-linux-gnu-gcc, and with clang where
it is installed (the flags setup.py uses), run under qemu-aarch64. What the harness checks, and its tolerances, are in its header:
identical activation bytes, bit-exact dequantization, every gemm output within 1e-5 of
sum |w||x|, a corrupted nibble that must show, attention within 1e-5 of max |v|.

Two emulated CPUs: one with dotprod (both variants run; neondot is what dispatch picks there)
and a Cortex-A53 without it (dispatch must see no dotprod, and the plain neon variant must run
without an SDOT: one would be an illegal instruction there).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_SRC = ROOT / "kernels" / "cpu"
HARNESS = Path(__file__).with_name("neon_harness.c")
GCC = shutil.which("aarch64-linux-gnu-gcc")
CLANG = shutil.which("clang")  # Apple Silicon builds with clang: its pragmas differ from GCC's
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
OBJDUMP = shutil.which("aarch64-linux-gnu-objdump")
# setup.py's flags (-pthread aside: the harness has no threads); static, so qemu needs no sysroot
CFLAGS = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
VARIANT_FILES = ["generic.c", "arch/arm/neon.c", "arch/arm/neon_dot.c"]

pytestmark = [
    pytest.mark.skipif(GCC is None, reason="aarch64-linux-gnu-gcc not found (Debian: apt-get install gcc-aarch64-linux-gnu)"),
    pytest.mark.skipif(QEMU is None, reason="qemu-aarch64 not found (Debian: apt-get install qemu-user)"),
]


def _compiler(name: str, tmp: Path) -> list[str]:
    """The argv of an aarch64 compiler that can link a static program, or a skip saying what lacks."""
    if name == "clang" and CLANG is None:
        pytest.skip("clang not found (Debian: apt-get install clang): the clang build is not checked")
    cc = [GCC] if name == "gcc" else [CLANG, "--target=aarch64-linux-gnu"]  # clang: gcc-cross's libc
    probe = tmp / "probe.c"
    probe.write_text("#include <math.h>\nint main(void) { return (int)sqrt(0.0); }\n")
    if subprocess.run([*cc, "-static", str(probe), "-lm", "-o", str(tmp / "probe")], capture_output=True).returncode:
        pytest.skip(f"{name} cannot link a static aarch64 program: no aarch64 C library "
                    "(Debian: apt-get install libc6-dev-arm64-cross)")
    return cc


def _compile(cc: list[str], args: list[str]) -> None:
    proc = subprocess.run([*cc, *CFLAGS, f"-I{CPU_SRC}", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module", params=["gcc", "clang"])
def build(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"neon-{request.param}")
    cc = _compiler(request.param, out)
    objects = []
    for name in VARIANT_FILES:
        obj = out / Path(name).name.replace(".c", ".o")
        _compile(cc, ["-c", str(CPU_SRC / name), "-o", str(obj)])
        objects.append(str(obj))
    _compile(cc, ["-static", str(HARNESS), *objects, "-lm", "-o", str(out / "neon_harness")])
    return out


def _run(build: Path, cpu: str, seed: int) -> str:
    proc = subprocess.run([QEMU, "-cpu", cpu, str(build / "neon_harness"), str(seed)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("seed", [1, 20260601])
def test_neon_variants_match_generic_on_a_dotprod_cpu(build, seed):
    out = _run(build, "max", seed)  # qemu's "max": every extension it emulates, dotprod included
    assert "dotprod: yes" in out
    for variant in ("neon", "neondot"):
        assert f"variant {variant}\n" in out
        # 15 weight types, each: 18 gemm shapes, the corrupted nibble
        assert sum(line.startswith(f"{variant} ") and " ok:" in line for line in out.splitlines()) == 15
    assert "34 passed, 0 failed" in out, out


def test_plain_neon_runs_without_dotprod(build):
    out = _run(build, "cortex-a53", 7)  # ARMv8.0: no dotprod
    assert "dotprod: no" in out  # what the module's dispatch would see: it picks neon
    assert "variant neondot" not in out
    assert "17 passed, 0 failed" in out, out


@pytest.mark.skipif(OBJDUMP is None, reason="aarch64-linux-gnu-objdump not found (binutils-aarch64-linux-gnu)")
def test_only_the_dotprod_variant_holds_sdot(build):
    def sdots(obj: str) -> int:
        asm = subprocess.run([OBJDUMP, "-d", str(build / obj)], capture_output=True, text=True, check=True).stdout
        return sum("\tsdot\t" in line for line in asm.splitlines())

    assert sdots("neon_dot.o") > 0
    assert sdots("neon.o") == 0
    assert sdots("generic.o") == 0


def test_the_module_links_for_aarch64_with_both_neon_variants(tmp_path):
    """setup.py's sources, the Python binding included, as an aarch64 shared object: every kernel symbol
    resolves and both NEON tables are in it (only Python's and libc's symbols stay undefined).
    The host's Python headers serve: LP64 Linux on both sides."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    sources = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOURCES")
    assert {"kernels/cpu/arch/arm/neon.c", "kernels/cpu/arch/arm/neon_dot.c"} <= set(sources)
    lib = tmp_path / "_cpu.so"
    _compile(_compiler("gcc", tmp_path), ["-shared", "-fPIC", "-pthread", f"-I{sysconfig.get_paths()['include']}",
              *(str(ROOT / s) for s in sources), "-lm", "-o", str(lib)])
    nm = shutil.which("aarch64-linux-gnu-nm")
    if nm is None:
        pytest.skip("aarch64-linux-gnu-nm not found (binutils-aarch64-linux-gnu)")
    defined = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "PyInit__cpu" in defined
    symbols = subprocess.run([nm, str(lib)], capture_output=True, text=True, check=True).stdout
    assert " tq_kernels_neon\n" in symbols and " tq_kernels_neondot\n" in symbols
    undefined = subprocess.run([nm, "-u", str(lib)], capture_output=True, text=True, check=True).stdout
    assert not [line for line in undefined.splitlines() if "tq_" in line]
