"""The Helm chart, rendered by Helm's own Go engine (helm-python-sdk), every object checked
against the real Kubernetes schemas; its values schema generated from one source."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from meterhub.billing_hooks.settings import pass_capacity
from meterhub.hub.config import load_site_config
from meterhub.hub.k8s import configure
from tools import helm_schema

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "meterhub"
KUBERNETES_VERSIONS = ("1.30.0", "1.33.0", "1.37.0")
DB = {"billing": {"database": {"url": "postgresql://meter:secret@ledger-db/ledger"}}}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def objects(chart, values: dict) -> list[dict]:
    manifests = chart.render(values, name="gpu", namespace="gpu-lab")
    found = []
    for path, text in manifests.items():
        if path.endswith(".yaml"):
            found += [doc for doc in yaml.safe_load_all(text) if doc]
    return found


def by_kind(found: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in found}


def merged(*layers: dict) -> dict:
    result: dict = {}
    for layer in layers:
        _merge(result, copy.deepcopy(layer))
    return result


def _merge(into: dict, layer: dict) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def test_values_schema_json_and_docs_are_generated_from_the_yaml():
    assert (CHART / "values.schema.json").read_text() == helm_schema.render_json(), (
        "run: .venv/bin/python -m tools.generate"
    )
    assert (ROOT / "docs" / "helm-values.md").read_text() == helm_schema.render_docs()


def test_values_schema_is_closed_and_described():
    schema = yaml.safe_load((CHART / "values.schema.yaml").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = {"resources", "jupyterhub", "global", "nodeSelector"}

    def walk(node: dict, where: str) -> None:
        for key, sub in node.get("properties", {}).items():
            assert sub.get("description"), f"{where}{key} has no description"
            if sub.get("type") == "object" and key not in open_objects:
                assert "additionalProperties" in sub, f"{where}{key} is not closed"
            walk(sub, f"{where}{key}.")

    assert schema["additionalProperties"] is False
    walk(schema, "")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"billing": {"databse": {}}}, "additional properties 'databse' not allowed"),
        ({"site": {"kubernetes": {"disk_size": "20GB"}}}, "disk_size"),
        ({"site": {"profiles": {"a800": {"price_per_hour": -1}}}}, "price_per_hour"),
        ({"public": {"claimName": "Not_A_Name"}}, "claimName"),
        ({"billing": {"database": {"url": "mysql://x"}}}, "url"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    ],
)
def test_values_outside_the_schema_are_rejected(chart, values, message):
    with pytest.raises(helm.HelmError) as e:
        chart.validate_schema(merged(DB, values))
    assert message in str(e.value)
    with pytest.raises(helm.HelmError):
        chart.render(merged(DB, values), name="gpu", namespace="gpu-lab")


def test_every_rendered_object_validates_on_every_kubernetes_version(chart):
    nfs = {"public": {"nfs": {"enabled": True, "server": "10.0.0.5", "path": "/pool"}}}
    for values in (DB, merged(DB, nfs)):
        found = objects(chart, values)
        assert len(found) >= 6
        for version in KUBERNETES_VERSIONS:
            for obj in found:
                kubernetes_validate.validate(obj, version, strict=True)


def test_default_objects(chart):
    found = by_kind(objects(chart, DB))
    assert set(found) == {
        ("ConfigMap", "meterhub-site"),
        ("Secret", "meterhub-database"),
        ("Deployment", "meterhub-billing"),
        ("Service", "meterhub-billing"),
        ("NetworkPolicy", "meterhub-billing"),
        ("PersistentVolumeClaim", "meterhub-public"),
        # hooks: the schema upgrade before an install or upgrade
        ("ConfigMap", "meterhub-upgrade-db"),
        ("Secret", "meterhub-upgrade-db"),
        ("Job", "meterhub-upgrade-db"),
    }
    assert found[("Secret", "meterhub-database")]["stringData"] == {
        "url": "postgresql://meter:secret@ledger-db/ledger"
    }
    pvc = found[("PersistentVolumeClaim", "meterhub-public")]
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_billing_service_runs_unprivileged_with_its_token_and_database(chart):
    deployment = by_kind(objects(chart, DB))[("Deployment", "meterhub-billing")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["meterhub", "billing", "service"]
    env = {e["name"]: e for e in container["env"]}
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub",
        "key": "hub.services.billing.apiToken",
    }
    assert env["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "meterhub-database",
        "key": "url",
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["hub.jupyter.org/network-access-hub"] == "true"


def test_network_policy_admits_only_the_proxy_hub_and_servers(chart):
    policy = by_kind(objects(chart, DB))[("NetworkPolicy", "meterhub-billing")]["spec"]
    (ingress,) = policy["ingress"]
    components = {peer["podSelector"]["matchLabels"]["component"] for peer in ingress["from"]}
    assert components == {"proxy", "hub", "singleuser-server"}
    ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert ports == {8081, 5432, 53}
    off = objects(chart, merged(DB, {"billing": {"networkPolicy": {"enabled": False}}}))
    assert "NetworkPolicy" not in {o["kind"] for o in off}


def test_nfs_pool_and_an_existing_database_secret(chart):
    values = merged(
        {"billing": {"database": {"existingSecret": "ledger-db-app", "secretKey": "uri"}}},
        {"public": {"nfs": {"enabled": True, "server": "10.0.0.5", "path": "/pool"}}},
        {
            "jupyterhub": {
                "hub": {
                    "extraEnv": {
                        "METERHUB_DB_URL": {
                            "valueFrom": {"secretKeyRef": {"name": "ledger-db-app", "key": "uri"}}
                        }
                    }
                }
            }
        },
    )
    found = by_kind(objects(chart, values))
    assert ("Secret", "meterhub-database") not in found
    pv = found[("PersistentVolume", "meterhub-public-gpu-lab")]
    assert pv["spec"]["nfs"] == {"server": "10.0.0.5", "path": "/pool", "readOnly": True}
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    pvc = found[("PersistentVolumeClaim", "meterhub-public")]
    assert pvc["spec"]["volumeName"] == "meterhub-public-gpu-lab"
    assert pvc["spec"]["storageClassName"] == ""
    container = found[("Deployment", "meterhub-billing")]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in container["containers"][0]["env"]}
    assert env["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "ledger-db-app",
        "key": "uri",
    }


@pytest.mark.parametrize(
    "values, message",
    [
        ({}, "billing.database.url (a postgresql:// URL) or billing.database.existingSecret"),
        (
            {"billing": {"database": {"existingSecret": "other"}}},
            'METERHUB_DB_URL.valueFrom.secretKeyRef.name must be "other"',
        ),
        (
            merged(DB, {"public": {"nfs": {"enabled": True}}}),
            "public.nfs.server is required",
        ),
        # GPU types: the schema cannot list them (site.gpu_types adds some)
        (
            merged(DB, {"site": {"profiles": {"a100": {}}}}),
            "site.profiles.a100: unknown GPU type (known: a800, h800, rtx4090)",
        ),
        (
            merged(DB, {"site": {"kubernetes": {"pass_capacity": {"l40s": 4}}}}),
            "site.kubernetes.pass_capacity.l40s: unknown GPU type",
        ),
        (
            merged(DB, {"site": {"kubernetes": {"node_products": {"v100": ["x"]}}}}),
            "site.kubernetes.node_products.v100: unknown GPU type",
        ),
    ],
)
def test_incomplete_values_fail_with_the_key_to_set(chart, values, message):
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert message in str(e.value)


def test_the_site_configmap_is_a_valid_kubernetes_site_config(chart, tmp_path):
    values = merged(
        DB,
        {
            "public": {"claimName": "lab-pool"},
            "site": {
                "profiles": {"h800": {"allowed_groups": ["lab-a"], "price_per_hour": "7.20"}},
                "billing": {"trial_credit": "5.00"},
                "kubernetes": {"pass_capacity": {"a800": 16}},
            },
        },
    )
    configmap = by_kind(objects(chart, values))[("ConfigMap", "meterhub-site")]
    path = tmp_path / "meterhub.yaml"
    path.write_text(configmap["data"]["meterhub.yaml"])
    site = load_site_config(path)
    assert site["backend"] == "kubernetes"
    assert site["kubernetes"]["public_claim"] == "lab-pool"
    c = Config()
    configure(c, str(path))
    assert c.JupyterHub.spawner_class == "meterhub.spawner.kube.KubeGPUSpawner"
    assert c.KubeGPUSpawner.public_claim_name == "lab-pool"
    assert c.Catalog.allowed_groups == {"h800": ["lab-a"]}
    assert c.Catalog.prices == {"h800": "7.20"}
    assert c.BillingSettings.trial_credit == "5.00"
    assert pass_capacity(c) == {"a800": 16}  # the hub's; the billing service reads the same


def test_the_hub_extra_config_in_values_runs(tmp_path, monkeypatch):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"backend": "kubernetes"}))
    monkeypatch.setenv("METERHUB_CONFIG", str(path))
    monkeypatch.setenv("METERHUB_DB_URL", "postgresql://meter:secret@ledger-db/ledger")
    c = Config()
    exec(values["jupyterhub"]["hub"]["extraConfig"]["meterhub"], {"c": c})  # as z2jh does
    assert c.JupyterHub.spawner_class == "meterhub.spawner.kube.KubeGPUSpawner"
    assert c.BillingSettings.db_url == "postgresql://meter:secret@ledger-db/ledger"
    assert c.Spawner.pre_spawn_hook.__name__ == "authorize_spawn"
    # billing's hooks on KubeGPUSpawner's own section: an operator's c.Spawner hook adds to them
    assert c.KubeGPUSpawner.pre_spawn_hook.__name__ == "billed_pre_spawn"
    assert c.KubeGPUSpawner.post_stop_hook.__name__ == "billed_post_stop"


def test_lint_finds_no_errors():
    report = helm.lint(CHART, DB)
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert not errors and not report["errors"], report


def test_pins_agree():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (z2jh,) = chart["dependencies"]
    assert z2jh["name"] == "jupyterhub" and re.fullmatch(r"\d+\.\d+\.\d+", z2jh["version"])
    dockerfile = (ROOT / "images" / "hub" / "Dockerfile").read_text()
    assert f"FROM quay.io/jupyterhub/k8s-hub:{z2jh['version']}" in dockerfile
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    hub_image = values["jupyterhub"]["hub"]["image"]
    assert hub_image["tag"] == values["billing"]["image"]["tag"] == chart["appVersion"]
    assert hub_image["name"] == values["billing"]["image"]["name"]


def test_the_chart_roles_are_billings_own():
    """hub.loadRoles gives users billing's spend scope and defines the billing admin role
    exactly as meterhub.billing_hooks.scopes does (no members: operators add them)."""
    from meterhub.billing_hooks.scopes import billing_admin_role, user_role

    roles = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"]["loadRoles"]
    expected_user = user_role()
    assert roles[expected_user["name"]]["scopes"] == expected_user["scopes"]
    admin = billing_admin_role()
    chart_admin = roles[admin["name"]]
    assert chart_admin["scopes"] == admin["scopes"]
    assert chart_admin["description"] == admin["description"]
    assert not chart_admin.get("users") and not chart_admin.get("services")
    assert not chart_admin.get("groups")
    # the meter's own role never gains the right to start servers
    assert not any("servers" in s and s.startswith(("admin", "servers")) for s in
                   roles["meterhub-billing"]["scopes"])  # fmt: skip


def test_the_meter_culls_per_profile_so_z2jhs_one_timeout_culler_is_off():
    """z2jh's culler would stop a debug-mode server after its single 60 minutes; the meter
    stops idle servers by each profile's timeout (docs/idle.md)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["jupyterhub"]["cull"] == {"enabled": False}


