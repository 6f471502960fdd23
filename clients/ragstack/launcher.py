"""Start the real NVIDIA Triton Inference Server on this project's repositories.

The server is `tritonserver` from `$TRITONSERVER_DIR` (a Triton install: bin/, backends/python/,
python_backend_stubs/X.Y/) or, by default, the Triton 2.51 build that PyPI's nvidia-pytriton ships.
The launcher assembles a backend directory (the Python backend with the stub for the running
Python, plus every `backends/<name>/` of the project), starts the server with the bundled
libraries on its LD_LIBRARY_PATH only, waits until it is ready, and stops it cleanly.

Triton's HTTP endpoint listens on 127.0.0.1 on a free port; the HTTP gateway (ragstack.gateway, its
own process in the launcher's process group) listens on the advertised address and HTTP port and
forwards to it. gRPC and metrics are Triton's own. With an OpenAI port, the OpenAI frontend
(ragstack.openai_frontend) runs beside them the same way and speaks gRPC to Triton.
"""
from __future__ import annotations

import compileall
import contextlib
import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ragstack import admin_key
from ragstack.fatal_signal import LogWatch
from ragstack.gateway.limits import GatewayLimits
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.parent_death import dying_with_parent
from ragstack.stub_watch import StubWatch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPOSITORIES = (ROOT / "model_repository", ROOT / "ensembles")
PROJECT_BACKENDS = ROOT / "backends"
PY_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
# The Python backend's shared-memory regions: /dev/shm/ragstack_<launcher pid>_<HTTP port>_<uuid>.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "ragstack_"


class LauncherError(RuntimeError):
    """A launch that cannot go ahead; the message says what to do."""


@dataclass(frozen=True)
class ServerInstall:
    server_bin: Path
    python_backend: Path        # folder with libtriton_python.so and triton_python_backend_utils.py
    stubs: Path                 # folder with one subfolder per Python version
    lib_dir: Path | None        # shared libraries the server binary needs, if not on the system path


def find_server_install() -> ServerInstall:
    """$TRITONSERVER_DIR if set, else the server inside the installed nvidia-pytriton package."""
    env_dir = os.environ.get("TRITONSERVER_DIR")
    if env_dir:
        base = Path(env_dir)
        libs = os.environ.get("TRITONSERVER_LIBS")
        install = ServerInstall(base / "bin" / "tritonserver", base / "backends" / "python",
                                base / "python_backend_stubs", Path(libs) if libs else None)
        source = f"TRITONSERVER_DIR={env_dir}"
    else:
        try:
            import pytriton  # noqa: PLC0415 - optional: only the embedded server needs it
        except ImportError as exc:
            raise LauncherError(
                "no tritonserver found: set TRITONSERVER_DIR to a Triton install "
                "(bin/tritonserver, backends/python, python_backend_stubs/) or "
                "`pip install nvidia-pytriton==0.7.0`, which bundles Triton 2.51") from exc
        pkg = Path(pytriton.__file__).resolve().parent
        base = pkg / "tritonserver"
        install = ServerInstall(base / "bin" / "tritonserver", base / "backends" / "python",
                                base / "python_backend_stubs",
                                pkg.parent / "nvidia_pytriton.libs")
        source = f"nvidia-pytriton at {pkg}"
    if not install.server_bin.is_file():
        raise LauncherError(f"no tritonserver binary at {install.server_bin} ({source})")
    if not (install.python_backend / "libtriton_python.so").is_file():
        raise LauncherError(f"no Python backend (libtriton_python.so) in {install.python_backend} ({source})")
    return install


def python_stub(install: ServerInstall) -> Path:
    stub = install.stubs / PY_VERSION / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in install.stubs.iterdir()) if install.stubs.is_dir() else []
        raise LauncherError(
            f"no Python backend stub for Python {PY_VERSION} in {install.stubs} "
            f"(stubs present: {', '.join(have) or 'none'}); run with one of those Python versions "
            "or build the stub for this one (python_backend, -DPYBIND11_PYTHON_VERSION)")
    return stub


