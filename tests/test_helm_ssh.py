"""The chart's SSH front door (`ssh.enabled`): its Deployment, Service, host-key Secret and
network policy, rendered by Helm's engine and validated like every other object; what the
gateway is told matches what `meterhub ssh serve` reads."""

from __future__ import annotations

import asyncio
import base64

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from meterhub.hub.config import SCHEMA as SITE_SCHEMA
from meterhub.hub.config import load_site_config

from .test_helm_chart import CHART, DB, KUBERNETES_VERSIONS, _prefixed, by_kind, merged, objects

SSH = merged(DB, {"ssh": {"enabled": True}})
NAMES = {
    ("Deployment", "meterhub-ssh"),
    ("Service", "meterhub-ssh"),
    ("Secret", "meterhub-ssh-host-key"),
    ("NetworkPolicy", "meterhub-ssh"),
}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _pod(found: dict, name: str = "meterhub-ssh") -> dict:
    return found[("Deployment", name)]["spec"]["template"]["spec"]


def _container(found: dict, name: str = "meterhub-ssh") -> dict:
    (container,) = _pod(found, name)["containers"]
    return container


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container["env"]}


def _host_key(found: dict, name: str = "meterhub-ssh-host-key") -> str:
    (encoded,) = found[("Secret", name)]["data"].values()
    return base64.b64decode(encoded).decode()


def test_off_by_default_nothing_of_it_is_rendered(chart):
    found = by_kind(objects(chart, DB))
    assert not {key for key in found if "ssh" in key[1]}
    ingress = found[("NetworkPolicy", "meterhub-billing")]["spec"]["ingress"]
    assert "meterhub-ssh" not in yaml.safe_dump(ingress)
    notes = chart.render(DB, name="gpu", namespace="gpu-lab")["meterhub/templates/NOTES.txt"]
    assert "SSH" not in notes
    enabled = chart.render(SSH, name="gpu", namespace="gpu-lab")["meterhub/templates/NOTES.txt"]
    assert "kubectl -n gpu-lab get svc meterhub-ssh" in enabled and "ssh -p 22 " in enabled


