"""An LLM inference engine whose hot paths are OpenAI Triton kernels (no dependency on the Triton server)."""
