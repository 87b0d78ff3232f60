"""Every deployment file is checked: the systemd unit by systemd-analyze, the Kubernetes
manifests against the Kubernetes schemas (offline, kubernetes-validate), docker-compose.yml
against the Compose specification's JSON schema, and the Dockerfile by a parser-based lint.

The image itself is built and run (with buildah) in test_container_image.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from shardcache import __version__
from shardcache.config import OPTIONS, Settings, load_settings
from shardcache.units import parse_size

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is required (Debian's systemd package)"
    unit = (DEPLOY / "systemd" / "shardcache.service").read_text()
    # verify checks that ExecStart exists: point it at this machine's shardcache.
    shardcache = shutil.which("shardcache")
    assert shardcache
    assert "ExecStart=/opt/shardcache/bin/shardcache serve" in unit
    local = tmp_path / "shardcache.service"
    local.write_text(unit.replace("/opt/shardcache/bin/shardcache", shardcache))
    result = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True)
    problems = [line for line in result.stderr.splitlines() if "shardcache.service" in line]
    assert result.returncode == 0 and problems == [], result.stderr
    for directive in (
        "Type=notify",
        "Restart=on-failure",
        "CacheDirectory=shardcache",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "ReadWritePaths=",
        "LimitNOFILE=",
        "EnvironmentFile=",
        "ExecReload=",
    ):
        assert directive in unit, directive


def test_example_config_is_valid(tmp_path: Path) -> None:
    from shardcache.config import load_settings
    from shardcache.daemon.wiring import build_origins
    from shardcache.origins.receivers import ReceiverPool

    # The systemd example starts as installed: no variable to set, no directory to create.
    settings = load_settings({"config": str(DEPLOY / "systemd" / "shardcache.toml")}, {})
    assert {o.name for o in settings.origins} == {"laion", "scratch"}
    assert set(build_origins(settings, ReceiverPool(1))) == {"laion", "scratch"}
    # Its commented examples are valid once uncommented.
    example = tmp_path / "uncommented.toml"
    text = (DEPLOY / "systemd" / "shardcache.toml").read_text()
    example.write_text(text.replace("# [origins.", "[origins.").replace("\n# url", "\nurl"))
    example.write_text(example.read_text().replace("\n# headers", "\nheaders"))
    uncommented = load_settings({"config": str(example)}, {"CDN_TOKEN": "t"})
    assert {o.name for o in uncommented.origins} == {"laion", "scratch", "cdn", "lustre"}
    # The compose demo listens on the container's 0.0.0.0: its token comes from the secret.
    compose_file = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose_file["services"]["shardcache"]
    token_path = service["environment"]["SHARDCACHE_ADMIN_TOKEN_FILE"]
    assert token_path == "/run/secrets/" + service["secrets"][0]
    secret_file = ROOT / compose_file["secrets"][service["secrets"][0]]["file"]
    compose = load_settings(
        {"config": str(DEPLOY / "compose" / "shardcache.toml")},
        {"SHARDCACHE_ADMIN_TOKEN_FILE": str(secret_file)},
    )
    assert compose.origins[0].endpoint_url == "http://minio:9000"
    # The node reads through the two tier members, which serve the same origin name.
    assert compose.origins[0].tier == ("http://tier-0:8470", "http://tier-1:8470")
    tier = load_settings(
        {"config": str(DEPLOY / "compose" / "tier.toml")},
        {"SHARDCACHE_ADMIN_TOKEN_FILE": str(secret_file)},
    )
    assert [o.name for o in tier.origins] == [o.name for o in compose.origins]
    assert tier.origins[0].url == compose.origins[0].url
    for member in ("tier-0", "tier-1"):
        mounts = compose_file["services"][member]["volumes"]
        assert mounts[0].startswith("./deploy/compose/tier.toml:"), member
    assert not compose.is_loopback and compose.admin_token is not None
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])


K8S = ["namespace.yaml", "configmap.yaml", "daemonset.yaml", "sidecar-example.yaml", "tier.yaml"]


@pytest.mark.parametrize("name", K8S)
def test_kubernetes_manifests_validate(name: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "-k",
            "1.30.0",
            str(DEPLOY / "kubernetes" / name),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout + result.stderr


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions In) selects `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_kubernetes_config_and_podmonitor_fit_the_daemonset() -> None:
    """The PodMonitor is a CRD the Kubernetes schemas do not cover: check it against the
    Prometheus Operator's required fields and against the DaemonSet it must select."""
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    monitor = yaml.safe_load((DEPLOY / "kubernetes" / "podmonitor.yaml").read_text())
    config = yaml.safe_load((DEPLOY / "kubernetes" / "configmap.yaml").read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    pod = daemonset["spec"]["template"]
    tier = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "tier.yaml").read_text())
        if d["kind"] == "StatefulSet"
    )["spec"]["template"]
    for scraped in (pod, tier):  # the Operator ignores prometheus.io annotations
        assert _selects(monitor["spec"]["selector"], scraped["metadata"]["labels"])
        ports = {p["name"] for c in scraped["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
            assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    from shardcache.config import load_settings

    # The DaemonSet listens on the node's address: it must read its token from the Secret.
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    token_path = Path(env["SHARDCACHE_ADMIN_TOKEN_FILE"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    secret_volume = next(n for n, v in volumes.items() if "secret" in v)
    assert token_path.parent == Path(mounts[secret_volume])
    assert volumes[secret_volume]["secret"].get("optional") is not True
    assert pod["spec"]["securityContext"]["fsGroup"] == container["securityContext"]["runAsGroup"]
    config_file = Path(__file__).parent / "_k8s.toml"
    token_file = Path(__file__).parent / "_k8s.token"
    try:
        config_file.write_text(config["data"]["shardcache.toml"])
        token_file.write_text("a-token-from-a-kubernetes-secret\n")
        settings = load_settings(
            {"config": str(config_file)}, {"SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
        )
    finally:
        config_file.unlink()
        token_file.unlink()
    assert grace > settings.shutdown_grace
    assert not settings.is_loopback and settings.admin_token is not None


def test_the_sidecar_example_is_a_job_that_completes_with_a_native_sidecar() -> None:
    """A bare Pod (restartPolicy Always by default) reran its trainer for ever. The example is
    a Job whose trainer runs once and whose shardcache is a native sidecar (an init container
    with restartPolicy Always, Kubernetes >= 1.29): stopped by the kubelet when the trainer
    exits, so the pod completes."""
    job = yaml.safe_load((DEPLOY / "kubernetes" / "sidecar-example.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert job["spec"]["backoffLimit"] <= 6  # retried a few times, not for ever
    (trainer,) = pod["containers"]  # the one container whose exit ends the pod
    assert trainer["name"] == "trainer" and "restartPolicy" not in trainer
    # Its command is a run that ends: no loop, no sleep, no server of its own.
    command = " ".join([*trainer.get("command", []), *trainer.get("args", [])])
    assert not re.search(r"\bwhile\b|\bsleep\b|tail -f|serve\b", command), command
    loader, sidecar = pod["initContainers"]
    assert "restartPolicy" not in loader  # the copy runs once, before the sidecar starts
    assert sidecar["name"] == "shardcache" and sidecar["restartPolicy"] == "Always"
    # The trainer starts once the sidecar serves: the kubelet waits for its startupProbe.
    probe = " ".join(sidecar["startupProbe"]["exec"]["command"])
    assert "127.0.0.1:8470/readyz" in probe and "--listen" in sidecar["args"]
    assert (
        sidecar["startupProbe"]["periodSeconds"] * sidecar["startupProbe"]["failureThreshold"] >= 60
    )
    # Both read the same port; the loader copy reaches the trainer's path.
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["SHARDCACHE_URL"] == "http://127.0.0.1:8470"
    assert sidecar["args"][sidecar["args"].index("--listen") + 1] == "127.0.0.1:8470"
    assert env["PYTHONPATH"] in {m["mountPath"] for m in trainer["volumeMounts"]}
    deploying = DOCS_DEPLOYING.read_text()
    assert "restartPolicy: Always" in deploying and "1.29" in deploying


def test_the_daemonset_selects_nodes_every_cluster_has() -> None:
    """Its nodeSelector was `node-role.example.com/training: "true"`, a label no node has and
    no page mentioned: as shipped it scheduled nowhere. It may select only labels the kubelet
    sets on every node; narrowing it is a documented choice."""
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    well_known = {"kubernetes.io/os": {"linux"}, "kubernetes.io/arch": {"amd64", "arm64"}}
    for label, value in (pod.get("nodeSelector") or {}).items():
        assert value in well_known.get(label, set()), f"nodeSelector {label}: {value}"
    assert "affinity" not in pod
    text = (DEPLOY / "kubernetes" / "daemonset.yaml").read_text()
    assert "example.com" not in text.replace("prometheus.io", "")
    assert "nodeSelector" in _section(DOCS_DEPLOYING, "Kubernetes")


def _settings_from(text: str, tmp_path: Path) -> Settings:
    config_file, token_file = tmp_path / "c.toml", tmp_path / "token"
    config_file.write_text(text)
    token_file.write_text("a-token-from-a-kubernetes-secret\n")
    return load_settings(
        {"config": str(config_file)}, {"SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
    )


def test_the_nodes_tier_list_names_the_statefulsets_members(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "tier.yaml").read_text()))
    by_kind = {d["kind"]: d for d in documents}
    service, statefulset = by_kind["Service"], by_kind["StatefulSet"]
    assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per member
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    name, namespace = statefulset["metadata"]["name"], statefulset["metadata"]["namespace"]
    domain = f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    members = tuple(
        f"http://{name}-{i}.{domain}:8470" for i in range(statefulset["spec"]["replicas"])
    )
    node_config = yaml.safe_load((DEPLOY / "kubernetes" / "configmap.yaml").read_text())
    node = _settings_from(node_config["data"]["shardcache.toml"], tmp_path)
    laion = next(o for o in node.origins if o.name == "laion")
    assert laion.tier == members
    tier = _settings_from(by_kind["ConfigMap"]["data"]["shardcache.toml"], tmp_path)
    assert not tier.is_loopback and tier.admin_token is not None
    assert {o.name for o in tier.origins} >= {"laion"}
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > tier.shutdown_grace
    claim = statefulset["spec"]["volumeClaimTemplates"][0]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/cache/shardcache"
    size = parse_size(claim["spec"]["resources"]["requests"]["storage"] + "B")  # 3500Gi
    assert tier.cache_size < size  # room for the index and partial files


def _compose_schema(tmp_path: Path) -> dict[str, object]:
    """The Compose specification's JSON schema, as shipped in the docker-compose package."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "docker-compose==1.29.2",
            "-d",
            str(tmp_path),
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("docker_compose-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("compose/config/compose_spec.json"))


def test_compose_file_follows_the_spec_and_mounts_only_files_in_the_repo(tmp_path: Path) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    schema = _compose_schema(tmp_path)
    schema.pop("$schema", None)
    jsonschema.validate(compose, schema)
    for name, service in compose["services"].items():
        image = service.get("image", "")
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).exists()
    assert {"minio", "minio-init", "shardcache", "tier-0", "tier-1", "prometheus", "grafana"} <= (
        compose["services"].keys()
    )


def test_compose_prometheus_config_and_grafana_provisioning(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian's prometheus package)"
    config = (DEPLOY / "compose" / "prometheus.yml").read_text()
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    local = tmp_path / "prometheus.yml"
    local.write_text(config.replace("/etc/prometheus/alerts.yml", str(tmp_path / "alerts.yml")))
    result = subprocess.run(
        [promtool, "check", "config", str(local)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    datasources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert datasources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "shardcache.yml").read_text()
    )
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dockerfile_lint() -> None:
    """hadolint is not installable here; these are its rules that matter for this image."""
    parser = DockerfileParser(path=str(DEPLOY / "docker" / "Dockerfile"))
    instructions = parser.structure
    froms = [i["value"] for i in instructions if i["instruction"] == "FROM"]
    assert froms and all(re.search(r":\d[\w.-]*", f) for f in froms), "pin base image tags"
    final = instructions[max(i for i, x in enumerate(instructions) if x["instruction"] == "FROM") :]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users and not users[-1].startswith(("0", "root")), "run as a non-root user"
    kinds = {i["instruction"] for i in final}
    assert {"HEALTHCHECK", "EXPOSE", "VOLUME", "ENTRYPOINT"} <= kinds
    assert "/healthz" in next(i["value"] for i in final if i["instruction"] == "HEALTHCHECK")
    for instruction in instructions:
        assert instruction["instruction"] != "ADD", "use COPY, not ADD"
        if instruction["instruction"] == "RUN" and "pip install" in instruction["value"]:
            assert "--no-cache-dir" in instruction["value"]
        if instruction["instruction"] == "COPY" and "--from" not in instruction["value"]:
            for source in instruction["value"].split()[:-1]:
                assert (ROOT / source).exists(), f"COPY of missing {source}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "tests" in ignored and ".git" in ignored


DOCS_DEPLOYING = ROOT / "docs" / "deploying.md"
IMAGE_PLACEHOLDER = "REGISTRY/shardcache:VERSION"


def _section(page: Path, heading: str) -> str:
    """The text of `## heading` in `page`, up to the next `## `."""
    text = page.read_text()
    assert f"\n## {heading}\n" in text, f"{page.name} has no section {heading!r}"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.DOTALL)


def test_the_install_instructions_name_what_exists() -> None:
    """shardcache is not on the package index: nothing may tell a user to `pip install
    shardcache`; the unit's install line is the one docs/deploying.md gives, and installs the
    clone (`.` with the daemon's extra) with the tested pins into the venv whose shardcache
    ExecStart runs."""
    from_index = re.compile(r"pip3? install\s+(?:-[-\w]+\s+)*shardcache(?![\w./-])")
    shipped = [ROOT / "README.md", ROOT / "docker-compose.yml", *ROOT.glob("docs/*.md")]
    shipped += [p for p in DEPLOY.rglob("*") if p.is_file()]
    offenders = [str(p.relative_to(ROOT)) for p in shipped if from_index.search(p.read_text())]
    assert offenders == [], f"`pip install shardcache` (not on the index) in {offenders}"

    unit = (DEPLOY / "systemd" / "shardcache.service").read_text()
    installs = [
        line.lstrip("# ").strip() for line in unit.splitlines() if "bin/pip install" in line
    ]
    install = (
        "/usr/bin/python3 -m venv /opt/shardcache && "
        "/opt/shardcache/bin/pip install -c constraints.txt '.[daemon]'"
    )
    assert installs == [install], installs
    systemd = _sh_blocks(_section(DOCS_DEPLOYING, "systemd"))
    assert install in systemd[0].splitlines()
    assert "ExecStart=/opt/shardcache/bin/shardcache serve" in unit  # the venv's entry point
    assert (ROOT / "constraints.txt").is_file() and (ROOT / "pyproject.toml").is_file()
    wheel = next(b for b in systemd if "pip wheel" in b)  # the wheel route installs what it built
    built = f"dist/shardcache-{__version__}-py3-none-any.whl"  # what `pip wheel -w dist .` writes
    assert "pip wheel --no-deps -w dist ." in wheel
    assert wheel.split("pip install", 1)[1].split() == [
        "-c",
        "constraints.txt",
        f"'{built}[daemon]'",
    ]


def _shardcache_containers(documents: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    found = []
    for document in documents:
        spec = document.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec)
        containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
        found += [c for c in containers if c["name"] == "shardcache"]
    return found


def _kubernetes_documents(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    return [
        d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d
    ]


def test_the_kubernetes_image_is_the_one_the_docs_build_and_push(tmp_path: Path) -> None:
    """Every manifest runs `REGISTRY/shardcache:VERSION` until the user sets theirs, and the
    docs' own commands build it from deploy/docker/Dockerfile, push it, and write it into
    every manifest that names it. Docker cannot run here: `docker` is a shell function that
    records what it was asked (the image build itself is tested elsewhere)."""
    containers = _shardcache_containers(_kubernetes_documents(DEPLOY / "kubernetes"))
    assert len(containers) == 3  # the DaemonSet, the tier's StatefulSet, the sidecar example
    assert {c["image"] for c in containers} == {IMAGE_PLACEHOLDER}

    [steps] = _sh_blocks(_section(DOCS_DEPLOYING, "Building and pushing the image"))
    work = tmp_path / "clone"
    shutil.copytree(DEPLOY / "kubernetes", work / "deploy" / "kubernetes")
    script = 'docker() { echo "$*" >> docker.calls; }\n' + steps
    subprocess.run(["bash", "-euc", script], cwd=work, check=True)
    image = re.search(r"^IMAGE=(\S+)", steps, re.MULTILINE)
    assert image, steps
    calls = (work / "docker.calls").read_text().splitlines()
    assert calls == [f"build -f deploy/docker/Dockerfile -t {image[1]} .", f"push {image[1]}"]
    assert (DEPLOY / "docker" / "Dockerfile").is_file()
    rewritten = _shardcache_containers(_kubernetes_documents(work / "deploy" / "kubernetes"))
    assert [c["image"] for c in rewritten] == [image[1]] * 3
    leftovers = [
        f.name
        for f in (work / "deploy" / "kubernetes").glob("*")
        if IMAGE_PLACEHOLDER in f.read_text()
    ]
    assert leftovers == []


def test_compose_publishes_every_port_on_this_machine_only() -> None:
    """Grafana (anonymous Admin), Prometheus, MinIO's console and shardcache: 127.0.0.1 only."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = {
        f"{name}: {port}"
        for name, service in compose["services"].items()
        for port in service.get("ports", [])
    }
    assert {p.split(": ")[0] for p in published} >= {"shardcache", "grafana", "prometheus", "minio"}
    wide = sorted(p for p in published if not str(p.split(": ", 1)[1]).startswith("127.0.0.1:"))
    assert wide == [], f"published beyond this machine: {wide}"


# What an example config is for: where to listen, how big, where, how to log, the token.
EXAMPLE_SETS = {"listen", "cache_size", "cache_dir", "log_format", "admin_token_file"}


def test_example_configs_pin_no_setting_away_from_its_default(tmp_path: Path) -> None:
    """A copied example must not silently fix a tuned setting (`prefetch_concurrency = 4`
    while the default is `auto`): every other key it writes says the default."""
    examples = {
        "deploy/systemd/shardcache.toml": (DEPLOY / "systemd" / "shardcache.toml").read_text(),
        "deploy/compose/shardcache.toml": (DEPLOY / "compose" / "shardcache.toml").read_text(),
        "deploy/compose/tier.toml": (DEPLOY / "compose" / "tier.toml").read_text(),
    }
    for name in ("configmap.yaml", "tier.yaml"):
        for document in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()):
            if document and document["kind"] == "ConfigMap":
                examples[f"deploy/kubernetes/{name}"] = document["data"]["shardcache.toml"]
    defaults = _settings_from("", tmp_path)
    options = {o.name for o in OPTIONS}
    pinned = []
    for where, text in examples.items():
        settings = _settings_from(text, tmp_path)
        for key in tomllib.loads(text).keys() & options - EXAMPLE_SETS:
            if getattr(settings, key) != getattr(defaults, key):
                pinned.append(f"{where}: {key}")
    assert pinned == [], f"example configs pin settings away from their defaults: {pinned}"
    systemd = tomllib.loads(examples["deploy/systemd/shardcache.toml"])
    assert systemd["prefetch_concurrency"] == "auto"