@pytest.mark.parametrize(
    "service",
    [
        {},
        {"type": "NodePort", "nodePort": 30022},
        {"type": "ClusterIP", "port": 2222},
        {
            "loadBalancerIP": "203.0.113.7",
            "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "annotations": {"metallb.universe.tf/allow-shared-ip": "gpu"},
        },
    ],
)
def test_enabled_its_objects_validate_on_every_kubernetes_version(chart, service):
    found = by_kind(objects(chart, merged(SSH, {"ssh": {"service": service}})))
    assert NAMES <= set(found)
    for version in KUBERNETES_VERSIONS:
        for obj in found.values():
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_service_exposes_port_22_and_keeps_clients_addresses(chart):
    spec = by_kind(objects(chart, SSH))[("Service", "meterhub-ssh")]["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["ports"] == [{"name": "ssh", "port": 22, "targetPort": "ssh"}]
    # failed logins are counted per client address: Cluster would hide it behind nodes
    assert spec["externalTrafficPolicy"] == "Local"
    assert spec["selector"] == {
        "app.kubernetes.io/name": "meterhub",
        "app.kubernetes.io/instance": "gpu",
        "app.kubernetes.io/component": "meterhub-ssh",
    }
    pod = by_kind(objects(chart, SSH))[("Deployment", "meterhub-ssh")]["spec"]["template"]
    assert spec["selector"].items() <= pod["metadata"]["labels"].items()
    values = {"ssh": {"service": {"type": "ClusterIP", "port": 2222, "nodePort": 30022,
                                  "loadBalancerSourceRanges": ["10.0.0.0/8"]}}}  # fmt: skip
    internal = by_kind(objects(chart, merged(SSH, values)))[("Service", "meterhub-ssh")]["spec"]
    assert internal["ports"] == [{"name": "ssh", "port": 2222, "targetPort": "ssh"}]
    for key in ("externalTrafficPolicy", "loadBalancerSourceRanges"):
        assert key not in internal, key
    values = {"ssh": {"service": {"loadBalancerSourceRanges": ["10.0.0.0/8"],
                                  "annotations": {"a": "b"}}}}  # fmt: skip
    service = by_kind(objects(chart, merged(SSH, values)))[("Service", "meterhub-ssh")]
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert service["metadata"]["annotations"] == {"a": "b"}


def test_the_gateway_is_told_the_hub_the_proxy_billing_and_its_token(chart):
    found = by_kind(objects(chart, SSH))
    container = _container(found)
    assert container["command"] == [
        "meterhub", "ssh", "serve", "--config", "/etc/meterhub/meterhub.yaml",
    ]  # fmt: skip
    env = _env(container)
    assert env["JUPYTERHUB_API_URL"]["value"] == "http://hub:8081/hub/api"
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub",
        "key": "hub.services.ssh.apiToken",
    }
    assert env["METERHUB_SSH_SERVER_URL"]["value"] == "http://proxy-public"
    assert (
        env["METERHUB_BILLING_URL"]["value"]
        == "http://meterhub-billing:8082/services/billing/api/v1"
    )
    assert "METERHUB_PUBLIC_URL" not in env
    # the host key's path is where its Secret is mounted
    key_path = env["METERHUB_SSH_HOST_KEY"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "host-key"]
    (volume,) = [v for v in _pod(found)["volumes"] if v["name"] == "host-key"]
    (item,) = volume["secret"]["items"]
    assert key_path == f"{mount['mountPath']}/{item['path']}"
    assert volume["secret"]["secretName"] == "meterhub-ssh-host-key"
    assert item["key"] == "ssh_host_ed25519_key"
    assert set(found[("Secret", "meterhub-ssh-host-key")]["data"]) == {"ssh_host_ed25519_key"}
    # readable by the gateway's group (fsGroup), by nobody else
    assert volume["secret"]["defaultMode"] == 0o440
    assert _pod(found)["securityContext"]["fsGroup"] == _pod(found)["securityContext"]["runAsUser"]

    public = merged(SSH, {"ssh": {"publicUrl": "https://gpu.example.org/"}})
    env = _env(_container(by_kind(objects(chart, public))))
    assert env["METERHUB_PUBLIC_URL"]["value"] == "https://gpu.example.org"


def test_what_the_pod_gets_is_what_the_gateway_reads(chart, tmp_path):
    """`meterhub ssh serve`'s settings from the site ConfigMap the pod mounts and the
    environment the chart gives it: the hub API, the proxy, the billing API, the host key,
    the site's port, and every address of the pod."""
    from meterhub.hub.cli import build_parser
    from meterhub.hub.ssh import settings_from

    values = merged(SSH, {"site": {"ssh": {"port": 2200}}})
    found = by_kind(objects(chart, values))
    site_path = tmp_path / "meterhub.yaml"
    site_path.write_text(found[("ConfigMap", "meterhub-site")]["data"]["meterhub.yaml"])
    container = _container(found)
    environ = {
        name: entry.get("value", "secret-from-the-hub-secret")
        for name, entry in _env(container).items()
    }
    settings = settings_from(load_site_config(site_path), environ)
    assert settings.hub_api == "http://hub:8081/hub/api"
    assert settings.service_token == "secret-from-the-hub-secret"
    assert settings.server_url == "http://proxy-public"
    assert settings.billing_api == "http://meterhub-billing:8082/services/billing/api/v1"
    assert settings.host_key == "/etc/meterhub-ssh/ssh_host_key"
    assert settings.host == ""  # asyncssh: every address of the pod
    assert settings.port == 2200
    assert container["ports"] == [{"name": "ssh", "containerPort": 2200}]
    # the command is the CLI's
    argv = container["command"]
    assert argv[0] == "meterhub"
    args = build_parser().parse_args(argv[1:])
    assert args.config == "/etc/meterhub/meterhub.yaml"


def test_the_port_defaults_to_the_site_configs_default(chart):
    default = SITE_SCHEMA["properties"]["ssh"]["properties"]["port"]["default"]
    (port,) = _container(by_kind(objects(chart, SSH)))["ports"]
    assert port == {"name": "ssh", "containerPort": default}


