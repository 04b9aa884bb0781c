"""meterhub inside the zero-to-jupyterhub hub: what the Helm chart's `hub.extraConfig` runs.

    from meterhub.hub.k8s import configure
    configure(c)

z2jh configures JupyterHub itself (database, proxy, authenticator, ports); this adds only
what is meterhub's: the Kubernetes spawner with the catalog's profiles, the spawn form, the
billing hooks, trial credit and the page templates — read from the site config the chart
mounts from a ConfigMap. The billing service runs in its own Deployment and is registered
by the chart through z2jh's `hub.services` and `hub.loadRoles`.
"""

from __future__ import annotations

import os

from traitlets.config import Config

from meterhub.billing_hooks.hooks import register_trial_credit
from meterhub.spawner.kube import OWNED_TRAITS

from .config import TEMPLATES, apply_spawner_config, load_site_config

SITE_PATH = "/etc/meterhub/meterhub.yaml"


def configure(c: Config, path: str | None = None) -> dict:
    """Apply the site config at `path` (default $METERHUB_CONFIG or the chart's mount) to `c`."""
    path = path or os.environ.get("METERHUB_CONFIG", SITE_PATH)
    site = load_site_config(path, cwd="/srv/jupyterhub")
    site["backend"] = "kubernetes"
    # z2jh's `singleuser` values set these on KubeSpawner, which would override
    # KubeGPUSpawner's own (its empty profileList alone would hide every profile)
    for name in OWNED_TRAITS:
        c.KubeSpawner.pop(name, None)
    apply_spawner_config(site, c)
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
