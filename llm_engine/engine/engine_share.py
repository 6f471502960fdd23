"""Where the clients of one shared engine process meet it: a lock file, a Unix socket and a log file in
a run directory private to this user, named by a key.

A server with several instances of one model (Triton's instance_group count, each instance a stub
that sends its own requests' responses) runs one engine process per device for them
(process_client.py, engine_process.py). The key names the engine: the serving process, the model,
its version and device, and everything that configures it, so a model whose settings changed never
meets an engine built from the old ones; `max_clients` (the instances of one load on that device)
bounds how many clients one engine takes over its life, so a later load of the model (a reload: its
new instances start while the old ones drain) starts an engine of its own, as with one instance.

Each client, under the lock: connects to the socket and asks to join; if nothing listens there or
the engine refuses (it took its clients, or it is closing), it starts a new engine, which listens
there once it has warmed up, and only then releases the lock. The engine's stderr goes to the log
file (the starting client relays its lines to its own stderr while it lives; every client quotes
the file's last lines when the engine fails); a clean close removes it. An engine that closes
stops listening (a client that comes then is refused, and starts another), and never waits for the
lock. A socket path stays until the next engine's starter replaces it, and the lock files stay
(removing one a client may be waiting on would let two start an engine), until the process that owned
their engines (the server) is gone: a starting client removes those.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

RUN_DIR_ENV = "LLM_ENGINE_RUN_DIR"  # default: <tmp>/llm-engine-<uid>
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path, less its terminating zero)


def run_directory() -> Path:
    """$LLM_ENGINE_RUN_DIR, else <tmp>/llm-engine-<uid>: created 0700, and refused if another user
    owns it or others may write it (its socket takes requests, its log holds their outputs)."""
    directory = Path(os.environ.get(RUN_DIR_ENV) or Path(tempfile.gettempdir()) / f"llm-engine-{os.getuid()}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{directory}: not a private directory of this user (owner uid {info.st_uid}, "
                              f"mode {oct(info.st_mode & 0o777)}); set ${RUN_DIR_ENV} to one")
    return directory


def remove_stale(directory: Path) -> None:
    """The files of engines whose owner process is gone: a key starts with the pid of the process that
    owns its engines (a server: its models' instances), and nothing else uses them once it has exited."""
    for path in directory.glob("*-*.*"):
        owner = path.name.split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class EngineShare:
    key: str                 # "<owner pid>-<16 hex digits>": names the engine's files
    max_clients: int         # clients one engine takes over its life, its starter included
    label: tuple[str, ...] = ()  # arguments that name the engine process in `ps` (process_tree.py reads them)
    directory: Path = field(default_factory=run_directory)

    @classmethod
    def named(cls, identity: dict, max_clients: int, label: tuple[str, ...] = (), directory: Path | None = None,
              owner: int | None = None) -> EngineShare:
        """The share of the engine that `identity` (JSON-able: the model, its settings) names for `owner`, the
        process whose clients share it (default: this process's parent, the server of a model's stubs)."""
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        key = f"{os.getppid() if owner is None else owner}-{digest}"
        share = cls(key, max(1, max_clients), tuple(label), directory or run_directory())
        if len(os.fsencode(share.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(f"{share.socket_path}: longer than a Unix socket's path may be ({MAX_SOCKET_PATH} bytes); "
                             f"set ${RUN_DIR_ENV} to a shorter directory")
        return share

    @property
    def socket_path(self) -> Path:
        return self.directory / f"{self.key}.sock"

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.key}.lock"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.key}.log"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The lock the clients hold while they join or start the engine."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