def test_it_follows_the_base_url(chart):
    values = merged(SSH, {"jupyterhub": {"hub": {"baseUrl": "/jupyter/"}}})
    env = _env(_container(by_kind(objects(chart, values))))
    assert env["JUPYTERHUB_API_URL"]["value"] == "http://hub:8081/jupyter/hub/api"
    assert (
        env["METERHUB_BILLING_URL"]["value"]
        == "http://meterhub-billing:8082/jupyter/services/billing/api/v1"
    )
    # servers' URLs from the hub API carry /jupyter/ already
    assert env["METERHUB_SSH_SERVER_URL"]["value"] == "http://proxy-public"


def test_a_prefix_renames_everything_consistently(chart):
    names = {}
    for release in ("lab-a", "lab-b"):
        values = merged(_prefixed(release, f"{release}-pool"), {"ssh": {"enabled": True}})
        rendered = chart.render(values, name=release, namespace="gpu")
        found = by_kind(
            [
                d
                for p, t in rendered.items()
                if p.endswith(".yaml")
                for d in yaml.safe_load_all(t)
                if d
            ]  # fmt: skip
        )
        names[release] = {key for key in found if "ssh" in key[1]}
        assert names[release] == {(kind, f"{release}-{name}") for kind, name in NAMES}
        pod = _pod(found, f"{release}-meterhub-ssh")
        env = _env(pod["containers"][0])
        assert env["JUPYTERHUB_API_URL"]["value"] == f"http://{release}-hub:8081/hub/api"
        assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{release}-hub"
        assert env["METERHUB_SSH_SERVER_URL"]["value"] == f"http://{release}-proxy-public"
        assert env["METERHUB_BILLING_URL"]["value"].startswith(
            f"http://{release}-meterhub-billing:8082/"
        )
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["site"]["configMap"]["name"] == f"{release}-meterhub-site"
        assert volumes["host-key"]["secret"]["secretName"] == f"{release}-meterhub-ssh-host-key"
        policy = found[("NetworkPolicy", f"{release}-meterhub-ssh")]["spec"]
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == release
        peers = [p["podSelector"]["matchLabels"] for rule in policy["egress"] for p in rule.get("to", [])]  # fmt: skip
        assert {p.get("release", p.get("app.kubernetes.io/instance")) for p in peers} == {release}
        for obj in found.values():
            kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
    assert not names["lab-a"] & names["lab-b"]


def test_an_existing_host_key_secret_is_used_and_none_is_made(chart):
    values = merged(SSH, {"ssh": {"hostKey": {"existingSecret": "lab-ssh", "secretKey": "key"}}})
    found = by_kind(objects(chart, values))
    assert not [key for key in found if key[0] == "Secret" and "ssh" in key[1]]
    (volume,) = [v for v in _pod(found)["volumes"] if v["name"] == "host-key"]
    assert volume["secret"]["secretName"] == "lab-ssh"
    assert volume["secret"]["items"] == [{"key": "key", "path": "ssh_host_key"}]


def test_the_generated_host_key_is_a_fresh_ed25519_key_the_gateway_serves(chart, tmp_path):
    import asyncssh

    first = _host_key(by_kind(objects(chart, SSH)))
    second = _host_key(by_kind(objects(chart, SSH)))
    assert first != second  # generated per install (then kept by lookup), never a constant
    key = asyncssh.import_private_key(first)
    assert key.get_algorithm() == "ssh-ed25519"
    path = tmp_path / "ssh_host_key"
    path.write_text(first)

    async def served_key():
        # as the gateway listens: the key by its path (METERHUB_SSH_HOST_KEY)
        acceptor = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[str(path)])
        try:
            port = acceptor.get_port()
            return await asyncssh.get_server_host_key("127.0.0.1", port)
        finally:
            acceptor.close()
            await acceptor.wait_closed()

    served = asyncio.run(served_key())
    assert served.export_public_key() == key.export_public_key()