def _prefixed(prefix: str, claim: str) -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    hub = values["jupyterhub"]["hub"]
    values["jupyterhub"]["fullnameOverride"] = prefix
    dash = f"{prefix}-" if prefix else ""
    hub["extraVolumes"][0]["configMap"]["name"] = f"{dash}meterhub-site"
    env = hub["extraEnv"]
    env["METERHUB_BILLING_SERVICE_URL"]["valueFrom"]["configMapKeyRef"]["name"] = (
        f"{dash}meterhub-site"
    )
    env["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"]["name"] = f"{dash}meterhub-database"
    values["public"]["claimName"] = claim  # or share one pool: public.create false
    return merged(values, DB)


def test_two_releases_in_one_namespace_share_no_name(chart):
    names = {}
    for release, prefix in (("lab-a", "lab-a"), ("lab-b", "lab-b")):
        rendered = chart.render(_prefixed(prefix, f"{release}-pool"), name=release, namespace="gpu")
        found = [d for p, t in rendered.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]  # fmt: skip
        names[release] = {(o["kind"], o["metadata"]["name"]) for o in found}
        for obj in found:
            kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
        deployment = by_kind(found)[("Deployment", f"{prefix}-meterhub-billing")]
        pod = deployment["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["JUPYTERHUB_API_URL"]["value"] == f"http://{prefix}-hub:8081/hub/api"
        assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{prefix}-hub"
        assert pod["volumes"][0]["configMap"]["name"] == f"{prefix}-meterhub-site"
        site = by_kind(found)[("ConfigMap", f"{prefix}-meterhub-site")]
        assert site["data"]["billing-service-url"] == f"http://{prefix}-meterhub-billing:8082"
        policy = by_kind(found)[("NetworkPolicy", f"{prefix}-meterhub-billing")]["spec"]
        releases = {
            p["podSelector"]["matchLabels"]["release"] for p in policy["ingress"][0]["from"]
        }
        assert releases == {release}  # only this release's proxy, hub and servers
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == release
    assert len(names["lab-a"]) >= 6 and not names["lab-a"] & names["lab-b"]


def test_a_null_prefix_is_the_release_and_z2jh_names(chart):
    values = _prefixed("", "meterhub-public")
    values["jupyterhub"]["fullnameOverride"] = None
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert 'the ConfigMap "gpu-jupyterhub-meterhub-site"' in str(e.value)
    fixed = _prefixed("gpu-jupyterhub", "meterhub-public")
    fixed["jupyterhub"]["fullnameOverride"] = None
    found = by_kind(objects(chart, fixed))
    env = {e["name"]: e for e in found[("Deployment", "gpu-jupyterhub-meterhub-billing")]["spec"][
        "template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "gpu-jupyterhub-hub"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda hub: hub["extraVolumes"][0]["configMap"].update(name="x"),
            'jupyterhub.hub.extraVolumes: the meterhub-site volume must name the ConfigMap "lab-meterhub-site"',
        ),
        (
            lambda hub: hub["extraEnv"]["METERHUB_BILLING_SERVICE_URL"]["valueFrom"][
                "configMapKeyRef"].update(name="x"),
            'METERHUB_BILLING_SERVICE_URL.valueFrom.configMapKeyRef.name must be "lab-meterhub-site"',
        ),
        (
            lambda hub: hub["extraEnv"]["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"].update(
                name="x"),
            'METERHUB_DB_URL.valueFrom.secretKeyRef.name must be "lab-meterhub-database"',
        ),
    ],
)  # fmt: skip
def test_names_z2jh_cannot_template_are_checked(chart, change, message):
    values = _prefixed("lab", "meterhub-public")
    chart.render(values, name="lab", namespace="gpu")  # consistent: renders
    change(values["jupyterhub"]["hub"])
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="lab", namespace="gpu")
    assert message in str(e.value)


