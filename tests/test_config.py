"""The site config: schema errors that name the key, and a pure translation to traitlets."""

import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from meterhub.hub.config import ClaimGroups, ConfigError, apply_config, load_site_config
from meterhub.spawner.catalog import IdlePolicy


def write(tmp_path, text) -> Path:
    path = tmp_path / "meterhub.yaml"
    path.write_text(text)
    return path


def test_embedded_default(tmp_path):
    site = load_site_config(None, cwd=str(tmp_path))
    assert site["data_dir"] == str(tmp_path / "meterhub-data")
    assert site["admin_users"] == ["admin"]
    assert site["local"] == {
        "sandbox": "auto",
        "uid_base": 200000,
        "disk_mount_path": "/home/jovyan",
    }
    assert "gpus" not in site  # detect with NVML
    c = apply_config(site, Config())
    assert c.JupyterHub.spawner_class == "meterhub.spawner.local.LocalGPUSpawner"
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path}/meterhub-data/jupyterhub.sqlite"
    assert c.JupyterHub.cleanup_servers is False
    assert c.LocalGPUSpawner.pool_dir == str(tmp_path / "meterhub-data" / "pool")
    assert "gpus" not in c.LocalGPUSpawner
    assert c.Catalog.prices == {}


def test_apply_config_translates_every_key(tmp_path):
    path = write(
        tmp_path,
        """
data_dir: /srv/mh
public_dir: /srv/pool
gpus: [{type: a800, count: 2}, {type: rtx4090, count: 1}]
profiles:
  a800: {price_per_hour: 4.8}
  debug: {price_per_hour: "0.05"}
admin_users: [boss, deputy]
hub: {api_port: 9081, proxy_api_port: 9001}
local: {sandbox: off, uid_base: 300000, disk_mount_path: /home/student}
""",
    )
    c = apply_config(load_site_config(path), Config())
    assert c.LocalGPUSpawner.data_dir == "/srv/mh"
    assert c.LocalGPUSpawner.pool_dir == "/srv/pool"
    assert c.LocalGPUSpawner.gpus == [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}]
    assert c.LocalGPUSpawner.sandbox == "off"  # YAML's bare `off` is false
    assert c.LocalGPUSpawner.uid_base == 300000
    assert c.LocalGPUSpawner.disk_mount_path == "/home/student"
    assert c.Catalog.prices == {"a800": "4.80", "debug": "0.05"}
    assert c.Authenticator.admin_users == {"boss", "deputy"}
    assert c.JupyterHub.hub_port == 9081
    assert c.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:9001"


def test_apply_config_is_pure():
    site = load_site_config(None, cwd="/x")
    before = repr(site)
    first = apply_config(site, Config())
    assert apply_config(site, Config()) == first
    assert repr(site) == before


@pytest.mark.parametrize(
    "text, named",
    [
        ("datadir: /x", "datadir: unknown key"),
        ("profiles: {a800: {pryce: 1}}", "profiles.a800.pryce: unknown key"),
        ("profiles: {a100: {price_per_hour: 1}}", "profiles.a100: unknown key"),
        ("gpus: [{type: a800, count: 0}]", "gpus.0.count"),
        ("gpus: [{type: v100, count: 1}]", "gpus.0.type"),
        ("gpus: [{type: a800}]", "gpus.0: 'count' is a required property"),
        ("gpus: {a800: 2}", "gpus: {'a800': 2} is not of type 'array'"),
        ("data_dir: 5", "data_dir: 5 is not of type 'string'"),
        ("profiles: {a800: {price_per_hour: 4.555}}", "profiles.a800.price_per_hour"),
        ("profiles: {a800: {price_per_hour: -1}}", "profiles.a800.price_per_hour"),
        ("local: {sandbox: docker}", "local.sandbox"),
        ("hub: {api_port: 70000}", "hub.api_port"),
        ("- a list", "(top level)"),
        ("key: [unclosed", "not valid YAML"),
        ("profiles: {a800: {allowed_groups_by_count: {3: [staff]}}}", "allowed_groups_by_count"),
        ("profiles: {debug: {allowed_groups_by_count: {1: [x]}}}", "debug mode has no GPUs"),
        ("profiles: {h800: {allowed_groups: []}}", "profiles.h800.allowed_groups"),
        ("backend: slurm", "backend"),
        ("kubernetes: {disk_size: 20GB}", "kubernetes.disk_size"),
        ("kubernetes: {node_products: {v100: [x]}}", "kubernetes.node_products.v100: unknown key"),
    ],
)
def test_errors_name_the_key(tmp_path, text, named):
    with pytest.raises(ConfigError) as e:
        load_site_config(write(tmp_path, text))
    assert named in str(e.value)
    assert str(tmp_path / "meterhub.yaml") in str(e.value)


