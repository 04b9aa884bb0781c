"""The `meterhub` command line."""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.exc import DBAPIError

from meterhub import i18n
from meterhub.billing_hooks.db import SchemaMismatch
from meterhub.i18n import _

from .billing_cli import CliError
from .config import ConfigError


def _serve(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)  # fail fast, before the hub's heavy imports
    from .config import check_https_files

    check_https_files(site)
    from .app import serve

    serve(site, args.ip, args.port, args.config)
    return 0


def _ssh_serve(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)
    from .ssh import main as serve_ssh

    return serve_ssh(site)


def _systemd_unit(args) -> int:
    from .config import check_https_files, load_site_config

    check_https_files(load_site_config(args.config))  # a unit for a config that cannot serve fails
    from .systemd import unit_for

    sys.stdout.write(unit_for(args.config, args.ip, args.port, args.working_directory))
    return 0


def _render_k8s(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)
    from .render_k8s import RenderError, render, render_yaml

    try:
        documents = render(
            site, args.user, args.profile, args.gpus, args.group or (), args.environment
        )
    except RenderError as e:
        raise CliError(str(e)) from None
    sys.stdout.write(render_yaml(documents))
    return 0


def _render_slurm(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)
    from .render_k8s import RenderError
    from .render_slurm import render

    try:
        script = render(
            site,
            args.user,
            args.profile,
            args.gpus,
            args.credit,
            args.group or (),
            args.environment,
        )
    except RenderError as e:
        raise CliError(str(e)) from None
    sys.stdout.write(script)
    return 0


def _user_add(args) -> int:
    from .accounts import AccountError, add_user
    from .config import load_site_config

    site = load_site_config(args.config)
    if site["auth"]["type"] != "native":
        raise CliError(f"auth.type is {site['auth']['type']!r}: accounts come from the provider")
    if not args.password_stdin:
        raise CliError("give the password on standard input with --password-stdin")
    password = sys.stdin.read().rstrip("\r\n")
    try:
        add_user(site, args.name, password, admin=args.admin)
    except AccountError as e:
        raise CliError(str(e)) from None
    from traitlets.config import Config

    from meterhub.billing_hooks.settings import BillingSettings

    from .config import apply_config

    settings = BillingSettings(config=apply_config(site, Config()))
    settings.ledger().ensure_user(args.name)  # the trial credit, as for any new account
    role = "admin" if args.admin else "user"
    print(f"created {role} {args.name!r}; sign in at /hub/login")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meterhub", description="GPU notebooks by the hour.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the hub in the foreground")
    serve.add_argument("--config", help="site config (YAML); default: the embedded default")
    serve.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.set_defaults(func=_serve)
    render = commands.add_parser(
        "render-k8s",
        help="print the Pod and PersistentVolumeClaim the Kubernetes backend would create",
        description="Offline: no cluster is contacted. Invalid choices exit 2 with the reason.",
    )
    render.add_argument("--config", help="site config (YAML); default: the embedded default")
    render.add_argument("--user", required=True, help="the user the server is for")
    render.add_argument(
        "--profile",
        required=True,
        help="debug or a GPU type of the site's catalog (rtx4090, a800, h800 and its gpu_types);"
        " checked against the catalog once the config is loaded",
    )
    render.add_argument("--gpus", type=int, help="GPU count (GPU profiles): 1, 2, 4 or 8")
    render.add_argument(
        "--environment",
        help="an environment of the site's list (pytorch, deepspeed, vllm, minimal):"
        " its image; default the default environment",
    )
    render.add_argument(
        "--group", action="append", help="a JupyterHub group of the user (repeatable)"
    )
    render.set_defaults(func=_render_k8s)
    slurm = commands.add_parser(
        "render-slurm",
        help="print the batch script the Slurm backend would submit",
        description="Offline: no cluster is contacted. Invalid choices exit 2 with the reason.",
    )
    slurm.add_argument("--config", help="site config (YAML) with a `slurm` section")
    slurm.add_argument("--user", required=True, help="the user the server is for")
    slurm.add_argument("--profile", required=True, help="debug or a GPU type of the catalog")
    slurm.add_argument("--gpus", type=int, help="GPU count (GPU profiles): 1, 2, 4 or 8")
    slurm.add_argument(
        "--environment",
        help="an environment of the site's list: the built one the job runs from",
    )
    slurm.add_argument(
        "--credit",
        help="the paying wallet's credit (e.g. 12.50): the time limit it buys at the rate",
    )
    slurm.add_argument(
        "--group", action="append", help="a JupyterHub group of the user (repeatable)"
    )
    slurm.set_defaults(func=_render_slurm)
    user = commands.add_parser("user", help="local accounts").add_subparsers(
        dest="action", required=True
    )
    add = user.add_parser(
        "add",
        help="create an account that signs in on the login page",
        description="Reads the password from standard input (e.g. `printf %s PW | ...`).",
    )
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="make the account a hub admin")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.add_argument("--config", help="site config (YAML); default: the embedded default")
    add.set_defaults(func=_user_add)
    ssh = commands.add_parser(
        "ssh", help="the SSH front door into users' running servers"
    ).add_subparsers(dest="action", required=True)
    ssh_serve = ssh.add_parser(
        "serve",
        help="run the SSH front door (the hub starts it: site config `ssh`)",
        description="Needs JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN, as a service of the hub.",
    )
    ssh_serve.add_argument("--config", help="site config (YAML); default: the embedded default")
    ssh_serve.set_defaults(func=_ssh_serve)
    unit = commands.add_parser(
        "systemd-unit",
        help="print a systemd unit that runs `meterhub serve` (restarts on failure)",
        description="Paths are made absolute; stopping the unit leaves users' servers running.",
    )
    unit.add_argument("--config", help="site config (YAML); default: the embedded default")
    unit.add_argument("--ip", default="127.0.0.1", help="serve --ip (default 127.0.0.1)")
    unit.add_argument("--port", type=int, default=8000, help="serve --port (default 8000)")
    unit.add_argument(
        "--working-directory",
        help="where relative data_dir/public_dir resolve (default: the current directory)",
    )
    unit.set_defaults(func=_systemd_unit)
    from .billing_cli import add_commands
    from .course_cli import add_commands as add_course_commands
    from .disk_cli import add_commands as add_disk_commands
    from .env_cli import add_commands as add_env_commands
    from .group_cli import add_commands as add_group_commands
    from .stop_cli import add_command as add_stop_command
    from .voucher_cli import add_commands as add_voucher_commands

    add_stop_command(commands)
    add_commands(commands)
    add_group_commands(commands)
    add_course_commands(commands)
    add_disk_commands(commands)
    add_env_commands(commands)
    add_voucher_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    # refusals in the operator's language (LANGUAGE, LC_ALL, LC_MESSAGES, LANG)
    i18n.set_language(i18n.environment_language())
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, CliError, SchemaMismatch) as e:
        print(f"meterhub: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except DBAPIError as e:
        message = _("the billing database did not answer: %(reason)s", reason=e.orig)
        print(f"meterhub: {message}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
