"""`meterhub env build|list`: the environments servers run from on the local and Slurm backends.

A build installs an environment's pinned requirements and meterhub itself (its notebook
extensions) into a folder of its own, `<envs_dir>/.builds/<slug>-<time>`, writes what it
built (`meterhub-env.json`) last, and only then points the link `<envs_dir>/<slug>` at it:
a server starting meanwhile gets the previous build, a server running keeps its own, and a
failed build changes nothing. Builds no process uses any more are removed.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from meterhub.i18n import _
from meterhub.spawner.environments import (
    BUILD_INFO,
    BUILDS_DIR,
    Environment,
    build_info,
    built_link,
    merge_environments,
    requirements_path,
)

from . import pyinstall
from .billing_cli import CliError
from .config import envs_dir

#: the uv bootstrapped where none is found (the Makefile's)
UV_VERSION = "0.13.8"
#: how much of a failed install's output is shown (its log keeps all of it)
LOG_TAIL_LINES = 30


def site_environments(site: dict) -> dict[str, Environment]:
    return merge_environments(site.get("environments"))


def meterhub_source() -> str:
    """What installs this meterhub into an environment: the clone it runs from (an editable
    install, as `make` makes), else this release from the package index."""
    from meterhub import hub

    root = Path(hub.__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    if project.is_file() and 'name = "meterhub"' in project.read_text():
        return str(root)
    return f"meterhub=={metadata.version('meterhub')}"


def _sha256(path: str) -> str:
    """The requirements file's hash, with the files it includes (`-r other.txt`)."""
    digest = hashlib.sha256()
    seen: set[str] = set()

    def add(name: str) -> None:
        name = os.path.abspath(name)
        if name in seen:
            return
        seen.add(name)
        with open(name, "rb") as f:
            text = f.read()
        digest.update(text)
        for line in text.decode("utf-8", "replace").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith(("-r ", "--requirement ")):
                add(os.path.join(os.path.dirname(name), line.split(None, 1)[1]))

    add(path)
    return digest.hexdigest()


def folder_size(path: str) -> int:
    """Bytes of the regular files below `path` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return total


def builds_in_use(builds: list[str], proc: str = "/proc") -> set[str]:
    """Which of the build folders `builds` a running process has its program, a loaded
    library or its command line in (a server from it, or a kernel)."""
    used: set[str] = set()
    prefixes = {b: b.rstrip("/") + "/" for b in builds}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        texts = []
        for name in ("cmdline", "maps"):
            try:
                with open(os.path.join(proc, entry, name), "rb") as f:
                    texts.append(f.read().decode("utf-8", "replace").replace("\0", " "))
            except OSError:
                continue
        text = " ".join(texts)
        used.update(b for b, p in prefixes.items() if p in text)
    return used


def _python_version(prefix: str) -> str:
    out = subprocess.run(
        [os.path.join(prefix, "bin", "python"), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def _run(command: list[str], log, env: dict | None = None) -> None:
    log.write("$ " + " ".join(command) + "\n")
    log.flush()
    result = subprocess.run(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, command)


def _uv() -> str | None:
    for candidate in (shutil.which("uv"), os.path.join(os.path.dirname(sys.executable), "uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def build(site: dict, environment: Environment, out=print) -> str:
    """Build `environment` and point its link at the build; the build folder. CliError when
    it cannot start (nothing written) or the install fails (the partial build removed, its
    log kept)."""
    requirements = requirements_path(environment)
    if not os.path.isfile(requirements):
        raise CliError(
            _(
                "%(environment)s: its requirements file %(path)s does not exist",
                environment=environment.slug,
                path=requirements,
            )
        )
    root = envs_dir(site)
    link = built_link(root, environment.slug)
    if os.path.exists(link) and not os.path.islink(link):
        raise CliError(
            _(
                "%(path)s is a folder, not the link a build makes; move it away first",
                path=link,
            )
        )
    builds = os.path.join(root, BUILDS_DIR)
    os.makedirs(builds, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    folder = os.path.join(builds, f"{environment.slug}-{stamp}")
    log_path = f"{folder}.log"
    started = time.monotonic()
    source = meterhub_source()
    uv = _uv()
    out(_("%(environment)s: building into %(folder)s", environment=environment.slug, folder=folder))
    try:
        with open(log_path, "w") as log:
            if uv:
                _run([uv, "venv", "--quiet", "--python", sys.executable, folder], log)
            else:
                _run([sys.executable, "-m", "venv", folder], log)
            for packages in (["-r", requirements], ["--no-deps", source]):
                command, env = pyinstall.install_command(Path(folder), UV_VERSION, packages, uv)
                if not command:
                    raise subprocess.CalledProcessError(1, ["pip"])
                _run(command, log, env)
    except (OSError, subprocess.CalledProcessError) as e:
        shutil.rmtree(folder, ignore_errors=True)
        try:
            with open(log_path) as f:
                tail = "".join(f.readlines()[-LOG_TAIL_LINES:])
        except OSError:
            tail = ""
        raise CliError(
            _(
                "%(environment)s: the build failed (%(error)s); nothing changed. The last lines"
                " of its log, %(log)s:\n%(tail)s",
                environment=environment.slug,
                error=e,
                log=log_path,
                tail=tail,
            )
        ) from None
    info = {
        "slug": environment.slug,
        "requirements": requirements,
        "requirements_sha256": _sha256(requirements),
        "meterhub": source,
        "python": _python_version(folder),
        "installer": "uv" if uv else "pip",
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
    }
    # last: a folder without it is not a built environment
    with open(os.path.join(folder, BUILD_INFO), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    # the link moves in one rename: a start sees the old build or the new, never neither
    temporary = f"{link}.new-{os.getpid()}"
    os.symlink(os.path.join(BUILDS_DIR, os.path.basename(folder)), temporary)
    os.replace(temporary, link)
    out(
        _(
            "%(environment)s: built in %(seconds)s s (%(size)s MB); new servers run from it",
            environment=environment.slug,
            seconds=info["seconds"],
            size=folder_size(folder) // 1_000_000,
        )
    )
    prune(root, environment.slug, keep=folder, out=out)
    return folder


def prune(root: str, slug: str, keep: str, out=print) -> None:
    """Remove the earlier builds of `slug` that no process runs from and no link names;
    say which stay. A build is `<slug>-<time>` exactly: `vllm-old-<time>` is another
    environment's."""
    builds = os.path.join(root, BUILDS_DIR)
    named = re.compile(re.escape(slug) + r"-\d{8}T\d{6}\Z")
    linked = {
        os.path.realpath(os.path.join(root, name))
        for name in os.listdir(root)
        if os.path.islink(os.path.join(root, name))
    }
    earlier = [
        os.path.join(builds, name)
        for name in sorted(os.listdir(builds))
        if named.match(name)
        and os.path.isdir(os.path.join(builds, name))
        and os.path.join(builds, name) != keep
        and os.path.realpath(os.path.join(builds, name)) not in linked
    ]
    if not earlier:
        return
    used = builds_in_use(earlier)
    for folder in earlier:
        if folder in used:
            out(
                _(
                    "%(environment)s: kept the earlier build %(folder)s: a running server uses"
                    " it (the next build removes it once none does)",
                    environment=slug,
                    folder=folder,
                )
            )
            continue
        shutil.rmtree(folder, ignore_errors=True)
        with_log = f"{folder}.log"
        if os.path.exists(with_log):
            os.remove(with_log)


