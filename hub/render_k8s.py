"""`meterhub render-k8s`: the Pod and PersistentVolumeClaims the Kubernetes backend would create.

Offline: KubeGPUSpawner is built from the site config with a placeholder kubeconfig, and
nothing talks to a cluster. For operators to preview a profile, and for the tests, which
validate the output against the real Kubernetes schemas.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from contextlib import contextmanager
from types import SimpleNamespace

import yaml
from jupyterhub.utils import maybe_future
from tornado import web
from traitlets.config import Config

from .config import apply_spawner_config

OFFLINE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
    "users": [{"name": "offline", "user": {"token": "offline"}}],
    "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline"}}],
    "current-context": "offline",
}


class RenderError(ValueError):
    """A choice the backend refuses; the message is the one the user would get."""


def refusal_text(error: web.HTTPError) -> str:
    """What an HTTPError says to the user (its message with its arguments put in)."""
    return error.log_message % error.args if error.args else (error.log_message or "")


@contextmanager
def offline_kubeconfig():
    """KubeSpawner loads a kubeconfig when it is built; give it one that points nowhere.

    kubernetes_asyncio reads $KUBECONFIG once, at import, into KUBE_CONFIG_DEFAULT_LOCATION;
    that module constant is what is swapped here, for the construction only.
    """
    from kubernetes_asyncio.config import kube_config

    saved_location = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    saved_host = os.environ.pop("KUBERNETES_SERVICE_HOST", None)  # never in-cluster here
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(OFFLINE_KUBECONFIG, f)
        f.flush()
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = f.name
        try:
            yield
        finally:
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_location
            if saved_host is not None:
                os.environ["KUBERNETES_SERVICE_HOST"] = saved_host


def _fake_user(name: str, groups) -> SimpleNamespace:
    """A user in `groups`, each a group as `meterhub group create` makes it (with a shared
    folder), so that a preview shows what a member of a meterhub group gets."""
    return SimpleNamespace(
        name=name,
        id=1,
        url=f"/user/{name}/",
        groups=[
            SimpleNamespace(name=g, id=i, properties={"shared_folder": True})
            for i, g in enumerate(groups, start=1)
        ],
        escaped_name=name,
    )


def offline_spawner(config: Config, user: str, groups=()):
    """A KubeGPUSpawner with `config`, for a user in `groups` (call it in an event loop)."""
    from meterhub.spawner.kube import KubeGPUSpawner

    hub = SimpleNamespace(
        public_host="",
        url="http://hub:8081/hub/",
        base_url="/hub/",
        api_url="http://hub:8081/hub/api",
    )
    with offline_kubeconfig():
        spawner = KubeGPUSpawner(config=config, user=_fake_user(user, groups), hub=hub)
    spawner.api_token = "<the server's own token, made at spawn>"
    return spawner


def _spawner(site: dict, user: str, groups):
    config = apply_spawner_config(dict(site, backend="kubernetes"), Config())
    return offline_spawner(config, user, groups)


async def start_manifests(spawner, options: dict) -> list[dict]:
    """What `spawner` would create for `options`: the Pod, the user's PVC and the claims
    of the user's groups' shared folders (each ensured at start), as API objects."""
    from kubernetes_asyncio.client import ApiClient

    spawner.user_options = options
    try:
        await spawner.load_user_options()
    except web.HTTPError as e:
        raise RenderError(refusal_text(e)) from None
    pod = await spawner.get_pod_manifest()
    pvc = spawner.get_pvc_manifest()
    claims = [spawner.get_group_pvc_manifest(group) for group in spawner.shared_groups]
    api = ApiClient()
    try:
        documents = [api.sanitize_for_serialization(obj) for obj in (pod, pvc, *claims)]
    finally:
        await api.close()
    kinds = ("Pod", "PersistentVolumeClaim", *["PersistentVolumeClaim"] * len(claims))
    for document, kind in zip(documents, kinds, strict=True):
        document.setdefault("apiVersion", "v1")
        document.setdefault("kind", kind)
        document["metadata"].setdefault("namespace", spawner.namespace)
    return documents


def profile_list(site: dict, user: str, groups=()) -> list[dict]:
    """KubeSpawner's profile_list as `user` would get it."""

    async def build():
        spawner = _spawner(site, user, groups)
        return await maybe_future(spawner.profile_list(spawner))

    return asyncio.run(build())


async def _render(site: dict, user: str, options: dict, groups) -> list[dict]:
    return await start_manifests(_spawner(site, user, groups), options)


def render(
    site: dict,
    user: str,
    profile: str,
    gpus: int | None = None,
    groups=(),
    environment: str | None = None,
) -> list[dict]:
    """The Pod and PVC for `user` starting `profile` (with `gpus`, in `environment`), then a
    claim per group of `groups` (each with a shared folder), as API objects (dicts)."""
    options = {"profile": profile}
    if gpus is not None:
        options["gpus"] = str(gpus)
    if environment is not None:
        options["environment"] = environment
    return asyncio.run(_render(site, user, options, groups))


def render_yaml(documents: list[dict]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)
