"""The Kubernetes backend, offline: what KubeGPUSpawner would create, checked against the
real Kubernetes schemas (kubernetes-validate, strict) for 1.30, 1.33 and 1.37."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from meterhub.hub.config import load_site_config
from meterhub.hub.render_k8s import RenderError, profile_list, render
from meterhub.spawner.catalog import GPU_COUNTS, GPU_TYPES

KUBERNETES_VERSIONS = ("1.30.0", "1.33.0", "1.37.0")
METERHUB = str(Path(sys.executable).parent / "meterhub")
CHOICES = [("debug", None)] + [(slug, n) for slug in GPU_TYPES for n in GPU_COUNTS]


@pytest.fixture(scope="module")
def site():
    return load_site_config(None)


@pytest.fixture(scope="module")
def restricted(tmp_path_factory):
    path = tmp_path_factory.mktemp("site") / "meterhub.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "backend": "kubernetes",
                "profiles": {
                    "h800": {"allowed_groups": ["lab-a"]},
                    "a800": {"allowed_groups_by_count": {8: ["staff"]}},
                },
                "kubernetes": {
                    "gpu_image": "registry.example/meterhub/singleuser-cuda:1",
                    "node_products": {"a800": ["NVIDIA-A800-SXM4-80GB", "NVIDIA-A800-80GB-PCIe"]},
                    "debug_node_selector": {"node-pool": "cpu"},
                    "disk_size": "50Gi",
                    "storage_class": "fast-rwo",
                },
            }
        )
    )
    return path


def spec_of(pod: dict) -> tuple[dict, dict]:
    (container,) = pod["spec"]["containers"]
    return pod["spec"], container


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def mounts_of(container: dict) -> dict[str, dict]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def volumes_of(spec: dict) -> dict[str, dict]:
    return {v["name"]: v for v in spec["volumes"]}


@pytest.mark.parametrize(("profile", "gpus"), CHOICES)
def test_every_choice_validates_strictly_on_every_kubernetes_version(site, profile, gpus):
    documents = render(site, "alice", profile, gpus)
    assert [d["kind"] for d in documents] == ["Pod", "PersistentVolumeClaim"]
    for version in KUBERNETES_VERSIONS:
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_can_fail(site):
    pod, _ = render(site, "alice", "debug")
    pod["spec"]["containers"][0]["gpuCount"] = 1  # not a Kubernetes field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("slug", list(GPU_TYPES))
def test_gpu_profiles_ask_for_their_gpus_on_nodes_of_their_type(site, slug):
    gpu_type = GPU_TYPES[slug]
    pod, _ = render(site, "alice", slug, 4)
    spec, container = spec_of(pod)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "4"
    assert resources["requests"]["nvidia.com/gpu"] == "4"
    assert resources["limits"]["cpu"] == 4 * gpu_type.cpu_per_gpu
    assert resources["requests"]["cpu"] == 4 * gpu_type.cpu_guarantee_per_gpu
    assert resources["limits"]["memory"] == 4 * gpu_type.memory_gib_per_gpu * 1024**3
    assert resources["requests"]["memory"] == 4 * gpu_type.memory_guarantee_gib_per_gpu * 1024**3
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [gpu_type.node_product]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    shm = volumes_of(spec)["shm"]["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": f"{4 * gpu_type.shm_gib_per_gpu}Gi"}
    env = env_of(container)
    assert (env["METERHUB_PROFILE"], env["METERHUB_GPUS"]) == (slug, "4")
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" not in env


def test_debug_mode_has_no_gpu_and_hides_them(site):
    pod, _ = render(site, "alice", "debug")
    spec, container = spec_of(pod)
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    assert not spec.get("tolerations") and "affinity" not in spec  # stays off GPU nodes
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert container["resources"]["limits"]["cpu"] == 2.0


IDLE_ENV = (
    "METERHUB_IDLE_SECONDS",
    "METERHUB_ON_IDLE",
    "METERHUB_IDLE_WARN_SECONDS",
    "METERHUB_GPU_BUSY_PERCENT",
    "JUPYTERHUB_ACTIVITY_INTERVAL",
    "METERHUB_STOP_GRACE_SECONDS",
)


def test_the_pod_is_told_its_idle_policy_and_grace(tmp_path):
    """What the server's extension needs to warn, sample its GPUs and give its kernels the
    pod's grace period: the site's idle settings, per profile."""
    path = tmp_path / "meterhub.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "backend": "kubernetes",
                "profiles": {"a800": {"idle_minutes": 20, "on_idle": "debug"}},
                "idle": {"check_interval_seconds": 15, "gpu_busy_percent": 12, "warn_minutes": 2},
                "stop_grace_seconds": 45,
            }
        )
    )
    site = load_site_config(path)
    shown = {}
    for profile, gpus in (("debug", None), ("a800", 2)):
        pod, _ = render(site, "alice", profile, gpus)
        env = env_of(spec_of(pod)[1])
        shown[profile] = {name: env.get(name) for name in IDLE_ENV}
    common = {
        "METERHUB_IDLE_WARN_SECONDS": "120",
        "METERHUB_GPU_BUSY_PERCENT": "12",
        "JUPYTERHUB_ACTIVITY_INTERVAL": "15",
        "METERHUB_STOP_GRACE_SECONDS": "45",
    }
    assert shown["debug"] == {
        "METERHUB_IDLE_SECONDS": "14400",  # the debug default: 4 hours
        "METERHUB_ON_IDLE": "stop",
        **common,
    }
    assert shown["a800"] == {"METERHUB_IDLE_SECONDS": "1200", "METERHUB_ON_IDLE": "debug", **common}


def test_one_disk_per_user_shared_by_every_profile_and_a_read_only_public_pool(site):
    claims = set()
    for profile, gpus in (("debug", None), ("a800", 2), ("h800", 8)):
        pod, pvc = render(site, "alice", profile, gpus)
        spec, container = spec_of(pod)
        volumes, mounts = volumes_of(spec), mounts_of(container)
        claims.add(volumes["home"]["persistentVolumeClaim"]["claimName"])
        assert pvc["metadata"]["name"] == volumes["home"]["persistentVolumeClaim"]["claimName"]
        assert mounts["/home/jovyan"]["name"] == "home" and not mounts["/home/jovyan"].get(
            "readOnly"
        )
        assert volumes["public"]["persistentVolumeClaim"] == {
            "claimName": "meterhub-public",
            "readOnly": True,
        }
        assert mounts["/public"] == {"mountPath": "/public", "name": "public", "readOnly": True}
        assert mounts["/dev/shm"]["name"] == "shm"
    assert claims == {"claim-alice"}  # switching debug <-> GPU keeps the files
    _, bob_pvc = render(site, "bob", "debug")
    assert bob_pvc["metadata"]["name"] == "claim-bob"
    assert bob_pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_user_servers_never_run_as_root(site):
    for profile, gpus in (("debug", None), ("rtx4090", 1)):
        pod, _ = render(site, "alice", profile, gpus)
        spec, container = spec_of(pod)
        context = container["securityContext"]
        assert context["runAsUser"] == 1000 and context["runAsUser"] != 0
        assert context["runAsNonRoot"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert not context.get("privileged")
        assert spec["automountServiceAccountToken"] is False
        # a new disk gets the image's starter notebooks once
        (command,) = [container["lifecycle"]["postStart"]["exec"]["command"]]
        assert command[:2] == ["sh", "-c"] and "/opt/meterhub/notebooks/*.ipynb" in command[2]


def test_site_config_reaches_the_pod(restricted):
    site = load_site_config(restricted)
    pod, pvc = render(site, "alice", "a800", 2)
    spec, container = spec_of(pod)
    assert container["image"] == "registry.example/meterhub/singleuser-cuda:1"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == [
        "NVIDIA-A800-SXM4-80GB",
        "NVIDIA-A800-80GB-PCIe",
    ]
    assert pvc["spec"]["storageClassName"] == "fast-rwo"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    debug, _ = render(site, "alice", "debug")
    spec, container = spec_of(debug)
    assert spec["nodeSelector"] == {"node-pool": "cpu"}
    assert container["image"] == "quay.io/jupyter/base-notebook:python-3.11"


def test_group_restrictions_are_enforced_server_side(restricted):
    site = load_site_config(restricted)
    with pytest.raises(RenderError, match="H800 is limited to the groups lab-a"):
        render(site, "alice", "h800", 1)
    with pytest.raises(RenderError, match="8 × A800 is limited to the groups staff"):
        render(site, "alice", "a800", 8, groups=["lab-a"])
    pod, *_ = render(site, "alice", "h800", 1, groups=["lab-a"])
    assert spec_of(pod)[1]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pod, *_ = render(site, "carol", "a800", 8, groups=["staff"])
    assert spec_of(pod)[1]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # KubeSpawner's own profile_list leaves the forbidden choices out as well
    profiles = {p["slug"]: p for p in profile_list(site, "alice")}
    assert set(profiles) == {"debug", "rtx4090", "a800"}
    assert set(profiles["a800"]["profile_options"]["gpus"]["choices"]) == {"1", "2", "4"}
    assert "h800" in {p["slug"] for p in profile_list(site, "alice", ["lab-a"])}


def test_invalid_choices_are_refused(site):
    with pytest.raises(RenderError, match="Unknown profile 'v100'"):
        render(site, "alice", "v100", 1)
    with pytest.raises(RenderError, match="'gpus' must be one of 1, 2, 4, 8"):
        render(site, "alice", "a800", 3)
    with pytest.raises(RenderError, match="needs 'gpus'"):
        render(site, "alice", "a800")


def test_render_k8s_command(restricted):
    out = subprocess.run(
        [
            METERHUB,
            "render-k8s",
            "--config",
            str(restricted),
            "--user",
            "dan",
            "--profile",
            "a800",
            "--gpus",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pod, pvc = yaml.safe_load_all(out.stdout)
    assert pod["kind"] == "Pod" and pvc["metadata"]["name"] == "claim-dan"
    for args, message in (
        (["--profile", "h800", "--gpus", "1"], "H800 is limited to the groups lab-a"),
        (["--profile", "a800", "--gpus", "3"], "'gpus' must be one of 1, 2, 4, 8"),
    ):
        out = subprocess.run(
            [METERHUB, "render-k8s", "--config", str(restricted), "--user", "dan", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and message in out.stderr and not out.stdout


def test_inside_z2jh_each_start_begins_from_the_configuration(tmp_path):
    """z2jh's jupyterhub_config.py sets `singleuser` values on KubeSpawner before our
    extraConfig runs; the spawner object then outlives each server it starts."""
    import asyncio

    from traitlets.config import Config

    from meterhub.hub.k8s import configure
    from meterhub.hub.render_k8s import offline_spawner, start_manifests

    path = tmp_path / "meterhub.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kubernetes": {
                    "image": "registry.example/cpu:1",
                    "gpu_image": "registry.example/cuda:1",
                    "debug_node_selector": {"node-pool": "cpu"},
                }
            }
        )
    )
    c = Config()  # what z2jh's own config leaves behind (values from its defaults)
    c.KubeSpawner.profile_list = []
    c.KubeSpawner.image = "quay.io/jupyterhub/k8s-singleuser-sample:4.3.3"
    c.KubeSpawner.pvc_name_template = "claim-{user_server}"  # KubeSpawner's own default
    dedicated = {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user",
                 "effect": "NoSchedule"}  # fmt: skip
    c.KubeSpawner.tolerations = [dedicated]
    c.KubeSpawner.node_selector = {"hub.jupyter.org/node-purpose": "user"}
    c.KubeSpawner.extra_resource_limits = {}
    configure(c, str(path))

    async def starts():
        spawner = offline_spawner(c, "alice")
        pods = []
        for options in ({"profile": "a800", "gpus": "2"}, {"profile": "debug"},
                        {"profile": "rtx4090", "gpus": "1"}):  # fmt: skip
            pod, pvc = await start_manifests(spawner, options)
            assert pvc["metadata"]["name"] == "claim-alice"
            pods.append(spec_of(pod))
        return pods

    (a800, a800_c), (debug, debug_c), (rtx, rtx_c) = asyncio.run(starts())
    assert a800_c["image"] == rtx_c["image"] == "registry.example/cuda:1"
    assert debug_c["image"] == "registry.example/cpu:1"
    assert a800_c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert rtx_c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in debug_c["resources"]["limits"]
    assert debug["tolerations"] == [dedicated]  # z2jh's kept, the GPU one not carried over
    assert dedicated in a800["tolerations"] and len(a800["tolerations"]) == 2
    assert debug["nodeSelector"] == {"hub.jupyter.org/node-purpose": "user", "node-pool": "cpu"}
    assert rtx["nodeSelector"] == {"hub.jupyter.org/node-purpose": "user"}
    assert "affinity" not in debug
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(rtx_c)
    assert env_of(debug_c)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert set(volumes_of(debug)) == {"home", "public", "shm"}


# ------------------------------------------------------------ inside the real z2jh hub config


def _site_file(tmp_path, site: dict | None = None) -> str:
    path = tmp_path / "meterhub.yaml"
    base = {"billing": {"db_url": f"sqlite:///{tmp_path}/ledger.sqlite"}}
    path.write_text(yaml.safe_dump({**base, **(site or {})}))
    return str(path)


def _z2jh_then_meterhub(path: str, meterhub_first: bool = False, **singleuser):
    """z2jh's jupyterhub_config.py, then meterhub's hub.extraConfig (or the reverse)."""
    from traitlets.config import Config

    from meterhub.hub.k8s import configure

    from .k8s.z2jh import apply_z2jh_config

    c = Config()
    if meterhub_first:
        configure(c, path)
        apply_z2jh_config(c, **singleuser)
    else:
        apply_z2jh_config(c, **singleuser)
        configure(c, path)
    return c


async def _effective(c, user="alice", groups=()):
    from jupyterhub.utils import maybe_future

    from meterhub.hub.render_k8s import offline_spawner

    spawner = offline_spawner(c, user, groups)
    profiles = await maybe_future(spawner.profile_list(spawner))
    return spawner, profiles


@pytest.mark.parametrize("meterhub_first", [False, True], ids=["z2jh-first", "meterhub-first"])
def test_meterhub_settings_hold_over_z2jh_config_in_either_order(
    tmp_path, monkeypatch, meterhub_first
):
    """Every spawner trait z2jh's jupyterhub_config.py assigns (tests/k8s/z2jh.py), then
    meterhub's configure(c): what the spawner really uses is meterhub's."""
    import asyncio

    from meterhub.billing_hooks import hooks
    from meterhub.hub.render_k8s import start_manifests
    from meterhub.spawner.catalog import GPU_TYPES

    monkeypatch.setenv("METERHUB_BILLING_SERVICE_URL", "http://lab-meterhub-billing:8082")
    path = _site_file(tmp_path)
    c = _z2jh_then_meterhub(
        path,
        meterhub_first=meterhub_first,
        environment={"TZ": "Asia/Shanghai"},  # an operator's singleuser.extraEnv
    )
    api = "http://lab-meterhub-billing:8082/services/billing/api/v1"

    async def check():
        spawner, profiles = await _effective(c)
        assert spawner.environment["METERHUB_BILLING_URL"] == api
        assert spawner.environment["TZ"] == "Asia/Shanghai"  # z2jh's kept, merged
        assert spawner.get_env()["METERHUB_BILLING_URL"] == api
        (command,) = [spawner.lifecycle_hooks["postStart"]["exec"]["command"]]
        assert "/opt/meterhub/notebooks/*.ipynb" in command[2]
        assert [p["slug"] for p in profiles] == ["debug", *GPU_TYPES]
        assert set(spawner.volumes) == {"home", "public"}
        assert spawner.volumes["public"]["persistentVolumeClaim"]["readOnly"] is True
        assert spawner.pvc_name_template == "claim-{username}"
        assert spawner.storage_capacity == "20Gi"
        assert spawner.pre_spawn_hook is hooks.billed_pre_spawn
        assert spawner.post_stop_hook is hooks.billed_post_stop
        assert spawner.tolerations  # z2jh's own, not meterhub's, are kept
        pod, pvc = await start_manifests(spawner, {"profile": "a800", "gpus": "1"})
        return pod, pvc

    pod, pvc = asyncio.run(check())
    spec, container = spec_of(pod)
    assert env_of(container)["METERHUB_BILLING_URL"] == api
    assert env_of(container)["TZ"] == "Asia/Shanghai"
    assert container["lifecycle"]["postStart"]["exec"]["command"][0] == "sh"
    assert set(volumes_of(spec)) == {"home", "public", "shm"}
    assert pvc["metadata"]["name"] == "claim-alice"
    for document in (pod, pvc):
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[-1], strict=True)


# ------------------------------------------------------------ z2jh values meterhub owns


def _refusal(trait: str) -> str:
    from meterhub.hub.k8s import Z2JH_OWNED

    return Z2JH_OWNED[trait][1]


def test_every_owned_trait_has_a_refusal_and_z2jhs_version_is_the_pinned_one():
    from meterhub.hub.k8s import Z2JH_OWNED, Z2JH_VERSION
    from meterhub.spawner.kube import OWNED_TRAITS

    from .k8s.z2jh import Z2JH_VERSION as STAND_IN_VERSION

    assert set(Z2JH_OWNED) == {*OWNED_TRAITS, "image"}
    chart = yaml.safe_load((Path(__file__).parent.parent / "helm/meterhub/Chart.yaml").read_text())
    assert Z2JH_VERSION == STAND_IN_VERSION == chart["dependencies"][0]["version"]


@pytest.mark.parametrize(
    "singleuser, trait, z2jh_value",
    [
        ({"uid": 0}, "uid", "jupyterhub.singleuser.uid"),
        ({"fs_gid": 0}, "fs_gid", "jupyterhub.singleuser.fsGid"),
        ({"allow_privilege_escalation": True}, "allow_privilege_escalation",
         "jupyterhub.singleuser.allowPrivilegeEscalation"),
        # allowPrivilegeEscalation: null reaches KubeSpawner as None
        ({"allow_privilege_escalation": None}, "allow_privilege_escalation",
         "jupyterhub.singleuser.allowPrivilegeEscalation"),
        ({"image": "registry.example/lab:1"}, "image", "jupyterhub.singleuser.image"),
        ({"profile_list": [{"display_name": "big"}]}, "profile_list",
         "jupyterhub.singleuser.profileList"),
        ({"extra_volumes": [{"name": "data", "emptyDir": {}}]}, "volumes",
         "jupyterhub.singleuser.storage (type, extraVolumes)"),
        ({"extra_volume_mounts": [{"name": "data", "mountPath": "/data"}]}, "volume_mounts",
         "singleuser.storage (type, homeMountPath, extraVolumeMounts)"),
        ({"storage_dynamic": True}, "storage_pvc_ensure", "jupyterhub.singleuser.storage.type"),
    ],
)  # fmt: skip
def test_z2jh_singleuser_values_meterhub_would_drop_stop_the_hub(
    tmp_path, singleuser, trait, z2jh_value
):
    from meterhub.hub.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _z2jh_then_meterhub(_site_file(tmp_path), **singleuser)
    message = str(e.value)
    assert f"c.KubeSpawner.{trait} = " in message
    assert z2jh_value in message and _refusal(trait) in message


@pytest.mark.parametrize(
    "section, trait, value",
    [
        ("KubeSpawner", "gid", 0),
        ("KubeSpawner", "storage_class", "fast"),
        ("KubeSpawner", "storage_capacity", "1Ti"),
        ("Spawner", "container_security_context", {"privileged": True}),
        ("KubeSpawner", "automount_service_account_token", True),
        ("Spawner", "uid", 0),
    ],
)
def test_owned_traits_from_hub_config_stop_the_hub(tmp_path, section, trait, value):
    """hub.config (or an earlier extraConfig) lands on c.KubeSpawner / c.Spawner too."""
    from meterhub.hub.config import ConfigError

    c = apply_z2jh_defaults()
    c[section][trait] = value
    with pytest.raises(ConfigError) as e:
        _configure(c, _site_file(tmp_path))
    assert f"c.{section}.{trait} = {value!r}" in str(e.value) and _refusal(trait) in str(e.value)


def apply_z2jh_defaults():
    from traitlets.config import Config

    from .k8s.z2jh import apply_z2jh_config

    return apply_z2jh_config(Config())


def _configure(c, path):
    from meterhub.hub.k8s import configure

    return configure(c, path)


def test_z2jh_defaults_and_kubespawners_own_pass(tmp_path):
    c = apply_z2jh_defaults()
    c.KubeSpawner.storage_access_modes = ["ReadWriteOnce"]  # KubeSpawner's default
    c.KubeSpawner.allow_privilege_escalation = False
    c.KubeGPUSpawner.uid = 2000  # meterhub's own section: read (site.kubernetes.uid sets it)
    _configure(c, _site_file(tmp_path))


def test_the_servers_billing_url_follows_the_hub_base_url(tmp_path, monkeypatch):
    """z2jh sets c.JupyterHub.base_url from jupyterhub.hub.baseUrl; JupyterHub then puts the
    billing service at {base_url}services/billing/, and the proxy forwards the whole path."""
    import asyncio

    from jupyterhub.services.service import Service

    monkeypatch.setenv("METERHUB_BILLING_SERVICE_URL", "http://lab-meterhub-billing:8082")
    for configured, base in (("/jupyter/", "/jupyter/"), ("/a/b", "/a/b/"), ("/", "/")):
        c = apply_z2jh_defaults()
        c.JupyterHub.base_url = configured
        _configure(c, _site_file(tmp_path))
        prefix = Service(name="billing", base_url=base).prefix
        assert prefix == f"{base}services/billing/"
        api = f"http://lab-meterhub-billing:8082{prefix}api/v1"
        assert c.KubeGPUSpawner.meterhub_environment == {"METERHUB_BILLING_URL": api}
        spawner, _ = asyncio.run(_effective(c))
        assert spawner.get_env()["METERHUB_BILLING_URL"] == api


def test_an_operators_post_start_hook_runs_after_the_starter_copy(tmp_path):
    import asyncio

    theirs = {"postStart": {"exec": {"command": ["sh", "-c", "echo hi > /tmp/x"]}}}
    c = _z2jh_then_meterhub(_site_file(tmp_path), lifecycle_hooks=theirs)
    spawner, _ = asyncio.run(_effective(c))
    command = spawner.lifecycle_hooks["postStart"]["exec"]["command"]
    script = command[2]
    assert script.startswith("( marker=") and script.endswith("; sh -c 'echo hi > /tmp/x'")


def test_the_billing_service_url_comes_from_the_chart_not_a_constant(tmp_path, monkeypatch):
    from traitlets.config import Config

    from meterhub.hub.k8s import configure

    monkeypatch.setenv("METERHUB_BILLING_SERVICE_URL", "http://lab-b-meterhub-billing:8082/")
    c = Config()
    c.JupyterHub.services = [{"name": "billing", "display": False}, {"name": "other"}]
    configure(c, _site_file(tmp_path))
    billing, other = c.JupyterHub.services
    assert billing["url"] == "http://lab-b-meterhub-billing:8082"
    assert "url" not in other
    assert c.KubeGPUSpawner.meterhub_environment == {
        "METERHUB_BILLING_URL": "http://lab-b-meterhub-billing:8082/services/billing/api/v1"
    }


@pytest.mark.parametrize(
    "key, value, instead",
    [
        ("auth", {"type": "github"}, "jupyterhub.hub.config"),
        ("gpus", [{"type": "a800", "count": 8}], "site.kubernetes.node_products"),
        ("local", {"sandbox": "off"}, "site.kubernetes"),
        ("data_dir", "/var/lib/meterhub", "billing.database"),
    ],
)
def test_local_only_keys_are_refused_on_kubernetes(tmp_path, key, value, instead):
    from traitlets.config import Config

    from meterhub.hub.config import ConfigError
    from meterhub.hub.k8s import configure

    path = _site_file(tmp_path, {key: value})
    with pytest.raises(ConfigError) as e:
        configure(Config(), path)
    assert f"{key}: only used by the local backend" in str(e.value) and instead in str(e.value)


# ------------------------------------------------------------ billing cannot be configured away


def _operator_hooks(calls: list):
    async def their_pre_spawn(spawner):
        calls.append(("pre", spawner.user.name))

    def their_post_stop(spawner):
        calls.append(("post", spawner.user.name))

    return their_pre_spawn, their_post_stop


def _ledger(path: str):
    from meterhub.billing_hooks.settings import BillingSettings
    from meterhub.hub.config import load_site_config

    site = load_site_config(path)
    return BillingSettings(db_url=site["billing"]["db_url"]).ledger()


@pytest.mark.parametrize("section", ["Spawner", "KubeSpawner"])
def test_an_operators_hooks_on_kubernetes_run_after_billing(tmp_path, section):
    """An operator's later hub.extraConfig sets c.Spawner (or c.KubeSpawner) hooks: billing
    still opens and settles the session, and their hooks run too."""
    import asyncio

    from jupyterhub.utils import maybe_future

    calls: list = []
    path = _site_file(tmp_path)
    c = _z2jh_then_meterhub(path)
    c[section].pre_spawn_hook, c[section].post_stop_hook = _operator_hooks(calls)
    ledger = _ledger(path)

    async def run():
        spawner, _ = await _effective(c)
        spawner.user_options = {"profile": "debug"}
        await maybe_future(spawner.run_pre_spawn_hook())
        (session,) = ledger.open_sessions("alice")  # billing opened it, at debug's rate
        assert calls == [("pre", "alice")] and session.profile == "debug"
        await maybe_future(spawner.run_post_stop_hook())
        assert calls == [("pre", "alice"), ("post", "alice")]

    asyncio.run(run())
    assert not ledger.open_sessions("alice")  # settled


def test_an_operators_hook_cannot_make_a_spawn_free(tmp_path):
    import asyncio

    from tornado import web

    calls: list = []
    path = _site_file(tmp_path, {"billing": {"db_url": f"sqlite:///{tmp_path}/ledger.sqlite",
                                             "trial_credit": "0.00"}})  # fmt: skip
    c = _z2jh_then_meterhub(path)
    c.Spawner.pre_spawn_hook, c.Spawner.post_stop_hook = _operator_hooks(calls)

    async def run():
        spawner, _ = await _effective(c)
        spawner.user_options = {"profile": "a800", "gpus": "1"}
        await spawner.run_pre_spawn_hook()

    with pytest.raises(web.HTTPError) as e:
        asyncio.run(run())
    assert e.value.status_code == 402
    assert calls == []  # refused before the operator's hook
    assert not _ledger(path).open_sessions("alice")


def test_an_operators_hooks_on_the_local_backend_run_after_billing(tmp_path):
    """The same for LocalGPUSpawner: c.Spawner hooks set after meterhub's config add to
    billing's, they do not replace it."""
    import asyncio

    from jupyterhub.utils import maybe_future
    from traitlets.config import Config

    from meterhub.hub.config import apply_config, load_site_config
    from meterhub.hub.render_k8s import _fake_user
    from meterhub.spawner.local import LocalGPUSpawner

    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    c = apply_config(load_site_config(path), Config())
    calls: list = []
    c.Spawner.pre_spawn_hook, c.Spawner.post_stop_hook = _operator_hooks(calls)
    spawner = LocalGPUSpawner(config=c, user=_fake_user("alice", ()))
    ledger = _ledger(str(path))

    async def run():
        spawner.user_options = {"profile": "debug"}
        await maybe_future(spawner.run_pre_spawn_hook())
        assert len(ledger.open_sessions("alice")) == 1 and calls == [("pre", "alice")]
        await maybe_future(spawner.run_post_stop_hook())

    asyncio.run(run())
    assert calls == [("pre", "alice"), ("post", "alice")]
    assert not ledger.open_sessions("alice")


