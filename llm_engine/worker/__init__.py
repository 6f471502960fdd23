"""The device side of a step: the model runner (step inputs packed and uploaded, the forward pass,
CUDA graphs, the KV pool and its sizing, warm-up), the sampler, and the tensor-parallel ranks
(rank 0's runner, the worker processes, their collectives)."""
