"""The deployment files (Dockerfile, deploy/compose.yaml, deploy/kubernetes/) checked without
Docker or a cluster: each against its schema (Compose: the compose-spec JSON schema vendored in
check-jsonschema; Kubernetes: kubernetes-validate --strict, the API's OpenAPI schemas), and every
swarmload command line in them parsed by swarmload's own argument parsers, so a renamed flag
fails here and not on a cluster. A broken copy of each file must be rejected (the check bites).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser

from collectors.standalone import _parser as collect_parser
from infra.roles import master_parser, worker_parser

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"
K8S_VERSION = "1.31.0"
BIN = Path(sys.executable).parent


def _parse(argv: list[str]) -> Any:
    """A swarmload command line through the parser its sub-command uses."""
    command, rest = argv[0], argv[1:]
    if command == "master":
        return master_parser().parse_args(rest)
    if command == "worker":
        return worker_parser().parse_args(rest)
    if command == "collect":
        return collect_parser().parse_args(rest)
    if command == "sim":
        from infra.targets.simulator.settings import parse_args

        return parse_args(rest)
    raise AssertionError(f"unknown swarmload command {command!r}")


def _defaults(text: str) -> str:
    """Compose interpolation with every variable unset: ${VAR:-default} -> default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def test_dockerfile_builds_the_package_and_runs_swarmload() -> None:
    parser = DockerfileParser(path=str(REPO_ROOT / "Dockerfile"))
    assert parser.baseimage.startswith("python:3.11")  # pyproject: requires-python >= 3.11
    # `make image` builds FROM its own Debian base where no registry is reachable
    assert "ARG BASE_IMAGE=python:3.11-slim" in parser.content
    assert "FROM ${BASE_IMAGE}" in parser.content
    instructions = parser.structure
    for copy in (i for i in instructions if i["instruction"] == "COPY"):
        *sources, _dest = shlex.split(copy["value"])
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
    copied = {shlex.split(i["value"])[0].rstrip("/") for i in instructions
              if i["instruction"] == "COPY"}
    packages = {"locustfiles", "workloads", "collectors", "dashboards", "infra"}
    assert packages <= copied  # pyproject's packages.find include list
    assert any("pip install" in i["value"] for i in instructions if i["instruction"] == "RUN")
    (entry,) = [i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"]
    assert entry.strip() == '["swarmload"]'
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "results" in ignored


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema",
                           "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    result = _check_compose(DEPLOY / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text((DEPLOY / "compose.yaml").read_text().replace("command:", "comand:", 1))
    assert _check_compose(broken).returncode != 0  # an unknown key is rejected


def test_compose_commands_parse_and_wire_up() -> None:
    compose = yaml.safe_load(_defaults((DEPLOY / "compose.yaml").read_text()))
    services = compose["services"]
    argv = {name: (shlex.split(svc["command"]) if isinstance(svc["command"], str)
                   else list(svc["command"])) for name, svc in services.items()
            if name != "prometheus"}
    parsed = {name: _parse(args) for name, args in argv.items()}
    master, worker = parsed["master"], parsed["worker"]
    assert worker.master_address == f"master:{master.master_port}"
    assert master.workers == int(services["worker"]["deploy"]["replicas"])
    assert master.target == f"http://target:{parsed['target'].port}"
    assert services["target"]["profiles"] == ["sim"]  # the target is optional
    # Prometheus scrapes the master's live figures and the target, as its config file says
    assert str(master.prometheus_port) in services["master"]["expose"]
    assert master.prometheus_bind == "0.0.0.0"  # inside the Compose network
    volume = services["prometheus"]["volumes"][0].split(":")[0]
    scrape = yaml.safe_load((DEPLOY / volume).read_text())["scrape_configs"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in scrape}
    assert targets == {"swarmload": [f"master:{master.prometheus_port}"],
                       "vllm": [f"target:{parsed['target'].port}"]}
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]  # loopback only


def _check_k8s(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", K8S_VERSION,
                           *map(str, paths)], capture_output=True, text=True, timeout=120)