def environment_rows(site: dict, server_env_prefix: str = sys.prefix) -> list[dict]:
    """What `meterhub env list` shows, an environment a row."""
    root = envs_dir(site)
    rows = []
    for environment in site_environments(site).values():
        row = {
            "slug": environment.slug,
            "name": _(environment.display_name),
            "default": environment.default,
            "gpu_only": environment.gpu_only,
            "image": environment.image,
            "prefix": "",
            "state": "",
            "built_at": "",
            "size_bytes": None,
        }
        if environment.prefix or not environment.requirements:
            prefix = environment.prefix or server_env_prefix
            row["prefix"] = prefix
            ready = os.path.isfile(os.path.join(prefix, "bin", "jupyterhub-singleuser"))
            row["state"] = (
                _("ready (an existing environment)")
                if ready
                else _("missing: %(path)s", path=prefix)
            )
        else:
            prefix = os.path.realpath(built_link(root, environment.slug))
            info = build_info(prefix)
            if info is None:
                row["state"] = _("not built: meterhub env build %(slug)s", slug=environment.slug)
            else:
                row["prefix"] = prefix
                row["built_at"] = info.get("built_at", "")
                row["size_bytes"] = folder_size(prefix)
                stale = info.get("requirements_sha256") != _sha256_or_none(
                    requirements_path(environment)
                )
                row["state"] = (
                    _("built; its requirements changed since: rebuild it") if stale else _("built")
                )
        rows.append(row)
    return rows


def _sha256_or_none(path: str) -> str | None:
    try:
        return _sha256(path)
    except OSError:
        return None


def _build(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)
    environments = site_environments(site)
    unknown = [slug for slug in args.slug if slug not in environments]
    if unknown:
        raise CliError(
            _(
                "unknown environment %(environment)s; this site offers: %(environments)s",
                environment=repr(unknown[0]),
                environments=", ".join(environments),
            )
        )
    chosen = [environments[slug] for slug in args.slug] or [
        e for e in environments.values() if e.builds
    ]
    for environment in chosen:
        if not environment.builds:
            where = environment.prefix or _(
                "the servers' own environment (%(prefix)s)", prefix=sys.prefix
            )
            print(
                _(
                    "%(environment)s runs from %(where)s: there is nothing to build",
                    environment=environment.slug,
                    where=where,
                )
            )
            continue
        build(site, environment)
    return 0


def _list(args) -> int:
    from .config import load_site_config

    rows = environment_rows(load_site_config(args.config))
    if args.json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return 0
    for row in rows:
        flags = [_("default")] if row["default"] else []
        if row["gpu_only"]:
            flags.append(_("GPU profiles only"))
        size = "" if row["size_bytes"] is None else f", {row['size_bytes'] // 1_000_000} MB"
        when = f", {row['built_at']}" if row["built_at"] else ""
        head = f"{row['slug']:<12} {row['name']}" + (f" ({', '.join(flags)})" if flags else "")
        print(head)
        print(f"{'':<12} {row['state']}{when}{size}")
        if row["prefix"]:
            print(f"{'':<12} {row['prefix']}")
    return 0


def add_commands(commands) -> None:
    env = commands.add_parser(
        "env", help="the environments servers run from (local and Slurm backends)"
    ).add_subparsers(dest="action", required=True)
    build_cmd = env.add_parser(
        "build",
        help="install environments from their pinned requirements into data_dir/envs",
        description="With no SLUG, every environment that has requirements of its own."
        " A running server keeps the build it started from.",
    )
    build_cmd.add_argument("slug", nargs="*", metavar="SLUG")
    build_cmd.add_argument("--config", help="site config (YAML); default: the embedded default")
    build_cmd.set_defaults(func=_build)
    list_cmd = env.add_parser("list", help="the site's environments: built or not, size, when")
    list_cmd.add_argument("--config", help="site config (YAML); default: the embedded default")
    list_cmd.add_argument("--json", action="store_true", help="one JSON list")
    list_cmd.set_defaults(func=_list)
