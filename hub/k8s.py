"""meterhub inside the zero-to-jupyterhub hub: what the Helm chart's `hub.extraConfig` runs.

    from meterhub.hub.k8s import configure
    configure(c)

z2jh configures JupyterHub itself (database, proxy, authenticator, ports); this adds only
what is meterhub's: the Kubernetes spawner with the catalog's profiles, the spawn form, the
billing hooks, trial credit and the page templates — read from the site config the chart
mounts from a ConfigMap. The billing service runs in its own Deployment and is registered
by the chart through z2jh's `hub.services` and `hub.loadRoles`.

z2jh's own `jupyterhub_config.py` runs first and sets many KubeSpawner traits from its
`singleuser` values; what meterhub owns is set on KubeGPUSpawner's own config section (which
wins over c.KubeSpawner and c.Spawner whatever the order) or merged in the spawner's code.
Where z2jh's values (or hub.config) set one of those traits to anything but z2jh's default,
configure() refuses to start, naming the site-config key to use instead.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml
from traitlets.config import Config, LazyConfigValue

from meterhub.billing_hooks.hooks import register_trial_credit

from .config import (
    TEMPLATES,
    ConfigError,
    apply_spawner_config,
    language_template_vars,
    load_site_config,
    site_template_vars,
)

SITE_PATH = "/etc/meterhub/meterhub.yaml"
#: the billing Service of this release, as the chart passes it (`http://NAME:8082`)
BILLING_SERVICE_ENV = "METERHUB_BILLING_SERVICE_URL"
#: the chart's default name of that Service (no `jupyterhub.fullnameOverride`)
BILLING_SERVICE_DEFAULT = "http://meterhub-billing:8082"
#: the zero-to-jupyterhub chart helm/meterhub/Chart.yaml pins (its defaults are below)
Z2JH_VERSION = "4.3.3"

STORAGE = (
    "not supported: meterhub's spawner owns the servers' storage: one disk per user"
    " (claim-{username}, sized by site.kubernetes.disk_size, class"
    " site.kubernetes.storage_class), the read-only /public pool (the chart's public.*) and"
    " /dev/shm; leave jupyterhub.singleuser.storage.type none"
)
#: what KubeGPUSpawner reads only from its own section (spawner.kube.OWNED_TRAITS, plus
#: `image`, which the site config always sets there): z2jh's `singleuser` values that set
#: these on c.KubeSpawner would be dropped, so they are refused, by the chart at install
#: ("meterhub.singleuser.refused" in helm/meterhub/templates/_helpers.tpl, the same texts)
#: and by configure() at hub start-up. trait: (the z2jh values setting it, or None where
#: only hub.config or extraConfig can; what to set instead)
Z2JH_OWNED: dict[str, tuple[str | None, str]] = {
    "image": (
        "jupyterhub.singleuser.image",
        "set site.kubernetes.image (debug mode, and GPU profiles unless"
        " site.kubernetes.gpu_image is set)",
    ),
    "profile_list": (
        "jupyterhub.singleuser.profileList",
        "profiles come from meterhub's catalog: set site.profiles and site.gpu_types",
    ),
    "uid": ("jupyterhub.singleuser.uid", "set site.kubernetes.uid"),
    "gid": (None, "not supported: servers run with gid 100"),
    "fs_gid": ("jupyterhub.singleuser.fsGid", "not supported: servers run with fsGroup 100"),
    "allow_privilege_escalation": (
        "jupyterhub.singleuser.allowPrivilegeEscalation",
        "not supported: servers never gain privileges",
    ),
    "container_security_context": (
        None,
        "not supported: servers run as non-root with every capability dropped",
    ),
    "automount_service_account_token": (
        None,
        "not supported: servers get no Kubernetes API token",
    ),
    "storage_capacity": ("jupyterhub.singleuser.storage.capacity", "set site.kubernetes.disk_size"),
    "storage_class": (
        "jupyterhub.singleuser.storage.dynamic.storageClass",
        "set site.kubernetes.storage_class",
    ),
    "storage_access_modes": (
        "jupyterhub.singleuser.storage.dynamic.storageAccessModes",
        "not supported: each user's disk is ReadWriteOnce",
    ),
    "pvc_name_template": ("jupyterhub.singleuser.storage.type", STORAGE),
    "storage_pvc_ensure": ("jupyterhub.singleuser.storage.type", STORAGE),
    "volumes": (
        "jupyterhub.singleuser.storage (type, extraVolumes) or singleuser.extraFiles",
        STORAGE,
    ),
    "volume_mounts": (
        "jupyterhub.singleuser.storage (type, homeMountPath, extraVolumeMounts) or"
        " singleuser.extraFiles",
        STORAGE,
    ),
}
#: what z2jh's jupyterhub_config.py assigns to those traits when its values are its chart's
#: defaults (with meterhub's storage.type none); KubeSpawner's own defaults pass as well
Z2JH_DEFAULTS = {
    "image": f"quay.io/jupyterhub/k8s-singleuser-sample:{Z2JH_VERSION}",
    "profile_list": [],
    "uid": 1000,
    "fs_gid": 100,
    "allow_privilege_escalation": False,
}

#: site-config keys that only mean something on the local backend, and what to use instead
LOCAL_ONLY = {
    "auth": "the authenticator is z2jh's: set jupyterhub.hub.config (e.g."
    " hub.config.JupyterHub.authenticator_class and hub.config.GitHubOAuthenticator)",
    "gpus": "GPUs come from the nodes (nvidia.com/gpu, labelled by the GPU operator): map"
    " GPU types to node products with site.kubernetes.node_products",
    "local": "servers are pods: set site.kubernetes (image, disk_size, storage_class, uid)",
    "data_dir": "the ledger is billing.database (url or existingSecret) and the hub's own"
    " database is jupyterhub.hub.db",
}


def refuse_local_keys(path: str) -> None:
    """A kubernetes site config must not carry keys that would be silently ignored."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return  # load_site_config reports these with the file name
    if not isinstance(raw, dict):
        return
    found = [key for key in LOCAL_ONLY if key in raw]
    if found:
        lines = [f"{key}: only used by the local backend; {LOCAL_ONLY[key]}" for key in found]
        raise ConfigError(f"{path}: " + "\n  ".join(["not for the kubernetes backend:", *lines]))


