"""What every meterhub backend shares about user options: the catalog, the form's fields,
validation and group restrictions; and which of a user's groups have a shared folder.

User options are the same for every backend: `{"profile": "debug"}` or
`{"profile": "a800", "gpus": "2"}`, with an `environment` where the user picks one
(`{"profile": "debug", "environment": "minimal"}`). They are validated on the server, whatever the form
showed: HTTP 400 for a malformed choice, 403 for one the user's groups may not use.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from tornado import web
from traitlets import Instance, Unicode, default
from traitlets.config import LoggingConfigurable

from meterhub.i18n import _

from .catalog import CAP_OPTIONS, Catalog, Choice, InvalidChoice
from .configured import per_config
from .environments import Environment, EnvironmentNotReady, environment_prefix

#: group names that may name a shared folder (a directory, a Kubernetes claim)
SHARED_FOLDER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")


def group_names(user) -> frozenset[str]:
    """The JupyterHub groups of a spawner's user (a hub User or its ORM row)."""
    return frozenset(group.name for group in getattr(user, "groups", None) or ())


@dataclass(frozen=True)
class SharedGroup:
    """A group of the user whose members share a folder at `<disk>/shared/<name>`."""

    name: str
    #: the JupyterHub group's id (the local backend derives the folder's gid from it)
    id: int


def shared_folder_groups(user, log: logging.Logger | None = None) -> list[SharedGroup]:
    """The groups of `user` whose `properties` say `"shared_folder": true`, by name.

    Read at each start: a member removed from a group gets no folder at the next one.
    A group whose name cannot name a folder is skipped with a warning.
    """
    found = []
    for group in getattr(user, "groups", None) or ():
        properties = getattr(group, "properties", None) or {}
        if properties.get("shared_folder") is not True:
            continue
        if not SHARED_FOLDER_NAME.match(group.name):
            (log or logging.getLogger(__name__)).warning(
                "Group %r has a shared folder but its name cannot name one"
                " (lowercase letters, digits, '.', '_', '-'; 64 at most): skipped",
                group.name,
            )
            continue
        found.append(SharedGroup(group.name, group.id))
    return sorted(found, key=lambda g: g.name)


def nothing_allowed(catalog: Catalog, groups: frozenset[str]) -> str:
    """Why a member of `groups` may start no choice of the catalog at all, or "" if one."""
    for profile in catalog.profiles().values():
        counts = (0,) if profile.is_debug else profile.counts
        if any(not catalog.refusal(Choice(profile, n), groups) for n in counts):
            return ""
    named = [*catalog.allowed_groups.values()]
    named += [g for counts in catalog.allowed_groups_by_count.values() for g in counts.values()]
    ask = {}  # one spelling per group (names compare case-insensitively), in a stable order
    for name in sorted({n for names in named for n in names}, key=lambda n: (n.casefold(), n)):
        ask.setdefault(name.casefold(), name)
    return _(
        "Your groups may start no profile on this hub; ask an admin to add you to one of:"
        " %(groups)s",
        groups=", ".join(ask.values()),
    )


class CatalogOptions(LoggingConfigurable):
    """Mixin for a Spawner: parse and authorize user options against the catalog."""

    catalog = Instance(Catalog)
    #: the validated choice of the current or last start
    choice = Instance(Choice, allow_none=True)

    @default("catalog")
    def _default_catalog(self):
        # the hub's one catalog, unless the config has a section for this spawner's own
        # (`LocalGPUSpawner.Catalog`, or below a parent of the spawner's), as traitlets
        # would find it for a catalog with this spawner as its parent
        mine = self._find_my_config(self.config)
        if any(name in mine for name in Catalog.section_names()):
            return Catalog(parent=self)
        return per_config(Catalog, self.config)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return _apply_catalog_options

    def options_from_form(self, formdata):
        """The form posts `profile`, per GPU profile `gpus_<profile>`, and, where the
        deployment offers a choice of who pays, `wallet` (checked by the deployment)."""
        profile = (formdata.get("profile") or [""])[0]
        options = {"profile": profile}
        gpus = (formdata.get(f"gpus_{profile}") or [""])[0]
        if gpus:
            options["gpus"] = gpus
        environment = (formdata.get("environment") or [""])[0]
        if environment:
            options["environment"] = environment
        wallet = (formdata.get("wallet") or [""])[0]
        if wallet and "wallet" in self.catalog.extra_options:
            options["wallet"] = wallet
        # "stop after ¥X / N hours": blank means no cap; the catalog checks the rest
        for cap in CAP_OPTIONS:
            value = (formdata.get(cap) or [""])[0].strip()
            if value:
                options[cap] = value
        return options

    def parse_options(self) -> Choice:
        """The validated, permitted choice from user_options; an HTTP error otherwise."""
        groups = group_names(self.user)
        refusal = nothing_allowed(self.catalog, groups)
        if refusal:
            raise web.HTTPError(403, refusal, reason="No profile allowed")
        try:
            choice = self.catalog.parse(self.user_options)
        except InvalidChoice as e:
            raise web.HTTPError(400, str(e), reason="Invalid profile") from None
        refusal = self.catalog.refusal(choice, groups)
        if refusal:
            raise web.HTTPError(403, refusal, reason="Profile not allowed")
        return choice

    def check_ready(self, choice: Choice) -> None:
        """Refuse (an HTTP error) a valid choice this backend cannot start now, e.g. an
        environment that is not built; the local and Slurm backends check theirs."""

    def environment_refusal(self, environment: Environment) -> str:
        """Why this backend cannot start `environment` now (the spawn page says it), or ""."""
        return ""


class FolderEnvironments(CatalogOptions):
    """For backends that run environments from folders (local, Slurm): the spawner has
    `envs_dir` and `server_env_prefix`; a start resolves its choice's environment once,
    into `env_prefix`, and runs from that."""

    #: the Python environment the current (or last) start runs from
    env_prefix = Unicode()

    @default("env_prefix")
    def _default_env_prefix(self):
        return self.server_env_prefix

    #: (choice, its environment's prefix) that `check_ready` found, for the start that follows
    _checked: tuple[Choice, str] | None = None

    async def resolve_environment(self, choice: Choice) -> None:
        # the check of this spawn's options just found it: no second look (a thread hop)
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == choice:
            self.env_prefix = checked[1]
            return
        self.env_prefix = await asyncio.to_thread(ready_environment_prefix, self, choice)

    def check_ready(self, choice: Choice) -> None:
        self._checked = (choice, ready_environment_prefix(self, choice))

    def environment_refusal(self, environment: Environment) -> str:
        try:
            environment_prefix(environment, self.envs_dir, self.server_env_prefix)
        except EnvironmentNotReady as e:
            return e.brief
        return ""


def ready_environment_prefix(spawner, choice: Choice) -> str:
    """The Python environment `choice` runs from on a backend that runs environments from
    folders (local, Slurm: `envs_dir`, `server_env_prefix`), or a 409 that says how to
    build it."""
    environment = spawner.catalog.environment_of(choice)
    try:
        return environment_prefix(environment, spawner.envs_dir, spawner.server_env_prefix)
    except EnvironmentNotReady as e:
        raise web.HTTPError(409, "%s", e, reason="Environment not built") from None


async def _apply_catalog_options(spawner: CatalogOptions, user_options: dict) -> None:
    """Check user options before billing or any allocation (start() checks again); whether
    the backend can start the choice now looks at files, off the event loop."""
    spawner.choice = spawner.parse_options()
    await asyncio.to_thread(spawner.check_ready, spawner.choice)
