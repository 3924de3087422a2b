"""Running SGLang's CUDA wheel on a CPU-only host: the environment, the flags, and a fast attention backend."""