def refuse_z2jh_owned(c: Config) -> None:
    """Refuse what z2jh's `singleuser` values (or hub.config, or an earlier extraConfig) set
    on c.KubeSpawner or c.Spawner that KubeGPUSpawner would not read: anything but
    KubeSpawner's default or z2jh's chart default, with the meterhub setting to use."""
    from kubespawner import KubeSpawner

    from meterhub.spawner.kube import KubeGPUSpawner

    traits = KubeSpawner.class_traits()
    problems = []
    for cls in KubeGPUSpawner.mro()[1:]:
        section = cls.__name__
        if not dict.__contains__(c, section):
            continue
        for name, (z2jh_values, instead) in Z2JH_OWNED.items():
            if not dict.__contains__(c[section], name):
                continue
            value = dict.__getitem__(c[section], name)
            default = traits[name].default()
            if isinstance(value, LazyConfigValue):  # z2jh's volumes.extend(extraVolumes)
                value = value.get_value(copy.deepcopy(default))
            if value == default or (name in Z2JH_DEFAULTS and value == Z2JH_DEFAULTS[name]):
                continue
            where = f" (z2jh's {z2jh_values})" if z2jh_values else ""
            problems.append(
                f"c.{section}.{name} = {value!r}{where}: meterhub's spawner does not read it;"
                f" {instead}"
            )
    if problems:
        raise ConfigError("\n  ".join(["not used by meterhub's KubeGPUSpawner:", *problems]))


def base_url(c: Config) -> str:
    """The hub's base URL as z2jh set it from jupyterhub.hub.baseUrl: "/" or "/a/b/"."""
    stripped = (c.JupyterHub.get("base_url") or "/").strip("/")
    return f"/{stripped}/" if stripped else "/"


def billing_prefix(c: Config) -> str:
    """Where JupyterHub puts the billing service: {base_url}services/billing/."""
    return f"{base_url(c)}services/billing/"


def billing_api_url(c: Config) -> str:
    """The billing API as pods reach it: the Service the chart names, under the prefix."""
    service = os.environ.get(BILLING_SERVICE_ENV, "").rstrip("/") or BILLING_SERVICE_DEFAULT
    return f"{service}{billing_prefix(c)}api/v1"


def configure(c: Config, path: str | None = None) -> dict:
    """Apply the site config at `path` (default $METERHUB_CONFIG or the chart's mount) to `c`."""
    path = path or os.environ.get("METERHUB_CONFIG", SITE_PATH)
    refuse_local_keys(path)
    refuse_z2jh_owned(c)
    site = load_site_config(path, cwd="/srv/jupyterhub")
    site["backend"] = "kubernetes"
    apply_spawner_config(site, c)
    c.KubeGPUSpawner.meterhub_environment = {"METERHUB_BILLING_URL": billing_api_url(c)}
    if os.environ.get(BILLING_SERVICE_ENV):
        # z2jh made c.JupyterHub.services from hub.services; the proxy routes
        # {base_url}services/billing/ to this release's billing Service
        for service in c.JupyterHub.get("services") or ():
            if service.get("name") == "billing" and not service.get("url"):
                service["url"] = os.environ[BILLING_SERVICE_ENV].rstrip("/")
    c.JupyterHub.template_paths = [TEMPLATES]
    # z2jh configures the authenticator (its hub.config); pods are isolated by Kubernetes,
    # so the local sandbox warning does not apply
    c.JupyterHub.template_vars = {
        "meterhub_native_auth": False,
        "meterhub_signup": False,
        "meterhub_sandbox_warning": "",
        **site_template_vars(site),
        **language_template_vars(),
    }
    register_trial_credit(c)
    add_group_admin_roles(c)
    return site


def add_group_admin_roles(c: Config) -> None:
    """The group admins' roles, from the ledger, as config roles (JupyterHub deletes any
    other at start-up). On Kubernetes they change when the hub restarts (`meterhub group
    admins` says so); the local hub applies them while running."""
    from sqlalchemy.exc import DBAPIError

    from meterhub.billing_hooks.db import SchemaMismatch
    from meterhub.billing_hooks.settings import BillingSettings

    from .group_sync import group_admin_roles

    try:
        extra = group_admin_roles(BillingSettings(config=c).ledger())
    except (DBAPIError, SchemaMismatch, OSError) as e:
        # the hub starts anyway (spawns are refused until billing answers); roles next start
        print(f"meterhub: group admins' roles not loaded from the ledger: {e}")
        return
    roles = list(c.JupyterHub.get("load_roles") or [])
    present = {role["name"] for role in roles}
    c.JupyterHub.load_roles = roles + [r for r in extra if r["name"] not in present]
