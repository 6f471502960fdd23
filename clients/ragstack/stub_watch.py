"""Reloads a Python-backend model whose stub process died.

Triton 2.51 neither restarts a dead stub nor marks its model unready: the instance answers every request
with INTERNAL `Stub process '<instance>' is not healthy` until the model is loaded anew, and the stub's
death itself is not logged (a SIGSEGV or SIGKILL leaves no line; the project's models enable
faulthandler, so a segfault at least prints their Python stacks). A watch thread beside the server
(`StubWatch`, which the launcher and triton_watch start) lists the server's stubs from /proc every `interval_s`. An
instance that was running and is gone while its model version stays READY over two looks and its current
config still has it died: the model is reloaded with its current config passed back as an override, which Triton
takes as a change, so new instances start while the live ones drain (no request is refused meanwhile).
Where Triton takes it for none (the same override as the last time), the model is unloaded and loaded:
refused for those moments. A stub leaving by an unload, or by a reload that drops the instance, is not a
death. A model reloaded `max_reloads` times within `window_s` is left as it is after its next death: a
stub that dies each time it serves would otherwise be reloaded forever.
"""
from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request

from ragstack.process_tree import Stub, server_stubs


def instance_names(config: dict) -> set[str]:
    """The instances a model's config (as Triton returns it) asks for, named as Triton names them: the
    group's name and the index. A KIND_GPU group's instances on several GPUs share a name, so a death among
    them is seen once they are all gone."""
    return {f"{spec.get('name') or config['name'] + '_' + str(group)}_{index}"
            for group, spec in enumerate(config.get("instance_group") or [{}])
            for index in range(int(spec.get("count", 1)))}


class StubWatch:
    """Watches one tritonserver's stubs from a daemon thread; `reloads` lists what it did."""

    def __init__(self, server_pid: int, triton_http_url: str, headers: dict[str, str] | None = None,
                 interval_s: float = 2.0, log=None, max_reloads: int = 3, window_s: float = 600.0):
        self.server_pid = server_pid
        self.base = f"http://{triton_http_url}/v2"
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.interval_s = interval_s
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.reloads: list[str] = []  # one line per dead stub and what became of its model
        self.max_reloads, self.window_s = max_reloads, window_s
        self._reloaded_at: dict[str, list[float]] = {}
        self._known: set[Stub] = set()
        self._suspects: set[Stub] = set()  # gone with their version READY at the last look
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StubWatch":
        self._known = self._running()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ragstack-stub-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except (urllib.error.URLError, OSError, ValueError) as error:  # the server stopping, say
                self.log(f"ragstack stub watch: {error}")

    def check(self) -> list[str]:
        """One look: reloads the models whose stubs died since the last; returns their names (those left as
        they are after too many reloads too)."""
        running = self._running()
        gone = (self._known | self._suspects) - running
        self._known = running
        if not gone:
            self._suspects = set()
            return []
        ready = {(m["name"], m.get("version", "")) for m in self._post("/repository/index", {})
                 if m.get("state") == "READY"}
        # An unload ends a stub a moment before Triton marks its version unloaded: a death is a stub gone
        # while its version stays READY over two looks.
        suspects = {stub for stub in gone if (stub.model, stub.version) in ready}
        confirmed, self._suspects = suspects & self._suspects, suspects - self._suspects
        reloaded = []
        for model in sorted({stub.model for stub in confirmed}):
            config = self._get(f"/models/{model}/config")
            dead = sorted(stub.instance for stub in confirmed if stub.model == model
                          and stub.instance in instance_names(config))
            if dead and not self._stop.is_set():
                reloaded.append(model)
                self._reload(model, config, dead)
        return reloaded

    def _running(self) -> set[Stub]:
        return set(server_stubs(self.server_pid).values())

    def _reload(self, model: str, config: dict, dead: list[str]) -> None:
        now = time.monotonic()
        recent = [t for t in self._reloaded_at.get(model, []) if now - t < self.window_s]
        self._reloaded_at[model] = recent + [now]
        if len(recent) >= self.max_reloads:
            self._report(dead, model, f"left as it is: reloaded {len(recent)} times in the last "
                                      f"{self.window_s / 60:g} min, its stubs keep dying; unload and load it by "
                                      "hand once the cause is found")
            return
        try:
            self._post(f"/repository/models/{model}/load", {"parameters": {"config": json.dumps(config)}})
            outcome = "reloaded"
            if not {stub.instance for stub in self._running() if stub.model == model} >= set(dead):
                # Triton took the override for no change (the same override as the last reload's): the
                # model goes away for a moment instead
                self._post(f"/repository/models/{model}/unload", {})
                self._post(f"/repository/models/{model}/load", {})
                outcome = "unloaded and loaded"
        except (urllib.error.URLError, OSError) as error:
            outcome = f"its reload failed: {_reason(error)}; unload and load it by hand"
        self._report(dead, model, outcome)

    def _report(self, dead: list[str], model: str, outcome: str) -> None:
        line = (f"ragstack stub watch: the stub of {', '.join(dead)} died (Triton 2.51 does not restart it); "
                f"model {model!r} {outcome}")
        self.reloads.append(line)
        self.log(line)

    def _get(self, path: str):
        request = urllib.request.Request(self.base + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def _post(self, path: str, body: dict):
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), headers=self.headers)
        # a reload waits for the new instances' initialize: the llm's loads its engine
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read() or b"null")


def _reason(error: Exception) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.read().decode(errors='replace')[:300]}"
    return str(error)
