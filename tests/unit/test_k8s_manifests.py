"""deploy/k8s: every overlay renders (`kubectl kustomize`), and every object it renders is valid against the
Kubernetes API schemas of the pinned version (kubernetes-validate, strict: unknown fields are errors), the custom
resources against the minimal CRD schemas in tests/data/k8s_crd_schemas. Without kubectl only the rendering is
skipped: the objects of the YAML files themselves are validated instead.

And the manifests agree with docker-compose.yml, `ragstack serve` and the code they run: Triton's flags (the
repositories, model control, the admin key's restricted APIs), the gateway's and the OpenAI frontend's command
lines (parsed by their own argument parsers), the Secret's key name, the probes' paths and ports, the drain
timings (preStop, exit timeouts, the llm's shutdown_timeout_s, the grace period), the autoscaler's metrics
(each one a prometheus-adapter rule provides) and the image's backends. The metric names and labels the rules
and the Grafana dashboard query are checked against the real server in tests/server/test_k8s_metrics.py."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

import k8s_manifests as k8s
from ragstack import admin_key, openai_frontend
from ragstack.client import DEFAULT_PORTS
from ragstack.launcher import ServerOptions
from ragstack.openai_frontend import keys as openai_keys
from ragstack.openai_frontend.triton import channel_args

K8S_VERSION = "1.32"   # the pinned Kubernetes API (kubectl here is 1.32; kubernetes-validate 1.37.0 has 1.25 to 1.37)
CRD_SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "k8s_crd_schemas"
CRDS = {("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.json",
        ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.json",
        ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.json"}
COMPOSE = yaml.safe_load((k8s.ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay's (and each standalone kustomization's) objects; without kubectl, each source file's."""
    if k8s.kubectl() is None:
        return k8s.source_objects()
    work = tmp_path_factory.mktemp("k8s")
    return {name: k8s.render(f"overlays/{name}", work) for name in k8s.OVERLAYS} | {
        name: k8s.render(name, work) for name in k8s.STANDALONE}


@pytest.fixture(scope="module")
def overlays(rendered) -> dict[str, list[dict]]:
    if k8s.kubectl() is None:
        pytest.skip("kubectl is not installed here: the overlays cannot be rendered (the source files are validated)")
    return {name: objects for name, objects in rendered.items() if name in k8s.OVERLAYS}


@pytest.fixture(scope="module")
def everything(rendered) -> list[dict]:
    """Every object once: those the overlays share (by kind and name) as the first overlay renders them."""
    seen = {}
    for objects in rendered.values():
        for o in objects:
            seen.setdefault((o["kind"], o["metadata"]["name"]), o)
    return list(seen.values())


# --- schemas ---

def _core_definitions() -> dict:
    """The pinned version's strict definitions, as kubernetes-validate ships them."""
    import importlib_resources

    schemas = importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema"
    folder = schemas / f"v{K8S_VERSION}.0-local-strict"
    return json.loads((folder / "_definitions.json").read_text())


CORE = _core_definitions()


