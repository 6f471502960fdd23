"""Piecewise CUDA graphs: the forward pass of a step with prefill chunks, all but attention replayed.

A decode-only step replays one CUDA graph of its whole forward pass (model_runner.py). A step with
prefill chunks cannot: attention's grid and metadata follow its chunks. Eagerly its forward pass is
~11 launches per layer from Python, which can cost the host more time than the GPU spends on the
step (docs/benchmarks.md). Here the pass is cut at each attention (the model's `pieces`): piece i,
layer i-1's output projection, norm and MLP with layer i's norm, QKV projection and KV write, is a
CUDA graph per token bucket, and only attention launches from Python between the replays.

Every tensor that crosses from one piece to the next sits in a static buffer sized for the largest
bucket: the step's token ids, positions and cache slots (padded to its bucket: padded tokens write
no KV, their rows are ignored), the residual stream, the rotated q, the attention output and the
final hidden states. A piece's own intermediates come from one memory pool that every graph
shares (the decode graphs' too): no graph reads another's, and they run one at a time.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from llm_engine.model.layers.attention import AttentionMetadata

# Bucket spacing: every 128 tokens up to 2048, then an eighth of the power of two at or below
# (256 up to 4096, 512 up to 8192, ...). Padded rows still go through the projections and the MLP:
# past 1024 tokens under an eighth of a step; 16 buckets up to 2048 and 32 up to 8192, each one
# graph per layer plus one.
SMALLEST_BUCKET = 128


def bucket_sizes(max_tokens: int) -> list[int]:
    """The token buckets that cover steps of up to max_tokens tokens."""
    sizes = [SMALLEST_BUCKET]
    while sizes[-1] < max_tokens:
        magnitude = 1 << (sizes[-1].bit_length() - 1)  # the power of two at or below
        sizes.append(sizes[-1] + max(SMALLEST_BUCKET, magnitude // 8))
    return sizes


class PiecewiseGraphs:
    def __init__(self, model, sizes: list[int], num_heads: int, head_dim: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        """Static buffers for `sizes` (token buckets) of `model` (with `pieces`); nothing captured
        yet: `capture` records the graphs, and until then `run` calls the pieces eagerly over the
        same buffers (how the CPU tests check the decomposition)."""
        self.pieces = model.pieces
        self.sizes = sorted(sizes)
        largest = self.sizes[-1]
        self._inputs = torch.zeros(3, largest, dtype=torch.int32, device=device)  # ids, positions, slots
        self._residual = torch.zeros(largest, hidden_size, dtype=dtype, device=device)
        self._q = torch.zeros(largest, num_heads, head_dim, dtype=dtype, device=device)
        self._attn_out = torch.zeros(largest, num_heads * head_dim, dtype=dtype, device=device)
        self._hidden = torch.zeros(largest, hidden_size, dtype=dtype, device=device)
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    def bucket(self, num_tokens: int) -> int | None:
        """The bucket a step of num_tokens tokens runs in; None: larger than every bucket."""
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, step_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], meta: AttentionMetadata,
            num_tokens: int) -> torch.Tensor:
        """The forward pass of a step whose token ids, positions and slots (`step_inputs`) the runner
        padded to a bucket's size (slot -1) -> its final hidden states [num_tokens, H]."""
        size = step_inputs[0].shape[0]
        for static, given in zip(self._input_views(size), step_inputs):
            static.copy_(given)
        replays = [g.replay for g in self._graphs[size]] if self._graphs else self._bodies(size)
        q, attn_out = self._q[:num_tokens], self._attn_out[:num_tokens]
        replays[0]()
        for i, replay in enumerate(replays[1:]):
            self.pieces.attend(i, q, meta, out=attn_out)
            replay()
        return self._hidden[:num_tokens]

    def capture(self, pool=None) -> None:
        """Record every bucket's pieces (largest bucket first) into `pool` (None: a new one).
        Placeholder inputs: token 0 at position 0, no KV written."""
        for size in reversed(self.sizes):
            ids, positions, slots = self._input_views(size)
            ids.zero_()
            positions.zero_()
            slots.fill_(-1)
            bodies = self._bodies(size)
            for body in bodies:  # outside a graph first: kernels compile, cuBLAS sets up
                body()
            torch.cuda.synchronize(self._q.device)
            graphs = []
            for body in bodies:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    body()
                pool = graph.pool() if pool is None else pool
                graphs.append(graph)
            self._graphs[size] = graphs
        torch.cuda.synchronize(self._q.device)

    def _input_views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._inputs[0, :size], self._inputs[1, :size], self._inputs[2, :size]

    def _bodies(self, size: int) -> list[Callable[[], None]]:
        """Each piece of bucket `size` over the static buffers."""
        ids, positions, slots = self._input_views(size)
        last = self.pieces.num_pieces - 1

        def body(i: int) -> Callable[[], None]:
            out = self._hidden[:size] if i == last else self._q[:size]
            return lambda: self.pieces.piece(i, ids, positions, slots, self._attn_out[:size], self._residual[:size],
                                             out)

        return [body(i) for i in range(last + 1)]