def test_group_members_mount_their_groups_shared_claims(site):
    documents = render(site, "alice", "a800", 1, groups=["vision", "lab_b"])
    pod, home, *claims = documents
    assert home["metadata"]["name"] == "claim-alice"
    for version in KUBERNETES_VERSIONS:
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)
    spec, container = spec_of(pod)
    volumes, mounts = volumes_of(spec), mounts_of(container)
    assert volumes["group-vision"]["persistentVolumeClaim"] == {
        "claimName": "meterhub-group-vision"
    }
    assert mounts["/home/jovyan/shared/vision"] == {
        "mountPath": "/home/jovyan/shared/vision",
        "name": "group-vision",
    }
    # `_` is no DNS character: the claim gets a stable name of its own, not lab-b's
    odd = mounts["/home/jovyan/shared/lab_b"]["name"]
    assert odd.startswith("group-lab-b-") and odd != "group-lab-b"
    names = [m["mountPath"] for m in container["volumeMounts"]]
    assert names.index("/home/jovyan") < names.index("/home/jovyan/shared/vision")
    by_group = {c["metadata"]["annotations"]["meterhub.io/group"]: c for c in claims}
    assert set(by_group) == {"vision", "lab_b"}
    vision = by_group["vision"]
    assert vision["metadata"]["name"] == "meterhub-group-vision"
    assert vision["spec"]["accessModes"] == ["ReadWriteMany"]
    assert vision["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert (
        by_group["lab_b"]["metadata"]["name"] == volumes[odd]["persistentVolumeClaim"]["claimName"]
    )


