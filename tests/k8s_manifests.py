"""The Kubernetes manifests of deploy/k8s as objects: each overlay rendered by `kubectl kustomize` (with a test
admin key written where the Secret's generator reads it), and the parts of them the tests compare with
docker-compose and the launcher; also the PromQL inside them and the Grafana dashboard, which the server
test checks against the real metrics endpoint."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
# Kustomizations rendered on their own (not through an overlay): the adapter's rules live in its namespace.
STANDALONE = ["prometheus-adapter"]
TEST_ADMIN_KEY = "k8s-test-key-0123456789abcdef"
ADMIN_SECRET = "ragstack-admin-key"


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(path: str, work: Path) -> list[dict]:
    """`kubectl kustomize` of deploy/k8s/<path>, from a copy of deploy/k8s holding a test admin-key.env."""
    tree = work / "k8s"
    if not tree.exists():
        shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("admin-key.env"))
        (tree / "shared" / "admin-key.env").write_text(f"RAGSTACK_ADMIN_KEY={TEST_ADMIN_KEY}\n")
    result = subprocess.run([kubectl(), "kustomize", str(tree / path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def source_objects() -> dict[str, list[dict]]:
    """Every object in deploy/k8s's YAML files (kustomization files left out), by file."""
    out = {}
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            out[str(path.relative_to(K8S))] = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    [found] = find(objects, kind, name)
    return found


def containers(obj: dict) -> dict[str, dict]:
    """A Deployment's or a ServingRuntime's containers by name."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    return {c["name"]: c for c in spec["containers"]}


def flag(args: list[str], name: str) -> str:
    """The value of `--name=value` or `--name value` in a command line."""
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return args[i + 1]
    raise KeyError(name)


# --- PromQL: metric names and the labels an expression selects or groups by ---

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_TEMPLATE = re.compile(r"<<\.(?:Series|LabelMatchers|GroupBy)>>")
_METRIC = re.compile(r"\b(?:nv_|triton_llm_|vllm:|ragstack_openai_)[a-zA-Z0-9_:]+")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_SELECTOR = re.compile(r"\{([^{}]*)\}")
# Labels Prometheus adds at the scrape (Prometheus Operator: namespace, pod, container, endpoint, job,
# instance) or a histogram's buckets carry; the server does not serve them.
SCRAPE_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance"}


def promql_metrics(expr: str) -> set[str]:
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def promql_labels(expr: str) -> set[str]:
    """Labels named in selectors and in by/without clauses (templates of prometheus-adapter removed)."""
    expr = _STRING.sub('""', _TEMPLATE.sub("", expr))
    labels = set()
    for group in _GROUPING.findall(expr):
        labels.update(name.strip() for name in group.split(",") if name.strip())
    for selector in _SELECTOR.findall(expr):
        labels.update(_MATCHER.findall(selector))
    return labels


def adapter_rules(objects: list[dict]) -> list[dict]:
    configmap = one(objects, "ConfigMap", "prometheus-adapter-ragstack")
    return yaml.safe_load(configmap["data"]["config.yaml"])["rules"]


def adapter_expressions(rules: list[dict]) -> list[str]:
    return [e for rule in rules for e in (rule["seriesQuery"], rule["metricsQuery"])]


def dashboard_expressions() -> list[str]:
    import json

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "triton.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
