"""Device tensors' copy to the host, started without blocking and waited for on first use.

On CUDA the copies go into pinned memory on the current stream, followed by one event: waiting
blocks only until the work queued before the copies is done, not the work launched after them (the
next step). On the CPU a tensor is its own host copy.
"""
from __future__ import annotations

import torch


class HostCopy:
    def __init__(self, *tensors: torch.Tensor) -> None:
        device = tensors[0].device
        if device.type != "cuda":
            self._host, self._event = tensors, None
            return
        self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
        for host, t in zip(self._host, tensors):
            host.copy_(t, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(device))

    def wait(self) -> tuple[torch.Tensor, ...]:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host


def to_device(values: list | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values on `device` without a sync: a copy from pageable memory would wait for the whole
    stream (the step just launched), so it goes through pinned memory."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
