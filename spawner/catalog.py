"""The one catalog of GPU types and profiles.

Every backend, the spawn form and billing read profiles from here; nothing else defines one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from decimal import ROUND_HALF_UP, Decimal

from traitlets import Dict, Int, List, TraitError, Unicode, observe, validate
from traitlets.config import LoggingConfigurable

from meterhub.i18n import N_, _, language

from .amounts import AmountError, parse_decimal
from .environments import Environment, default_environment, merge_environments

#: GPU counts a profile may ask for.
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8)

DEBUG = "debug"
#: how people read debug mode: its profile's name, and a choice of it (the spawn page's label)
DEBUG_NAME = N_("Debug mode")
DEBUG_LABEL = N_("debug mode (no GPU)")


class InvalidChoice(ValueError):
    """User options that do not name a valid profile; the message is shown to the user."""


@dataclass(frozen=True)
class GpuType:
    slug: str
    display_name: str
    vram_gb: int
    default_price_per_hour: Decimal
    #: CPU and memory limits per GPU, the guarantees (requests) on Kubernetes, and the size
    #: of the memory-backed /dev/shm (PyTorch data loaders need more than Docker's 64 MiB)
    cpu_per_gpu: int
    memory_gib_per_gpu: int
    cpu_guarantee_per_gpu: int
    memory_guarantee_gib_per_gpu: int
    shm_gib_per_gpu: int
    #: lower-case substrings of NVML product names that identify this type
    product_patterns: tuple[str, ...]
    #: value of the `nvidia.com/gpu.product` node label set by GPU feature discovery
    node_product: str


#: the built-in GPU types; a site adds or overrides types with `gpu_types` (Catalog.gpu_types)
GPU_TYPES: dict[str, GpuType] = {
    t.slug: t
    for t in (
        GpuType(
            "rtx4090",
            "RTX 4090",
            24,
            Decimal("1.25"),
            cpu_per_gpu=12,
            memory_gib_per_gpu=60,
            cpu_guarantee_per_gpu=8,
            memory_guarantee_gib_per_gpu=48,
            shm_gib_per_gpu=16,
            product_patterns=("rtx 4090",),
            node_product="NVIDIA-GeForce-RTX-4090",
        ),
        GpuType(
            "a800",
            "A800",
            80,
            Decimal("4.50"),
            cpu_per_gpu=16,
            memory_gib_per_gpu=120,
            cpu_guarantee_per_gpu=12,
            memory_guarantee_gib_per_gpu=96,
            shm_gib_per_gpu=32,
            product_patterns=("a800",),
            node_product="NVIDIA-A800-SXM4-80GB",
        ),
        GpuType(
            "h800",
            "H800",
            80,
            Decimal("6.67"),
            cpu_per_gpu=20,
            memory_gib_per_gpu=200,
            cpu_guarantee_per_gpu=16,
            memory_guarantee_gib_per_gpu=160,
            shm_gib_per_gpu=48,
            product_patterns=("h800",),
            node_product="NVIDIA-H800",
        ),
    )
}

DEBUG_PRICE_PER_HOUR = Decimal("0.10")
DEBUG_CPU = 2
DEBUG_MEMORY_GIB = 8
DEBUG_CPU_GUARANTEE = 0.5
DEBUG_MEMORY_GUARANTEE_GIB = 2
DEBUG_SHM_GIB = 1

#: the built-in profiles; a configured catalog's are `Catalog.slugs()`
PROFILE_SLUGS: tuple[str, ...] = (DEBUG, *GPU_TYPES)

#: a GPU type's slug: it is a form field, a Kubernetes label value and a ledger profile name
SLUG_PATTERN = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?\Z")
SLUG_RULE = "lower-case letters, digits and '-', starting with a letter, at most 32 characters"

#: site config field -> (GpuType field, kind); the other GpuType fields have the same name
GPU_TYPE_FIELDS: dict[str, tuple[str, str]] = {
    "display_name": ("display_name", "text"),
    "vram_gb": ("vram_gb", "int"),
    "price_per_hour": ("default_price_per_hour", "price"),
    "cpu_per_gpu": ("cpu_per_gpu", "int"),
    "memory_gib_per_gpu": ("memory_gib_per_gpu", "int"),
    "cpu_guarantee_per_gpu": ("cpu_guarantee_per_gpu", "int"),
    "memory_guarantee_gib_per_gpu": ("memory_guarantee_gib_per_gpu", "int"),
    "shm_gib_per_gpu": ("shm_gib_per_gpu", "int"),
    "product_patterns": ("product_patterns", "patterns"),
    "node_product": ("node_product", "text"),
}
#: fields a new GPU type must give; the guarantees and /dev/shm are derived when left out
GPU_TYPE_REQUIRED: tuple[str, ...] = (
    "display_name",
    "vram_gb",
    "price_per_hour",
    "cpu_per_gpu",
    "memory_gib_per_gpu",
    "product_patterns",
    "node_product",
)

#: period: (seconds, hours of use priced, share of the hourly price)
PASS_PERIODS: dict[str, tuple[int, int, Decimal]] = {
    "daily": (86_400, 24, Decimal("0.90")),
    "weekly": (7 * 86_400, 168, Decimal("0.75")),
    "monthly": (30 * 86_400, 720, Decimal("0.62")),
}


def gpu_type_for_product(
    product_name: str, gpu_types: Mapping[str, GpuType] | None = None
) -> GpuType | None:
    """Map an NVML product name ("NVIDIA A800-SXM4-80GB") to a GPU type, or None.

    `gpu_types`: the configured catalog's (`Catalog.types()`); default the built-in ones.
    """
    name = product_name.lower()
    for gpu_type in (GPU_TYPES if gpu_types is None else gpu_types).values():
        if any(pattern in name for pattern in gpu_type.product_patterns):
            return gpu_type
    return None


def parse_price(value: object, where: str) -> Decimal:
    """A price per hour from config: a positive amount with at most two decimals."""
    try:
        return parse_decimal(value, where=where, allow_numbers=True)
    except AmountError as e:
        raise ValueError(str(e)) from None


def _gpu_type_value(value: object, kind: str, where: str):
    if kind == "price":
        return parse_price(value, where)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
            raise ValueError(f"{where}: expected a whole number from 1 to 4096, got {value!r}")
        return value
    if kind == "patterns":
        if (
            isinstance(value, str)
            or not isinstance(value, (list, tuple))
            or not value
            or not all(isinstance(v, str) and v.strip() for v in value)
        ):
            raise ValueError(f"{where}: expected a list of product name substrings, got {value!r}")
        return tuple(v.strip().lower() for v in value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: expected a non-empty string, got {value!r}")
    return value.strip()


def merge_gpu_types(
    configured: Mapping[str, Mapping] | None, where: str = "gpu_types"
) -> dict[str, GpuType]:
    """The built-in GPU types with `configured` ones added or overriding fields of theirs.

    `configured` maps slugs to site-config fields (`price_per_hour`, not
    `default_price_per_hour`). Raise ValueError naming the key of the first problem.
    """
    types = dict(GPU_TYPES)
    if not configured:
        return types
    if not isinstance(configured, Mapping):
        raise ValueError(f"{where}: expected a mapping of GPU type slugs to their fields")
    for slug, entry in configured.items():
        key = f"{where}.{slug}"
        if slug == DEBUG:
            raise ValueError(f"{key}: '{DEBUG}' is debug mode, not a GPU type; choose another slug")
        if not isinstance(slug, str) or not SLUG_PATTERN.match(slug):
            raise ValueError(f"{where}.{slug}: a GPU type slug is {SLUG_RULE}")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{key}: expected a mapping of fields, got {entry!r}")
        unknown = sorted(set(entry) - set(GPU_TYPE_FIELDS))
        if unknown:
            raise ValueError(
                f"{key}.{unknown[0]}: unknown key (allowed here: {', '.join(GPU_TYPE_FIELDS)})"
            )
        values = {
            GPU_TYPE_FIELDS[name][0]: _gpu_type_value(
                entry[name], GPU_TYPE_FIELDS[name][1], f"{key}.{name}"
            )
            for name in GPU_TYPE_FIELDS
            if name in entry
        }
        if slug in types:
            types[slug] = replace(types[slug], **values)
            continue
        missing = [name for name in GPU_TYPE_REQUIRED if name not in entry]
        if missing:
            raise ValueError(
                f"{key}.{missing[0]}: required for a new GPU type"
                f" (new types give {', '.join(GPU_TYPE_REQUIRED)};"
                f" built-in types {', '.join(GPU_TYPES)} take overrides of any field)"
            )
        cpu, memory = values["cpu_per_gpu"], values["memory_gib_per_gpu"]
        values.setdefault("cpu_guarantee_per_gpu", max(1, cpu * 3 // 4))
        values.setdefault("memory_guarantee_gib_per_gpu", max(1, memory * 4 // 5))
        values.setdefault("shm_gib_per_gpu", max(1, memory // 4))
        types[slug] = GpuType(slug=slug, **values)
    for gpu_type in types.values():
        _check_gpu_type(gpu_type, f"{where}.{gpu_type.slug}")
    return types


def _check_gpu_type(gpu_type: GpuType, key: str) -> None:
    """Guarantees are at most the limits (Kubernetes refuses a pod otherwise)."""
    for guarantee, limit in (
        ("cpu_guarantee_per_gpu", "cpu_per_gpu"),
        ("memory_guarantee_gib_per_gpu", "memory_gib_per_gpu"),
    ):
        if getattr(gpu_type, guarantee) > getattr(gpu_type, limit):
            raise ValueError(
                f"{key}.{guarantee}: {getattr(gpu_type, guarantee)} is more than"
                f" {limit} ({getattr(gpu_type, limit)})"
            )


assert {f.name for f in fields(GpuType)} == {"slug"} | {f for f, _k in GPU_TYPE_FIELDS.values()}


@dataclass(frozen=True)
class Profile:
    slug: str
    display_name: str
    gpu_type: GpuType | None
    #: per GPU-hour for GPU profiles, per hour for debug
    price_per_hour: Decimal
    counts: tuple[int, ...]
    #: CPU and memory limits of debug mode (GPU profiles have theirs per GPU, from the type)
    cpu: int = DEBUG_CPU
    memory_gib: int = DEBUG_MEMORY_GIB

    @property
    def is_debug(self) -> bool:
        return self.gpu_type is None


@dataclass(frozen=True)
class Choice:
    """A validated selection: a profile and a GPU count (0 for debug)."""

    profile: Profile
    gpus: int
    #: the user's spend cap for this session ("stop after ¥X"), in the site currency
    max_cost: Decimal | None = None
    #: the user's time cap for this session ("stop after N hours")
    max_hours: int | None = None
    #: what software it runs; None: the catalog's default (a Choice made without options)
    environment: Environment | None = None

    @property
    def rate_per_hour(self) -> Decimal:
        if self.profile.is_debug:
            return self.profile.price_per_hour
        return self.profile.price_per_hour * self.gpus

    @property
    def cpu(self) -> int:
        if self.profile.is_debug:
            return self.profile.cpu
        return self.profile.gpu_type.cpu_per_gpu * self.gpus

    @property
    def memory_gib(self) -> int:
        if self.profile.is_debug:
            return self.profile.memory_gib
        return self.profile.gpu_type.memory_gib_per_gpu * self.gpus

    @property
    def cpu_guarantee(self) -> float:
        if self.profile.is_debug:
            return min(DEBUG_CPU_GUARANTEE, float(self.profile.cpu))
        return float(self.profile.gpu_type.cpu_guarantee_per_gpu * self.gpus)

    @property
    def memory_guarantee_gib(self) -> int:
        if self.profile.is_debug:
            return min(DEBUG_MEMORY_GUARANTEE_GIB, self.profile.memory_gib)
        return self.profile.gpu_type.memory_guarantee_gib_per_gpu * self.gpus

    @property
    def shm_gib(self) -> int:
        if self.profile.is_debug:
            return DEBUG_SHM_GIB
        return self.profile.gpu_type.shm_gib_per_gpu * self.gpus

    @property
    def user_options(self) -> dict[str, str]:
        options = {"profile": self.profile.slug}
        if not self.profile.is_debug:
            options["gpus"] = str(self.gpus)
        if self.max_cost is not None:
            options["max_cost"] = str(self.max_cost)
        if self.max_hours is not None:
            options["max_hours"] = str(self.max_hours)
        if self.environment is not None:
            options["environment"] = self.environment.slug
        return options

    @property
    def label(self) -> str:
        if self.profile.is_debug:
            return _(DEBUG_LABEL)
        # "1 × A800" reads the same in every language
        return f"{self.gpus} × {self.profile.display_name}"


class Catalog(LoggingConfigurable):
    """The profiles this deployment offers, with the site's prices."""

    gpu_types = Dict(
        key_trait=Unicode(),
        help="""
        GPU types added to the built-in ones (rtx4090, a800, h800), or fields of a built-in
        one overridden, by slug: `{"l40s": {"display_name": "L40S", "vram_gb": 48,
        "price_per_hour": "3.20", "cpu_per_gpu": 16, "memory_gib_per_gpu": 96,
        "product_patterns": ["l40s"], "node_product": "NVIDIA-L40S"}}`.

        A new type needs display_name, vram_gb, price_per_hour (per GPU-hour, at most two
        decimals), cpu_per_gpu, memory_gib_per_gpu, product_patterns (lower-case substrings
        of the NVML product name, for detection on the local backend) and node_product (the
        `nvidia.com/gpu.product` node label on Kubernetes). cpu_guarantee_per_gpu,
        memory_guarantee_gib_per_gpu and shm_gib_per_gpu default to 3/4 of the CPUs, 4/5 of
        the memory and 1/4 of the memory. Every backend, the spawn form and billing read
        the types from here.
        """,
    ).tag(config=True)

    @validate("gpu_types")
    def _validate_gpu_types(self, proposal):
        try:
            merge_gpu_types(proposal["value"], where="Catalog.gpu_types")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    def types(self) -> dict[str, GpuType]:
        """The GPU types of this deployment: the built-in ones with `gpu_types` applied."""
        return merge_gpu_types(self.gpu_types, where="Catalog.gpu_types")

    def slugs(self) -> tuple[str, ...]:
        """Every profile slug: debug, then the GPU types."""
        return (DEBUG, *self.types())

    environments = List(
        Dict(),
        help="""
        The environments servers may run, chosen at spawn beside the profile (user option
        `environment`), as a list of `{"slug", "display_name", "description", "requirements",
        "image", "gpu_only", "default", "prefix"}`. Empty (default): the built-in ones,
        `pytorch` (the default: the servers' own environment), `deepspeed`, `vllm` (GPU
        profiles only) and `minimal`. A list offers exactly its entries: one with a built-in
        slug takes that environment's fields and overrides those it gives.

        `requirements` is a pinned requirements file (absolute, or relative to meterhub's
        `envs` folder) that `meterhub env build` installs into `<data_dir>/envs/<slug>` for
        the local and Slurm backends; `prefix` an existing Python environment to run from
        instead (it needs `meterhub[lab]`); `image` the image on Kubernetes. A spawn of an
        environment that is not built is refused with the command that builds it.
        """,
    ).tag(config=True)

    @validate("environments")
    def _validate_environments(self, proposal):
        try:
            merge_environments(proposal["value"], where="Catalog.environments")
        except ValueError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    def environments_offered(self) -> dict[str, Environment]:
        """The environments of this deployment by slug, in the site's order."""
        return merge_environments(self.environments, where="Catalog.environments")

    def default_environment(self) -> Environment:
        return default_environment(self.environments_offered())

    def environment_of(self, choice: Choice) -> Environment:
        """The environment `choice` runs: its own, or the default."""
        return choice.environment or self.default_environment()

    prices = Dict(
        key_trait=Unicode(),
        help="""
        Price per hour by profile slug, overriding the defaults.

        For GPU profiles the price is per GPU-hour; `debug` is per hour. Amounts are
        strings or numbers with at most two decimals in the site currency ("4.50").
        """,
    ).tag(config=True)

    pass_prices = Dict(
        key_trait=Unicode(),
        help="""
        Pass prices per GPU by GPU profile and period, overriding the defaults, e.g.
        `{"a800": {"monthly": "2000.00"}}`. Defaults: a daily pass costs 90% of 24 h at the
        hourly rate, weekly 75% of 168 h, monthly 62% of 720 h.
        """,
    ).tag(config=True)

    extra_options = List(
        Unicode(),
        help="""
        User options besides `profile` and `gpus` that the deployment checks itself (the
        hub adds `wallet`, which billing validates); any other key is refused.
        """,
    ).tag(config=True)

    allowed_groups = Dict(
        key_trait=Unicode(),
        help="""
        Profiles limited to members of JupyterHub groups: `{"h800": ["lab-a", "staff"]}`.
        A profile not listed is open to every user. Enforced on the spawn form and, whatever
        is posted, on the server before anything is allocated.
        """,
    ).tag(config=True)

    allowed_groups_by_count = Dict(
        key_trait=Unicode(),
        help="""
        GPU counts limited to members of JupyterHub groups, per GPU profile:
        `{"a800": {"4": ["staff"], "8": ["staff"]}}`. Counts not listed are open to whoever
        may use the profile.
        """,
    ).tag(config=True)

    debug_cpu = Int(
        DEBUG_CPU,
        min=1,
        help="""
        CPU cores a debug-mode server may use (its limit; a cgroup quota on the local
        backend, `cpu_limit` on Kubernetes).
        """,
    ).tag(config=True)

    debug_memory_gib = Int(
        DEBUG_MEMORY_GIB,
        min=1,
        help="""
        Memory limit of a debug-mode server in GiB. A server that goes over it is stopped
        (the OOM killer on the local backend with cgroups, the kubelet on Kubernetes).
        """,
    ).tag(config=True)

    idle_policy = Dict(
        key_trait=Unicode(),
        help="""
        Idle shutdown per profile slug: `{"a800": {"idle_seconds": 1800, "on_idle": "debug",
        "on_cap": "stop"}}`. `idle_seconds` 0 = never; `on_idle` and `on_cap` are "stop" or
        "debug" (restart in debug mode on the same disk). A profile not listed: 30 minutes
        on a GPU, 4 hours in debug mode, stop. The meter acts on it; servers are told it so
        JupyterLab can warn (site config `profiles.<slug>.idle_minutes`, `on_idle`, `on_cap`).
        """,
    ).tag(config=True)

    idle_warn_seconds = Int(
        300, min=0, help="Seconds before an idle action at which the user is warned."
    ).tag(config=True)

    activity_interval_seconds = Int(
        60,
        min=1,
        help="""
        How often a server reports its activity (kernels, terminals, changes, busy GPUs)
        to the hub's activity API ($JUPYTERHUB_ACTIVITY_INTERVAL), and samples its GPUs.
        """,
    ).tag(config=True)

    gpu_busy_percent = Int(
        5,
        min=0,
        max=100,
        help="GPU utilization (percent, NVML) above which a server counts as busy.",
    ).tag(config=True)

    def profile_refusal(self, profile: Profile, groups: set[str] | frozenset[str]) -> str:
        """Why a member of `groups` may not use `profile` at all, or "" when allowed."""
        allowed = self.allowed_groups.get(profile.slug)
        if allowed and not self._in_any(allowed, groups):
            return _(
                "%(profile)s is limited to the groups %(groups)s, and you are in none of them",
                profile=profile.display_name,
                groups=", ".join(sorted(allowed)),
            )
        return ""

    @staticmethod
    def _in_any(allowed, groups) -> bool:
        """Whether one of `groups` is one of `allowed`, whatever the letter case."""
        return not {_fold(g) for g in allowed}.isdisjoint(_fold(g) for g in groups)

    def refusal(self, choice: Choice, groups: set[str] | frozenset[str]) -> str:
        """Why a member of `groups` may not start `choice`, or "" when allowed."""
        refusal = self.profile_refusal(choice.profile, groups)
        if refusal:
            return refusal
        allowed = self.allowed_groups_by_count.get(choice.profile.slug, {}).get(str(choice.gpus))
        if allowed and not self._in_any(allowed, groups):
            return _(
                "%(profile)s is limited to the groups %(groups)s, and you are in none of them",
                profile=choice.label,
                groups=", ".join(sorted(allowed)),
            )
        return ""

    def pass_price(self, slug: str, gpus: int, period: str) -> Decimal:
        """What a `period` pass for `gpus` GPUs of profile `slug` costs."""
        profile = self.profiles().get(slug)
        if profile is None or profile.is_debug:
            raise InvalidChoice(
                _(
                    "Passes are for GPU profiles (%(profiles)s), not %(profile)s",
                    profiles=", ".join(self.slugs()[1:]),
                    profile=repr(slug),
                )
            )
        if period not in PASS_PERIODS:
            raise InvalidChoice(
                _(
                    "Unknown period %(period)s; choose %(periods)s",
                    period=repr(period),
                    periods=", ".join(PASS_PERIODS),
                )
            )
        if gpus not in profile.counts:
            raise InvalidChoice(
                _("'gpus' must be one of %(counts)s", counts=", ".join(map(str, profile.counts)))
            )
        configured = self.pass_prices.get(slug, {}).get(period)
        if configured is not None:
            per_gpu = parse_price(configured, f"profiles.{slug}.passes.{period}")
        else:
            hours, share = PASS_PERIODS[period][1], PASS_PERIODS[period][2]
            per_gpu = (profile.price_per_hour * hours * share).quantize(
                Decimal("0.01"), rounding=ROUND_HALF_UP
            )
        return per_gpu * gpus

    @observe("gpu_types", "prices", "debug_cpu", "debug_memory_gib")
    def _forget_profiles(self, _change) -> None:
        self.__dict__["_profiles_by_language"] = {}

    def profiles(self) -> dict[str, Profile]:
        """The profiles by slug, debug first; made once a language (debug mode's name is
        translated) while the traits they come from stay the same: a spawn asks for them
        five times, and the hub's catalog is one for all spawns (`per_config`)."""
        made = self.__dict__.setdefault("_profiles_by_language", {})
        code = language()
        if code not in made:
            made[code] = self._make_profiles()
        return dict(made[code])

    def _make_profiles(self) -> dict[str, Profile]:
        gpu_types = self.types()
        slugs = (DEBUG, *gpu_types)
        unknown = set(self.prices) - set(slugs)
        if unknown:
            raise ValueError(
                f"Catalog.prices: unknown profile {sorted(unknown)[0]!r}; known: {', '.join(slugs)}"
            )
        profiles = {
            DEBUG: Profile(
                DEBUG,
                _(DEBUG_NAME),
                None,
                parse_price(self.prices.get(DEBUG, DEBUG_PRICE_PER_HOUR), "profiles.debug"),
                (),
                cpu=self.debug_cpu,
                memory_gib=self.debug_memory_gib,
            )
        }
        for slug, gpu_type in gpu_types.items():
            price = parse_price(
                self.prices.get(slug, gpu_type.default_price_per_hour), f"profiles.{slug}"
            )
            profiles[slug] = Profile(slug, gpu_type.display_name, gpu_type, price, GPU_COUNTS)
        return profiles

    def choice(self, slug: str, gpus: int = 0) -> Choice:
        return self.parse({"profile": slug, "gpus": str(gpus)} if gpus else {"profile": slug})

    def parse(self, user_options: dict | None) -> Choice:
        """Validate user options against the catalog; raise InvalidChoice with a clear message.

        Accepted shapes (the same for every backend): `{"profile": "debug"}` and
        `{"profile": "<gpu type>", "gpus": "<1|2|4|8>"}` (gpus as string or integer).
        """
        if not user_options:
            raise InvalidChoice(
                _(
                    "Choose a profile: {'profile': one of %(profiles)s}",
                    profiles=", ".join(self.slugs()),
                )
            )
        if not isinstance(user_options, dict):
            raise InvalidChoice(_("user options must be an object"))
        allowed = {"profile", "gpus", "environment", *CAP_OPTIONS, *self.extra_options}
        unknown = set(user_options) - allowed
        if unknown:
            raise InvalidChoice(
                _(
                    "Unknown option %(option)s; allowed options are %(allowed)s",
                    option=repr(sorted(unknown)[0]),
                    allowed=", ".join(repr(k) for k in sorted(allowed)),
                )
            )
        slug = user_options.get("profile")
        profiles = self.profiles()
        if not isinstance(slug, str) or slug not in profiles:
            raise InvalidChoice(
                _(
                    "Unknown profile %(profile)s; choose one of: %(profiles)s",
                    profile=repr(slug),
                    profiles=", ".join(profiles),
                )
            )
        profile = profiles[slug]
        max_cost, max_hours = session_caps(user_options)
        environment = self.parse_environment(user_options.get("environment"), profile)
        caps = {"max_cost": max_cost, "max_hours": max_hours, "environment": environment}
        raw_gpus = user_options.get("gpus")
        if profile.is_debug:
            if raw_gpus not in (None, "", "0", 0):
                raise InvalidChoice(_("Debug mode has no GPUs; leave out 'gpus'"))
            return Choice(profile, 0, **caps)
        counts = ", ".join(map(str, profile.counts))
        if raw_gpus is None:
            raise InvalidChoice(
                _(
                    "Profile %(profile)s needs 'gpus': one of %(counts)s",
                    profile=repr(slug),
                    counts=counts,
                )
            )
        gpus = _whole_number(raw_gpus, profile.counts)
        if gpus is None:
            raise InvalidChoice(
                _(
                    "'gpus' must be one of %(counts)s, got %(got)s",
                    counts=counts,
                    got=repr(raw_gpus),
                )
            )
        return Choice(profile, gpus, **caps)

    def parse_environment(self, raw: object, profile: Profile) -> Environment | None:
        """The environment user options name for `profile` (absent or empty: None, the
        default, whatever it is when the server starts); InvalidChoice for an unknown one, or
        a GPU-only one in debug mode."""
        offered = self.environments_offered()
        if raw in (None, ""):
            return None
        if not isinstance(raw, str) or raw not in offered:
            raise InvalidChoice(
                _(
                    "Unknown environment %(environment)s; choose one of: %(environments)s",
                    # never a whole 10 kB value back in a refusal
                    environment=repr(raw)[:60],
                    environments=", ".join(offered),
                )
            )
        environment = offered[raw]
        if environment.gpu_only and profile.is_debug:
            raise InvalidChoice(
                _(
                    "The %(environment)s environment needs a GPU: choose a GPU profile, or"
                    " another environment for debug mode",
                    environment=_(environment.display_name),
                )
            )
        return environment

    def idle(self, slug: str) -> IdlePolicy:
        """What happens to an idle (or capped) server of profile `slug`."""
        given = self.idle_policy.get(slug) or {}
        default = DEBUG_IDLE_SECONDS if slug == DEBUG else GPU_IDLE_SECONDS
        return IdlePolicy(
            idle_seconds=int(given.get("idle_seconds", default)),
            on_idle=given.get("on_idle", "stop"),
            on_cap=given.get("on_cap", "stop"),
        )

    def idle_env(self, slug: str) -> dict[str, str]:
        """What a server of profile `slug` is told of its idle policy (its JupyterLab warns
        with it; the meter decides): the environment of every backend."""
        policy = self.idle(slug)
        return {
            "METERHUB_IDLE_SECONDS": str(policy.idle_seconds),
            "METERHUB_ON_IDLE": policy.on_idle,
            "METERHUB_IDLE_WARN_SECONDS": str(self.idle_warn_seconds),
            "METERHUB_GPU_BUSY_PERCENT": str(self.gpu_busy_percent),
            # jupyterhub-singleuser reports its activity to the hub this often (default 300)
            "JUPYTERHUB_ACTIVITY_INTERVAL": str(self.activity_interval_seconds),
        }