def interpreter_libpython() -> Path | None:
    """The running interpreter's own shared libpython, when it was built with one (pyenv, conda).

    The stub must embed the same build as the venv's standard library: Debian's 3.11.2 libpython
    with pyenv's 3.11.7 lib-dynload fails on `import ssl` (undefined symbol)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    candidate = Path(libdir) / f"libpython{PY_VERSION}.so.1.0" if libdir else None
    return candidate if candidate is not None and candidate.is_file() else None


def check_libpython() -> None:
    """The stub links against the shared libpython of the Python that runs it."""
    if interpreter_libpython() is not None:
        return
    name = f"libpython{PY_VERSION}.so.1.0"
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        raise LauncherError(
            f"{name} cannot be loaded ({exc}); the Python backend stub needs it: "
            f"`apt-get install libpython{PY_VERSION}` (Debian/Ubuntu)") from exc


def assemble_backend_dir(install: ServerInstall, dest: Path, project_backends: Path = PROJECT_BACKENDS) -> Path:
    """dest/python = the Python backend + this Python's stub; dest/<name> = each project backend."""
    stub = python_stub(install)
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for src in (install.python_backend / "libtriton_python.so",
                install.python_backend / "triton_python_backend_utils.py", stub):
        # Copied, then renamed over: a stub of a server that ran here before may still be running.
        shutil.copy2(src, python_dir / f"{src.name}.new")
        os.replace(python_dir / f"{src.name}.new", python_dir / src.name)
    if project_backends.is_dir():
        for backend in sorted(p for p in project_backends.iterdir() if (p / "model.py").is_file()):
            # A link keeps the project's backend code live: edit, then reload the model.
            link = dest / backend.name
            if link.is_symlink():  # a server started again in its work dir
                link.unlink()
            link.symlink_to(backend.resolve(), target_is_directory=True)
    return dest


def port_is_free(address: str, port: int) -> bool:
    """Whether `port` can be bound on `address` (IPv4). An address that cannot be bound at all raises
    LauncherError, so it is not taken for a port in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise LauncherError(f"cannot bind {address} port {port}: {exc.strerror or exc}") from None
    return True


def free_port(address: str = "127.0.0.1") -> int:
    return free_ports(1, address)[0]


def free_ports(count: int, address: str = "127.0.0.1", besides: tuple[int, ...] = ()) -> list[int]:
    """`count` distinct free ports, none of `besides`: each socket stays bound until all are picked (two
    free_port calls can give the same port, the first's socket closed before the second binds)."""
    with contextlib.ExitStack() as stack:
        socks = []
        while len(socks) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((address, 0))
            if sock.getsockname()[1] not in besides:
                socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]


@dataclass
class ServerOptions:
    model_repositories: list[Path] = field(default_factory=lambda: list(DEFAULT_REPOSITORIES))
    models: list[str] = field(default_factory=lambda: ["*"])   # loaded at start; "*" = every model
    address: str = "127.0.0.1"
    http_port: int = 8000           # the gateway's; Triton's own HTTP port is a free one on 127.0.0.1
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_verbose: int = 0
    exit_timeout_s: int = 30
    startup_timeout_s: float = 300.0
    admin_key: str | None = None    # set: the repository and other admin APIs need it (ragstack.admin_key)
    extra_args: list[str] = field(default_factory=list)
    gateway: GatewayLimits = field(default_factory=GatewayLimits)
    # The OpenAI frontend's port; 0: none. `ragstack serve` runs it on 9000; the servers of the build steps,
    # the benchmarks and most tests need none.
    openai_port: int = 0
    openai: FrontendLimits = field(default_factory=FrontendLimits)
    openai_api_key_file: Path | None = None   # else $RAGSTACK_OPENAI_API_KEY, if set (never a command line)
    # How often ragstack.stub_watch looks for dead Python-backend stubs (and reloads their models); 0: never.
    stub_watch_interval_s: float = 2.0