def _k8s_objects() -> dict[str, dict[str, Any]]:
    objects = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def test_kubernetes_manifests_match_the_api_schemas(tmp_path: Path) -> None:
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    result = _check_k8s(*manifests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == 8, result.stdout
    broken = tmp_path / "workers.yaml"
    broken.write_text((DEPLOY / "kubernetes" / "workers.yaml").read_text()
                      .replace("replicas: 4", "replicas: four"))
    assert _check_k8s(broken).returncode != 0


def test_kubernetes_commands_parse_and_wire_up() -> None:
    objects = _k8s_objects()
    assert {"Deployment/swarmload-master", "Service/swarmload-master",
            "Deployment/swarmload-worker", "DaemonSet/swarmload-collector"} <= set(objects)
    master_spec = objects["Deployment/swarmload-master"]["spec"]["template"]["spec"]
    script = master_spec["containers"][0]["args"][0]
    master = _parse(shlex.split(script.split(";")[0])[1:])  # drop "swarmload"
    service = objects["Service/swarmload-master"]["spec"]["ports"][0]
    assert service["port"] == master.master_port
    workers = objects["Deployment/swarmload-worker"]["spec"]
    worker = _parse(workers["template"]["spec"]["containers"][0]["args"])
    assert worker.master_address == f"swarmload-master:{service['port']}"
    assert master.workers == workers["replicas"]
    collector = objects["DaemonSet/swarmload-collector"]["spec"]["template"]["spec"]
    assert collector["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    args = _parse(collector["containers"][0]["args"])
    assert args.serve.endswith(":9109") and args.gpu_interval > 0
    # Prometheus in the cluster scrapes the master's Service port for the live figures
    live = next(p for p in objects["Service/swarmload-master"]["spec"]["ports"]
                if p["name"] == "live-metrics")
    assert live["port"] == master.prometheus_port
    config = yaml.safe_load(objects["ConfigMap/swarmload-prometheus"]["data"]["prometheus.yml"])
    targets = {job["job_name"]: job["static_configs"][0]["targets"][0]
               for job in config["scrape_configs"]}
    assert targets["swarmload"] == f"swarmload-master:{live['port']}"
    assert targets["vllm"] == master.target.removeprefix("http://")


def _grafana_round_trip(dashboard: dict[str, Any]) -> list[str]:
    """Where ``dashboard`` differs from itself decoded into Grafana's own dashboard types and
    encoded back (grafana-foundation-sdk: types generated from Grafana's published dashboard
    schema, panel plugins included): a key Grafana's schema does not have is dropped there."""
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    back = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    lost: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict):
            for key, value in a.items():
                if not isinstance(b, dict) or key not in b:
                    lost.append(f"{path}/{key}")
                else:
                    walk(value, b[key], f"{path}/{key}")
        elif isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                lost.append(path)
            else:
                for i, (x, y) in enumerate(zip(a, b, strict=True)):
                    walk(x, y, f"{path}[{i}]")
        elif a != b:
            lost.append(f"{path}: {a!r} -> {b!r}")

    walk(dashboard, back, "")
    return lost


GRAFANA = DEPLOY / "grafana" / "swarmload-dashboard.json"


def test_grafana_dashboard_matches_grafanas_dashboard_schema() -> None:
    import json

    dashboard = json.loads(GRAFANA.read_text())
    assert _grafana_round_trip(dashboard) == []
    broken = json.loads(GRAFANA.read_text().replace('"gridPos"', '"gridpos"', 1))
    assert _grafana_round_trip(broken) == ["/panels[0]/gridpos"]  # the check bites
    ids, rows = set(), []
    for panel in dashboard["panels"]:
        assert panel["id"] not in ids
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0  # Grafana's grid
        if panel["type"] == "row":
            rows.append(panel["title"])
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and all(t["expr"] for t in panel["targets"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    # the client's own series beside vLLM's, in the names both really serve
    from collectors.live_metrics import METRICS_PREFIX

    assert f"{METRICS_PREFIX}ttft_seconds_bucket" in exprs
    assert "vllm:time_to_first_token_seconds_bucket" in exprs