def _inline(schema: dict) -> dict:
    """Merges the properties of each level's `x-inline-properties` definition (README beside the schemas)."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            name = node.pop("x-inline-properties", None)
            if name:
                for key, value in CORE["$defs"][name]["properties"].items():
                    node["properties"].setdefault(key, _absolute_refs(value))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def _absolute_refs(node):
    """The definitions' own `#/$defs/...` references, made absolute to resolve from another schema."""
    if isinstance(node, dict):
        return {k: (CORE["$id"] + v if k == "$ref" and v.startswith("#/") else _absolute_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute_refs(v) for v in node]
    return node


def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = _inline(json.loads((CRD_SCHEMAS / CRDS[(api_version, kind)]).read_text()))
    registry = Registry().with_resource(CORE["$id"], Resource.from_contents(CORE))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict) -> None:
    """Raises what is wrong with `obj`; a kind without a schema fails too."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        crd_validator(*key).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_every_overlay_renders(overlays):
    assert set(overlays) == {"single-gpu", "autoscaling", "kserve"}
    for name, objects in overlays.items():
        assert objects, name
        namespaced = [o for o in objects if o["kind"] != "Namespace"]
        assert {o["metadata"].get("namespace") for o in namespaced} == {"ragstack"}, name


def test_every_object_is_valid_against_the_pinned_kubernetes_api_and_the_crd_schemas(rendered):
    checked = 0
    for source, objects in rendered.items():
        for obj in objects:
            try:
                validate(obj)
            except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.ValidationError,
                    jsonschema.ValidationError) as exc:
                pytest.fail(f"{source}: {obj['kind']}/{obj['metadata']['name']}: "
                            f"{'.'.join(map(str, getattr(exc, 'path', [])))}: {getattr(exc, 'message', exc)}")
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("kind, breakage", [
    ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="grpc")),
    ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0].update(livenesProbe={})),
    ("HorizontalPodAutoscaler", lambda o: o["spec"]["metrics"][0]["pods"].update(targett={})),
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(intervall="15s")),
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(interval="15 seconds")),
    ("ServingRuntime", lambda o: o["spec"]["containers"][0].update(args="tritonserver")),
    ("InferenceService", lambda o: o["spec"]["predictor"].update(minReplica=1)),
    ("InferenceService", lambda o: o["spec"]["predictor"]["model"].update(resources={"limits": []})),
])
def test_the_validation_catches_a_broken_object(everything, kind, breakage):
    obj = copy.deepcopy(k8s.find(everything, kind)[0])
    validate(obj)
    breakage(obj)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(obj)


# --- agreement with docker-compose, the launcher and the programs' own flags ---

def triton_pods(everything) -> list[dict]:
    """The Triton Deployment and the KServe ServingRuntime."""
    found = k8s.find(everything, "Deployment", "ragstack-triton") + k8s.find(everything, "ServingRuntime")
    assert len(found) >= 2
    return found


def triton_container(pod: dict) -> dict:
    named = k8s.containers(pod)
    return named.get("triton") or named["kserve-container"]


def env_of(container: dict) -> dict[str, dict | str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_triton_runs_as_compose_runs_it_with_its_http_behind_the_gateway(everything):
    watched = COMPOSE["services"]["triton"]["command"]
    compose = watched[watched.index("tritonserver"):]
    for pod in triton_pods(everything):
        watched_args = triton_container(pod)["args"]
        args = watched_args[watched_args.index("tritonserver"):]
        root = "/mnt/models" if pod["kind"] == "ServingRuntime" else "/models"
        # Under ragstack.triton_watch, as compose: its stub watch reloads a model whose stub died.
        assert watched_args[:watched_args.index("tritonserver")] == watched[:watched.index("tritonserver")]
        # The same repositories, relative to where each mounts them, and the same model control and shm.
        assert [a.replace(root, "/models") for a in args if a.startswith("--model-repository=")] == \
            [a for a in compose if a.startswith("--model-repository=")]
        for prefix in ("--model-control-mode=", "--load-model=", "--model-config-name=", "--backend-config="):
            assert [a for a in args if a.startswith(prefix)] == [a for a in compose if a.startswith(prefix)], prefix
        # The admin key's flags as admin_key writes them, the key from the Secret through the env var.
        assert [a for a in args if "restricted" in a] == [
            a.replace("=" + k8s.TEST_ADMIN_KEY, f"=$({admin_key.ENV})")
            for a in admin_key.server_args(k8s.TEST_ADMIN_KEY)]
        env = env_of(triton_container(pod))
        assert env[admin_key.ENV] == {"secretKeyRef": {"name": k8s.ADMIN_SECRET, "key": admin_key.ENV}}
        assert env["TRITON_CACHE_DIR"] == COMPOSE["services"]["triton"]["environment"]["TRITON_CACHE_DIR"]
        # Triton's own HTTP on loopback (as the launcher runs it), where the llm asks for its readiness.
        assert k8s.flag(args, "--http-address") == "127.0.0.1"
        assert env["RAGSTACK_TRITON_HTTP"] == f"127.0.0.1:{k8s.flag(args, '--http-port')}"
        ports = {p["name"]: p["containerPort"] for p in triton_container(pod)["ports"]}
        assert int(k8s.flag(args, "--grpc-port")) == ports["grpc"] == DEFAULT_PORTS["grpc"]
        assert int(k8s.flag(args, "--metrics-port")) == ports["metrics"] == ServerOptions().metrics_port


def test_the_gateway_listens_on_the_clients_http_port_and_forwards_to_tritons_loopback(everything, monkeypatch):
    import ragstack.gateway.__main__ as gateway_main

    served = []

    async def serve(*args):
        served.append(args)

    monkeypatch.setattr(gateway_main, "serve", serve)
    monkeypatch.setattr(gateway_main.gateway_limits, "reserve_descriptors", lambda limits: None)
    monkeypatch.delenv(admin_key.ENV, raising=False)
    for pod in triton_pods(everything):
        gateway = k8s.containers(pod)["gateway"]
        args = gateway["args"]
        assert args[:3] == COMPOSE["services"]["gateway"]["command"][:3] == ["python3", "-m", "ragstack.gateway"]
        assert k8s.flag(args, "--listen") == f"0.0.0.0:{DEFAULT_PORTS['http']}"
        assert k8s.flag(args, "--upstream") == f"127.0.0.1:{k8s.flag(triton_container(pod)['args'], '--http-port')}"
        assert env_of(gateway)[admin_key.ENV] == {"secretKeyRef": {"name": k8s.ADMIN_SECRET, "key": admin_key.ENV}}
        with no_exit():                                     # its own parser takes the flags
            assert gateway_main.main(args[3:]) == 0
    assert len(served) == len(triton_pods(everything))


class no_exit:
    """Fails the test, naming the code, where an argument parser exits."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is SystemExit:
            pytest.fail(f"the parser refused the flags (exit {value.code})")
        return False


