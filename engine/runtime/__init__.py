"""Running a loaded model: generation and sampling, KV prefix reuse across turns, CUDA graphs, LocalEngine."""
