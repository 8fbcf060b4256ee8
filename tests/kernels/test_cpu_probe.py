"""The x86 feature probe (cpuid + xgetbv, kernels/cpu/arch/x86/features.h) answers exactly the
compile targets of each kernel variant: a variant runs only where every feature its source is
compiled for is present, so a CPU without one (BMI2, AVX512DQ...) never gets SIGILL. Checked
against the kernel's own view of the CPU (/proc/cpuinfo) and against the source files' pragmas."""
import platform
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tramontane.kernels import cpu_native

SOURCES = Path(__file__).resolve().parents[2] / "kernels" / "cpu"
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not (cpu_native.AVAILABLE and X86), reason="x86-64 native kernels")
# GCC's target() names -> Linux /proc/cpuinfo flag names
CPUINFO_NAME = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx512bf16": "avx512_bf16",
                "sse4.2": "sse4_2", "bmi": "bmi1"}
VARIANT_SOURCES = {"avx2": "arch/x86/avx2.c", "avxvnni": "arch/x86/avxvnni.c", "avx512vnni": "arch/x86/avx512.c"}


def cpuinfo_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text()
    return set(re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split())


def test_each_variant_is_probed_for_exactly_what_its_source_is_compiled_for():
    targets = cpu_native._cpu.variant_targets()
    assert targets["generic"] is None
    for variant, source in VARIANT_SOURCES.items():
        text = (SOURCES / source).read_text()
        gcc = re.search(r'#pragma GCC target\("([^"]+)"\)', text).group(1)
        clang = re.search(r'#pragma clang attribute push\(__attribute__\(\(target\("([^"]+)"\)\)\)', text).group(1)
        table = re.search(r'#define TQ_TARGET_FEATURES "([^"]+)"', text).group(1)
        assert gcc == clang == table == targets[variant], variant


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux: /proc/cpuinfo")
def test_the_probe_agrees_with_the_kernel_for_every_feature_and_picks_variants_by_it():
    flags = cpuinfo_flags()
    targets = cpu_native._cpu.variant_targets()
    features = {f for t in targets.values() if t for f in t.split(",")} | {"avxvnni", "avx512bf16", "sse4.2"}
    for feature in sorted(features):
        assert cpu_native._cpu.cpu_has(feature) == (CPUINFO_NAME.get(feature, feature) in flags), feature
    runnable = [v for v, t in targets.items()
                if t is None or all(CPUINFO_NAME.get(f, f) in flags for f in t.split(","))]
    assert cpu_native.variants() == runnable


def test_an_unknown_feature_is_refused():
    assert cpu_native._cpu.cpu_has("avx1024") is False
    assert cpu_native._cpu.cpu_has("avx2,fma") is False  # one name at a time


def test_the_avx_vnni_variant_is_ranked_and_probed():
    """AVX-VNNI (Alder Lake and later, no AVX-512) sits between the AVX-512 and AVX2 builds, and
    runs exactly where the probe finds avx_vnni with AVX2, FMA, F16C and BMI2."""
    targets = cpu_native._cpu.variant_targets()
    assert list(targets) == ["avx512vnni", "avxvnni", "avx2", "generic"]
    runs = cpu_native._cpu.cpu_has("avxvnni") and all(cpu_native._cpu.cpu_has(f) for f in ("avx2", "fma", "f16c", "bmi2"))
    assert ("avxvnni" in cpu_native.variants()) == runs
    if not runs:
        with pytest.raises(ValueError, match="lacks"):
            cpu_native.use_variant("avxvnni")


def _disassemble(source: str, tmp_path: Path) -> list[tuple[str, str]]:
    """(raw bytes, instruction) of each instruction of one variant file compiled as setup.py does."""
    cc, objdump = shutil.which("gcc") or shutil.which("cc"), shutil.which("objdump")
    if cc is None or objdump is None:
        pytest.skip("needs gcc and objdump")
    obj = tmp_path / (Path(source).name + ".o")
    subprocess.run([cc, "-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-fPIC", f"-I{SOURCES}",
                    f"-I{sysconfig.get_paths()['include']}", "-c", str(SOURCES / source), "-o", str(obj)],
                   check=True, capture_output=True, timeout=600)
    out = subprocess.run([objdump, "-d", str(obj)], check=True, capture_output=True, text=True).stdout
    return [(f[1].strip(), f[2].strip()) for f in (line.split("\t") for line in out.splitlines()) if len(f) >= 3]


def test_the_avx_vnni_build_uses_vex_vnni_and_nothing_of_avx512(tmp_path):
    """What proves the AVX-VNNI variant on a CPU that cannot run it (this one, if it lacks
    avx_vnni; qemu 7.2 does not emulate it either): its machine code has the VEX-encoded VNNI
    dot products (vpdpbusd / vpdpwssd, the same operations the AVX-512 VNNI build runs and the
    tests check there) and not one EVEX-encoded instruction (0x62 prefix: AVX-512, which an Alder
    Lake lacks), no zmm, no mask or upper-16 vector register. The AVX-512 build is the control."""
    insns = _disassemble(VARIANT_SOURCES["avxvnni"], tmp_path)
    assert sum("{vex} vpdpbusd" in i for _, i in insns) > 50 and any("{vex} vpdpwssd" in i for _, i in insns)
    evex = [i for raw, i in insns if raw.startswith("62 ")]
    assert not evex, evex[:5]
    assert not [i for _, i in insns if re.search(r"zmm|%k[0-7]|%[xy]mm(1[6-9]|2\d|3[01])", i)]
    control = _disassemble(VARIANT_SOURCES["avx512vnni"], tmp_path)
    assert sum(raw.startswith("62 ") for raw, _ in control) > 1000
