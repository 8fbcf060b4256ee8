"""The x86 feature probe (cpuid + xgetbv, kernels/cpu/tq_x86_features.h) answers exactly the
compile targets of each kernel variant: a variant runs only where every feature its source is
compiled for is present, so a CPU without one (BMI2, AVX512DQ...) never gets SIGILL. Checked
against the kernel's own view of the CPU (/proc/cpuinfo) and against the source files' pragmas."""
import platform
import re
from pathlib import Path

import pytest

from tramontane.kernels import cpu_native

SOURCES = Path(__file__).resolve().parents[2] / "kernels" / "cpu"
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not (cpu_native.AVAILABLE and X86), reason="x86-64 native kernels")
# GCC's target() names -> Linux /proc/cpuinfo flag names
CPUINFO_NAME = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx512bf16": "avx512_bf16",
                "sse4.2": "sse4_2", "bmi": "bmi1"}
VARIANT_SOURCES = {"avx2": "tq_avx2.c", "avx512vnni": "tq_avx512.c"}


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
