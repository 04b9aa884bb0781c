"""`meterhub disk …`: users' disks on the local backend, and the rule that archives idle ones.

A disk is archived (spawner/disk_archive.py) when its user has had no server for
`disks.archive_after_days`, by the hub or by `meterhub disk archive`, and restored at the
user's next start or by `meterhub disk restore`. `meterhub disk delete --yes` is the only
way a disk is ever deleted. Nothing here runs while a server uses the disk: the server's
runtime record names it, and the disk's lock keeps a starting server and an archive apart.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import unicodedata

from meterhub.i18n import N_, _
from meterhub.spawner import disk_archive
from meterhub.spawner.disk_archive import ArchiveBusy, Archived, ArchiveError, DiskLock, gib

from .billing_cli import CliError, load_settings
from .group_cli import _hub_rows

KUBERNETES = N_(
    "the Kubernetes backend keeps disks as PersistentVolumeClaims: meterhub neither archives"
    " nor deletes them (see docs/idle.md)"
)


def disk_dirname(user: str) -> str:
    # spawner.local imports JupyterHub: only when a disk command runs, not for every command
    from meterhub.spawner.local import disk_dirname

    return disk_dirname(user)


class Refused(ArchiveError):
    """Not now, and why: no disk, archived already, a server uses it."""


def server_on_disk(data_dir: str, disk: str) -> str:
    """Why a server may be using `disk` (its runtime record names it), or "" when none is.
    Unreadable records count as "maybe": they cannot say which disk they are for."""
    from meterhub.spawner.local import read_records

    records, bad = read_records(data_dir)
    disk = os.path.normpath(os.path.abspath(disk))
    if any(os.path.normpath(os.path.abspath(r.marker)) == disk for r in records):
        return _("a server is running on it")
    if bad:
        return _(
            "runtime records %(records)s cannot be read, so a server may use it",
            records=", ".join(bad)[:200],
        )
    return ""


def newest_use(spawner_times) -> datetime.datetime | None:
    """The newest of a user's spawners' `last_activity` and `started` (naive UTC, as
    JupyterHub keeps them), aware; None when there is none."""
    times = [t if t.tzinfo else t.replace(tzinfo=datetime.UTC) for t in spawner_times if t]
    return max(times, default=None)


def last_use(disk: str, spawner_times) -> datetime.datetime:
    """When a disk was last used: `newest_use(spawner_times)`, else the disk folder's mtime."""
    newest = newest_use(spawner_times)
    if newest is not None:
        return newest
    return datetime.datetime.fromtimestamp(os.stat(disk).st_mtime, datetime.UTC)


def archive_user_disk(
    data_dir: str,
    disk_root: str,
    user: str,
    now: datetime.datetime,
    idle_before: datetime.datetime | None = None,
    spawner_times=(),
) -> Archived | None:
    """Archive `user`'s disk (blocking). With `idle_before`, only when it was last used
    before then (None: it was not). Refused (a Refused or ArchiveBusy) when there is no
    disk, it is archived already, or a server is running or starting on it. What refuses
    cheaply is checked before the disk's lock is taken (a refusal writes nothing) and again
    once it is held."""
    name, disk, folder = _paths(data_dir, disk_root, user)

    def refuse() -> None:
        if not os.path.isdir(disk):
            raise Refused(_("%(user)s has no disk", user=user))
        marker = disk_archive.archived(folder)
        if marker is not None:
            raise Refused(
                _(
                    "%(user)s's disk is archived already (%(archive)s)",
                    user=user,
                    archive=marker.archive,
                )
            )

    def idle() -> bool:
        return idle_before is None or last_use(disk, spawner_times) <= idle_before

    refuse()
    if not idle():
        return None
    with DiskLock(data_dir, name):
        refuse()
        why = server_on_disk(data_dir, disk)
        if why:
            raise Refused(
                _("%(user)s's server is running: %(why)s; stop it first", user=user, why=why)
            )
        if not idle():
            return None
        return disk_archive.archive_idle(disk, folder, now)


def _paths(data_dir: str, disk_root: str, user: str) -> tuple[str, str, str]:
    """A user's disk folder name, disk and archive folder."""
    name = disk_dirname(user)
    return name, os.path.join(disk_root, name), disk_archive.archive_dir(data_dir, name)


# ---------------------------------------------------------------------- the CLI


def _local(args):
    """The local backend's spawner settings (no user) and the config; refused on Kubernetes."""
    from meterhub.spawner.local import LocalGPUSpawner

    c, _settings = load_settings(args)
    if c.JupyterHub.spawner_class.endswith("KubeGPUSpawner"):
        raise CliError(_(KUBERNETES))
    return LocalGPUSpawner(config=c), c