def test_billing_probes_and_pull_secrets(chart):
    """A stalled meter restarts the pod (liveness on /health); the wallet API stays in the
    Service while the process serves (readiness on the port)."""
    from meterhub.billing_hooks.meter import UNHEALTHY_AFTER_INTERVALS
    from meterhub.hub.config import SCHEMA

    values = merged(DB, {"billing": {"image": {"pullSecrets": ["registry-cred"]}}})
    deployment = by_kind(objects(chart, values))[("Deployment", "meterhub-billing")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-cred"}]
    (container,) = pod["containers"]
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness == {"tcpSocket": {"port": "http"}, "periodSeconds": 10}
    assert liveness["httpGet"] == {"path": "/services/billing/api/v1/health", "port": "http"}
    # /health turns 503 after three meter intervals without a pass; the restart follows a
    # few checks later, so one slow answer or a slow start-up restarts nothing
    interval = SCHEMA["properties"]["billing"]["properties"]["meter_interval_seconds"]["default"]
    assert interval == 60 and UNHEALTHY_AFTER_INTERVALS == 3
    grace = liveness["periodSeconds"] * liveness["failureThreshold"]
    assert 60 <= grace <= 3 * interval and liveness["timeoutSeconds"] < liveness["periodSeconds"]
    default = by_kind(objects(chart, DB))[("Deployment", "meterhub-billing")]
    assert "imagePullSecrets" not in default["spec"]["template"]["spec"]


@pytest.mark.parametrize("key", ["auth", "gpus", "local", "data_dir"])
def test_local_only_site_keys_fail_the_render(chart, key):
    value = {"auth": {"type": "native"}, "gpus": [{"type": "a800", "count": 1}],
             "local": {"sandbox": "off"}, "data_dir": "/data"}[key]  # fmt: skip
    with pytest.raises(helm.HelmError) as e:
        chart.render(merged(DB, {"site": {key: value}}), name="gpu", namespace="gpu-lab")
    assert f"site.{key}: only used by the local backend" in str(e.value)


HOOK = "meterhub-upgrade-db"
EXISTING = merged(
    {"billing": {"database": {"existingSecret": "ledger-db-app", "secretKey": "uri"}}},
    {
        "jupyterhub": {
            "hub": {
                "extraEnv": {
                    "METERHUB_DB_URL": {
                        "valueFrom": {"secretKeyRef": {"name": "ledger-db-app", "key": "uri"}}
                    }
                }
            }
        }
    },
)


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container["env"]}