def test_the_openai_frontend_runs_composes_command_against_every_triton_pod(everything, monkeypatch):
    import uvicorn

    import ragstack.openai_frontend.__main__ as frontend_main

    deployments = k8s.find(everything, "Deployment", "ragstack-openai")
    assert deployments
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    monkeypatch.setattr(frontend_main, "create_app", lambda *args: None)
    monkeypatch.delenv(admin_key.ENV, raising=False)
    headless = k8s.one(everything, "Service", "ragstack-triton-grpc")
    assert headless["spec"]["clusterIP"] == "None"
    for deployment in deployments:
        [frontend] = k8s.containers(deployment).values()
        args = frontend["args"]
        compose = COMPOSE["services"]["openai"]["command"]
        assert args[:3] == compose[:3] == ["python3", "-m", "ragstack.openai_frontend"]
        assert k8s.flag(args, "--listen") == k8s.flag(compose, "--listen") == f"0.0.0.0:{openai_frontend.DEFAULT_PORT}"
        # Every Triton pod through the headless Service, balanced per request (round_robin).
        assert k8s.flag(args, "--triton") == f"dns:///{headless['metadata']['name']}:{DEFAULT_PORTS['grpc']}"
        assert ("grpc.lb_policy_name", "round_robin") in channel_args(k8s.flag(args, "--triton"))
        env = env_of(frontend)
        assert env[admin_key.ENV] == {"secretKeyRef": {"name": k8s.ADMIN_SECRET, "key": admin_key.ENV}}
        assert env[openai_keys.ENV]["secretKeyRef"]["key"] == openai_keys.ENV
        assert env[openai_keys.ENV]["secretKeyRef"]["optional"] is True
        # Workers as compose runs them; one process here, where the stubbed server can run in-process.
        assert k8s.flag(args, "--openai-workers") == k8s.flag(compose, "--openai-workers") == "4"
        workers = args.index("--openai-workers")
        with no_exit():
            assert frontend_main.main(args[3:workers] + args[workers + 2:]) == 1   # parsed; the stubbed server did not start
        assert frontend["ports"] == [
            {"name": "openai", "containerPort": openai_frontend.DEFAULT_PORT, "protocol": "TCP"}]


def test_a_plain_triton_address_keeps_tritonclients_channel_and_dns_balances():
    import tritonclient.grpc.aio as grpcaio

    plain = dict(channel_args("triton:8001"))
    assert "grpc.lb_policy_name" not in plain
    assert plain["grpc.keepalive_time_ms"] == grpcaio.KeepAliveOptions().keepalive_time_ms
    balanced = dict(channel_args("dns:///ragstack-triton-grpc:8001"))
    assert balanced.pop("grpc.lb_policy_name") == "round_robin"
    assert balanced == plain and plain["grpc.max_receive_message_length"] > 2 ** 30   # tritonclient's own options


