"""Requests in flight, counted for max_inflight. One process: a plain count. Workers (--openai-workers N):
each writes its own count into its slot of a file the supervisor made (8 bytes a worker, mmap'd), and a
worker admits a request while all of them together hold fewer than N x max_inflight: the kernel hands a
burst of new connections on the shared socket to whichever worker is awake, and a per-worker limit then
turned clients away while the other workers idled. Reading the other slots unlocked may admit a few past
the limit in the same instant; a bound, not a quota."""
from __future__ import annotations

import mmap
import os
import struct

ENV = "RAGSTACK_OPENAI_INFLIGHT"   # "PATH:INDEX:WORKERS", set by the supervisor for each worker
SLOT = struct.Struct("q")


class Inflight:
    def __init__(self, max_inflight: int):
        self.limit, self.count = max_inflight, 0

    def full(self) -> bool:
        return self.total() >= self.limit

    def total(self) -> int:
        return self.count

    def add(self, delta: int) -> None:
        self.count += delta


class SharedInflight(Inflight):
    def __init__(self, max_inflight: int, path: str, index: int, workers: int):
        super().__init__(max_inflight * workers)
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), SLOT.size * workers)
        self._offset, self._format = SLOT.size * index, f"{workers}q"
        SLOT.pack_into(self._map, self._offset, 0)   # a replaced worker's slot starts again from none

    def total(self) -> int:
        return sum(struct.unpack_from(self._format, self._map))

    def add(self, delta: int) -> None:
        self.count += delta
        SLOT.pack_into(self._map, self._offset, self.count)


def create_file(path: str, workers: int) -> None:
    with open(path, "wb") as file:
        file.write(bytes(SLOT.size * workers))


def clear(path: str, index: int) -> None:
    """A dead worker's slot, zeroed by the supervisor before its replacement starts."""
    with open(path, "r+b") as file:
        file.seek(SLOT.size * index)
        file.write(SLOT.pack(0))


def from_environment(max_inflight: int) -> Inflight:
    """The worker's shared count where the supervisor set one up, else a count of this process's own."""
    value = os.environ.get(ENV)
    if not value:
        return Inflight(max_inflight)
    path, index, workers = value.rsplit(":", 2)
    return SharedInflight(max_inflight, path, int(index), int(workers))