def test_the_upgrade_hook_job_runs_upgrade_db_before_anything_starts(chart):
    values = merged(
        DB,
        {
            "billing": {
                "image": {"pullSecrets": ["registry-cred"]},
                "nodeSelector": {"pool": "cpu"},
            },
            "site": {"billing": {"trial_credit": "5.00"}},
        },
    )
    found = by_kind(objects(chart, values))
    job = found[("Job", HOOK)]
    hook_annotations = {
        "helm.sh/hook": "pre-install,pre-upgrade",
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }
    # the config and the URL exist before the Job (a lower weight): on an install the
    # release's own do not exist yet when hooks run
    for kind, weight in (("ConfigMap", "-5"), ("Secret", "-5"), ("Job", "0")):
        annotations = found[(kind, HOOK)]["metadata"]["annotations"]
        assert annotations == {**hook_annotations, "helm.sh/hook-weight": weight}
    pod = _pod(job)
    (container,) = pod["containers"]
    assert container["command"] == [
        "meterhub", "billing", "upgrade-db", "--config", "/etc/meterhub/meterhub.yaml",
    ]  # fmt: skip
    assert pod["restartPolicy"] == "Never"
    # what the billing service runs with: image, pod and container security, pull secrets,
    # node selector, resources, the site config mounted where it reads it
    billing = _pod(found[("Deployment", "meterhub-billing")])
    (service,) = billing["containers"]
    for key in ("image", "imagePullPolicy", "securityContext", "resources", "volumeMounts"):
        assert container[key] == service[key], key
    assert container["image"] == "ghcr.io/meterhub/hub:0.1.0"
    for key in ("securityContext", "imagePullSecrets", "nodeSelector"):
        assert pod[key] == billing[key], key
    assert pod["automountServiceAccountToken"] is False
    # the same site config and database URL, in the hook's copies
    assert pod["volumes"] == [{"name": "site", "configMap": {"name": HOOK}}]
    assert (
        found[("ConfigMap", HOOK)]["data"]["meterhub.yaml"]
        == found[("ConfigMap", "meterhub-site")]["data"]["meterhub.yaml"]
    )
    assert _env(container)["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": HOOK,
        "key": "url",
    }
    assert found[("Secret", HOOK)]["stringData"] == found[("Secret", "meterhub-database")][
        "stringData"]  # fmt: skip
    # its pods are not the billing Service's
    selector = found[("Service", "meterhub-billing")]["spec"]["selector"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= labels.items()


def test_the_upgrade_hook_job_reads_an_existing_secret_itself(chart):
    found = by_kind(objects(chart, EXISTING))
    assert ("Secret", HOOK) not in found and ("Secret", "meterhub-database") not in found
    (container,) = _pod(found[("Job", HOOK)])["containers"]
    billing = _pod(found[("Deployment", "meterhub-billing")])["containers"][0]
    assert _env(container)["METERHUB_DB_URL"] == _env(billing)["METERHUB_DB_URL"]
    assert _env(container)["METERHUB_DB_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "ledger-db-app",
        "key": "uri",
    }
    for version in KUBERNETES_VERSIONS:
        for obj in found.values():
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_billing_pod_waits_for_the_schema_instead_of_crash_looping(chart):
    pod = _pod(by_kind(objects(chart, DB))[("Deployment", "meterhub-billing")])
    (wait,) = pod["initContainers"]
    (service,) = pod["containers"]
    assert wait["command"] == ["python3", "-m", "meterhub.billing_hooks.db"]
    assert _env(wait)["METERHUB_DB_URL"] == _env(service)["METERHUB_DB_URL"]
    for key in ("image", "securityContext", "volumeMounts"):
        assert wait[key] == service[key], key


def test_the_hook_job_and_the_init_container_upgrade_and_release_a_ledger(
    chart, tmp_path, monkeypatch, capsys
):
    """What the pods run, here on a SQLite ledger left at the first schema revision: the
    billing pod's init container waits; the hook Job's command migrates; then it goes on."""
    from alembic import command

    from meterhub.billing_hooks import db
    from meterhub.hub.cli import main

    found = by_kind(objects(chart, DB))
    site = tmp_path / "meterhub.yaml"
    site.write_text(found[("ConfigMap", HOOK)]["data"]["meterhub.yaml"])
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    command.upgrade(db.alembic_config(url), "0001")
    monkeypatch.setenv("METERHUB_DB_URL", url)
    lines: list[str] = []
    sleeps: list[float] = []
    assert not db.wait_for_schema(url, max_checks=3, sleep=sleeps.append, log=lines.append)
    assert sleeps == [5.0, 5.0] and len(lines) == 1  # said once, not every check
    assert "waiting for `meterhub billing upgrade-db`" in lines[0]

    (job,) = _pod(found[("Job", HOOK)])["containers"]
    argv = [a.replace("/etc/meterhub/meterhub.yaml", str(site)) for a in job["command"]]
    assert argv[0] == "meterhub"
    assert main(argv[1:]) == 0
    assert "billing database is at the current schema" in capsys.readouterr().out
    assert db.wait_for_schema(url, max_checks=1, sleep=sleeps.append, log=lines.append)
    # a ledger a newer meterhub migrated (a rollback without restoring it): wait, and say so
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    lines.clear()
    assert not db.wait_for_schema(url, max_checks=1, sleep=sleeps.append, log=lines.append)
    assert "restore the ledger backup" in lines[0]


def test_chart_lock_is_in_step_with_chart_yaml():
    """`helm dependency build` refuses a Chart.lock whose digest is not Helm's hash of
    Chart.yaml's dependencies and the locked ones (resolver.HashReq: sha256 of the JSON of
    both lists)."""
    import hashlib
    import json

    deps = yaml.safe_load((CHART / "Chart.yaml").read_text())["dependencies"]
    lock = yaml.safe_load((CHART / "Chart.lock").read_text())
    fields = ("name", "version", "repository")
    requested = [{key: d[key] for key in fields} for d in deps]
    locked = [{key: d[key] for key in fields} for d in lock["dependencies"]]
    assert locked == requested  # pinned: the lock resolves to the same exact version
    data = json.dumps([requested, locked], separators=(",", ":"))
    assert lock["digest"] == "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def test_the_database_ca_is_mounted_in_every_billing_pod(chart):
    values = merged(EXISTING, {"billing": {"database": {"caSecret": "ledger-db-ca"}}})
    found = by_kind(objects(chart, values))
    mount = {"name": "database-ca", "mountPath": "/etc/meterhub-db-ca", "readOnly": True}
    volume = {
        "name": "database-ca",
        "secret": {"secretName": "ledger-db-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    }
    deployment = _pod(found[("Deployment", "meterhub-billing")])
    job = _pod(found[("Job", HOOK)])
    for pod in (deployment, job):
        assert volume in pod["volumes"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert mount in container["volumeMounts"]
    for obj in found.values():
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[0], strict=True)
    default = _pod(by_kind(objects(chart, DB))[("Deployment", "meterhub-billing")])
    assert [v["name"] for v in default["volumes"]] == ["site"]


# ------------------------------------------------------------ z2jh values meterhub owns


def _refused_table() -> dict:
    """The chart's table of refused z2jh `singleuser` values (a YAML define in _helpers.tpl)."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    body = re.search(
        r'define "meterhub.singleuser.refused" -}}\n(.*?)\n{{- end }}', text, re.S
    ).group(1)
    return yaml.safe_load(body)


def _nested(path: str, value) -> dict:
    *parents, leaf = path.split(".")
    result: dict = {leaf: value}
    for key in reversed(parents):
        result = {key: result}
    return {"jupyterhub": {"singleuser": result}}


def _other_than(default):
    if default is None:
        return "fast-rwo"
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return 0
    if isinstance(default, str):
        return default + "-mine"
    if isinstance(default, list):
        return ["ReadWriteMany"] if default else [{"name": "data", "emptyDir": {}}]
    return {"motd.txt": {"mountPath": "/etc/motd", "stringData": "hi"}}


def test_the_charts_refusals_say_what_the_hub_says():
    from meterhub.hub.k8s import Z2JH_OWNED

    from .k8s.z2jh import SINGLEUSER_DEFAULTS, Z2JH_VERSION

    table = _refused_table()
    for trait, text in table["instead"].items():
        assert text == Z2JH_OWNED[trait][1], trait
    assert {entry["trait"] for entry in table["values"]} == set(table["instead"])
    # the defaults it lets pass are z2jh's (storage.type: meterhub's none)
    for entry in table["values"]:
        node = SINGLEUSER_DEFAULTS
        for part in entry["value"].split("."):
            node = node[part]
        assert node == entry["z2jh"], entry["value"]
    pinned = yaml.safe_load((CHART / "Chart.yaml").read_text())["dependencies"][0]["version"]
    assert SINGLEUSER_DEFAULTS["image"]["tag"] == Z2JH_VERSION == pinned


def test_z2jh_singleuser_defaults_as_the_subchart_coalesces_them_render(chart):
    from .k8s.z2jh import SINGLEUSER_DEFAULTS

    values = merged(DB, {"jupyterhub": {"singleuser": SINGLEUSER_DEFAULTS}})
    assert ("Deployment", "meterhub-billing") in by_kind(objects(chart, values))


@pytest.mark.parametrize("entry", _refused_table()["values"], ids=lambda e: e["value"])
def test_z2jh_singleuser_values_meterhub_would_drop_fail_the_render(chart, entry):
    from meterhub.hub.k8s import Z2JH_OWNED

    values = merged(DB, _nested(entry["value"], _other_than(entry["z2jh"])))
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    message = str(e.value)
    assert f"jupyterhub.singleuser.{entry['value']}: meterhub's spawner does not read it" in message
    assert Z2JH_OWNED[entry["trait"]][1] in message
    # what z2jh has passes, and so does a null (Helm removes it)
    for same in (entry["z2jh"], None):
        chart.render(merged(DB, _nested(entry["value"], same)), name="gpu", namespace="gpu-lab")


def test_a_refusal_names_the_site_key(chart):
    values = merged(DB, {"jupyterhub": {"singleuser": {"uid": 0}}})
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert (
        "jupyterhub.singleuser.uid: meterhub's spawner does not read it (leave it at 1000);"
        " set site.kubernetes.uid"
    ) in str(e.value)


# ------------------------------------------------------------ hub.baseUrl


def test_billing_follows_hub_base_url_with_a_prefix(chart, tmp_path, monkeypatch):
    """jupyterhub.hub.baseUrl /jupyter/: JupyterHub puts the billing service at
    /jupyter/services/billing/ and the proxy forwards that whole path to the billing pod,
    which must serve there; its hub API is under the base URL too; servers get the API
    under the same prefix. With a fullnameOverride as well."""
    from jupyterhub.services.service import Service

    values = merged(_prefixed("lab", "lab-pool"), {"jupyterhub": {"hub": {"baseUrl": "/jupyter/"}}})
    found = by_kind(objects_of(chart, values, "lab"))
    pod = _pod(found[("Deployment", "lab-meterhub-billing")])
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    prefix = Service(name="billing", base_url="/jupyter/").prefix
    assert prefix == "/jupyter/services/billing/"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == prefix
    assert env["JUPYTERHUB_BASE_URL"] == "/jupyter/"
    assert env["JUPYTERHUB_API_URL"] == "http://lab-hub:8081/jupyter/hub/api"
    assert env["JUPYTERHUB_OAUTH_CALLBACK_URL"] == f"{prefix}oauth_callback"
    assert container["livenessProbe"]["httpGet"]["path"] == f"{prefix}api/v1/health"

    # the hub, from the site ConfigMap it mounts and the URL it reads from it
    configmap = found[("ConfigMap", "lab-meterhub-site")]
    site = tmp_path / "meterhub.yaml"
    site.write_text(configmap["data"]["meterhub.yaml"])
    monkeypatch.setenv("METERHUB_BILLING_SERVICE_URL", configmap["data"]["billing-service-url"])
    monkeypatch.setenv("METERHUB_DB_URL", f"sqlite:///{tmp_path}/ledger.sqlite")
    c = Config()
    c.JupyterHub.base_url = "/jupyter/"  # z2jh's, from hub.baseUrl
    c.JupyterHub.services = [{"name": "billing", "display": False}]
    configure(c, str(site))
    assert c.JupyterHub.services[0]["url"] == "http://lab-meterhub-billing:8082"
    assert c.KubeGPUSpawner.meterhub_environment == {
        "METERHUB_BILLING_URL": f"http://lab-meterhub-billing:8082{prefix}api/v1"
    }
    for obj in found.values():
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)


def objects_of(chart, values: dict, release: str) -> list[dict]:
    manifests = chart.render(values, name=release, namespace="gpu")
    return [d for p, t in manifests.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]  # fmt: skip


def test_the_billing_app_answers_its_probes_at_the_rendered_paths(chart, tmp_path):
    """The billing app, made with the prefix the chart gives it, serves the liveness path:
    200 while the meter passes, 503 once it has stalled three intervals."""
    import asyncio

    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from meterhub.billing_hooks.clock import FakeClock
    from meterhub.billing_hooks.db import connect
    from meterhub.billing_hooks.ledger import Ledger
    from meterhub.billing_hooks.meter import UNHEALTHY_AFTER_INTERVALS, Meter
    from meterhub.billing_hooks.service import make_app

    values = merged(DB, {"jupyterhub": {"hub": {"baseUrl": "/jupyter"}}})
    (container,) = _pod(by_kind(objects(chart, values))[("Deployment", "meterhub-billing")])[
        "containers"]  # fmt: skip
    prefix = _env(container)["JUPYTERHUB_SERVICE_PREFIX"]["value"]
    path = container["livenessProbe"]["httpGet"]["path"]
    assert prefix == "/jupyter/services/billing/" and path.startswith(prefix)

    class Hub:
        async def user_exists(self, name):
            return False

        async def group_members(self, name):
            return None

        #: the servers' last activity as the hub tells it: none reported
        last_activity: dict = {}

        async def running_servers(self):
            return {}

    clock = FakeClock()
    ledger = Ledger(connect(f"sqlite:///{tmp_path}/l.sqlite"), clock=clock)
    meter = Meter(ledger, Hub(), clock=clock)

    async def probe():
        sock, port = bind_unused_port()
        server = HTTPServer(make_app(prefix, ledger, 0, Hub(), Config(), [30], meter))
        server.add_sockets([sock])
        client = AsyncHTTPClient()
        codes = []
        try:
            for advance in (0, UNHEALTHY_AFTER_INTERVALS * meter.interval_seconds):
                clock.advance(advance)
                response = await client.fetch(f"http://127.0.0.1:{port}{path}", raise_error=False)
                codes.append(response.code)
            wrong = await client.fetch(
                f"http://127.0.0.1:{port}/services/billing/api/v1/health", raise_error=False
            )
            codes.append(wrong.code)
        finally:
            server.stop()
        return codes

    assert asyncio.run(probe()) == [200, 503, 404]


def test_a_base_url_set_in_hub_config_instead_of_hub_base_url_fails(chart):
    values = merged(DB, {"jupyterhub": {"hub": {"config": {"JupyterHub": {"base_url": "/x/"}}}}})
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert 'set jupyterhub.hub.baseUrl: "/x/" instead' in str(e.value)
    agreeing = {"hub": {"baseUrl": "/x", "config": {"JupyterHub": {"base_url": "/x/"}}}}
    chart.render(merged(DB, {"jupyterhub": agreeing}), name="gpu", namespace="gpu-lab")


def test_the_top_up_secret_comes_from_a_secret_never_the_site_configmap(chart):
    """Whoever reads billing.topup_secret can credit any wallet, and the site config is a
    ConfigMap (Kubernetes' `view` role reads ConfigMaps, not Secrets): the chart refuses it
    there and passes an existing Secret's key to the billing service as its environment."""
    secret = "x" * 40
    with pytest.raises(helm.HelmError) as e:
        chart.render(
            merged(DB, {"site": {"billing": {"topup_secret": secret}}}),
            name="gpu",
            namespace="gpu-lab",
        )
    assert "site.billing.topup_secret" in str(e.value) and "billing.topup.existingSecret" in str(
        e.value
    )
    assert secret not in str(e.value)
    found = by_kind(
        objects(chart, merged(DB, {"billing": {"topup": {"existingSecret": "pay-hook"}}}))
    )
    (container,) = found[("Deployment", "meterhub-billing")]["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["METERHUB_TOPUP_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "pay-hook",
        "key": "topup-secret",
    }
    # without it, top-ups stay off (503), and no empty variable stands in for a secret
    (default,) = by_kind(objects(chart, DB))[("Deployment", "meterhub-billing")]["spec"][
        "template"
    ]["spec"]["containers"]
    assert "METERHUB_TOPUP_SECRET" not in {e["name"] for e in default["env"]}