def test_a_user_in_no_shared_group_gets_no_group_volume(site):
    pod, pvc = render(site, "alice", "debug")
    spec, container = spec_of(pod)
    assert not [v for v in volumes_of(spec) if v.startswith("group-")]
    assert not [m for m in mounts_of(container) if "/shared/" in m]


async def _start_in_groups(c, groups, properties):
    """A KubeGPUSpawner's start for a user in `groups` (each with `properties`)."""
    from types import SimpleNamespace

    from meterhub.hub.render_k8s import offline_spawner, start_manifests

    spawner = offline_spawner(c, "alice")
    spawner.user.groups = [
        SimpleNamespace(name=g, id=i, properties=properties) for i, g in enumerate(groups, 1)
    ]
    return spawner, await start_manifests(spawner, {"profile": "debug"})


def test_groups_without_a_shared_folder_or_with_the_trait_off_get_none():
    import asyncio

    from traitlets.config import Config

    from meterhub.hub.render_k8s import start_manifests

    async def check():
        c = Config()
        _, documents = await _start_in_groups(c, ["vision"], {})
        assert len(documents) == 2
        c.KubeGPUSpawner.group_folders = False
        _, documents = await _start_in_groups(c, ["vision"], {"shared_folder": True})
        assert len(documents) == 2
        c = Config()
        c.KubeGPUSpawner.group_folder_claim_template = "shared-{group}"
        c.KubeGPUSpawner.group_folder_storage_class = "nfs-rwx"
        c.KubeGPUSpawner.group_folder_capacity = "1Ti"
        spawner, (pod, _, claim) = await _start_in_groups(c, ["vision"], {"shared_folder": True})
        assert claim["metadata"]["name"] == "shared-vision"
        assert claim["spec"]["storageClassName"] == "nfs-rwx"
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Ti"
        # the spawner outlives the server: removed from the group, no mount next start
        spawner.user.groups = []
        pod, *rest = await start_manifests(spawner, {"profile": "debug"})
        assert len(rest) == 1 and "/home/jovyan/shared/vision" not in mounts_of(spec_of(pod)[1])

    asyncio.run(check())