def _hub_users(c) -> dict[str, tuple[str, int, list]]:
    """The hub's users by disk folder: (name, id, their spawners' last activity and start)."""
    rows = _hub_rows(
        c,
        "SELECT users.name, users.id, spawners.last_activity, spawners.started"
        " FROM users LEFT JOIN spawners ON spawners.user_id = users.id",
    )
    users: dict[str, tuple[str, int, list]] = {}
    for name, user_id, last_activity, started in rows:
        entry = users.setdefault(disk_dirname(name), (name, user_id, []))
        entry[2].extend(_when(t) for t in (last_activity, started) if t)
    return users


def _when(value) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value))


def _hub_server(c, user: str) -> bool:
    """Whether the hub's database has a server (running or starting) for `user`."""
    rows = _hub_rows(
        c,
        "SELECT 1 FROM spawners JOIN users ON spawners.user_id = users.id"
        " WHERE users.name = :n AND spawners.server_id IS NOT NULL",
        n=user,
    )
    return bool(rows)


def _user(args) -> str:
    if not 0 < len(args.user) <= 255 or not args.user.isprintable():
        raise CliError(_("USER: a user name"))
    return args.user


@contextlib.contextmanager
def _one_line(user: str):
    """Archive errors as a command's one line (a busy disk: try again)."""
    try:
        yield
    except ArchiveBusy:
        raise CliError(
            _("%(user)s's disk is being started, archived or restored; try again", user=user)
        ) from None
    except ArchiveError as e:
        raise CliError(str(e)) from None


def disk_list(args) -> int:
    local, c = _local(args)
    users = _hub_users(c)
    archives_root = os.path.join(local.data_dir, "archives")
    folders = set()
    for root in (local.disk_root, archives_root):
        if os.path.isdir(root):
            folders.update(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
    rows = [(_("USER"), _("SIZE"), _("LAST USED"), _("STATE"), _("ARCHIVES"))]
    for folder in sorted(folders, key=lambda f: users.get(f, (f,))[0]):
        no_account = _("%(folder)s (no account)", folder=folder)
        name, _id, times = users.get(folder, (no_account, None, []))
        disk = os.path.join(local.disk_root, folder)
        archive_folder = disk_archive.archive_dir(local.data_dir, folder)
        has_disk = os.path.isdir(disk)
        size = "-"
        try:
            marker = disk_archive.archived(archive_folder)
        except ArchiveError:
            marker, state = None, _("marker damaged")
        else:
            if marker is not None:
                state = _("archived %(day)s", day=marker.day)
                size = _("%(size)s (archived)", size=gib(marker.disk_bytes))
            else:
                state = _("on disk") if has_disk else _("no disk")
        if has_disk and marker is None:
            size = gib(disk_archive.tree_bytes(disk))
        used = last_use(disk, times).strftime("%Y-%m-%d %H:%M") if has_disk else "-"
        archived_bytes = disk_archive.tree_bytes(archive_folder)
        rows.append((name, size, used, state, gib(archived_bytes) if archived_bytes else "-"))
    if len(rows) == 1:
        print(_("no disks in %(root)s", root=local.disk_root))
        return 0
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(
                cell + " " * (width - _width(cell)) for cell, width in zip(row, widths, strict=True)
            ).rstrip()
        )
    return 0


