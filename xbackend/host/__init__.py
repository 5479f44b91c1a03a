"""The host: its GPU stack, the CUDA runtime calls, the environment a comparison ran in."""
