"""The `meterhub` command line."""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.exc import DBAPIError

from billing_hooks.db import SchemaMismatch

from .billing_cli import CliError
from .config import ConfigError


def _serve(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)  # fail fast, before the hub's heavy imports
    from .app import serve

    serve(site, args.ip, args.port, args.config)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meterhub", description="GPU notebooks by the hour.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the hub in the foreground")
    serve.add_argument("--config", help="site config (YAML); default: the embedded default")
    serve.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.set_defaults(func=_serve)
    from .billing_cli import add_commands

    add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, CliError, SchemaMismatch) as e:
        print(f"meterhub: {e}", file=sys.stderr)
        return 2
    except DBAPIError as e:
        print(f"meterhub: the billing database did not answer: {e.orig}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
