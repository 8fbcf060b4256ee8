"""Triton kernels for quantized GGUF weights, each beside a plain-torch reference."""
