"""Environments: what software a server runs, chosen at spawn beside the profile.

An environment is a Python environment on the local and Slurm backends (built from a pinned
requirements file into `<data_dir>/envs/<slug>` by `meterhub env build`, or an existing
prefix) and an image on Kubernetes. The catalog (`Catalog.environments`) holds the list;
user options name one: `{"profile": "debug", "environment": "minimal"}`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from meterhub.i18n import N_, _

#: an environment's slug: a form field, a folder name, a Kubernetes label value
ENV_SLUG_PATTERN = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?\Z")
ENV_SLUG_RULE = "lower-case letters, digits and '-', starting with a letter, at most 32 characters"
#: the image tag of the built-in environments' images (images/<name>/Dockerfile)
IMAGE_TAG = "0.1.0"
IMAGE_REGISTRY = "ghcr.io/meterhub"


@dataclass(frozen=True)
class Environment:
    slug: str
    #: how the spawn page names it (built-in ones are translated, marked with N_)
    display_name: str
    description: str = ""
    #: a pinned requirements file for the local and Slurm backends: a path, absolute or
    #: relative to meterhub's own `envs` folder (images/envs); "" for none
    requirements: str = ""
    #: the image on Kubernetes; "" for the spawner's configured images (image, gpu_image)
    image: str = ""
    #: only GPU profiles may start it (it needs CUDA); refused in debug mode
    gpu_only: bool = False
    default: bool = False
    #: local and Slurm: run from this existing Python environment instead of a built one;
    #: "" with no requirements: the servers' environment (`server_env_prefix`, the hub's own)
    prefix: str = ""

    @property
    def builds(self) -> bool:
        """Whether `meterhub env build` makes it (else it runs from an existing prefix)."""
        return bool(self.requirements) and not self.prefix


#: the built-in environments; a site's `environments` list picks and overrides them
BUILTIN_ENVIRONMENTS: dict[str, Environment] = {
    e.slug: e
    for e in (
        Environment(
            "pytorch",
            N_("PyTorch"),
            N_("PyTorch, Transformers, PEFT, Accelerate, Datasets: the LoRA starter's stack"),
            # the servers' own environment (what `make` installs: meterhub[lab]); an operator
            # may give it a requirements file of its own to build it apart
            requirements="",
            image="",
            default=True,
        ),
        Environment(
            "deepspeed",
            N_("DeepSpeed"),
            N_("PyTorch with DeepSpeed for ZeRO and multi-GPU training"),
            requirements="deepspeed.txt",
            image=f"{IMAGE_REGISTRY}/singleuser-deepspeed:{IMAGE_TAG}",
        ),
        Environment(
            "vllm",
            N_("vLLM"),
            N_("vLLM for fast LLM inference and serving (needs a GPU)"),
            requirements="vllm.txt",
            image=f"{IMAGE_REGISTRY}/singleuser-vllm:{IMAGE_TAG}",
            gpu_only=True,
        ),
        Environment(
            "minimal",
            N_("Minimal"),
            N_("JupyterLab with NumPy, pandas, SciPy and Matplotlib; no PyTorch"),
            requirements="minimal.txt",
            image=f"{IMAGE_REGISTRY}/singleuser-minimal:{IMAGE_TAG}",
        ),
    )
}

#: site config fields of an environment, with their kind
ENVIRONMENT_FIELDS: dict[str, str] = {
    "slug": "slug",
    "display_name": "text",
    "description": "text",
    "requirements": "path",
    "image": "text",
    "gpu_only": "bool",
    "default": "bool",
    "prefix": "path",
}


def _field(value: object, kind: str, where: str):
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind == "slug":
        if not isinstance(value, str) or not ENV_SLUG_PATTERN.match(value):
            raise ValueError(f"{where}: an environment's slug is {ENV_SLUG_RULE}, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    if kind == "path" and value and ("\n" in value or "\0" in value):
        raise ValueError(f"{where}: not a path: {value!r}")
    if kind == "text" and not value.strip():
        raise ValueError(f"{where}: expected a non-empty string")
    return value.strip()


def merge_environments(
    configured: Sequence[Mapping] | None, where: str = "environments"
) -> dict[str, Environment]:
    """The environments a site offers, in its order, the default first among equals.

    None or empty: every built-in one. Otherwise exactly the listed ones: an entry with a
    built-in slug takes that environment's fields and overrides those it gives; a new slug
    gives `display_name` and a way to run it (`requirements`, `prefix` or `image`). One
    entry at most says `default: true`; with none, the first is the default. Raise
    ValueError naming the key of the first problem.
    """
    if not configured:
        return dict(BUILTIN_ENVIRONMENTS)
    if isinstance(configured, (str, bytes)) or not isinstance(configured, Sequence):
        raise ValueError(f"{where}: expected a list of environments")
    found: dict[str, Environment] = {}
    for i, entry in enumerate(configured):
        key = f"{where}.{i}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{key}: expected a mapping of fields, got {entry!r}")
        unknown = sorted(set(entry) - set(ENVIRONMENT_FIELDS))
        if unknown:
            raise ValueError(
                f"{key}.{unknown[0]}: unknown key (allowed here: {', '.join(ENVIRONMENT_FIELDS)})"
            )
        if "slug" not in entry:
            raise ValueError(f"{key}.slug: required")
        values = {
            name: _field(entry[name], kind, f"{key}.{name}")
            for name, kind in ENVIRONMENT_FIELDS.items()
            if name in entry
        }
        slug = values["slug"]
        if slug in found:
            raise ValueError(f"{key}.slug: {slug!r} is listed twice")
        builtin = BUILTIN_ENVIRONMENTS.get(slug)
        if builtin is not None:
            # a site's list decides the default: a built-in's own flag does not carry over
            found[slug] = replace(builtin, **{"default": False, **values})
            continue
        if "display_name" not in values:
            raise ValueError(f"{key}.display_name: required for a new environment")
        if not any(values.get(k) for k in ("requirements", "prefix", "image")):
            raise ValueError(
                f"{key}: a new environment needs `requirements` or `prefix` (local and Slurm"
                " backends) or `image` (Kubernetes)"
            )
        found[slug] = Environment(**values)
    defaults = [e.slug for e in found.values() if e.default]
    if len(defaults) > 1:
        raise ValueError(
            f"{where}: only one environment may be the default ({', '.join(defaults)})"
        )
    if not defaults:
        first = next(iter(found))
        found[first] = replace(found[first], default=True)
    default = next(e for e in found.values() if e.default)
    if default.gpu_only:
        raise ValueError(
            f"{where}: the default environment {default.slug!r} is gpu_only; debug mode needs"
            " a default it can start"
        )
    return found


def default_environment(environments: Mapping[str, Environment]) -> Environment:
    return next(e for e in environments.values() if e.default)


# ------------------------------------------------------------------ built environments
# `meterhub env build SLUG` installs an environment into a folder of its own below
# `<envs_dir>/.builds/` and then points the link `<envs_dir>/<slug>` at it, so a rebuild
# never changes the files of a server that runs from the previous build.

#: the file a finished build writes last: without it the folder is not a built environment
BUILD_INFO = "meterhub-env.json"
BUILDS_DIR = ".builds"


class EnvironmentNotReady(Exception):
    """The environment cannot be started here; the message says what to do, `brief` says it
    in a few words beside the spawn page's choice."""

    def __init__(self, message: str, brief: str = ""):
        super().__init__(message)
        self.brief = brief or message