def test_cli_prints_a_readable_line_and_exits_2(tmp_path):
    path = write(tmp_path, "profiles: {a800: {pryce: 1}}\n")
    meterhub = str(Path(sys.executable).parent / "meterhub")
    out = subprocess.run(
        [meterhub, "serve", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "profiles.a800.pryce: unknown key" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "meterhub-data").exists(), "a bad config writes nothing"
    missing = subprocess.run(
        [meterhub, "serve", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_missing_public_dir_is_refused_before_writing(tmp_path):
    path = write(tmp_path, f"data_dir: {tmp_path}/data\npublic_dir: {tmp_path}/no-pool\n")
    meterhub = str(Path(sys.executable).parent / "meterhub")
    out = subprocess.run(
        [meterhub, "serve", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert (
        out.returncode == 2 and "public_dir:" in out.stderr and "is not a directory" in out.stderr
    )
    assert not (tmp_path / "data").exists()


def test_serve_refuses_a_ledger_at_another_schema_with_the_upgrade_command(tmp_path):
    import sqlite3

    from meterhub.billing_hooks.db import connect

    data = tmp_path / "data"
    connect(f"sqlite:///{data}/billing.sqlite").dispose()
    db = sqlite3.connect(data / "billing.sqlite")
    db.execute("UPDATE alembic_version SET version_num = '0000'")
    db.commit()
    db.close()
    path = write(tmp_path, f"data_dir: {data}\n")
    meterhub = str(Path(sys.executable).parent / "meterhub")
    out = subprocess.run(
        [meterhub, "serve", "--config", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "meterhub billing upgrade-db" in out.stderr and "Traceback" not in out.stderr


def test_group_restrictions_and_the_kubernetes_backend(tmp_path):
    path = write(
        tmp_path,
        """
backend: kubernetes
profiles:
  h800: {allowed_groups: [lab-a, staff]}
  a800: {allowed_groups_by_count: {8: [staff], "4": [staff]}}
kubernetes:
  image: registry.example/cpu:1
  gpu_image: registry.example/cuda:1
  namespace: gpu-users
  disk_size: 100Gi
  storage_class: ssd
  public_claim: pool
  node_products: {rtx4090: [NVIDIA-GeForce-RTX-4090-D]}
  debug_node_selector: {pool: cpu}
  uid: 1001
""",
    )
    c = apply_config(load_site_config(path), Config())
    assert c.JupyterHub.spawner_class == "meterhub.spawner.kube.KubeGPUSpawner"
    assert c.Catalog.allowed_groups == {"h800": ["lab-a", "staff"]}
    assert c.Catalog.allowed_groups_by_count == {"a800": {"8": ["staff"], "4": ["staff"]}}
    k = c.KubeGPUSpawner
    assert (k.image, k.gpu_image, k.namespace) == (
        "registry.example/cpu:1",
        "registry.example/cuda:1",
        "gpu-users",
    )
    assert (k.storage_capacity, k.storage_class, k.public_claim_name) == ("100Gi", "ssd", "pool")
    assert k.node_products == {"rtx4090": ["NVIDIA-GeForce-RTX-4090-D"]}
    assert (k.debug_node_selector, k.uid) == ({"pool": "cpu"}, 1001)
    default = apply_config(load_site_config(None, cwd=str(tmp_path)), Config())
    assert default.JupyterHub.spawner_class == "meterhub.spawner.local.LocalGPUSpawner"


@pytest.mark.parametrize(
    "auth, cls, expected",
    [
        (
            "{type: github, oauth: {client_id: abc, client_secret: s3, callback_url: 'https://hub.example/hub/oauth_callback', allowed_groups: [lab-org]}}",
            "GitHubOAuthenticator",
            {"client_id": "abc", "client_secret": "s3", "allowed_organizations": {"lab-org"}},
        ),
        (
            "{type: gitlab, oauth: {client_id: abc, gitlab_url: 'https://git.example', allowed_groups: [ml]}}",
            "GitLabOAuthenticator",
            {"gitlab_url": "https://git.example", "allowed_gitlab_groups": {"ml"}},
        ),
        (
            "{type: generic-oauth, oauth: {client_id: abc, authorize_url: 'https://id.example/auth', token_url: 'https://id.example/token', userdata_url: 'https://id.example/userinfo', allowed_groups: [gpu-users]}}",
            "GenericOAuthenticator",
            {
                "authorize_url": "https://id.example/auth",
                "username_claim": "preferred_username",
                "allowed_groups": {"gpu-users"},
                "manage_groups": True,
                "auth_state_groups_key": ClaimGroups("groups"),
            },
        ),
    ],
)
def test_oauth_sign_in(tmp_path, auth, cls, expected):
    c = apply_config(load_site_config(write(tmp_path, f"auth: {auth}")), Config())
    assert c.JupyterHub.authenticator_class.endswith("." + cls)
    for key, value in expected.items():
        assert c[cls][key] == value, key


def test_native_sign_in_is_the_default(tmp_path):
    c = apply_config(load_site_config(None, cwd=str(tmp_path)), Config())
    assert c.JupyterHub.authenticator_class == "meterhub.hub.auth.MeterNativeAuthenticator"
    assert c.NativeAuthenticator.open_signup is False
    assert c.NativeAuthenticator.minimum_password_length == 8
    path = write(tmp_path, "auth: {open_signup: true, enable_signup: false}")
    c = apply_config(load_site_config(path), Config())
    assert (
        c.NativeAuthenticator.open_signup is True and c.NativeAuthenticator.enable_signup is False
    )


@pytest.mark.parametrize(
    "auth", ["{type: native}", "{type: github, oauth: {client_id: abc, allow_all: true}}"]
)
def test_every_sign_in_has_one_username_rule_and_samesite_cookies(tmp_path, auth):
    from meterhub.hub.accounts import NAME, USERNAME_PATTERN

    c = apply_config(load_site_config(write(tmp_path, f"auth: {auth}")), Config())
    # on c.Authenticator: sign-up, the login page, OAuth and the admin API all check it
    assert c.Authenticator.username_pattern == USERNAME_PATTERN == NAME.pattern
    # JupyterHub applies cookie_options to the xsrf cookie too; Secure is left to JupyterHub
    assert c.JupyterHub.tornado_settings["cookie_options"] == {"samesite": "Lax"}
    for good in ("stu", "ada.l-b_2", "ada@example.org", "a" * 64):
        assert NAME.match(good), good
    for bad in ("x\ttabindex=1\tonfocus=alert(1)", "eve smith", "<b>", '"x', "Eve", "wes\n"):
        assert not NAME.match(bad), bad
    assert not NAME.match("a" * 65) and not NAME.match("-a") and not NAME.match("@a")


def test_samesite_cookies_keep_other_tornado_settings():
    from meterhub.hub.config import apply_auth

    c = Config()
    c.JupyterHub.tornado_settings = {"headers": {"X-Frame-Options": "DENY"}}
    site = {"auth": {"type": "github", "oauth": {"allow_all": True}}}
    settings = apply_auth(site, c).JupyterHub.tornado_settings
    assert settings == {
        "headers": {"X-Frame-Options": "DENY"},
        "cookie_options": {"samesite": "Lax"},
    }


def test_the_schema_defaults_fill_the_site_config(tmp_path):
    from meterhub.hub.config import SCHEMA, complete

    site = complete({"auth": {"type": "github", "oauth": {"client_id": "x"}}}, cwd=str(tmp_path))
    billing = SCHEMA["properties"]["billing"]["properties"]
    assert site["billing"]["warn_minutes"] == billing["warn_minutes"]["default"] == [30, 10, 2]
    assert site["auth"]["type"] == "github" and site["auth"]["enable_signup"] is True
    assert site["auth"]["oauth"]["username_claim"] == "preferred_username"  # given: filled
    assert "oauth" not in complete({})["auth"]  # a nested mapping is filled only when given
    assert "https" not in site and "gpu_types" not in site  # no defaults: presence means something
    assert site["profiles"] == {} and complete({"profiles": {"debug": {"cpu": 4}}})["profiles"] == {
        "debug": {"cpu": 4, "memory_gib": 8, "on_idle": "stop", "on_cap": "stop"}
    }


def test_the_schema_defaults_are_the_traits_defaults():
    """One source: a trait's own default is what the schema says (the schema fills the config)."""
    from meterhub.billing_hooks.settings import BillingSettings
    from meterhub.hub.config import SCHEMA
    from meterhub.spawner.catalog import Catalog

    billing = SCHEMA["properties"]["billing"]["properties"]
    settings = BillingSettings()
    for key in (
        "currency",
        "trial_credit",
        "meter_interval_seconds",
        "min_minutes_to_start",
        "audit_interval_seconds",
    ):
        assert getattr(settings, key) == billing[key]["default"], key
    assert settings.warn_minutes == billing["warn_minutes"]["default"]
    assert (settings.overdraft, settings.max_grant) == ("0", "100000")
    assert (billing["overdraft"]["default"], billing["max_grant"]["default"]) == ("0", "100000")
    debug = SCHEMA["definitions"]["debug_profile"]["properties"]
    catalog = Catalog()
    assert (catalog.debug_cpu, catalog.debug_memory_gib) == (
        debug["cpu"]["default"],
        debug["memory_gib"]["default"],
    )


def test_groups_from_the_identity_provider(tmp_path):
    from meterhub.hub.config import ClaimGroups, github_team_groups

    github = "{type: github, manage_groups: true, oauth: {client_id: abc, allow_all: true}}"
    c = apply_config(load_site_config(write(tmp_path, f"auth: {github}")), Config())
    g = c.GitHubOAuthenticator
    assert g.manage_groups and g.populate_teams_in_auth_state and "read:org" in g.scope
    assert g.auth_state_groups_key is github_team_groups
    teams = [{"organization": {"login": "MIT-Lab"}, "slug": "vision"}]
    assert github_team_groups({"teams": teams}) == ["mit-lab.vision"]
    oidc = (
        "{type: generic-oauth, manage_groups: true, oauth: {client_id: abc, allow_all: true,"
        " groups_claim: roles}}"
    )
    c = apply_config(load_site_config(write(tmp_path, f"auth: {oidc}")), Config())
    assert c.GenericOAuthenticator.manage_groups is True
    key = c.GenericOAuthenticator.auth_state_groups_key
    assert key == ClaimGroups("roles")
    assert key({"oauth_user": {"roles": ["Vision", "lab-A", "vision"]}}) == ["lab-a", "vision"]
    assert key({"oauth_user": {}}) == []
    assert "allowed_groups" not in c.GenericOAuthenticator  # membership, not who signs in
    with pytest.raises(ConfigError, match="auth.manage_groups: groups come from github"):
        load_site_config(write(tmp_path, "auth: {type: native, manage_groups: true}"))


def test_group_settings_reach_billing_the_hub_and_the_spawners(tmp_path):
    site = "groups: {alert_balances: ['50.00', 0], alert_runway_days: 3, sync_interval_seconds: 2, shared_folders: false}"
    c = apply_config(load_site_config(write(tmp_path, site)), Config())
    assert c.BillingSettings.group_alert_balances == ["50.00", "0"]
    assert c.BillingSettings.group_alert_runway_days == 3
    assert c.MeterHub.group_sync_interval_seconds == 2
    assert c.LocalGPUSpawner.group_folders is False and c.KubeGPUSpawner.group_folders is False
    assert c.Catalog.extra_options == ["wallet"]
    with pytest.raises(ConfigError, match="groups"):
        load_site_config(write(tmp_path, "groups: {sync_interval_seconds: 0}"))


def test_idle_and_stopping_reach_the_catalog_billing_and_both_spawners(tmp_path):
    """What docs/idle.md promises of the config: per-profile idle policies (fractions of a
    minute exact, the rest the catalog's defaults), proxy traffic not taken for activity,
    and one grace period for the local stop, the pod and billing's cap minimum."""
    from meterhub.billing_hooks.settings import BillingSettings
    from meterhub.spawner.catalog import Catalog

    path = tmp_path / "meterhub.yaml"
    path.write_text(
        "profiles:\n  a800: {idle_minutes: 0.1, on_idle: debug}\n  debug: {on_cap: stop}\n"
        "idle: {warn_minutes: 0.5, check_interval_seconds: 7, gpu_busy_percent: 12}\n"
        "stop_grace_seconds: 9\n"
    )
    c = apply_config(load_site_config(path, cwd=str(tmp_path)), Config())
    catalog = Catalog(config=c)
    assert catalog.idle("a800") == IdlePolicy(6, "debug", "stop")
    assert catalog.idle("debug") == IdlePolicy(14400, "stop", "stop")  # the default time
    assert catalog.idle("h800") == IdlePolicy(1800, "stop", "stop")
    assert catalog.idle_env("a800")["JUPYTERHUB_ACTIVITY_INTERVAL"] == "7"
    assert catalog.idle_env("a800")["METERHUB_GPU_BUSY_PERCENT"] == "12"
    assert catalog.idle_warn_seconds == 30
    assert c.JupyterHub.last_activity_interval == 0
    assert c.LocalGPUSpawner.stop_grace_seconds == c.KubeGPUSpawner.delete_grace_period == 9
    assert BillingSettings(config=c).stop_grace_seconds == 9