def test_the_secret_holds_the_admin_key_under_the_name_every_program_reads(rendered, everything):
    shared = (k8s.K8S / "shared" / "kustomization.yaml").read_text()
    [generator] = yaml.safe_load(shared)["secretGenerator"]
    assert generator["name"] == k8s.ADMIN_SECRET and generator["options"]["disableNameSuffixHash"] is True
    example = (k8s.K8S / "shared" / generator["envs"][0]).with_suffix(".env.example").read_text().strip()
    name, _, value = example.partition("=")
    assert name == admin_key.ENV and admin_key.check(value)
    if k8s.kubectl() is not None:
        for objects in (rendered[o] for o in k8s.OVERLAYS):
            secret = k8s.one(objects, "Secret", k8s.ADMIN_SECRET)
            assert set(secret["data"]) == {admin_key.ENV}
    refs = list(secret_refs(everything))
    assert {key for name, key in refs if name == k8s.ADMIN_SECRET} == {admin_key.ENV}


def secret_refs(node):
    """(Secret name, key) of every secretKeyRef in `node`."""
    if isinstance(node, dict):
        if "secretKeyRef" in node:
            yield node["secretKeyRef"]["name"], node["secretKeyRef"]["key"]
        for value in node.values():
            yield from secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from secret_refs(value)


def _compose_check(service: str) -> tuple[str, int]:
    """(path, port) of a compose healthcheck's URL."""
    url = COMPOSE["services"][service]["healthcheck"]["test"][-1]
    match = re.fullmatch(r"http://localhost:(\d+)(/\S*)", url)
    return match.group(2), int(match.group(1))


def _probe(probe: dict) -> tuple[str, int]:
    return probe["httpGet"]["path"], probe["httpGet"]["port"]