def remove_shm_regions(prefix: str) -> None:
    for region in SHM_DIR.glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def remove_stale_shm_regions() -> None:
    """The regions of servers whose launcher process is gone (killed before it could stop them)."""
    pids = {region.name[len(SHM_PREFIX):].split("_", 1)[0] for region in SHM_DIR.glob(f"{SHM_PREFIX}*")}
    for pid in pids:
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove_shm_regions(f"{SHM_PREFIX}{pid}_")


def compile_python_models(repository: Path) -> None:
    """Byte-compile a repository's Python models before the server loads them. A stub that finds no
    bytecode writes __pycache__ into the model's directory after the load (its embedded Python ignores
    PYTHONDONTWRITEBYTECODE), which makes the model look changed: the next `load` of the unchanged model
    would reload it instead of doing nothing. A read-only repository is left as it is. Not covered: model
    directories that are symlinks (compileall skips them), and a model.py edited while served (the stub
    writes its bytecode once more at the reload)."""
    compileall.compile_dir(repository, quiet=2)


class TritonServer:
    """One tritonserver process. Use as a context manager, or start() / stop()."""

    def __init__(self, options: ServerOptions | None = None, work_dir: Path | None = None):
        self.options = options or ServerOptions()
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="ragstack-triton-"))
        self.log_path = self.work_dir / "tritonserver.log"
        self.gateway_log_path = self.work_dir / "gateway.log"
        self.openai_log_path = self.work_dir / "openai.log"
        self.process: subprocess.Popen | None = None
        self.gateway_process: subprocess.Popen | None = None
        self.openai_process: subprocess.Popen | None = None
        self.triton_http_port = 0  # chosen at start
        self._crash_watch: LogWatch | None = None  # the log's crash lines since this start
        self.stub_watch: StubWatch | None = None  # running while the server is
        self.crash_lines: list[str] = []

    @property
    def http_url(self) -> str:
        """The gateway's address: what clients use."""
        return f"{self.options.address}:{self.options.http_port}"

    @property
    def triton_http_url(self) -> str:
        """Triton's own HTTP endpoint behind the gateway (tests compare the two)."""
        return f"127.0.0.1:{self.triton_http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.address}:{self.options.grpc_port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI API's base URL (its routes are under /v1)."""
        return f"http://{self.options.address}:{self.options.openai_port}"

    @property
    def shm_prefix(self) -> str:
        """Names of this server's Python-backend shared-memory regions (/dev/shm) start with it."""
        return f"{SHM_PREFIX}{os.getpid()}_{self.options.http_port}_"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.address}:{self.options.metrics_port}/metrics"

    def command(self, install: ServerInstall, backend_dir: Path) -> list[str]:
        opts = self.options
        cmd = [str(install.server_bin)]
        cmd += [f"--model-repository={repo}" for repo in opts.model_repositories]
        cmd += ["--model-control-mode=explicit"]
        cmd += [f"--load-model={m}" for m in opts.models]
        cmd += [
            f"--backend-directory={backend_dir}",
            "--http-address=127.0.0.1", f"--http-port={self.triton_http_port}",
            f"--grpc-address={opts.address}", f"--grpc-port={opts.grpc_port}",
            f"--metrics-address={opts.address}", f"--metrics-port={opts.metrics_port}",
            f"--log-verbose={opts.log_verbose}",
            f"--exit-timeout-secs={opts.exit_timeout_s}",
            "--exit-on-error=true", "--strict-readiness=true",
            # A unique shm prefix: several servers on one machine must not share Python-backend regions.
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216",
        ]
        if opts.admin_key:
            cmd += admin_key.server_args(opts.admin_key)
        return cmd + list(opts.extra_args)

    def gateway_command(self) -> list[str]:
        opts = self.options
        return [sys.executable, "-m", "ragstack.gateway", "--listen", self.http_url, "--upstream", self.triton_http_url,
                "--exit-timeout", str(opts.exit_timeout_s), *opts.gateway.to_args()]

    def openai_command(self) -> list[str]:
        opts = self.options
        # Triton's gRPC from this machine: a wildcard bind address is reached through loopback.
        grpc_host = "127.0.0.1" if opts.address in ("0.0.0.0", "::", "") else opts.address
        command = [sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"{opts.address}:{opts.openai_port}",
                   "--triton", f"{grpc_host}:{opts.grpc_port}", "--exit-timeout", str(opts.exit_timeout_s),
                   *opts.openai.to_args()]
        return command + (["--api-key-file", str(opts.openai_api_key_file)] if opts.openai_api_key_file else [])

    def _environment(self, install: ServerInstall) -> dict[str, str]:
        env = dict(os.environ)
        own_libpython = interpreter_libpython()
        lib_dirs = [str(own_libpython.parent)] if own_libpython else []
        if install.lib_dir:
            lib_dirs.append(str(install.lib_dir))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        # The stub imports its packages through the `python3` on PATH: make that this venv's.
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env.setdefault("HF_HUB_OFFLINE", "1")
        # Where the llm's stub asks for its own readiness: turning false, an unload has begun.
        env["RAGSTACK_TRITON_HTTP"] = self.triton_http_url
        return env

    def _check_inputs(self) -> None:
        opts = self.options
        for repo in opts.model_repositories:
            if not Path(repo).is_dir():
                raise LauncherError(f"model repository {repo} does not exist")
        if opts.admin_key:
            try:
                admin_key.check(opts.admin_key)
            except ValueError as exc:
                raise LauncherError(str(exc)) from None
        if ":" in opts.address:   # Triton 2.51 joins its gRPC address and port as "::" + ":port"
            raise LauncherError(f"--address {opts.address}: an IPv6 address is not supported (Triton's gRPC cannot "
                                "bind one); use an IPv4 address such as 0.0.0.0 or 127.0.0.1")
        ports = [("HTTP", opts.http_port), ("gRPC", opts.grpc_port), ("metrics", opts.metrics_port)]
        ports += [("OpenAI", opts.openai_port)] if opts.openai_port else []
        named: dict[int, str] = {}
        for name, port in ports:
            if port in named:
                raise LauncherError(f"--{named[port].lower()}-port and --{name.lower()}-port are both {port}; give "
                                    "each its own port")
            named[port] = name
        for name, port in ports:
            if not port_is_free(opts.address, port):
                raise LauncherError(f"{name} port {port} is already in use on {opts.address}; "
                                    f"choose another with --{name.lower()}-port")

    def start(self) -> "TritonServer":
        self._check_inputs()
        remove_stale_shm_regions()
        install = find_server_install()
        check_libpython()
        backend_dir = assemble_backend_dir(install, self.work_dir / "backends")
        for repo in self.options.model_repositories:
            compile_python_models(Path(repo))
        opts = self.options
        self.triton_http_port = free_ports(1, besides=(opts.http_port, opts.grpc_port, opts.metrics_port,
                                                        opts.openai_port))[0]
        cmd = self.command(install, backend_dir)
        self.crash_lines = []
        self._crash_watch = LogWatch(self.log_path, self.log_path.stat().st_size if self.log_path.exists() else 0)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                dying_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._environment(install), cwd=ROOT,
                start_new_session=True)  # its own process group: we signal it and its stubs together
        try:
            self.gateway_process = self._start_beside(self.gateway_command(), self.gateway_log_path)
            if self.options.openai_port:
                self.openai_process = self._start_beside(self.openai_command(), self.openai_log_path)
            self.wait_ready()
            if self.options.stub_watch_interval_s > 0:
                self.stub_watch = StubWatch(self.process.pid, self.triton_http_url,
                                            admin_key.headers("http", self.options.admin_key),
                                            self.options.stub_watch_interval_s, log=self._log_line).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_line(self, line: str) -> None:
        """Into the server's log, beside Triton's own lines (and the dead stub's faulthandler dump), and to
        stderr."""
        print(line, file=sys.stderr, flush=True)
        with open(self.log_path, "a") as log:
            log.write(line + "\n")

    def _start_beside(self, command: list[str], log_path: Path) -> subprocess.Popen:
        """The gateway or the OpenAI frontend. The admin key goes in its environment, not on its command
        line: the gateway's /livez probe and the frontend's repository calls send it."""
        env = {k: v for k, v in os.environ.items() if k != admin_key.ENV}
        if self.options.admin_key:
            env[admin_key.ENV] = self.options.admin_key
        with open(log_path, "ab") as log:
            # In our process group, unlike Triton: a Ctrl-C reaches it, and it drains as Triton does.
            return subprocess.Popen(dying_with_parent(command), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)

    def exit_report(self) -> str | None:
        """None while Triton, the gateway and the OpenAI frontend all run; else which one exited, with its
        last log lines."""
        for name, proc, log in (("tritonserver", self.process, self.log_path),
                                ("the HTTP gateway", self.gateway_process, self.gateway_log_path),
                                ("the OpenAI frontend", self.openai_process, self.openai_log_path)):
            if proc is not None and proc.poll() is not None:
                return f"{name} exited with code {proc.returncode}; last log lines ({log}):\n{tail_log(log)}"
        if self.crashed():
            return (f"tritonserver logged {self.crash_lines}: it crashed, and its crash handler can hang there "
                    f"(docs/operations.md); last log lines ({self.log_path}):\n{self.tail_log()}")
        return None

    def crashed(self) -> bool:
        """Whether the server logged a crash (ragstack.fatal_signal) since its last start."""
        if self._crash_watch is not None:
            self.crash_lines += self._crash_watch.new_fatal_lines()
        return bool(self.crash_lines)

    def is_ready(self) -> bool:
        """Triton ready through the gateway, its metrics answering (Triton starts them last, after it says it
        is ready), and the OpenAI frontend (if any) ready to serve."""
        urls = [f"http://{self.http_url}/v2/health/ready", self.metrics_url]
        if self.options.openai_port:
            urls.append(f"{self.openai_url}/health")
        return all(_answers_ok(url) for url in urls)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            report = self.exit_report()
            if report is not None:
                raise LauncherError(f"during start-up, {report}")
            if self.is_ready():
                return
            time.sleep(0.25)
        raise LauncherError(f"tritonserver not ready after {self.options.startup_timeout_s:.0f} s; "
                            f"last log lines ({self.log_path}):\n{self.tail_log()}")

    def tail_log(self, lines: int = 15) -> str:
        return tail_log(self.log_path, lines)

    def stop(self) -> int | None:
        """SIGINT lets in-flight requests finish (up to exit_timeout_s); then the group is killed. The
        gateway and the OpenAI frontend, sent SIGTERM first, stop listening and relay those requests'
        answers until Triton exits."""
        if self.stub_watch is not None:  # first: the stubs an unload ends are no deaths
            self.stub_watch.stop()
            self.stub_watch = None
        beside = [self.gateway_process, self.openai_process]
        self.gateway_process = self.openai_process = None
        for companion in beside:
            if companion is not None and companion.poll() is None:
                companion.send_signal(signal.SIGTERM)
        proc, self.process = self.process, None
        if proc is None:
            for companion in beside:
                _wait_or_kill(companion, self.options.exit_timeout_s + 15)
            return None
        # A crashed server may hang in its crash handler, deaf to SIGINT: it is killed below at once.
        if proc.poll() is None and not self.crashed():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            _wait_or_kill(proc, self.options.exit_timeout_s + 15)
        # Python backend stubs left behind by a crashed server are in the same process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _wait_or_kill(proc, 15)
        for companion in beside:
            _wait_or_kill(companion, 15)
        # A server that exits cleanly removes its regions; a killed or aborted one leaves them in RAM.
        remove_shm_regions(self.shm_prefix)
        if self._own_work_dir:
            backends = self.work_dir / "backends"
            shutil.rmtree(backends, ignore_errors=True)
        return proc.returncode

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def _wait_or_kill(proc: subprocess.Popen | None, timeout_s: float) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail_log(log: Path, lines: int = 15) -> str:
    """A log's error lines (a failed model load says why there), then its last lines."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    errors = [line for line in text if line.startswith("E") or "UNAVAILABLE:" in line]
    tail = [line for line in text[-lines:] if line not in errors]
    return "\n".join(errors[-20:] + tail)
