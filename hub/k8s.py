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
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from traitlets.config import Config

from meterhub.billing_hooks.hooks import register_trial_credit

from .config import TEMPLATES, ConfigError, apply_spawner_config, load_site_config

SITE_PATH = "/etc/meterhub/meterhub.yaml"
#: the billing Service of this release, as the chart passes it (`http://NAME:8082`)
BILLING_SERVICE_ENV = "METERHUB_BILLING_SERVICE_URL"
BILLING_PREFIX = "/services/billing/"

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


def billing_api_url() -> str | None:
    """The billing API as pods reach it, from the Service the chart names (None: not set)."""
    service = os.environ.get(BILLING_SERVICE_ENV, "").rstrip("/")
    return f"{service}{BILLING_PREFIX}api/v1" if service else None


def configure(c: Config, path: str | None = None) -> dict:
    """Apply the site config at `path` (default $METERHUB_CONFIG or the chart's mount) to `c`."""
    path = path or os.environ.get("METERHUB_CONFIG", SITE_PATH)
    refuse_local_keys(path)
    site = load_site_config(path, cwd="/srv/jupyterhub")
    site["backend"] = "kubernetes"
    apply_spawner_config(site, c)
    api = billing_api_url()
    if api:
        c.KubeGPUSpawner.meterhub_environment = {"METERHUB_BILLING_URL": api}
        # z2jh made c.JupyterHub.services from hub.services; the proxy routes
        # /services/billing/ to this release's billing Service
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
    }
    register_trial_credit(c)
    return site
