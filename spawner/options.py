"""What every meterhub backend shares about user options: the catalog, the form's fields,
validation and group restrictions.

User options are the same for every backend: `{"profile": "debug"}` or
`{"profile": "a800", "gpus": "2"}`. They are validated on the server, whatever the form
showed: HTTP 400 for a malformed choice, 403 for one the user's groups may not use.
"""

from __future__ import annotations

from tornado import web
from traitlets import Instance, default
from traitlets.config import LoggingConfigurable

from .catalog import Catalog, Choice, InvalidChoice


def group_names(user) -> frozenset[str]:
    """The JupyterHub groups of a spawner's user (a hub User or its ORM row)."""
    return frozenset(group.name for group in getattr(user, "groups", None) or ())


class CatalogOptions(LoggingConfigurable):
    """Mixin for a Spawner: parse and authorize user options against the catalog."""

    catalog = Instance(Catalog)
    #: the validated choice of the current or last start
    choice = Instance(Choice, allow_none=True)

    @default("catalog")
    def _default_catalog(self):
        return Catalog(parent=self)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return _apply_catalog_options

    def options_from_form(self, formdata):
        """The form posts `profile` and, per GPU profile, `gpus_<profile>`."""
        profile = (formdata.get("profile") or [""])[0]
        options = {"profile": profile}
        gpus = (formdata.get(f"gpus_{profile}") or [""])[0]
        if gpus:
            options["gpus"] = gpus
        return options

    def parse_options(self) -> Choice:
        """The validated, permitted choice from user_options; an HTTP error otherwise."""
        try:
            choice = self.catalog.parse(self.user_options)
        except InvalidChoice as e:
            raise web.HTTPError(400, str(e), reason="Invalid profile") from None
        refusal = self.catalog.refusal(choice, group_names(self.user))
        if refusal:
            raise web.HTTPError(403, refusal, reason="Profile not allowed")
        return choice


def _apply_catalog_options(spawner: CatalogOptions, user_options: dict) -> None:
    """Check user options before billing or any allocation (start() checks again)."""
    spawner.choice = spawner.parse_options()
