"""Builds the native CPU kernels (tramontane.kernels._cpu); everything else is in pyproject.toml.

One C extension, compiled by `pip install .` / `pip install -e .` with the platform's C compiler.
The kernel sources are built once per instruction set (kernels/cpu/generic.c; arch/x86/avx2.c,
avxvnni.c, avx512.c on x86-64; arch/arm/neon.c, neon_dot.c on aarch64 select their targets with pragmas),
and the module picks one at import from the CPU's features (cpuid; the OS's hwcaps on ARM),
so the built module runs on any CPU of its architecture and nothing is compiled at run time.
Without a working C compiler the install still succeeds, without the module (the CPU then uses
the torch path and says so); TRAMONTANE_REQUIRE_NATIVE=1 turns that into an error.
"""
import os
import sys
import warnings
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# An editable install of a mapped layout (package-dir: app/ -> tramontane.app, ...) goes through
# setuptools' meta path finder, which then warns to "be careful with folders in your working
# directory with the same name as your package": here that folder is tramontane/, the package
# itself, so the note says nothing to act on; pip shows it on every `pip install -e .`.
warnings.filterwarnings("ignore", message=r"Editable installation\.")

# the x86 variant files compile to nothing on ARM and the NEON ones to nothing on x86
SOURCES = ["kernels/cpu/module.c", "kernels/cpu/dispatch.c", "kernels/cpu/pool.c", "kernels/cpu/matmul.c",
           "kernels/cpu/attention.c", "kernels/cpu/ops.c", "kernels/cpu/decode.c",
           "kernels/cpu/repack.c", "kernels/cpu/generic.c",
           "kernels/cpu/arch/x86/avx2.c", "kernels/cpu/arch/x86/avx512.c", "kernels/cpu/arch/x86/avxvnni.c",
           "kernels/cpu/arch/arm/neon.c", "kernels/cpu/arch/arm/neon_dot.c"]
# headers and the per-variant bodies they include (a change to one rebuilds the module)
DEPENDS = sorted(p for p in glob("kernels/cpu/**/*", recursive=True) if p.endswith((".h", ".inc")))


class BuildExt(build_ext):
    def build_extensions(self):
        if self.compiler.compiler_type == "msvc":
            args = ["/O2", "/std:c11"]
        else:
            # -ffp-contract=off: no silent a*b+c fusing, so every variant rounds the activation
            # quantization the same way (the tests compare them)
            args = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno"]
            if sys.platform != "win32":
                args.append("-pthread")
        for ext in self.extensions:
            ext.extra_compile_args = args + list(ext.extra_compile_args or [])
            if self.compiler.compiler_type != "msvc" and sys.platform != "win32":
                ext.extra_link_args = ["-pthread"] + list(ext.extra_link_args or [])
        super().build_extensions()

    def build_extension(self, ext):
        # No C compiler: install anyway; kernels.linear then keeps the torch path and warns once.
        # TRAMONTANE_REQUIRE_NATIVE=1 (CI, the installer build) makes a failed build an error.
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - CompileError, LinkError, missing compiler
            if os.environ.get("TRAMONTANE_REQUIRE_NATIVE", "") not in ("", "0"):
                raise
            what = ("image preprocessing will use the slower torch path" if ext.name.endswith("_resample")
                    else "CPU inference will use the slower torch path")
            print(f"warning: the native extension {ext.name} was not built: {exc}; {what}", file=sys.stderr)


setup(
    ext_modules=[Extension("tramontane.kernels._cpu", SOURCES, depends=DEPENDS,
                           include_dirs=["kernels/cpu"]),
                 # image preprocessing's resampler (engine/mistral3/image.py keeps a torch path)
                 Extension("tramontane.kernels._resample", ["kernels/image/resample.c"])],
    cmdclass={"build_ext": BuildExt},
)
