"""Models: specs (hub ids, directories, GGUF, Ollama, built-ins), GGUF import, the fast-math
path for MLX's x86 CPU build, and batched sampling."""
