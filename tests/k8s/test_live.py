"""Live checks against a real cluster running the chart; skipped without one.

    KUBECONFIG=~/.kube/config METERHUB_HUB_URL=https://hub.example \
    METERHUB_ADMIN_TOKEN=... METERHUB_NAMESPACE=gpu-lab .venv/bin/python -m pytest tests/k8s

The admin token is an API token of a hub admin (z2jh: a service in `hub.services` with the
admin role). What is checked is listed in docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
import requests

pytestmark = pytest.mark.skipif(
    not (os.environ.get("KUBECONFIG") and os.environ.get("METERHUB_HUB_URL")),
    reason="no cluster: set KUBECONFIG, METERHUB_HUB_URL and METERHUB_ADMIN_TOKEN",
)

HUB = os.environ.get("METERHUB_HUB_URL", "").rstrip("/")
NAMESPACE = os.environ.get("METERHUB_NAMESPACE", "default")
LABEL = "nvidia.com/gpu.product"


def api(method: str, path: str, **kwargs) -> requests.Response:
    headers = {"Authorization": f"token {os.environ['METERHUB_ADMIN_TOKEN']}"}
    return requests.request(method, f"{HUB}/hub/api{path}", headers=headers, timeout=60, **kwargs)


def spawn(user: str, options: dict, timeout: float = 600) -> dict:
    if api("GET", f"/users/{user}").status_code == 404:
        assert api("POST", f"/users/{user}").status_code == 201
    r = api("POST", f"/users/{user}/server", json=options)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = api("GET", f"/users/{user}").json()["servers"].get("")
        if server and server.get("ready"):
            return server
        time.sleep(3)
    raise AssertionError(f"{user}'s server did not become ready in {timeout}s")


def stop(user: str) -> None:
    api("DELETE", f"/users/{user}/server")
    deadline = time.monotonic() + 300
    while api("GET", f"/users/{user}").json()["servers"].get("") and time.monotonic() < deadline:
        time.sleep(3)


async def _read(kind: str, name: str | None = None, label_selector: str | None = None):
    from kubernetes_asyncio import client, config

    await config.load_kube_config()
    async with client.ApiClient() as api_client:
        core = client.CoreV1Api(api_client)
        if kind == "pod":
            return api_client.sanitize_for_serialization(
                await core.read_namespaced_pod(name, NAMESPACE)
            )
        if kind == "pvc":
            return api_client.sanitize_for_serialization(
                await core.read_namespaced_persistent_volume_claim(name, NAMESPACE)
            )
        nodes = await core.list_node(label_selector=label_selector)
        return api_client.sanitize_for_serialization(nodes)["items"]


def read(*args, **kwargs):
    return asyncio.run(_read(*args, **kwargs))


def test_debug_server_runs_without_gpus_unprivileged_and_keeps_its_disk():
    user = f"live-{uuid.uuid4().hex[:8]}"
    spawn(user, {"profile": "debug"})
    try:
        pod = read("pod", f"jupyter-{user}")
        (container,) = pod["spec"]["containers"]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert container["securityContext"]["runAsNonRoot"] is True
        assert pod["metadata"]["labels"]["meterhub.io/profile"] == "debug"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/public"]["readOnly"] is True
    finally:
        stop(user)
    pvc = read("pvc", f"claim-{user}")
    assert pvc["status"]["phase"] == "Bound"  # the disk outlives the server


def test_gpu_server_lands_on_a_node_of_its_type():
    from meterhub.spawner.catalog import GPU_TYPES

    nodes = read("nodes", label_selector=LABEL)
    products = {n["metadata"]["labels"][LABEL] for n in nodes}
    slug = next((s for s, t in GPU_TYPES.items() if t.node_product in products), None)
    if slug is None:
        pytest.skip(f"no node labelled {LABEL} with a catalog product: {sorted(products)}")
    user = f"live-{uuid.uuid4().hex[:8]}"
    spawn(user, {"profile": slug, "gpus": "1"})
    try:
        pod = read("pod", f"jupyter-{user}")
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        node = next(n for n in nodes if n["metadata"]["name"] == pod["spec"]["nodeName"])
        assert node["metadata"]["labels"][LABEL] == GPU_TYPES[slug].node_product
    finally:
        stop(user)
