"""A stand-in for what zero-to-jupyterhub's hub config leaves on `c` before meterhub's
`hub.extraConfig` runs.

z2jh's `jupyterhub/files/hub/jupyterhub_config.py` (repository
jupyterhub/zero-to-jupyterhub-k8s, chart 4.x as pinned in helm/meterhub/Chart.yaml) builds
the hub's config from its values. Every spawner trait that file assigns is assigned here, in
the same order, as plain values: z2jh's chart defaults with meterhub's `jupyterhub:` values
(helm/meterhub/values.yaml) on top. Traits z2jh only sets when a value is not null are left
out where the default is null; branches the defaults do not take are named in comments.
"""

from __future__ import annotations

from traitlets.config import Config

Z2JH_VERSION = "4.3.3"

#: z2jh's `singleuser` values (jupyterhub/values.yaml at Z2JH_VERSION) that set the traits
#: meterhub's KubeGPUSpawner owns, as the subchart's defaults reach the parent chart's
#: `.Values.jupyterhub` when Helm coalesces them (null: absent); storage.type is meterhub's
SINGLEUSER_DEFAULTS = {
    "image": {"name": "quay.io/jupyterhub/k8s-singleuser-sample", "tag": Z2JH_VERSION,
              "pullPolicy": None, "pullSecrets": []},
    "profileList": [],
    "uid": 1000,
    "fsGid": 100,
    "allowPrivilegeEscalation": False,
    "extraFiles": {},
    "storage": {
        "type": "none",
        "extraLabels": {},
        "extraVolumes": [],
        "extraVolumeMounts": [],
        "static": {"pvcName": None, "subPath": "{username}"},
        "capacity": "10Gi",
        "homeMountPath": "/home/jovyan",
        "dynamic": {
            "storageClass": None,
            "pvcNameTemplate": None,
            "volumeNameTemplate": "volume-{user_server}",
            "storageAccessModes": ["ReadWriteOnce"],
            "subPath": None,
        },
    },
}  # fmt: skip

#: scheduling.userPods.tolerations (z2jh default)
DEDICATED_TOLERATIONS = [
    {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
    {"key": "hub.jupyter.org_dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
]  # fmt: skip
#: scheduling.userPods.nodeAffinity.matchNodePurpose: prefer (z2jh default)
NODE_PURPOSE_PREFERRED = {
    "weight": 100,
    "preference": {
        "matchExpressions": [
            {"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}
        ]
    },
}


def apply_z2jh_config(
    c: Config, release: str = "gpu", namespace: str = "gpu-lab", **singleuser
) -> Config:
    """Assign what z2jh's jupyterhub_config.py assigns; `singleuser` overrides a trait's
    value the way a `singleuser.*` value would (e.g. environment={...})."""

    def value(trait, default):
        return singleuser.get(trait, default)

    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.KubeSpawner.common_labels = {
        "app": "jupyterhub",
        "heritage": "jupyterhub",
        "chart": f"jupyterhub-{Z2JH_VERSION}",
        "release": release,
    }
    c.KubeSpawner.namespace = namespace  # $POD_NAMESPACE
    c.Spawner.consecutive_failure_limit = 5  # hub.consecutiveFailureLimit
    # the singleuser.* loop, in its order (pod_name_template, image_pull_policy,
    # service_account, mem_limit, cpu_limit and cpu_guarantee default to null: not set)
    c.KubeSpawner.start_timeout = value("start_timeout", 300)
    c.KubeSpawner.events_enabled = True
    c.KubeSpawner.extra_labels = value(
        "extra_labels", {"hub.jupyter.org/network-access-hub": "true"}
    )
    c.KubeSpawner.extra_annotations = {}
    c.KubeSpawner.uid = value("uid", 1000)
    c.KubeSpawner.fs_gid = value("fs_gid", 100)
    c.KubeSpawner.storage_extra_labels = {}
    c.KubeSpawner.node_selector = value("node_selector", {})
    c.KubeSpawner.node_affinity_required = []
    c.KubeSpawner.node_affinity_preferred = []
    c.KubeSpawner.pod_affinity_required = []
    c.KubeSpawner.pod_affinity_preferred = []
    c.KubeSpawner.pod_anti_affinity_required = []
    c.KubeSpawner.pod_anti_affinity_preferred = []
    c.KubeSpawner.lifecycle_hooks = value("lifecycle_hooks", {})
    c.KubeSpawner.init_containers = []
    c.KubeSpawner.extra_containers = []
    c.KubeSpawner.mem_guarantee = "1G"
    c.KubeSpawner.extra_resource_limits = {}
    c.KubeSpawner.extra_resource_guarantees = {}
    c.KubeSpawner.environment = value("environment", {})  # singleuser.extraEnv
    c.KubeSpawner.profile_list = value("profile_list", [])
    c.KubeSpawner.extra_pod_config = {}
    c.KubeSpawner.image = value("image", f"quay.io/jupyterhub/k8s-singleuser-sample:{Z2JH_VERSION}")
    # get_config: None when the value is null
    c.KubeSpawner.allow_privilege_escalation = value("allow_privilege_escalation", False)
    # image_pull_secrets: none by default
    c.KubeSpawner.scheduler_name = f"{release}-user-scheduler"  # userScheduler.enabled
    c.KubeSpawner.node_affinity_preferred.append(NODE_PURPOSE_PREFERRED)
    c.KubeSpawner.tolerations = value("tolerations", list(DEDICATED_TOLERATIONS))
    # singleuser.storage.type: none (meterhub's values): neither the dynamic branch
    # (pvc_name_template, storage_pvc_ensure, storage_class, storage_access_modes,
    # storage_capacity, volumes, volume_mounts) nor the static one runs; it is emulated
    # with its defaults when `storage_dynamic` is passed, as a chart left at z2jh's would
    if singleuser.get("storage_dynamic"):
        c.KubeSpawner.pvc_name_template = "claim-{user_server}"
        c.KubeSpawner.storage_pvc_ensure = True
        c.KubeSpawner.storage_access_modes = ["ReadWriteOnce"]
        c.KubeSpawner.storage_capacity = "10Gi"
        c.KubeSpawner.volumes = [
            {"name": "volume-{user_server}", "persistentVolumeClaim": {"claimName": "claim-{user_server}"}}
        ]  # fmt: skip
        c.KubeSpawner.volume_mounts = [
            {"mountPath": "/home/jovyan", "name": "volume-{user_server}"}
        ]
    # singleuser.extraFiles: none
    c.KubeSpawner.volumes.extend(value("extra_volumes", []))  # singleuser.storage.extraVolumes
    c.KubeSpawner.volume_mounts.extend(value("extra_volume_mounts", []))  # .extraVolumeMounts
    c.Spawner.cmd = "jupyterhub-singleuser"  # singleuser.cmd
    # singleuser.cloudMetadata.blockWithIptables: false (meterhub's values): no init container
    # hub.config, then jupyterhub_config.d, then hub.extraConfig (sorted by key) follow
    return c
