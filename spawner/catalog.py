"""The one catalog of GPU types and profiles.

Every backend, the spawn form and billing read profiles from here; nothing else defines one.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from traitlets import Dict, Int, Unicode
from traitlets.config import LoggingConfigurable

from .amounts import AmountError, parse_decimal

#: GPU counts a profile may ask for.
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8)

DEBUG = "debug"


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

PROFILE_SLUGS: tuple[str, ...] = (DEBUG, *GPU_TYPES)

#: period: (seconds, hours of use priced, share of the hourly price), from DESIGN.md
PASS_PERIODS: dict[str, tuple[int, int, Decimal]] = {
    "daily": (86_400, 24, Decimal("0.90")),
    "weekly": (7 * 86_400, 168, Decimal("0.75")),
    "monthly": (30 * 86_400, 720, Decimal("0.62")),
}


def gpu_type_for_product(product_name: str) -> GpuType | None:
    """Map an NVML product name ("NVIDIA A800-SXM4-80GB") to a GPU type, or None."""
    name = product_name.lower()
    for gpu_type in GPU_TYPES.values():
        if any(pattern in name for pattern in gpu_type.product_patterns):
            return gpu_type
    return None


def parse_price(value: object, where: str) -> Decimal:
    """A price per hour from config: a positive amount with at most two decimals."""
    try:
        return parse_decimal(value, where=where, allow_numbers=True)
    except AmountError as e:
        raise ValueError(str(e)) from None


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
        if self.profile.is_debug:
            return {"profile": DEBUG}
        return {"profile": self.profile.slug, "gpus": str(self.gpus)}

    @property
    def label(self) -> str:
        if self.profile.is_debug:
            return "debug mode (no GPU)"
        return f"{self.gpus} × {self.profile.display_name}"


class Catalog(LoggingConfigurable):
    """The profiles this deployment offers, with the site's prices."""

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

    def profile_refusal(self, profile: Profile, groups: set[str] | frozenset[str]) -> str:
        """Why a member of `groups` may not use `profile` at all, or "" when allowed."""
        allowed = self.allowed_groups.get(profile.slug)
        if allowed and not set(allowed) & set(groups):
            return (
                f"{profile.display_name} is limited to the groups"
                f" {', '.join(sorted(allowed))}, and you are in none of them"
            )
        return ""

    def refusal(self, choice: Choice, groups: set[str] | frozenset[str]) -> str:
        """Why a member of `groups` may not start `choice`, or "" when allowed."""
        refusal = self.profile_refusal(choice.profile, groups)
        if refusal:
            return refusal
        allowed = self.allowed_groups_by_count.get(choice.profile.slug, {}).get(str(choice.gpus))
        if allowed and not set(allowed) & set(groups):
            return (
                f"{choice.label} is limited to the groups {', '.join(sorted(allowed))},"
                " and you are in none of them"
            )
        return ""

    def pass_price(self, slug: str, gpus: int, period: str) -> Decimal:
        """What a `period` pass for `gpus` GPUs of profile `slug` costs."""
        profile = self.profiles().get(slug)
        if profile is None or profile.is_debug:
            raise InvalidChoice(
                f"Passes are for GPU profiles ({', '.join(GPU_TYPES)}), not {slug!r}"
            )
        if period not in PASS_PERIODS:
            raise InvalidChoice(f"Unknown period {period!r}; choose {', '.join(PASS_PERIODS)}")
        if gpus not in profile.counts:
            raise InvalidChoice(f"'gpus' must be one of {', '.join(map(str, profile.counts))}")
        configured = self.pass_prices.get(slug, {}).get(period)
        if configured is not None:
            per_gpu = parse_price(configured, f"profiles.{slug}.passes.{period}")
        else:
            hours, share = PASS_PERIODS[period][1], PASS_PERIODS[period][2]
            per_gpu = (profile.price_per_hour * hours * share).quantize(
                Decimal("0.01"), rounding=ROUND_HALF_UP
            )
        return per_gpu * gpus

    def profiles(self) -> dict[str, Profile]:
        unknown = set(self.prices) - set(PROFILE_SLUGS)
        if unknown:
            raise ValueError(
                f"Catalog.prices: unknown profile {sorted(unknown)[0]!r}; known: {', '.join(PROFILE_SLUGS)}"
            )
        profiles = {
            DEBUG: Profile(
                DEBUG,
                "Debug mode",
                None,
                parse_price(self.prices.get(DEBUG, DEBUG_PRICE_PER_HOUR), "profiles.debug"),
                (),
                cpu=self.debug_cpu,
                memory_gib=self.debug_memory_gib,
            )
        }
        for slug, gpu_type in GPU_TYPES.items():
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
                f"Choose a profile: {{'profile': one of {', '.join(PROFILE_SLUGS)}}}"
            )
        if not isinstance(user_options, dict):
            raise InvalidChoice("user options must be an object")
        unknown = set(user_options) - {"profile", "gpus"}
        if unknown:
            raise InvalidChoice(
                f"Unknown option {sorted(unknown)[0]!r}; allowed options are 'profile' and 'gpus'"
            )
        slug = user_options.get("profile")
        profiles = self.profiles()
        if not isinstance(slug, str) or slug not in profiles:
            raise InvalidChoice(
                f"Unknown profile {slug!r}; choose one of: {', '.join(PROFILE_SLUGS)}"
            )
        profile = profiles[slug]
        raw_gpus = user_options.get("gpus")
        if profile.is_debug:
            if raw_gpus not in (None, "", "0", 0):
                raise InvalidChoice("Debug mode has no GPUs; leave out 'gpus'")
            return Choice(profile, 0)
        if raw_gpus is None:
            raise InvalidChoice(
                f"Profile {slug!r} needs 'gpus': one of {', '.join(map(str, profile.counts))}"
            )
        if isinstance(raw_gpus, bool) or not isinstance(raw_gpus, (int, str)):
            raise InvalidChoice(f"'gpus' must be one of {', '.join(map(str, profile.counts))}")
        try:
            gpus = int(raw_gpus)
        except ValueError:
            gpus = None
        if gpus not in profile.counts or str(raw_gpus).strip() != str(gpus):
            raise InvalidChoice(
                f"'gpus' must be one of {', '.join(map(str, profile.counts))}, got {raw_gpus!r}"
            )
        return Choice(profile, gpus)
