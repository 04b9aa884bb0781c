"""The Kubernetes backend: KubeSpawner with a profile_list generated from the one catalog.

KubeSpawner does the work (pods, PVCs, events, reflectors); this class only says what a
meterhub profile means on Kubernetes and checks user options the way the local backend
does. The user options are the same: `{"profile": "debug"}`, `{"profile": "a800",
"gpus": "2"}` — KubeSpawner's own format for a profile with one profile option, `gpus`.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from functools import partial

from jupyterhub.utils import exponential_backoff
from kubespawner import KubeSpawner
from kubespawner.objects import make_pvc
from traitlets import Bool, Dict, List, Unicode, default
from traitlets.config import Config

from meterhub.i18n import _

from .catalog import Catalog, Choice
from .environments import Environment
from .options import CatalogOptions, SharedGroup, group_names, shared_folder_groups

GIB = 1024**3
#: the traits a choice changes; each start resets them to their configured values first
CHOICE_TRAITS = (
    "image",
    "cpu_limit",
    "cpu_guarantee",
    "mem_limit",
    "mem_guarantee",
    "extra_resource_limits",
    "extra_resource_guarantees",
    "environment",
    "volumes",
    "volume_mounts",
    "extra_labels",
    "node_selector",
    "node_affinity_required",
    "tolerations",
)
#: what meterhub decides, not z2jh's `singleuser` values: KubeGPUSpawner ignores these in
#: the config sections of the classes it derives from (c.KubeSpawner, c.Spawner), whatever
#: the order they were set in, so its own defaults hold (one disk per user, /public,
#: profiles, the non-root security context); c.KubeGPUSpawner.<trait> still sets them.
#: Dropped, never silently: hub.k8s.configure refuses them on those sections at hub
#: start-up, and the Helm chart the z2jh values that set them (hub.k8s.Z2JH_OWNED)
OWNED_TRAITS = (
    "profile_list",
    "volumes",
    "volume_mounts",
    "pvc_name_template",
    "storage_pvc_ensure",
    "storage_capacity",
    "storage_class",
    "storage_access_modes",
    "uid",
    "gid",
    "fs_gid",
    "container_security_context",
    "allow_privilege_escalation",
    "automount_service_account_token",
)
GPU_RESOURCE = "nvidia.com/gpu"
#: what hides every GPU from CUDA and from the NVIDIA container runtime
HIDE_GPUS = {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def dns_label(name: str, limit: int = 63) -> str:
    """A group's name as a DNS label (a volume's or claim's name part) of at most `limit`
    characters: the name itself when it is one, else its letters and digits followed by a
    hash of the whole name, so that `lab_a` and `lab-a` never share a claim."""
    if len(name) <= limit and _DNS_LABEL.match(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9]+", "-", name)[: limit - len(digest) - 1].strip("-")
    return f"{base}-{digest}" if base else digest


class KubeGPUSpawner(CatalogOptions, KubeSpawner):
    """Servers as pods: GPU profiles get `nvidia.com/gpu` on nodes of their GPU type.

    Inside zero-to-jupyterhub, the chart's `jupyterhub_config.py` sets many KubeSpawner
    traits before meterhub's `hub.extraConfig` runs; nothing here depends on that order:
    OWNED_TRAITS are read only from this class's own section, `meterhub_environment` is
    merged over `environment`, and the starter-notebook postStart hook over
    `lifecycle_hooks`.
    """

    meterhub_environment = Dict(
        value_trait=Unicode(),
        key_trait=Unicode(),
        help="""
        Environment variables meterhub gives every server (e.g. METERHUB_BILLING_URL),
        merged over `environment` (z2jh's `singleuser.extraEnv`) instead of being replaced
        by it. A name in both gets this value.
        """,
    ).tag(config=True)

    gpu_image = Unicode(
        "",
        help="Image for GPU profiles (CUDA). Empty: the same as `image`, used by debug mode.",
    ).tag(config=True)

    node_label = Unicode(
        "nvidia.com/gpu.product",
        help="""
        Node label that names a node's GPU product. The default is the label NVIDIA GPU
        feature discovery (part of the GPU operator) sets.
        """,
    ).tag(config=True)

    node_products = Dict(
        key_trait=Unicode(),
        help="""
        Values of `node_label` per GPU type, overriding the catalog's, e.g.
        `{"a800": ["NVIDIA-A800-SXM4-80GB", "NVIDIA-A800-80GB-PCIe"]}`.
        """,
    ).tag(config=True)

    gpu_tolerations = List(
        help="Tolerations of GPU pods (GPU nodes are usually tainted `nvidia.com/gpu`).",
    ).tag(config=True)

    @default("gpu_tolerations")
    def _default_gpu_tolerations(self):
        return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]

    debug_node_selector = Dict(
        help="Node selector of debug-mode pods (CPU nodes), e.g. `{'node-role/cpu': 'true'}`.",
    ).tag(config=True)

    disk_mount_path = Unicode(
        "/home/jovyan", help="Where the user's persistent disk is mounted (their HOME)."
    ).tag(config=True)

    public_claim_name = Unicode(
        "meterhub-public",
        help="PersistentVolumeClaim (ReadOnlyMany) of the /public pool of models and datasets.",
    ).tag(config=True)

    public_mount_path = Unicode("/public", help="Where the pool is mounted, read-only.").tag(
        config=True
    )

    group_folders = Bool(
        True,
        help="""
        Mount a shared folder at `<disk_mount_path>/shared/<group>` in the pods of the
        members of each JupyterHub group whose properties say `"shared_folder": true`: a
        ReadWriteMany PersistentVolumeClaim per group (`group_folder_claim_template`).
        Membership is read at every start: a member removed from the group has no mount
        from their next start on; the claim and its files stay. Only groups named like
        `^[a-z0-9][a-z0-9._-]{0,63}$` get one; none with `enable_user_namespaces` (a claim
        lives in one namespace).

        Every pod runs as uid 1000, gid 100 (fsGroup 100): the volume must let them write.
        DANGER: every member can read, change and delete everything in it, and anyone who
        can create pods in the namespace can mount the claim.
        """,
    ).tag(config=True)

    group_folder_claim_template = Unicode(
        "meterhub-group-{group}",
        help="""
        Name of a group's shared-folder claim; `{group}` is the group's name (as a DNS
        label: a name with `.` or `_` becomes its letters and digits plus a short hash).
        """,
    ).tag(config=True)

    group_folder_ensure = Bool(
        True,
        help="""
        Create a group's claim (ReadWriteMany, `group_folder_capacity`,
        `group_folder_storage_class`) when a member's server starts and it does not exist
        yet; an existing claim is used as it is. False: the operator creates the claims
        (a member's pod stays Pending until theirs exists).
        """,
    ).tag(config=True)

    group_folder_capacity = Unicode(
        "10Gi", help="Size a group's shared-folder claim asks for when the hub creates it."
    ).tag(config=True)

    group_folder_storage_class = Unicode(
        None,
        allow_none=True,
        help="""
        Storage class of the groups' shared-folder claims; it must offer ReadWriteMany
        (NFS, CephFS, a cloud file store). None: the cluster's default class.
        """,
    ).tag(config=True)

    #: the groups whose folders the current (or last rendered) start mounts
    shared_groups = List()

    # ------------------------------------------------------------ KubeSpawner defaults

    @default("pvc_name_template")
    def _default_pvc_name_template(self):
        # one disk per user, whatever the profile or server name
        return "claim-{username}"

    @default("storage_pvc_ensure")
    def _default_storage_pvc_ensure(self):
        return True

    @default("storage_capacity")
    def _default_storage_capacity(self):
        return "20Gi"

    @default("uid")
    def _default_uid(self):
        return 1000

    @default("gid")
    def _default_gid(self):
        return 100

    @default("fs_gid")
    def _default_fs_gid(self):
        return 100

    @default("automount_service_account_token")
    def _default_automount(self):
        return False

    @default("container_security_context")
    def _default_container_security_context(self):
        return {
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }

    @default("volumes")
    def _default_volumes(self):
        return {
            "home": {"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}},
            "public": {
                "name": "public",
                "persistentVolumeClaim": {"claimName": self.public_claim_name, "readOnly": True},
            },
        }

    @default("volume_mounts")
    def _default_volume_mounts(self):
        return {
            "home": {"name": "home", "mountPath": self.disk_mount_path},
            "public": {"name": "public", "mountPath": self.public_mount_path, "readOnly": True},
            "shm": {"name": "shm", "mountPath": "/dev/shm"},
        }

    starter_notebooks_dir = Unicode(
        "/opt/meterhub/notebooks",
        help="Notebooks in the image copied into a user's disk on the first start.",
    ).tag(config=True)

    def starter_copy_script(self) -> str:
        """Copy the starter notebooks into HOME once per disk (a marker file): a user who
        deletes one keeps it deleted."""
        return (
            'marker="$HOME/.meterhub-starters"; [ -e "$marker" ] && exit 0;'
            f' for f in {self.starter_notebooks_dir}/*.ipynb; do [ -e "$f" ] &&'
            ' cp -n "$f" "$HOME"/; done; touch "$marker"'
        )

    def merged_lifecycle_hooks(self, configured: dict) -> dict:
        """The configured hooks (z2jh's `singleuser.lifecycleHooks`) plus the starter copy.

        A configured `exec` postStart runs after the copy, in the same shell; any other
        kind of postStart (httpGet) cannot be chained, so it replaces the copy, with a
        warning.
        """
        hooks = copy.deepcopy(configured or {})
        theirs = hooks.get("postStart")
        script = self.starter_copy_script()
        if theirs is None:
            hooks["postStart"] = {"exec": {"command": ["sh", "-c", script]}}
        elif (theirs.get("exec") or {}).get("command"):
            # the copy in a subshell: its early `exit 0` must not skip the configured hook
            then = shlex.join(theirs["exec"]["command"])
            hooks["postStart"] = {"exec": {"command": ["sh", "-c", f"( {script} ); {then}"]}}
        else:
            self.log.warning(
                "lifecycle_hooks.postStart is not an exec hook; starter notebooks are not copied"
            )
        return hooks

    @default("profile_list")
    def _default_profile_list(self):
        return _profile_list

    # ------------------------------------------------------------ user options

    @default("options_form")
    def _default_options_form(self):
        # the hub's spawn form (hub/spawn_form.py) replaces this in a meterhub deployment
        from .form import render_options_form

        return lambda spawner: render_options_form(
            spawner.catalog, None, groups=group_names(spawner.user)
        )

    def _load_config(self, cfg, section_names=None, traits=None):
        # z2jh (and any operator) configures c.KubeSpawner; what meterhub owns is taken only
        # from c.KubeGPUSpawner, so the order the two configs ran in cannot matter
        return super()._load_config(_without_owned(cfg, KubeGPUSpawner), section_names, traits)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.environment = {**self.environment, **self.meterhub_environment}
        self.lifecycle_hooks = self.merged_lifecycle_hooks(self.lifecycle_hooks)
        # what the configuration says, before any choice: each start begins from here
        self._configured = {name: copy.deepcopy(getattr(self, name)) for name in CHOICE_TRAITS}

    async def load_user_options(self):
        """Check the options like every backend (400, 403), then let KubeSpawner apply them.

        The spawner object outlives a server: undo the last start's choice first, so an
        A800 start after a debug one (or the reverse) carries nothing over.
        """
        self.choice = self.parse_options()
        self.user_options = dict(self.choice.user_options)
        for name, value in self._configured.items():
            setattr(self, name, copy.deepcopy(value))
        await super().load_user_options()
        groups = self._start_groups
        self.shared_groups = self.user_shared_groups() if groups is None else groups
        volumes, mounts = self.group_folder_volumes(self.shared_groups)
        self.volumes = _with(self.volumes, volumes)
        self.volume_mounts = _with(self.volume_mounts, mounts)

    # ------------------------------------------------------------ group folders

    _start_groups = None

    def user_shared_groups(self) -> list[SharedGroup]:
        """The user's groups with a shared folder, read now (membership changes apply at
        the next start)."""
        if not self.group_folders:
            return []
        if self.enable_user_namespaces:
            self.log.warning("Group folders need one namespace for all users; none mounted")
            return []
        return shared_folder_groups(self.user, self.log)

    def group_claim_name(self, group: SharedGroup) -> str:
        return self.group_folder_claim_template.format(group=dns_label(group.name))

    def group_folder_volumes(self, groups: list[SharedGroup]) -> tuple[dict, dict]:
        """The volumes and volume mounts of `groups`' folders, keyed so that KubeSpawner
        (which sorts by key) lists them after the disk they are mounted in."""
        volumes, mounts = {}, {}
        for group in groups:
            name = f"group-{dns_label(group.name, 63 - len('group-'))}"
            key = f"shared-{group.name}"
            volumes[key] = {
                "name": name,
                "persistentVolumeClaim": {"claimName": self.group_claim_name(group)},
            }
            mounts[key] = {
                "name": name,
                "mountPath": f"{self.disk_mount_path.rstrip('/')}/shared/{group.name}",
            }
        return volumes, mounts

    def get_group_pvc_manifest(self, group: SharedGroup):
        """The claim of a group's shared folder (pure; what `ensure_group_claims` creates)."""
        return make_pvc(
            name=self.group_claim_name(group),
            storage_class=self.group_folder_storage_class,
            access_modes=["ReadWriteMany"],
            selector=None,
            storage=self.group_folder_capacity,
            labels={
                **self.common_labels,
                "app.kubernetes.io/component": "group-folder",
                "component": "group-folder",
            },
            annotations={"meterhub.io/group": group.name},
        )

    async def ensure_group_claims(self, groups: list[SharedGroup]) -> None:
        """Create the groups' claims that do not exist yet; "already exists" is success."""
        for group in groups:
            pvc = self.get_group_pvc_manifest(group)
            await exponential_backoff(
                partial(self._make_create_pvc_request, pvc, self.k8s_api_request_timeout),
                _("Could not create the shared-folder claim %(claim)s", claim=pvc.metadata.name),
                timeout=self.k8s_api_request_retry_timeout,
            )

    async def _start(self):
        # the claims must exist before the pod that mounts them; membership is read once
        groups = self.user_shared_groups()
        if groups and self.group_folder_ensure:
            await self.ensure_group_claims(groups)
        self._start_groups = groups
        try:
            return await super()._start()
        finally:
            self._start_groups = None

    # ------------------------------------------------------------ profiles

    def products(self, slug: str) -> list[str]:
        return list(self.node_products.get(slug) or [self.catalog.types()[slug].node_product])

    def choice_override(self, choice: Choice) -> dict:
        """What a choice sets on top of the configuration (KubeSpawner merges dicts, replaces
        lists and values); load_user_options resets the configured values first."""
        configured = self._configured
        gpu = not choice.profile.is_debug
        environment = {
            "METERHUB_PROFILE": choice.profile.slug,
            "METERHUB_GPUS": str(choice.gpus),
            "METERHUB_PUBLIC_DIR": self.public_mount_path,
            # the pod's grace period: how long its kernels get to exit on SIGTERM
            "METERHUB_STOP_GRACE_SECONDS": str(self.delete_grace_period),
            **self.catalog.idle_env(choice.profile.slug),
        }
        override = {
            "cpu_limit": float(choice.cpu),
            "cpu_guarantee": float(choice.cpu_guarantee),
            "mem_limit": choice.memory_gib * GIB,
            "mem_guarantee": choice.memory_guarantee_gib * GIB,
            "environment": environment,
            "volumes": {
                "shm": {
                    "name": "shm",
                    "emptyDir": {"medium": "Memory", "sizeLimit": f"{choice.shm_gib}Gi"},
                }
            },
            "extra_labels": {
                "meterhub.io/profile": choice.profile.slug,
                "meterhub.io/gpus": str(choice.gpus),
            },
        }
        if not gpu:
            environment.update(HIDE_GPUS)
            override["image"] = configured["image"]
            override["node_selector"] = dict(self.debug_node_selector)
            return override
        override["image"] = self.gpu_image or configured["image"]
        override["extra_resource_limits"] = {GPU_RESOURCE: str(choice.gpus)}
        override["extra_resource_guarantees"] = {GPU_RESOURCE: str(choice.gpus)}
        override["node_affinity_required"] = [
            *configured["node_affinity_required"],
            {
                "matchExpressions": [
                    {
                        "key": self.node_label,
                        "operator": "In",
                        "values": self.products(choice.profile.slug),
                    }
                ]
            },
        ]
        override["tolerations"] = [*configured["tolerations"], *self.gpu_tolerations]
        return override

    def environment_override(self, environment: Environment) -> dict:
        """What an environment sets on top of its profile's choice (applied after it): its
        image, where it has one (the built-in `pytorch` keeps `image` / `gpu_image`)."""
        override: dict = {"environment": {"METERHUB_ENVIRONMENT": environment.slug}}
        if environment.image:
            override["image"] = environment.image
        return override


def environment_option(spawner: KubeGPUSpawner, catalog: Catalog, debug: bool) -> dict:
    """The `environment` profile option of a profile: the catalog's environments (not the
    GPU-only ones in debug mode), the default one preselected."""
    choices = {}
    for environment in catalog.environments_offered().values():
        if debug and environment.gpu_only:
            continue
        choices[environment.slug] = {
            "display_name": _(environment.display_name),
            "kubespawner_override": spawner.environment_override(environment),
        }
        if environment.default:
            choices[environment.slug]["default"] = True
    return {"display_name": _("Environment"), "choices": choices}


def _with(configured: dict | list, added: dict) -> dict | list:
    """KubeSpawner's `volumes` or `volume_mounts` (a dict, or a list) plus `added`."""
    if isinstance(configured, dict):
        return {**configured, **added}
    return [*configured, *added.values()]


def _without_owned(cfg: Config, cls: type) -> Config:
    """`cfg` without OWNED_TRAITS in the sections of the classes `cls` derives from."""
    inherited = {base.__name__ for base in cls.mro()[1:]}
    touched = [
        name
        for name in inherited
        if dict.__contains__(cfg, name) and any(t in cfg[name] for t in OWNED_TRAITS)
    ]
    if not touched:
        return cfg
    filtered = Config(cfg)
    for name in touched:
        filtered[name] = Config({k: v for k, v in cfg[name].items() if k not in OWNED_TRAITS})
    return filtered


def _profile_list(spawner: KubeGPUSpawner) -> list[dict]:
    """KubeSpawner's profile_list, from the catalog: a profile per GPU type plus debug.

    Profiles and counts the user's groups may not use are left out, so KubeSpawner's own
    validation refuses them too (meterhub's check runs first, with a clearer message).
    """
    return profile_list_for(spawner, spawner.catalog, group_names(spawner.user))


def profile_list_for(spawner: KubeGPUSpawner, catalog: Catalog, groups) -> list[dict]:
    profiles = []
    for profile in catalog.profiles().values():
        if catalog.profile_refusal(profile, groups):
            continue
        if profile.is_debug:
            choice = Choice(profile, 0)
            profiles.append(
                {
                    "slug": profile.slug,
                    "display_name": profile.display_name,
                    "description": _(
                        "No GPU, same disk · %(price)s per hour", price=profile.price_per_hour
                    ),
                    "kubespawner_override": spawner.choice_override(choice),
                    "profile_options": {
                        "environment": environment_option(spawner, catalog, debug=True)
                    },
                }
            )
            continue
        gpu_type = profile.gpu_type
        choices = {}
        for count in profile.counts:
            choice = Choice(profile, count)
            if catalog.refusal(choice, groups):
                continue
            choices[str(count)] = {
                "display_name": _(
                    "%(label)s · %(price)s per hour",
                    label=choice.label,
                    price=profile.price_per_hour * count,
                ),
                "kubespawner_override": spawner.choice_override(choice),
            }
        if not choices:
            continue
        profiles.append(
            {
                "slug": profile.slug,
                "display_name": profile.display_name,
                "description": _(
                    "%(vram)s GB per GPU · %(price)s per GPU-hour",
                    vram=gpu_type.vram_gb,
                    price=profile.price_per_hour,
                ),
                # in this order: the environment's image goes over the GPU choice's
                "profile_options": {
                    "gpus": {"display_name": _("GPUs"), "choices": choices},
                    "environment": environment_option(spawner, catalog, debug=False),
                },
            }
        )
    return profiles