def test_the_probes_are_composes_healthchecks(everything):
    """Start-up: Triton's ready through the gateway (compose's triton check; the launcher waits on it too);
    then readiness: the gateway's /readyz (a failed load leaves the other models serving); liveness: the
    gateway's /livez, which restarts a wedged Triton (operations.md); the frontend's /health."""
    ready, live = _compose_check("triton"), _compose_check("gateway")
    assert ready[1] == live[1] == DEFAULT_PORTS["http"]
    for pod in triton_pods(everything):
        triton = triton_container(pod)
        assert _probe(triton["startupProbe"]) == ready
        assert _probe(triton["readinessProbe"]) == ("/readyz", live[1])
        assert _probe(triton["livenessProbe"]) == live
        # The gateway's 3 s deadline fits in the probes' timeouts.
        assert triton["livenessProbe"]["timeoutSeconds"] > 3 and triton["readinessProbe"]["timeoutSeconds"] > 3
        # Loading and warming an LLM: at least compose's 600 s start period.
        startup = triton["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
        assert k8s.containers(pod)["gateway"]["livenessProbe"]["tcpSocket"]["port"] == DEFAULT_PORTS["http"]
    for deployment in k8s.find(everything, "Deployment", "ragstack-openai"):
        [frontend] = k8s.containers(deployment).values()
        assert _probe(frontend["readinessProbe"]) == _probe(frontend["startupProbe"]) == _compose_check("openai")


def _llm_shutdown_timeout_s() -> float:
    config = (k8s.ROOT / "model_repository" / "llm" / "config.pbtxt").read_text()
    return float(re.search(r'key: "shutdown_timeout_s", value: \{ string_value: "([0-9.]+)"', config).group(1))


def _pre_stop_s(container: dict) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    return int(command[1])


def test_a_pod_drains_its_streams_within_its_grace_period(everything):
    """preStop sleeps while the pod leaves the endpoints; then the llm's streams get shutdown_timeout_s, which
    Triton's exit timeout exceeds (so their last responses are sent), the gateway and the frontend relay for as
    long, and the grace period holds all of it."""
    shutdown = _llm_shutdown_timeout_s()
    for pod in triton_pods(everything) + k8s.find(everything, "Deployment", "ragstack-openai"):
        named = k8s.containers(pod)
        if pod["kind"] == "ServingRuntime":
            grace = k8s.one(everything, "InferenceService")["spec"]["predictor"]["terminationGracePeriodSeconds"]
        else:
            grace = pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for name, container in named.items():
            args = container["args"]
            timeout = float(k8s.flag(args, "--exit-timeout-secs" if "tritonserver" in args else "--exit-timeout"))
            assert timeout >= shutdown + 5, (name, timeout, shutdown)
            assert grace >= _pre_stop_s(container) + timeout + 10, (name, grace)
        if "gateway" in named:
            assert k8s.flag(named["gateway"]["args"], "--exit-timeout") == \
                k8s.flag(triton_container(pod)["args"], "--exit-timeout-secs")
    for deployment in k8s.find(everything, "Deployment"):
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_triton_pods_have_a_gpu_shared_memory_and_the_kernel_cache(everything):
    for pod in triton_pods(everything):
        spec = pod["spec"]["template"]["spec"] if pod["kind"] == "Deployment" else pod["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in triton_container(pod)["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        cache = env_of(triton_container(pod))["TRITON_CACHE_DIR"]
        assert volumes[mounts[cache]]["persistentVolumeClaim"]["claimName"] == "ragstack-kernel-cache"
        assert triton_container(pod)["resources"]["limits"]["nvidia.com/gpu"] == 1
        if pod["kind"] == "Deployment":
            repository = volumes[mounts["/models"]]["persistentVolumeClaim"]
            assert repository == {"claimName": "ragstack-model-repository", "readOnly": True}
    isvc = k8s.one(everything, "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://ragstack-model-repository"


def test_the_servingruntime_runs_the_deployments_containers(everything):
    deployment = k8s.containers(k8s.one(everything, "Deployment", "ragstack-triton"))
    runtime = k8s.containers(k8s.one(everything, "ServingRuntime"))
    assert deployment["triton"]["args"] == [
        a.replace("/mnt/models", "/models") for a in runtime["kserve-container"]["args"]]
    assert deployment["gateway"]["args"] == runtime["gateway"]["args"]
    for key in ("env", "resources", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle", "image"):
        assert deployment["triton"][key] == runtime["kserve-container"][key], key
    # KServe selects its pods by the predictor's labels: the Services, PDB, NetworkPolicy and PodMonitor's.
    labels = k8s.one(everything, "InferenceService")["spec"]["predictor"]["labels"]
    pod_labels = k8s.one(everything, "Deployment", "ragstack-triton")["spec"]["template"]["metadata"]["labels"]
    assert labels == pod_labels


def test_services_policies_and_monitors_select_the_pods_and_their_ports(everything):
    pods = {d["metadata"]["name"]: d for d in k8s.find(everything, "Deployment")}
    triton = pods["ragstack-triton"]["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in triton["spec"]["containers"] for p in c.get("ports", [])}
    assert ports == {"grpc": DEFAULT_PORTS["grpc"], "metrics": ServerOptions().metrics_port,
                     "http": DEFAULT_PORTS["http"]}
    for service in k8s.find(everything, "Service"):
        selected = [p for p in pods.values()
                    if service["spec"]["selector"].items() <= p["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, service["metadata"]["name"]
        named = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
    # Inference and metrics ports are the ones the NetworkPolicy opens.
    policy = k8s.one(everything, "NetworkPolicy", "ragstack-triton")
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert opened == set(ports.values())
    for monitor in k8s.find(everything, "PodMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"].items()
        [pod] = [p for p in pods.values() if selector <= p["spec"]["template"]["metadata"]["labels"].items()]
        named = {p["name"] for c in pod["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= named
        assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])


ADAPTER_RULE = {
    "type": "object", "required": ["seriesQuery", "resources", "name", "metricsQuery"], "additionalProperties": False,
    "properties": {
        "seriesQuery": {"type": "string"}, "metricsQuery": {"type": "string"},
        "resources": {"type": "object", "required": ["overrides"], "additionalProperties": False, "properties": {
            "overrides": {"type": "object", "additionalProperties": {
                "type": "object", "required": ["resource"], "properties": {"resource": {"type": "string"}}}}}},
        "name": {"type": "object", "required": ["matches", "as"], "additionalProperties": False,
                 "properties": {"matches": {"type": "string"}, "as": {"type": "string", "pattern": "^[a-z_]+$"}}},
    }}


def test_every_autoscaler_metric_is_a_prometheus_adapter_rule(everything):
    """The adapter's config, structurally (it is no Kubernetes object): each rule names one served series, maps
    the scrape's namespace and pod labels to their resources, and its query uses only the adapter's templates."""
    rules = k8s.adapter_rules(everything)
    for rule in rules:
        jsonschema.validate(rule, ADAPTER_RULE)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        [series] = k8s.promql_metrics(rule["seriesQuery"])
        assert re.fullmatch(rule["name"]["matches"], series)
        assert series in k8s.promql_metrics(rule["metricsQuery"])
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
        templates = set(re.findall(r"<<[^>]*>>", rule["metricsQuery"]))
        assert templates <= {"<<.LabelMatchers>>", "<<.GroupBy>>", "<<.Series>>"}
        assert rule["metricsQuery"].count("(") == rule["metricsQuery"].count(")")
    provided = {rule["name"]["as"] for rule in rules}
    for hpa in k8s.find(everything, "HorizontalPodAutoscaler"):
        wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
        assert wanted == provided
        assert all(m["type"] == "Pods" and m["pods"]["target"]["type"] == "AverageValue"
                   for m in hpa["spec"]["metrics"])
        assert hpa["spec"]["minReplicas"] >= 2     # one can drain while another serves
    # The queue-time rule leaves out the ensembles, whose steps their own models count.
    [queue] = [r for r in rules if "nv_inference_queue_duration_us" in r["seriesQuery"]]
    excluded = set(re.findall(r'model!~"([^"]+)"', queue["metricsQuery"]))
    ensembles = {p.name for p in (k8s.ROOT / "ensembles").iterdir() if (p / "config.pbtxt").is_file()}
    assert excluded == {"|".join(sorted(ensembles, key=["rag", "rag_context", "embed", "rerank"].index))}


def test_the_hpa_scales_the_deployment_each_overlay_runs(overlays):
    for name, objects in overlays.items():
        for hpa in k8s.find(objects, "HorizontalPodAutoscaler"):
            target = hpa["spec"]["scaleTargetRef"]["name"]
            if k8s.find(objects, "InferenceService"):
                assert target == f"{k8s.one(objects, 'InferenceService')['metadata']['name']}-predictor"
                annotations = k8s.one(objects, "InferenceService")["metadata"]["annotations"]
                assert annotations["serving.kserve.io/autoscalerClass"] == "external"    # no second HPA
            else:
                assert k8s.find(objects, "Deployment", target), (name, target)


def test_the_image_holds_the_backends_compose_mounts(everything):
    """Kubernetes mounts only the repositories: the image has the project's backends where compose mounts them."""
    dockerfile = (k8s.ROOT / "deploy" / "Dockerfile").read_text()
    copied = dict(re.findall(r"^COPY (backends/\S+) (/opt/tritonserver/backends/\S+)$", dockerfile, re.M))
    mounted = {v.split(":")[0].removeprefix("./"): v.split(":")[1] for v in COMPOSE["services"]["triton"]["volumes"]
               if ":/opt/tritonserver/backends/" in v}
    assert copied == mounted and copied
    for pod in triton_pods(everything):
        assert not [m for m in triton_container(pod).get("volumeMounts", [])
                    if m["mountPath"].startswith("/opt/tritonserver/backends")]


def test_the_label_reading_sees_what_the_rules_group_by():
    """The PromQL reading that tests/server/test_k8s_metrics.py relies on."""
    expr = ('sum by (<<.GroupBy>>) (rate(nv_inference_queue_duration_us{<<.LabelMatchers>>,model!~"rag|embed"}[1m]))'
            ' / clamp_min(sum by (model, version) (rate(nv_inference_request_success{x="a{b}"}[1m])), 1e-9)')
    assert k8s.promql_metrics(expr) == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    assert k8s.promql_labels(expr) == {"model", "version", "x"}