#: user options that cap one session's spend and time (the spawn page's "stop after")
CAP_OPTIONS = ("max_cost", "max_hours")
#: the longest time cap a user may set: 30 days
MAX_HOURS = 720
#: the largest spend cap a user may set
MAX_COST = Decimal("1000000")
#: idle timeouts when the site sets none: 30 minutes on a GPU, 4 hours in debug mode
GPU_IDLE_SECONDS = 30 * 60
DEBUG_IDLE_SECONDS = 240 * 60


@dataclass(frozen=True)
class IdlePolicy:
    #: 0: never idle
    idle_seconds: int
    #: "stop" or "debug" (restart in debug mode on the same disk)
    on_idle: str
    #: what reaching a session's spend or time cap does: "stop" or "debug"
    on_cap: str


def session_caps(user_options: dict) -> tuple[Decimal | None, int | None]:
    """`max_cost` (an amount string, "12.50") and `max_hours` (whole hours) of user
    options; absent or empty: no cap. InvalidChoice says what was expected."""
    raw_cost = user_options.get("max_cost")
    cost = None
    if raw_cost not in (None, ""):
        try:
            cost = parse_decimal(raw_cost, where="max_cost", maximum=MAX_COST)
        except AmountError as e:
            raise InvalidChoice(str(e)) from None
    raw_hours = user_options.get("max_hours")
    hours = None
    if raw_hours not in (None, ""):
        hours = _whole_number(raw_hours, range(1, MAX_HOURS + 1))
        if hours is None:
            raise InvalidChoice(
                _(
                    "max_hours: expected a whole number of hours from 1 to %(max)s, got %(got)s",
                    max=MAX_HOURS,
                    got=repr(raw_hours),
                )
            )
    return cost, hours


def _whole_number(raw: object, allowed: Collection[int]) -> int | None:
    """`raw` as a whole number in `allowed`: an int, or a string of ASCII digits without
    sign, spaces or leading zeros. Anything else: None (the caller says what it expected)."""
    text = str(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else None
    if (
        text is None
        or len(text) > len(str(max(allowed, default=0)))  # before int(): 5000 digits raise
        or not (text.isascii() and text.isdigit())
        or text != str(int(text))
        or int(text) not in allowed
    ):
        return None
    return int(text)


def _fold(name: str) -> str:
    """A group name as it compares: ASCII letters lower-cased, any other name as it is
    (`str.casefold` folds the Kelvin sign to "k"; the billing side folds the same way)."""
    return name.lower() if name.isascii() else name