def test_the_network_policy_admits_clients_and_reaches_hub_proxy_billing_dns(chart):
    found = by_kind(objects(chart, SSH))
    policy = found[("NetworkPolicy", "meterhub-ssh")]["spec"]
    assert policy["ingress"] == [{"ports": [{"port": "ssh"}]}]  # from anywhere, its port only
    reached = {}
    for rule in policy["egress"]:
        for peer in rule.get("to", [{}]):
            labels = peer.get("podSelector", {}).get("matchLabels", {})
            component = labels.get("component") or labels.get("app.kubernetes.io/component")
            reached[component] = sorted(p["port"] for p in rule["ports"])
    assert reached == {"hub": [8081], "proxy": [8000], "meterhub-billing": [8082], None: [53, 53]}
    labels = found[("Deployment", "meterhub-ssh")]["spec"]["template"]["metadata"]["labels"]
    # z2jh's hub and proxy policies admit pods by these labels
    assert labels["hub.jupyter.org/network-access-hub"] == "true"
    assert labels["hub.jupyter.org/network-access-proxy-http"] == "true"
    # the billing service's own policy admits the gateway
    billing = found[("NetworkPolicy", "meterhub-billing")]["spec"]["ingress"]
    admitted = [p["podSelector"]["matchLabels"] for rule in billing for p in rule.get("from", [])]
    assert {
        "app.kubernetes.io/name": "meterhub",
        "app.kubernetes.io/instance": "gpu",
        "app.kubernetes.io/component": "meterhub-ssh",
    } in admitted
    off = by_kind(objects(chart, merged(SSH, {"ssh": {"networkPolicy": {"enabled": False}}})))
    assert ("NetworkPolicy", "meterhub-ssh") not in off


