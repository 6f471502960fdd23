"""docker-compose.yml is valid: `docker compose config` where the plugin runs, else parsed: its ports
(HTTP through the gateway service), repositories, model control and admin flags agree with the clients
and the launcher the tests run, and every referenced path exists. (No Docker engine here: its healthcheck and the dashboard's metrics are
checked against the real server in tests/server/test_deployment_files.py.)"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ragstack import admin_key, openai_frontend
from ragstack.client import DEFAULT_PORTS
from ragstack.launcher import DEFAULT_REPOSITORIES, ServerInstall, ServerOptions, TritonServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def _compose_plugin_runs() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_docker_compose_config_validates():
    if not _compose_plugin_runs():
        pytest.skip("the docker compose plugin is not installed here; the parsed checks below cover the file")
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                            text=True, env={"RAGSTACK_ADMIN_KEY": "test", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


def published(service: dict) -> set[tuple[str, str]]:
    return {tuple(p.split(":")[-2:]) for p in service.get("ports", [])}   # (host port, container port)


def test_clients_reach_the_published_ports_and_only_inference_faces_the_network(compose):
    """RagClient's and the CLI's default ports are published: HTTP by the gateway, gRPC by triton, which
    also publishes the metrics port the launcher serves on (the command sets no port: Triton's defaults,
    which the launcher's are). Triton's own HTTP port is not published: HTTP goes through the gateway,
    which forwards to it. Only the inference ports face the network; the rest stays on loopback."""
    triton, gateway = compose["services"]["triton"], compose["services"]["gateway"]
    assert not [arg for arg in triton["command"] if arg.startswith(("--http-port", "--grpc-port", "--metrics-port"))]
    http, grpc, metrics = str(DEFAULT_PORTS["http"]), str(DEFAULT_PORTS["grpc"]), str(ServerOptions().metrics_port)
    assert published(triton) == {(grpc, grpc), (metrics, metrics)}
    assert published(gateway) == {(http, http)}
    command = gateway["command"]
    assert command[:3] == ["python3", "-m", "ragstack.gateway"]
    assert command[command.index("--listen") + 1] == f"0.0.0.0:{http}"
    assert command[command.index("--upstream") + 1] == f"triton:{http}"    # Triton's default HTTP port
    inference = {("gateway", http), ("triton", grpc), ("openai", str(openai_frontend.DEFAULT_PORT))}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            if (name, port.rsplit(":", 1)[-1]) not in inference:
                assert port.startswith("127.0.0.1:"), (name, port)


def test_the_gateway_is_checked_by_livez_and_runs_the_servers_image(compose):
    """(The healthcheck runs against a live gateway in tests/server/test_deployment_files.py.)"""
    triton, gateway = compose["services"]["triton"], compose["services"]["gateway"]
    assert gateway["healthcheck"]["test"] == ["CMD", "curl", "-fsS", "http://localhost:8000/livez"]
    assert gateway["image"] == triton["image"] and gateway["build"] == triton["build"]
    assert gateway["environment"]["RAGSTACK_ADMIN_KEY"] == "${RAGSTACK_ADMIN_KEY:?set RAGSTACK_ADMIN_KEY}"
    assert gateway["restart"] and "triton" in gateway["depends_on"]
    # docs/operations.md: the server can abort (upstream server#8882): a restart policy; the Python
    # backend's regions need more /dev/shm than Docker's default
    assert triton["restart"] and triton["shm_size"]


def test_compose_serves_the_launchers_repositories_the_way_it_does(compose, tmp_path):
    """The server the tests run (the launcher's) and the compose one serve the same repositories, with the
    same model control and the same restricted admin APIs as `ragstack serve` with the key set."""
    triton = compose["services"]["triton"]
    command = triton["command"]
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in triton["volumes"]}
    served = {(ROOT / mounted[arg.split("=", 1)[1]]).resolve() for arg in command if arg.startswith("--model-repository=")}
    assert served == {Path(repository).resolve() for repository in DEFAULT_REPOSITORIES}
    install = ServerInstall(Path("tritonserver"), Path("python"), Path("stubs"), None)
    launched = TritonServer(ServerOptions(), work_dir=tmp_path).command(install, tmp_path / "backends")
    model_control = ("--model-control-mode=", "--load-model=")
    assert [a for a in command if a.startswith(model_control)] == [a for a in launched if a.startswith(model_control)]
    # The key comes from the environment.
    expected = [arg.replace("=" + "k" * 16, "=${RAGSTACK_ADMIN_KEY:?set RAGSTACK_ADMIN_KEY}")
                for arg in admin_key.server_args("k" * 16)]
    assert [c for c in command if "restricted" in c] == expected
    assert all(v.endswith(":ro") for v in triton["volumes"] if v.startswith("./"))


def test_triton_runs_under_the_crash_watch(compose):
    """A crashed Triton 2.51 can hang, alive and deaf, and compose restarts only what exits: the watch kills it
    (ragstack.triton_watch, tested in test_triton_watch.py) and `restart` brings a fresh one."""
    triton = compose["services"]["triton"]
    command = triton["command"]
    assert command[:command.index("tritonserver")] == ["python3", "-m", "ragstack.triton_watch", "--"]
    assert triton["restart"] == "unless-stopped" and triton["init"] is True  # tini passes SIGTERM on to the watch
    # its stub watch reloads a model whose stub died, through the repository API that the key guards
    assert triton["environment"]["RAGSTACK_ADMIN_KEY"] == "${RAGSTACK_ADMIN_KEY:?set RAGSTACK_ADMIN_KEY}"
    assert "--http-port" not in " ".join(command)  # the watch reaches Triton's HTTP on its default, 8000


def test_every_referenced_path_exists(compose):
    triton = compose["services"]["triton"]
    assert (ROOT / triton["build"]["context"] / triton["build"]["dockerfile"]).is_file()
    named = set(compose.get("volumes", {}))
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{source} is mounted but missing"
            else:
                assert source in named, f"named volume {source} is not declared"
    # Project backends mounted into the image's backend directory must exist as backends.
    for volume in triton["volumes"]:
        source, target = volume.split(":")[:2]
        if target.startswith("/opt/tritonserver/backends/"):
            assert (ROOT / source / "model.py").is_file()
            assert not target.endswith("/onnxruntime"), "the image's native onnxruntime backend must serve ONNX"
    mounted = {v.split(":")[1].rsplit("/", 1)[-1] for v in triton["volumes"]
               if v.split(":")[1].startswith("/opt/tritonserver/backends/")}
    project = {p.name for p in (ROOT / "backends").iterdir() if (p / "model.py").is_file()}
    assert mounted == project - {"onnxruntime"}, "every project backend but onnxruntime is mounted"


def test_prometheus_scrapes_triton_and_the_openai_frontend_on_their_metrics_ports(compose):
    """(The metrics the Grafana dashboard queries are checked against the real server and frontend in
    tests/server/test_deployment_files.py.)"""
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = [target for job in prom["scrape_configs"] for config in job["static_configs"] for target in config["targets"]]
    runs_triton = [name for name, service in compose["services"].items() if "tritonserver" in service.get("command", [])]
    assert targets == [f"{name}:{ServerOptions().metrics_port}" for name in runs_triton] + [
        f"openai:{openai_frontend.DEFAULT_PORT}"]


def test_the_openai_frontend_runs_the_servers_image_and_reaches_triton_over_grpc(compose, tmp_path):
    """The launcher's command for the frontend, with compose's addresses; the keys from the environment."""
    triton, frontend = compose["services"]["triton"], compose["services"]["openai"]
    assert frontend["image"] == triton["image"] and frontend["build"] == triton["build"]
    command = frontend["command"]
    assert command[:3] == ["python3", "-m", "ragstack.openai_frontend"]
    assert command[command.index("--listen") + 1] == f"0.0.0.0:{openai_frontend.DEFAULT_PORT}"
    assert command[command.index("--triton") + 1] == f"triton:{DEFAULT_PORTS['grpc']}"
    launched = TritonServer(ServerOptions(openai_port=openai_frontend.DEFAULT_PORT), work_dir=tmp_path).openai_command()
    assert launched[1:3] == ["-m", "ragstack.openai_frontend"] and "--triton" in launched and "--listen" in launched
    assert frontend["environment"]["RAGSTACK_ADMIN_KEY"] == "${RAGSTACK_ADMIN_KEY:?set RAGSTACK_ADMIN_KEY}"
    assert frontend["environment"]["RAGSTACK_OPENAI_API_KEY"] == "${RAGSTACK_OPENAI_API_KEY:-}"
    assert frontend["healthcheck"]["test"] == ["CMD", "curl", "-fsS", f"http://localhost:{openai_frontend.DEFAULT_PORT}/health"]
    assert frontend["restart"] and "triton" in frontend["depends_on"]
