"""The site config: one YAML file, checked by a JSON schema, translated to traitlets.

`apply_config` sets values only on the Config it is given (it reads the OAuth client
secret and the top-up secret from the environment and finds NativeAuthenticator's
templates, nothing else), so the translation is tested by applying it to a fresh `Config()`.
"""

from __future__ import annotations

import copy
import os
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from traitlets.config import Config

from meterhub import i18n
from meterhub.billing_hooks import hooks
from meterhub.billing_hooks.scopes import BILLING_ACCESS, CUSTOM_SCOPES
from meterhub.i18n.web import language_transform
from meterhub.spawner.catalog import DEBUG, merge_gpu_types, parse_price
from meterhub.spawner.environments import merge_environments

from . import spawn_form
from .accounts import USERNAME_PATTERN

HERE = Path(__file__).parent
SCHEMA: dict = yaml.safe_load((HERE / "site-schema.yaml").read_text())
TEMPLATES = str(HERE / "templates")
#: the default single-user image on Kubernetes until meterhub's own images are published
KUBE_IMAGE: str = SCHEMA["properties"]["kubernetes"]["properties"]["image"]["default"]


#: the hub's requests' language (one class: applying the config twice adds it once)
LANGUAGE_TRANSFORM = language_transform("/")


class ConfigError(ValueError):
    """A site config that cannot be used; the message names the file and the key."""


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


#: keys whose values are secrets: a refusal names the key and the rule, never the value
#: (jsonschema's messages quote it, and they go to the hub's log)
SECRET_KEYS = frozenset({"topup_secret", "client_secret", "db_url"})


def _secret_problem(error) -> str:
    """What is wrong with a secret's value, without the value."""
    rule = error.validator_value
    if error.validator == "type":
        return f"must be a {rule} (quote it in the YAML)"
    if error.validator == "minLength":
        return f"too short (at least {rule} characters)"
    if error.validator == "maxLength":
        return f"too long (at most {rule} characters)"
    return f"does not meet the schema's {error.validator} rule"


def validation_errors(site: Any) -> list[str]:
    """Readable messages, one per problem, each naming the key it concerns."""
    # jsonschema imports every optional format checker it can find; rfc3987_syntax alone
    # spends ~2.5 s compiling a grammar, on every CLI call. The site schema uses no formats.
    sys.modules.setdefault("rfc3987_syntax", None)
    import jsonschema

    messages = []
    validator = jsonschema.Draft7Validator(SCHEMA)
    for error in sorted(validator.iter_errors(site), key=lambda e: list(map(str, e.path))):
        where = list(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = sorted(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed)):
                messages.append(
                    f"{_path([*where, key])}: unknown key (allowed here: {', '.join(allowed)})"
                )
        elif error.validator == "oneOf" and where and where[-1] == "price_per_hour":
            messages.append(
                f"{_path(where)}: expected a positive amount with at most two decimals, got {error.instance!r}"
            )
        elif where and where[-1] in SECRET_KEYS:
            messages.append(f"{_path(where)}: {_secret_problem(error)}")
        else:
            messages.append(f"{_path(where)}: {error.message}")
    return messages