def builtin_requirements_dir() -> str:
    """meterhub's own pinned requirements of the built-in environments (`meterhub.envs`,
    images/envs: data only)."""
    spec = importlib.util.find_spec("meterhub.envs")
    folders = [p for p in (spec.submodule_search_locations or []) if os.path.isdir(p)]
    return folders[0] if folders else ""


def requirements_path(environment: Environment) -> str:
    """The environment's requirements file, absolute ("" when it has none)."""
    if not environment.requirements:
        return ""
    return os.path.join(builtin_requirements_dir(), os.path.expanduser(environment.requirements))


def built_link(envs_dir: str, slug: str) -> str:
    return os.path.join(envs_dir, slug)


def build_info(prefix: str) -> dict | None:
    """What a finished build of the environment at `prefix` recorded, or None."""
    try:
        with open(os.path.join(prefix, BUILD_INFO)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def environment_prefix(environment: Environment, envs_dir: str, server_env_prefix: str) -> str:
    """The Python environment a server of `environment` runs from, resolved to a real path
    (a rebuild later moves the link, not this server's files); EnvironmentNotReady when it
    is not there to run."""
    if environment.prefix:
        prefix = environment.prefix
        if not os.path.isfile(os.path.join(prefix, "bin", "jupyterhub-singleuser")):
            raise EnvironmentNotReady(
                _(
                    "The %(environment)s environment's prefix %(prefix)s has no"
                    " jupyterhub-singleuser; install meterhub[lab] into it",
                    environment=environment.slug,
                    prefix=prefix,
                )
            )
        return prefix
    if not environment.requirements:
        return server_env_prefix
    prefix = os.path.realpath(built_link(envs_dir, environment.slug))
    if build_info(prefix) is None:
        raise EnvironmentNotReady(
            _(
                "The %(environment)s environment is not built on this hub yet; an admin builds"
                " it with: meterhub env build %(environment)s",
                environment=environment.slug,
            ),
            _("not built yet: meterhub env build %(environment)s", environment=environment.slug),
        )
    return prefix
