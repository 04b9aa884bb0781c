"""`meterhub render-slurm`: the batch script the Slurm backend would submit.

Offline: SlurmGPUSpawner is built from the site config and asked for its script; no
cluster is contacted. For operators to review a profile (and for the tests, which give
every profile's script to `sbatch --test-only` on the test cluster).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from tornado import web
from traitlets.config import Config

from meterhub.i18n import _
from meterhub.spawner.options import ready_environment_prefix

from .config import apply_spawner_config
from .render_k8s import RenderError, _fake_user, refusal_text

#: the server's token is made at spawn; the script only names the variable
TOKEN_PLACEHOLDER = "<the server's own token, made at spawn>"


def offline_spawner(site: dict, user: str, groups=()):
    """A SlurmGPUSpawner with the site's config, for a user in `groups`."""
    from types import SimpleNamespace

    from meterhub.spawner.slurm import SlurmGPUSpawner

    if not (site.get("slurm") or {}).get("home_root"):
        raise RenderError(_("slurm.home_root is not set in the site config"))
    config = apply_spawner_config(dict(site, backend="slurm"), Config())
    host = site["slurm"]["hub_host"]
    port = site["hub"]["api_port"]
    hub = SimpleNamespace(
        public_host="",
        url=f"http://{host}:{port}/hub/",
        base_url="/hub/",
        api_url=f"http://{host}:{port}/hub/api",
    )
    spawner = SlurmGPUSpawner(config=config, user=_fake_user(user, groups), hub=hub)
    spawner.api_token = TOKEN_PLACEHOLDER
    return spawner


def render(
    site: dict,
    user: str,
    profile: str,
    gpus: int | None = None,
    credit: str | None = None,
    groups=(),
    environment: str | None = None,
) -> str:
    """The batch script for `user` starting `profile` (with `gpus`, in `environment`); with
    `credit` (an amount in the site currency), the time limit that credit buys at the
    profile's rate."""
    from meterhub.billing_hooks.money import seconds_covered, to_micros

    spawner = offline_spawner(site, user, groups)
    spawner.user_options = {
        "profile": profile,
        **({"gpus": str(gpus)} if gpus is not None else {}),
        **({"environment": environment} if environment is not None else {}),
    }
    try:
        spawner.choice = spawner.parse_options()
        spawner.env_prefix = ready_environment_prefix(spawner, spawner.choice)
    except web.HTTPError as e:
        raise RenderError(refusal_text(e)) from None
    if credit is not None:
        try:
            amount = Decimal(credit)
        except InvalidOperation:
            raise RenderError(
                _("--credit: not an amount: %(credit)s", credit=repr(credit))
            ) from None
        if not amount.is_finite() or amount < 0 or amount.as_tuple().exponent < -2:
            raise RenderError(
                _("--credit: expected an amount like 12.50, got %(credit)s", credit=repr(credit))
            )
        spawner.credit_seconds = seconds_covered(
            to_micros(amount), to_micros(spawner.choice.rate_per_hour)
        )
    from meterhub.spawner.slurm import job_script

    return job_script(spawner.job_spec(spawner.choice, spawner.get_env()))