def _width(text: str) -> int:
    """How many columns `text` takes on a terminal: Chinese characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _refuse_running(c, local, user: str) -> None:
    _name, disk, _folder = _paths(local.data_dir, local.disk_root, user)
    why = server_on_disk(local.data_dir, disk)
    if why or _hub_server(c, user):
        raise CliError(_("%(user)s's server is running or starting: stop it first", user=user))


def disk_archive_command(args) -> int:
    local, c = _local(args)
    user = _user(args)
    _refuse_running(c, local, user)
    with _one_line(user):
        marker = archive_user_disk(local.data_dir, local.disk_root, user, disk_archive.utcnow())
    assert marker is not None
    print(
        _(
            "archived %(user)s's disk (%(size)s) as %(archive)s (%(archive_size)s, sha256"
            " %(sha256)s…); restored at their next start",
            user=user,
            size=gib(marker.disk_bytes),
            archive=marker.archive,
            archive_size=gib(marker.bytes),
            sha256=marker.sha256[:12],
        )
    )
    return 0


def _run_as(c, local, user: str) -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    rows = _hub_rows(c, "SELECT id FROM users WHERE name = :n", n=user)
    return (local.uid_base + rows[0][0],) * 2 if rows else None


def disk_restore(args) -> int:
    local, c = _local(args)
    user = _user(args)
    name, disk, folder = _paths(local.data_dir, local.disk_root, user)
    with _one_line(user):
        if disk_archive.archived(folder) is None:
            raise CliError(_("%(user)s's disk is not archived", user=user))
    _refuse_running(c, local, user)
    run_as = _run_as(c, local, user)
    with _one_line(user), DiskLock(local.data_dir, name):
        if server_on_disk(local.data_dir, disk):
            raise CliError(_("%(user)s's server is running: stop it first", user=user))
        marker = disk_archive.restore_idle(disk, folder, run_as)
    if marker is None:
        raise CliError(_("%(user)s's disk is not archived", user=user))
    print(
        _(
            "restored %(user)s's disk (%(size)s) from %(archive)s; the archive is kept until"
            " the disk's next idle archive replaces it",
            user=user,
            size=gib(marker.disk_bytes),
            archive=marker.archive,
        )
    )
    return 0


def disk_delete(args) -> int:
    local, c = _local(args)
    user = _user(args)
    name, disk, folder = _paths(local.data_dir, local.disk_root, user)
    has_disk = os.path.isdir(disk)
    has_archives = os.path.isdir(folder) and bool(os.listdir(folder))
    if not has_disk and not (args.archives and has_archives):
        if args.archives:
            raise CliError(_("%(user)s has no disk", user=user))
        raise CliError(_("%(user)s has no disk (see --archives)", user=user))
    _refuse_running(c, local, user)
    what = []
    if has_disk:
        what.append(f"{disk} ({gib(disk_archive.tree_bytes(disk))})")
    if args.archives and has_archives:
        what.append(
            _(
                "%(count)s archive(s) in %(folder)s (%(size)s)",
                count=len(disk_archive.archives(folder)),
                folder=folder,
                size=gib(disk_archive.tree_bytes(folder)),
            )
        )
    if not args.yes:
        raise CliError(_("would delete %(what)s; add --yes to delete", what=_(" and ").join(what)))
    with _one_line(user), DiskLock(local.data_dir, name):
        if server_on_disk(local.data_dir, disk):
            raise CliError(_("%(user)s's server is running: stop it first", user=user))
        if has_disk:
            disk_archive.empty_disk(disk)
            os.rmdir(disk)
            disk_archive.forget_size(disk)
        if args.archives and has_archives:
            shutil.rmtree(folder)
        elif disk_archive.forget_archived(folder) is not None:
            # the next start begins on a new disk; the archives stay where they are
            what.append(_("the mark that restored the archive at the next start"))
    deleted = _(" and ").join(what)
    if has_archives and not args.archives:
        print(
            _(
                "deleted %(what)s; kept %(count)s archive(s) in %(folder)s (--archives deletes"
                " them)",
                what=deleted,
                count=len(disk_archive.archives(folder)),
                folder=folder,
            )
        )
    else:
        print(_("deleted %(what)s", what=deleted))
    return 0


def add_commands(commands) -> None:
    disk = commands.add_parser(
        "disk",
        help="users' disks (local backend): list, archive, restore, delete",
        description="Idle disks are archived by the hub (disks.archive_after_days) and"
        " restored at their user's next start; nothing deletes a disk but `disk delete --yes`.",
    ).add_subparsers(dest="action", required=True)
    listing = disk.add_parser("list", help="every disk: size, last use, archived or not")
    listing.set_defaults(func=disk_list)
    archive = disk.add_parser(
        "archive", help="archive a stopped user's disk now (restored at their next start)"
    )
    archive.add_argument("user", metavar="USER")
    archive.set_defaults(func=disk_archive_command)
    restore = disk.add_parser("restore", help="put an archived disk back now")
    restore.add_argument("user", metavar="USER")
    restore.set_defaults(func=disk_restore)
    delete = disk.add_parser(
        "delete",
        help="delete a user's disk (the only way a disk is deleted)",
        description="Without --yes it only says what it would delete. The disk's archives"
        " are kept unless --archives is given too.",
    )
    delete.add_argument("user", metavar="USER")
    delete.add_argument("--yes", action="store_true", help="really delete")
    delete.add_argument("--archives", action="store_true", help="delete its archives too")
    delete.set_defaults(func=disk_delete)
    for parser in disk.choices.values():
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")