def test_it_runs_unprivileged_from_the_billing_image(chart):
    values = merged(SSH, {"billing": {"image": {"pullSecrets": ["registry-cred"]}},
                          "ssh": {"nodeSelector": {"pool": "cpu"}, "replicas": 3}})  # fmt: skip
    found = by_kind(objects(chart, values))
    pod, billing = _pod(found), _pod(found, "meterhub-billing")
    container = pod["containers"][0]
    assert container["image"] == billing["containers"][0]["image"] == "ghcr.io/meterhub/hub:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "registry-cred"}]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert found[("Deployment", "meterhub-ssh")]["spec"]["replicas"] == 3
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == billing["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "ssh"}, probe


@pytest.mark.parametrize(
    "https, url",
    [
        ({"enabled": False}, "http://proxy-public"),
        # z2jh's Let's Encrypt pod holds proxy-public: the proxy itself is proxy-http
        ({"enabled": True, "type": "letsencrypt", "hosts": ["gpu.example.org"]}, "http://proxy-http:8000"),
        ({"enabled": True, "type": "offload"}, "http://proxy-public"),
    ],
)  # fmt: skip
def test_the_proxy_url_follows_z2jhs_https_setup(chart, https, url):
    values = merged(SSH, {"jupyterhub": {"proxy": {"https": https}}})
    env = _env(_container(by_kind(objects(chart, values))))
    assert env["METERHUB_SSH_SERVER_URL"]["value"] == url


def test_a_proxy_that_only_redirects_plain_http_needs_a_server_url(chart):
    values = merged(SSH, {"jupyterhub": {"proxy": {"https": {"enabled": True, "type": "secret"}}}})
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert "ssh.serverUrl: jupyterhub.proxy.https.type secret" in str(e.value)
    values = merged(values, {"ssh": {"serverUrl": "http://proxy-internal:8080/"}})
    env = _env(_container(by_kind(objects(chart, values))))
    assert env["METERHUB_SSH_SERVER_URL"]["value"] == "http://proxy-internal:8080"
    offload = {"https": {"enabled": True, "type": "offload"}, "service": {"disableHttpPort": True}}
    env = _env(_container(by_kind(objects(chart, merged(SSH, {"jupyterhub": {"proxy": offload}})))))  # fmt: skip
    assert env["METERHUB_SSH_SERVER_URL"]["value"] == "http://proxy-public:443"


@pytest.mark.parametrize(
    "site, message",
    [
        ({"enabled": True}, "site.ssh.enabled: on Kubernetes the chart runs the SSH front door; set ssh.enabled"),
        ({"ip": "127.0.0.1"}, "site.ssh.ip: on Kubernetes the chart runs the SSH front door"),
        ({"host_key": "/data/key"}, "site.ssh.host_key: on Kubernetes the chart runs the SSH front door; put the key in a Secret"),
    ],
)  # fmt: skip
def test_site_ssh_keys_the_chart_decides_fail_the_render(chart, site, message):
    for values in (DB, SSH):
        with pytest.raises(helm.HelmError) as e:
            chart.render(merged(values, {"site": {"ssh": site}}), name="gpu", namespace="gpu-lab")
        assert message in str(e.value)


@pytest.mark.parametrize(
    "hub, message",
    [
        ({"services": {"ssh": None}}, "jupyterhub.hub.services.ssh: the SSH front door's JupyterHub service is missing"),
        ({"loadRoles": {"meterhub-ssh": {"services": []}}}, "jupyterhub.hub.loadRoles.meterhub-ssh"),
    ],
)  # fmt: skip
def test_without_its_jupyterhub_service_and_role_it_fails_the_render(chart, hub, message):
    values = merged(SSH, {"jupyterhub": {"hub": hub}})
    with pytest.raises(helm.HelmError) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert message in str(e.value)
    chart.render(merged(DB, {"jupyterhub": {"hub": hub}}), name="gpu", namespace="gpu-lab")


def test_its_jupyterhub_service_and_roles():
    """The gateway's token reads only what it asks the hub (a user's groups and servers);
    every user may SSH into their own servers (the scope hub/ssh.py checks)."""
    hub = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"]
    assert hub["services"]["ssh"] == {"display": False}
    role = hub["loadRoles"]["meterhub-ssh"]
    assert role["services"] == ["ssh"]
    assert sorted(role["scopes"]) == ["read:servers", "read:users:groups", "read:users:name"]
    assert "custom:meterhub:ssh!user" in hub["loadRoles"]["user"]["scopes"]


def test_the_values_schema_rejects_what_kubernetes_would(chart):
    for wrong in (
        {"service": {"type": "ExternalName"}},
        {"service": {"externalTrafficPolicy": "local"}},
        {"replicas": 0},
        {"publicUrl": "gpu.example.org"},
        {"serverUrl": "http://proxy-public/hub/"},
        {"hostKey": {"secretKey": ""}},
    ):
        with pytest.raises(helm.HelmError):
            chart.validate_schema(merged(SSH, {"ssh": wrong}))


def test_the_user_role_lets_each_user_ssh_into_their_own_server_only():
    """The chart's `user` role, as JupyterHub expands it for alice (`self`, `!user`), passes
    the gateway's check for alice's server and not for bob's."""
    import warnings

    from jupyterhub import orm
    from jupyterhub import scopes as hub_scopes

    from meterhub.billing_hooks.scopes import CUSTOM_SCOPES, SSH_SCOPE
    from meterhub.hub.ssh import may_ssh

    # what the hub does at start-up (c.JupyterHub.custom_scopes)
    undeclared = {k: v for k, v in CUSTOM_SCOPES.items() if k not in hub_scopes.scope_definitions}
    if undeclared:
        hub_scopes.define_custom_scopes(undeclared)
    role = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"]["loadRoles"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alice = hub_scopes.expand_scopes(
            frozenset(role["user"]["scopes"]), owner=orm.User(name="alice")
        )
    assert f"{SSH_SCOPE}!user=alice" in alice
    assert may_ssh(alice, "alice", set())
    assert not may_ssh(alice, "bob", set())
    # without the SSH scope, access to the server alone does not open it over SSH
    assert not may_ssh({s for s in alice if not s.startswith(SSH_SCOPE)}, "alice", set())


def test_its_role_is_the_one_the_local_hub_gives_its_gateway():
    from meterhub.hub.app import ssh_service

    _, (local,) = ssh_service(load_site_config(None), None, "127.0.0.1", 8000)
    chart_role = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"][
        "loadRoles"][local["name"]]  # fmt: skip
    assert chart_role == {key: local[key] for key in ("description", "scopes", "services")}


def test_lint_finds_no_errors_with_it_enabled():
    report = helm.lint(CHART, SSH)
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert not errors and not report["errors"], report