def test_the_spawner_ensures_the_claims_before_the_pod_and_tolerates_existing_ones():
    """`_start` creates each group's claim (409 "already exists" is success) first."""
    import asyncio
    from types import SimpleNamespace

    from kubernetes_asyncio.client.rest import ApiException
    from traitlets.config import Config

    from meterhub.hub.render_k8s import offline_spawner

    created: list[str] = []

    class FakeApi:
        async def create_namespaced_persistent_volume_claim(self, namespace, body):
            created.append(body.metadata.name)
            if body.metadata.name == "meterhub-group-nlp":
                raise ApiException(status=409, reason="AlreadyExists")

    async def check():
        spawner = offline_spawner(Config(), "alice")
        spawner.user.groups = [
            SimpleNamespace(name=g, id=i, properties={"shared_folder": True})
            for i, g in enumerate(["nlp", "vision"], 1)
        ]
        spawner.api = FakeApi()
        await spawner.ensure_group_claims(spawner.user_shared_groups())

    asyncio.run(check())
    assert created == ["meterhub-group-nlp", "meterhub-group-vision"]


def test_render_k8s_shows_a_groups_folder(restricted):
    out = subprocess.run(
        [METERHUB, "render-k8s", "--config", str(restricted), "--user", "dan"]
        + ["--profile", "debug", "--group", "vision"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pod, _, claim = yaml.safe_load_all(out.stdout)
    assert "/home/jovyan/shared/vision" in mounts_of(spec_of(pod)[1])
    assert claim["kind"] == "PersistentVolumeClaim"
    assert claim["metadata"]["name"] == "meterhub-group-vision"