def _yaml_problem(error: yaml.YAMLError) -> str:
    """The parser's complaint and where, without the snippet of the line that PyYAML adds:
    the line may hold a secret (billing.topup_secret, auth.oauth.client_secret)."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return where + (error.problem or error.context or "cannot be parsed")
    return type(error).__name__


def load_site_config(path: str | os.PathLike | None, cwd: str | None = None) -> dict:
    """Read, validate and complete a site config; None means the embedded default."""
    site: Any = {}
    source = "embedded default"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"{source}: cannot read: {e.strerror}") from None
        try:
            site = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{source}: not valid YAML: {_yaml_problem(e)}") from None
        if site is None:
            site = {}
        _stringify_counts(site)
    problems = validation_errors(site)
    if not problems:
        for slug, profile in (site.get("profiles") or {}).items():
            if slug == "debug" and "passes" in profile:
                problems.append("profiles.debug.passes: debug mode has no passes")
            if slug == "debug" and "allowed_groups_by_count" in profile:
                problems.append("profiles.debug.allowed_groups_by_count: debug mode has no GPUs")
            for key in ("on_idle", "on_cap"):
                if slug == "debug" and profile.get(key) == "debug":
                    problems.append(
                        f"profiles.debug.{key}: a debug-mode server cannot fall back to debug"
                        " mode; use stop"
                    )
            for period, price in (profile.get("passes") or {}).items():
                try:
                    parse_price(price, f"profiles.{slug}.passes.{period}")
                except ValueError as e:
                    problems.append(str(e))
            if "price_per_hour" in profile:
                try:
                    parse_price(profile["price_per_hour"], f"profiles.{slug}.price_per_hour")
                except ValueError as e:
                    problems.append(str(e))
        problems += gpu_type_problems(site)
        try:
            merge_environments(site.get("environments"))
        except ValueError as e:
            problems.append(str(e))
        slurm = site.get("slurm") or {}
        if str(slurm.get("user_map", "")).startswith("run_as:") and slurm.get("sandbox") != "bwrap":
            problems.append(
                "slurm.sandbox: with user_map run_as every job runs as one account and only the"
                " sandbox keeps users apart; set sandbox: bwrap"
            )
        if site.get("backend") == "slurm" and not slurm.get("home_root"):
            problems.append(
                "slurm.home_root: required with backend: slurm (the users' disks on the"
                " cluster's shared filesystem)"
            )
        problems += https_problems(site)
        auth = site.get("auth") or {}
        if auth.get("manage_groups") and auth.get("type", "native") not in (
            "github",
            "generic-oauth",
        ):
            problems.append(
                "auth.manage_groups: groups come from github or generic-oauth providers only;"
                " with native accounts use `meterhub group add`"
            )
    if problems:
        raise ConfigError(f"{source}: " + "\n  ".join(["invalid site config:", *problems]))
    if os.environ.get("METERHUB_DB_URL"):
        # a secret does not belong in a config file: the Helm chart passes it from a Secret
        site.setdefault("billing", {})["db_url"] = os.environ["METERHUB_DB_URL"]
    return complete(site, cwd=cwd)


def gpu_type_problems(site: dict) -> list[str]:
    """`gpu_types`, and every key naming a GPU type checked against the merged catalog
    (the schema cannot list the types: a site adds its own)."""
    try:
        types = merge_gpu_types(site.get("gpu_types"))
    except ValueError as e:
        return [str(e)]
    known = ", ".join(types)
    problems = [
        f"profiles.{slug}: unknown key (allowed here: {DEBUG}, {known})"
        for slug in site.get("profiles") or {}
        if slug != DEBUG and slug not in types
    ]
    problems += [
        f"gpus.{i}.type: unknown GPU type {entry['type']!r} (known: {known})"
        for i, entry in enumerate(site.get("gpus") or [])
        if entry["type"] not in types
    ]
    problems += [
        f"kubernetes.{section}.{slug}: unknown key (allowed here: {known})"
        for section in ("node_products", "pass_capacity")
        for slug in (site.get("kubernetes") or {}).get(section) or {}
        if slug not in types
    ]
    return problems


def https_problems(site: dict) -> list[str]:
    """`https` needs both files: a certificate without its key (or the reverse) is refused."""
    https = site.get("https")
    if https is None:
        return []
    missing = [key for key in ("cert_file", "key_file") if key not in https]
    return [f"https.{key}: missing (https needs both cert_file and key_file)" for key in missing]


def check_https_files(site: dict) -> None:
    """Refuse, naming the key, a certificate or key file that is not a readable file. Only
    where the hub is served from: other commands need not read the private key."""
    for key in ("cert_file", "key_file"):
        path = site.get("https", {}).get(key)
        if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            why = "cannot be read" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"https.{key}: {path} {why}")


def _stringify_counts(site: Any) -> None:
    """YAML reads `8: [staff]` with an integer key; GPU counts are keys as strings."""
    profiles = site.get("profiles") if isinstance(site, dict) else None
    for profile in (profiles or {}).values() if isinstance(profiles, dict) else ():
        counts = profile.get("allowed_groups_by_count") if isinstance(profile, dict) else None
        if isinstance(counts, dict):
            profile["allowed_groups_by_count"] = {str(k): v for k, v in counts.items()}


def fill_schema_defaults(site: dict, schema: dict = SCHEMA) -> dict:
    """Fill `site` in place with the schema's `default:` values, the one source of defaults.

    An absent top-level section with defaults somewhere below it (`local`, `auth`,
    `profiles`, ...) is created and filled; one without (`https`: its presence means
    something) stays absent. A nested mapping (`auth.oauth`, `profiles.debug`) is filled
    only when given. A value that is given is never replaced.
    """
    _fill_defaults(site, schema, schema.get("definitions", {}), create_sections=True)
    return site


def _fill_defaults(instance: dict, schema: dict, definitions: dict, create_sections: bool):
    def resolve(sub: dict) -> dict:
        return definitions[sub["$ref"].split("/")[-1]] if "$ref" in sub else sub

    def has_defaults(sub: dict) -> bool:
        sub = resolve(sub)
        nested = [*sub.get("properties", {}).values(), sub.get("additionalProperties")]
        return "default" in sub or any(isinstance(n, dict) and has_defaults(n) for n in nested)

    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key in [*properties, *(key for key in instance if key not in properties)]:
        sub = properties.get(key, extra if isinstance(extra, dict) else None)
        if sub is None:
            continue
        resolved = resolve(sub)
        if key not in instance:
            if "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            elif create_sections and resolved.get("type") == "object" and has_defaults(sub):
                instance[key] = {}
        value = instance.get(key)
        if isinstance(value, dict):
            _fill_defaults(value, resolved, definitions, create_sections=False)
        elif isinstance(value, list) and isinstance(resolved.get("items"), dict):
            for item in value:
                if isinstance(item, dict):
                    _fill_defaults(item, resolve(resolved["items"]), definitions, False)


def complete(site: dict, cwd: str | None = None) -> dict:
    """Fill in defaults (the schema's, then those derived from other keys) and resolve
    paths, without touching the filesystem."""
    site = fill_schema_defaults(copy.deepcopy(site))
    base = cwd or os.getcwd()
    site["data_dir"] = os.path.abspath(os.path.join(base, site["data_dir"]))
    if "public_dir" in site:
        site["public_dir"] = os.path.abspath(os.path.join(base, site["public_dir"]))
    for key in ("cert_file", "key_file"):
        if key in site.get("https", {}):
            site["https"][key] = os.path.abspath(os.path.join(base, site["https"][key]))
    if "topup_secret_file" in site.get("billing", {}):
        secret_file = site["billing"]["topup_secret_file"]
        site["billing"]["topup_secret_file"] = os.path.abspath(os.path.join(base, secret_file))
    for environment in site.get("environments") or ():
        # a path with a folder in it is the site's own file; a bare name is one of meterhub's
        if "/" in environment.get("requirements", ""):
            environment["requirements"] = os.path.abspath(
                os.path.join(base, environment["requirements"])
            )
    if site["local"]["sandbox"] is False:
        site["local"]["sandbox"] = "off"
    billing = site["billing"]
    billing.setdefault("db_url", "sqlite:///" + os.path.join(site["data_dir"], "billing.sqlite"))
    return site


#: the escape hatch: `*.py` files in this folder beside the site config, run last with `c`
CONFIG_D = "jupyterhub_config.d"


def config_d_files(config_path: str | os.PathLike | None) -> list[Path]:
    """The `jupyterhub_config.d/*.py` files beside the site config, in sorted order."""
    if config_path is None:
        return []
    folder = Path(config_path).resolve().parent / CONFIG_D
    return sorted(folder.glob("*.py"), key=lambda path: path.name) if folder.is_dir() else []


def apply_config_d(config_path: str | os.PathLike | None, c: Config) -> list[Path]:
    """Run each `jupyterhub_config.d/*.py` beside the site config with `c` in scope (as
    JupyterHub runs jupyterhub_config.py), after meterhub's own config; returns the files.

    Not pure: it runs the operator's code. An error stops the start, naming file and line.
    """
    files = config_d_files(config_path)
    for path in files:
        scope = {"c": c, "get_config": lambda: c, "__file__": str(path), "__name__": "__config__"}
        try:
            code = compile(path.read_text(), str(path), "exec")
            exec(code, scope)  # the operator's own code, as jupyterhub_config.py is
        except Exception as e:
            line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else None
            tb = e.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == str(path):
                    line = tb.tb_lineno
                tb = tb.tb_next
            where = f"{path}, line {line}" if line else str(path)
            raise ConfigError(f"{where}: {type(e).__name__}: {e}") from e
    return files


def demo_pool_dir(site: dict) -> str:
    return os.path.join(site["data_dir"], "pool")


def apply_config(site: dict, c: Config) -> Config:
    """Translate a completed site config into JupyterHub traitlets config. Pure: sets values only."""
    data_dir = site["data_dir"]
    c.JupyterHub.db_url = "sqlite:///" + os.path.join(data_dir, "jupyterhub.sqlite")
    c.JupyterHub.cookie_secret_file = os.path.join(data_dir, "jupyterhub_cookie_secret")
    c.ConfigurableHTTPProxy.pid_file = os.path.join(data_dir, "jupyterhub-proxy.pid")
    # A hub restart must keep servers (and their GPUs) running.
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.template_paths = [TEMPLATES]
    c.JupyterHub.hub_port = site["hub"]["api_port"]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{site['hub']['proxy_api_port']}"
    if "https" in site:
        # JupyterHub hands both to the proxy, which then serves https on the public port
        c.JupyterHub.ssl_cert = site["https"]["cert_file"]
        c.JupyterHub.ssl_key = site["https"]["key_file"]
    c.Authenticator.admin_users = set(site["admin_users"])
    apply_auth(site, c)

    apply_spawner_config(site, c)
    return c


OAUTH_CLASSES = {
    "github": "oauthenticator.github.GitHubOAuthenticator",
    "gitlab": "oauthenticator.gitlab.GitLabOAuthenticator",
    "generic-oauth": "oauthenticator.generic.GenericOAuthenticator",
}


#: where a payment provider's top-up secret may come from instead of the site config
TOPUP_SECRET_ENV = "METERHUB_TOPUP_SECRET"

#: the hub's cookies (login, session, `_xsrf`): not sent on cross-site POSTs, sub-requests
#: or frames. No `secure` here: it would override JupyterHub, which adds Secure itself when
#: the request or `public_url` is https, and break sign-in on a plain-http hub.
COOKIE_OPTIONS = {"samesite": "Lax"}


def apply_auth(site: dict, c: Config) -> Config:
    """The authenticator: local accounts (NativeAuthenticator) or an OAuth provider."""
    auth = site["auth"]
    # one user-name rule for every way in: sign-up, login page, OAuth, admin API
    c.Authenticator.username_pattern = USERNAME_PATTERN
    tornado_settings = dict(c.JupyterHub.get("tornado_settings", {}))
    tornado_settings["cookie_options"] = {
        **tornado_settings.get("cookie_options", {}),
        **COOKIE_OPTIONS,
    }
    c.JupyterHub.tornado_settings = tornado_settings
    if auth["type"] == "native":
        import nativeauthenticator

        c.JupyterHub.authenticator_class = "meterhub.hub.auth.MeterNativeAuthenticator"
        n = c.NativeAuthenticator
        n.enable_signup = auth["enable_signup"]
        n.open_signup = auth["open_signup"]
        n.minimum_password_length = auth["minimum_password_length"]
        n.check_common_password = True
        # NativeAuthenticator decides who may sign in (authorized accounts)
        n.allow_all = True
        templates = os.path.join(os.path.dirname(nativeauthenticator.__file__), "templates")
        c.JupyterHub.template_paths = [TEMPLATES, templates]
        return c
    if auth["type"] == "lti13":
        lti = auth.get("lti13") or {}
        c.JupyterHub.authenticator_class = "meterhub.hub.lti.MeterLTI13Authenticator"
        section = c.LTI13Authenticator
        section.issuer = lti.get("issuer", "")
        section.client_id = set(lti.get("client_id", []))
        section.authorize_url = lti.get("authorize_url", "")
        section.jwks_endpoint = lti.get("jwks_endpoint", "")
        section.username_key = lti.get("username_key", "email")
        # the LMS decides who launches; each launch says the course and the role
        section.allow_all = True
        return c
    oauth = dict(auth.get("oauth", {}))
    kind = auth["type"]
    c.JupyterHub.authenticator_class = OAUTH_CLASSES[kind]
    section = c[OAUTH_CLASSES[kind].rsplit(".", 1)[1]]
    for key in ("client_id", "client_secret"):
        if key in oauth:
            setattr(section, key, oauth[key])
    if os.environ.get("METERHUB_OAUTH_CLIENT_SECRET"):
        section.client_secret = os.environ["METERHUB_OAUTH_CLIENT_SECRET"]
    if "callback_url" in oauth:
        section.oauth_callback_url = oauth["callback_url"]
    section.allow_all = oauth.get("allow_all", False)
    if oauth.get("allowed_users"):
        section.allowed_users = set(oauth["allowed_users"])
    groups = set(oauth.get("allowed_groups", []))
    if kind == "github" and groups:
        section.allowed_organizations = groups
    elif kind == "gitlab":
        if groups:
            section.allowed_gitlab_groups = groups
        if "gitlab_url" in oauth:
            section.gitlab_url = oauth["gitlab_url"]
    elif kind == "generic-oauth":
        for key in ("authorize_url", "token_url", "userdata_url"):
            if key in oauth:
                setattr(section, key, oauth[key])
        section.username_claim = oauth.get("username_claim", "preferred_username")
        section.scope = list(oauth.get("scope", ["openid", "profile", "email"]))
        if groups or auth.get("manage_groups"):
            # the provider's groups become JupyterHub groups (also for profiles.allowed_groups
            # and group wallets), refreshed at each sign-in
            section.manage_groups = True
            section.auth_state_groups_key = ClaimGroups(oauth.get("groups_claim", "groups"))
        if groups:
            section.allowed_groups = groups
    if kind == "github" and auth.get("manage_groups"):
        section.populate_teams_in_auth_state = True
        section.scope = sorted({*section.get("scope", []), "read:org"})
        section.manage_groups = True
        section.auth_state_groups_key = github_team_groups
    return c


class ClaimGroups:
    """The provider's groups claim as hub group names, lower case: a group wallet is paid
    from by the hub group of exactly its (lower-case) name."""

    def __init__(self, claim: str):
        self.claim = claim

    def __call__(self, auth_state: dict) -> list[str]:
        groups = (auth_state.get("oauth_user") or {}).get(self.claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return sorted({str(g).lower() for g in groups})

    def __eq__(self, other) -> bool:
        return isinstance(other, ClaimGroups) and other.claim == self.claim

    def __repr__(self) -> str:
        return f"ClaimGroups({self.claim!r})"


def github_team_groups(auth_state: dict) -> list[str]:
    """GitHub teams as hub group names: `<org>.<team slug>`, lower case (a group wallet's
    name may not hold the `:` of GitHub's own `org:team`)."""
    return sorted(
        f"{team['organization']['login']}.{team['slug']}".lower()
        for team in auth_state.get("teams") or ()
    )


def template_vars(site: dict, sandbox_warning: str = "") -> dict:
    """What meterhub's page templates need to know about the site."""
    native = site["auth"]["type"] == "native"
    return {
        "meterhub_native_auth": native,
        "meterhub_signup": native and site["auth"]["enable_signup"],
        "meterhub_sandbox_warning": sandbox_warning,
        **site_template_vars(site),
        **language_template_vars(),
    }


def site_template_vars(site: dict) -> dict:
    """What the sign-in and prices pages say about the site: its name, the trial credit."""
    from meterhub.billing_hooks.money import format_money, parse_amount

    billing = site["billing"]
    return {
        "meterhub_site_name": site["site_name"],
        "meterhub_trial_credit": format_money(
            parse_amount(billing["trial_credit"], where="billing.trial_credit")
            if Decimal(billing["trial_credit"])
            else 0,
            billing["currency"],
        ),
    }


def language_template_vars() -> dict:
    """gettext for meterhub's templates (`{{ _("Wallet") }}`), and the page's language for its
    switch. JupyterHub calls a callable template variable with the page's user, while the
    request runs: in the language the request's transform chose (meterhub.i18n.web)."""
    return {
        "_": lambda user: i18n._,
        "ngettext": lambda user: i18n.ngettext,
        "meterhub_language": lambda user: i18n.language(),
        "meterhub_languages": dict(i18n.LANGUAGES),
    }


def apply_language(c: Config) -> Config:
    """Every hub request in its reader's language (`?lang=`, the cookie, Accept-Language):
    a tornado transform, so JupyterHub's own handlers need no change."""
    tornado_settings = dict(c.JupyterHub.get("tornado_settings", {}))
    transforms = [t for t in tornado_settings.get("transforms", []) if t is not LANGUAGE_TRANSFORM]
    tornado_settings["transforms"] = [*transforms, LANGUAGE_TRANSFORM]
    c.JupyterHub.tornado_settings = tornado_settings
    return c


#: the billing API as user pods reach it when nothing says otherwise (`meterhub render-k8s`);
#: the Helm chart passes its release's own Service as $METERHUB_BILLING_SERVICE_URL
#: (hub.k8s.configure)
KUBE_BILLING_API = "http://meterhub-billing:8082/services/billing/api/v1"

#: the Wallet and billing admin pages (hub handlers; tornado imports them by name)
PAGE_HANDLERS = [
    (r"/wallet", "meterhub.hub.pages.WalletPage"),
    (r"/wallet/passes", "meterhub.hub.pages.WalletPassesPage"),
    (r"/wallet/redeem", "meterhub.hub.pages.WalletRedeemPage"),
    (r"/wallet/usage.csv", "meterhub.hub.pages.WalletCsv"),
    (r"/prices", "meterhub.hub.pages.PricesPage"),
    (r"/billing-admin", "meterhub.hub.pages.BillingAdminPage"),
    (r"/billing-admin/grant", "meterhub.hub.pages.BillingAdminGrant"),
    (r"/groups/([^/]+)", "meterhub.hub.group_pages.GroupPage"),
    (r"/groups/([^/]+)/caps", "meterhub.hub.group_pages.GroupCapPage"),
    (r"/groups/([^/]+)/stop", "meterhub.hub.group_pages.GroupStopPage"),
    (r"/groups/([^/]+)/statement.csv", "meterhub.hub.group_pages.GroupStatement"),
    (r"/courses/([^/]+)", "meterhub.hub.course_pages.CoursePage"),
    (r"/courses/([^/]+)/settings", "meterhub.hub.course_pages.CourseSettingsPage"),
    (r"/courses/([^/]+)/stop", "meterhub.hub.course_pages.CourseStopPage"),
    (r"/courses/([^/]+)/stop-all", "meterhub.hub.course_pages.CourseStopAllPage"),
    (r"/courses/([^/]+)/usage.csv", "meterhub.hub.course_pages.CourseUsageCsv"),
    (r"/courses/([^/]+)/reset", "meterhub.hub.course_pages.CourseResetPage"),
    (r"/courses/([^/]+)/restore", "meterhub.hub.course_pages.CourseRestorePage"),
]


def apply_spawner_config(site: dict, c: Config) -> Config:
    """The spawner, catalog, billing and pages half of the config, shared with the Helm
    chart's hub."""
    # JupyterHub 3.1 deprecated extra_handlers in favour of services, but these pages must
    # be hub pages: JupyterHub's templates and navigation bar, its sign-in and XSRF checks
    c.JupyterHub.extra_handlers = list(PAGE_HANDLERS)
    apply_language(c)
    # billing decides from a token's scopes (meterhub.billing_hooks.scopes)
    c.JupyterHub.custom_scopes = dict(CUSTOM_SCOPES)
    # the in-notebook credit status (extensions/server.py) asks the billing API with the
    # server's own token: it may reach the billing service, and nothing else of billing
    c.Spawner.server_token_scopes = [
        "users:activity!user",
        "access:servers!server",
        BILLING_ACCESS,
    ]
    if site["backend"] == "kubernetes":
        c.JupyterHub.spawner_class = "meterhub.spawner.kube.KubeGPUSpawner"
        c.Spawner.environment = {"METERHUB_BILLING_URL": KUBE_BILLING_API}
        apply_kubernetes(site, c)
    elif site["backend"] == "slurm":
        c.JupyterHub.spawner_class = "meterhub.spawner.slurm.SlurmGPUSpawner"
        apply_slurm(site, c)
    else:
        c.JupyterHub.spawner_class = "meterhub.spawner.local.LocalGPUSpawner"
        c.Spawner.environment = {"METERHUB_BILLING_URL": billing_api(site)}
    data_dir = site["data_dir"]
    c.LocalGPUSpawner.data_dir = data_dir
    c.LocalGPUSpawner.envs_dir = envs_dir(site)
    c.LocalGPUSpawner.pool_dir = site.get("public_dir") or demo_pool_dir(site)
    if "gpus" in site:
        c.LocalGPUSpawner.gpus = [{"type": g["type"], "count": g["count"]} for g in site["gpus"]]
    c.LocalGPUSpawner.sandbox = site["local"]["sandbox"]
    c.LocalGPUSpawner.uid_base = site["local"]["uid_base"]
    c.LocalGPUSpawner.disk_mount_path = site["local"]["disk_mount_path"]
    # idle disks archived by the hub, the quota warned about at spawn (local backend only)
    disks = site.get("disks", {})
    if "archive_after_days" in disks:
        c.MeterHub.disk_archive_after_days = disks["archive_after_days"]
    if "quota_gib" in disks:
        c.LocalGPUSpawner.disk_quota_gib = float(disks["quota_gib"])

    billing = site["billing"]
    c.BillingSettings.db_url = billing["db_url"]
    for key in (
        "currency",
        "meter_interval_seconds",
        "min_minutes_to_start",
        "warn_minutes",
        "audit_interval_seconds",
        "topup_url",
        "topup_secret",
        "topup_secret_file",
        "redeem_failures_per_user",
        "redeem_failures_overall",
        "redeem_window_seconds",
    ):
        if key in billing:
            setattr(c.BillingSettings, key, billing[key])
    for key in ("trial_credit", "overdraft", "max_grant", "max_topup"):
        if key in billing:
            setattr(c.BillingSettings, key, str(billing[key]))
    if os.environ.get(TOPUP_SECRET_ENV):
        # a secret does not belong in a config file (the managed billing service gets it
        # from the hub's environment, hub.app.billing_service)
        c.BillingSettings.topup_secret = os.environ[TOPUP_SECRET_ENV]
    groups = site.get("groups", {})
    if "alert_balances" in groups:
        c.BillingSettings.group_alert_balances = [str(v) for v in groups["alert_balances"]]
    if "alert_runway_days" in groups:
        c.BillingSettings.group_alert_runway_days = groups["alert_runway_days"]
    if "sync_interval_seconds" in groups:
        c.MeterHub.group_sync_interval_seconds = groups["sync_interval_seconds"]
    c.Catalog.extra_options = ["wallet"]
    if "shared_folders" in groups:
        c.LocalGPUSpawner.group_folders = groups["shared_folders"]
        c.KubeGPUSpawner.group_folders = groups["shared_folders"]
    c.Spawner.options_form = spawn_form.options_form
    c.LocalGPUSpawner.gpu_reservations = hooks.gpu_reservations
    c.Spawner.pre_spawn_hook = hooks.authorize_spawn
    c.Spawner.post_stop_hook = hooks.settle_stop
    # an operator's c.Spawner hooks run after billing's, never instead
    hooks.install_billing_hooks(c.LocalGPUSpawner)

    c.Catalog.gpu_types = {
        slug: {
            key: str(parse_price(value, f"gpu_types.{slug}.{key}"))
            if key == "price_per_hour"
            else copy.deepcopy(value)
            for key, value in fields.items()
        }
        for slug, fields in (site.get("gpu_types") or {}).items()
    }
    c.Catalog.pass_prices = {
        slug: {period: str(price) for period, price in profile["passes"].items()}
        for slug, profile in site["profiles"].items()
        if profile.get("passes")
    }
    c.Catalog.prices = {
        slug: str(parse_price(profile["price_per_hour"], f"profiles.{slug}.price_per_hour"))
        for slug, profile in site["profiles"].items()
        if "price_per_hour" in profile
    }
    c.Catalog.allowed_groups = {
        slug: list(profile["allowed_groups"])
        for slug, profile in site["profiles"].items()
        if profile.get("allowed_groups")
    }
    c.Catalog.allowed_groups_by_count = {
        slug: {count: list(groups) for count, groups in profile["allowed_groups_by_count"].items()}
        for slug, profile in site["profiles"].items()
        if profile.get("allowed_groups_by_count")
    }
    c.Catalog.environments = copy.deepcopy(site.get("environments") or [])
    apply_idle(site, c)
    debug = site["profiles"].get("debug", {})
    if "cpu" in debug:
        c.Catalog.debug_cpu = debug["cpu"]
    if "memory_gib" in debug:
        c.Catalog.debug_memory_gib = debug["memory_gib"]
    return c


def idle_policies(site: dict) -> dict[str, dict]:
    """What the site sets of each profile's idle timeout (seconds), idle action and cap
    action (`profiles.<slug>.idle_minutes`, `on_idle`, `on_cap`); the catalog has the
    defaults (Catalog.idle). Pure."""
    policies = {}
    for slug, profile in site["profiles"].items():
        policy = {key: profile[key] for key in ("on_idle", "on_cap") if key in profile}
        if "idle_minutes" in profile:
            # exact for fractions written in decimal (0.1 min = 6 s), never binary
            policy["idle_seconds"] = int(Decimal(str(profile["idle_minutes"])) * 60)
        if policy:
            policies[slug] = policy
    return policies


def apply_idle(site: dict, c: Config) -> Config:
    """Idle shutdown and stopping: the catalog's per-profile policy (the meter decides, the
    servers warn), how often servers report activity, and the stop grace period (pure)."""
    idle = site["idle"]
    c.Catalog.idle_policy = idle_policies(site)
    c.Catalog.idle_warn_seconds = int(Decimal(str(idle["warn_minutes"])) * 60)
    c.Catalog.activity_interval_seconds = idle["check_interval_seconds"]
    c.Catalog.gpu_busy_percent = idle["gpu_busy_percent"]
    # a server's activity is what it reports (kernels, terminals, changes, busy GPUs), not
    # the traffic of an open tab through the proxy: JupyterLab polls every few seconds, and
    # an idle GPU in a forgotten tab would otherwise never stop
    c.JupyterHub.last_activity_interval = 0
    grace = site["stop_grace_seconds"]
    # SIGTERM, then SIGKILL after the grace period (LocalGPUSpawner); the pod's grace
    # period on Kubernetes (KubeSpawner's delete_grace_period)
    c.LocalGPUSpawner.stop_grace_seconds = grace
    c.BillingSettings.stop_grace_seconds = grace
    c.KubeGPUSpawner.delete_grace_period = grace
    return c


def billing_api(site: dict) -> str:
    """The billing REST API as servers and the hub's services reach it."""
    return f"http://{billing_host(site)}:{site['hub']['billing_port']}/services/billing/api/v1"


def envs_dir(site: dict) -> str:
    """Where `meterhub env build` puts the environments and the backend runs them from:
    `slurm.envs_dir` (on the nodes' shared filesystem) on Slurm, else `data_dir/envs`."""
    if site["backend"] == "slurm" and (site.get("slurm") or {}).get("envs_dir"):
        return site["slurm"]["envs_dir"]
    return os.path.join(site["data_dir"], "envs")


def billing_host(site: dict) -> str:
    """Where the billing service listens and servers reach it: the nodes' way to the hub
    on Slurm, this machine otherwise."""
    return site["slurm"]["hub_host"] if site["backend"] == "slurm" else "127.0.0.1"


def apply_slurm(site: dict, c: Config) -> Config:
    """SlurmGPUSpawner's traits from the site's `slurm` section (pure)."""
    slurm = site["slurm"]
    s = c.SlurmGPUSpawner
    s.home_root = slurm["home_root"]
    s.partitions = dict(slurm.get("partitions", {}))
    s.debug_partition = slurm["debug_partition"]
    s.account = slurm.get("account", "")
    s.qos = slurm.get("qos", "")
    s.user_map = slurm["user_map"]
    s.sandbox = slurm["sandbox"]
    s.queue_timeout_seconds = slurm["start_timeout"]
    s.max_time_minutes = slurm["max_time_minutes"]
    s.poll_interval = slurm["poll_interval_seconds"]
    if "env_prefix" in slurm:
        s.server_env_prefix = slurm["env_prefix"]
    s.envs_dir = envs_dir(site)
    # the pool on the shared filesystem; the demo pool lives in the hub's private data_dir
    s.pool_dir = site.get("public_dir") or ""
    s.disk_mount_path = site["local"]["disk_mount_path"]
    s.stop_grace_seconds = site["stop_grace_seconds"]
    host = slurm["hub_host"]
    # jobs on other nodes reach the hub's API and the billing service at hub_host
    c.JupyterHub.hub_ip = host
    c.JupyterHub.hub_connect_ip = host
    s.environment = {"METERHUB_BILLING_URL": billing_api(site)}
    if "pass_capacity" in slurm:
        c.BillingSettings.pass_capacity = dict(slurm["pass_capacity"])
    hooks.install_billing_hooks(s)
    return c


def apply_kubernetes(site: dict, c: Config) -> Config:
    """KubeGPUSpawner's traits from the site's `kubernetes` section (pure)."""
    kube = site["kubernetes"]
    k = c.KubeGPUSpawner
    k.image = kube["image"]
    if "gpu_image" in kube:
        k.gpu_image = kube["gpu_image"]
    if "namespace" in kube:
        k.namespace = kube["namespace"]
    k.storage_capacity = kube["disk_size"]
    if "storage_class" in kube:
        k.storage_class = kube["storage_class"]
    k.public_claim_name = kube["public_claim"]
    k.node_label = kube["node_label"]
    k.node_products = {slug: list(values) for slug, values in kube.get("node_products", {}).items()}
    k.debug_node_selector = dict(kube.get("debug_node_selector", {}))
    k.uid = kube["uid"]
    if "pass_capacity" in kube:
        # read by billing_hooks.settings.pass_capacity; not set: no pass is sold here
        c.BillingSettings.pass_capacity = dict(kube["pass_capacity"])
    # on KubeGPUSpawner's own section, which wins over z2jh's c.KubeSpawner whatever the
    # order: merged over z2jh's `singleuser.extraEnv`, and billing's hooks composed with an
    # operator's own (c.Spawner / c.KubeSpawner hooks run after billing's, never instead)
    k.meterhub_environment = {"METERHUB_BILLING_URL": KUBE_BILLING_API}
    hooks.install_billing_hooks(k)
    return c
