"""Shared fixtures of the kernel tests."""
from support.cpu_kernels import restore_cpu_kernel_settings  # noqa: F401 - a fixture
