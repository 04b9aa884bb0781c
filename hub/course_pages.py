"""The instructor console: a course's roster with who runs what, Stop and Stop all, the
course wallet and its runway, the usage CSV, a launch-link builder for nbgitpuller, and
resetting a student's environment (archived first, restorable) on the local backend.

For the course's TAs and instructors (custom:meterhub:course-staff!group=NAME) and billing
admins. Stop and Stop all reach only what the course pays for, a student's own money being
their own: the page decides from the course-staff scope and the ledger, and the hub stops
the server itself (the staff's roles hold no delete:servers).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import time
from decimal import Decimal
from urllib.parse import urlencode, urlsplit

from tornado import web

from meterhub.billing_hooks import actions, course_actions, labwindows
from meterhub.billing_hooks.courses import lab_phrase
from meterhub.billing_hooks.groups import CAP_PERIOD_NAMES, cap_period_name, runway, runway_phrase
from meterhub.billing_hooks.money import from_micros
from meterhub.billing_hooks.scopes import instructs, teaches
from meterhub.billing_hooks.settings import priced_catalog
from meterhub.billing_hooks.wallets import GROUP_NAME, fold
from meterhub.i18n import _
from meterhub.spawner import disk_archive
from meterhub.spawner.local import disk_dirname

from .disk_cli import server_on_disk
from .group_pages import stop_server_for
from .group_sync import find_group
from .pages import MeterhubPage, when

#: what a launch link may name: a git repository over http(s), a branch, a path in it
BRANCH = re.compile(r"^[A-Za-z0-9._/-]{1,100}\Z")
REPO_PATH = re.compile(r"^[A-Za-z0-9._/ -]{0,200}\Z")


def launch_link(
    hub_url: str, course: str, repo: str, branch: str, path: str, profile: str, gpus: str
) -> str:
    """A link that starts the student's server on the course's money (JupyterHub 6 takes
    spawn options in the URL as `opt-` arguments) and then has nbgitpuller pull `repo` and
    open `path` in JupyterLab. ValueError says what is wrong with the input."""
    parts = urlsplit(repo)
    if parts.scheme not in ("https", "http") or not parts.netloc or len(repo) > 300:
        raise ValueError(_("the repository is an http(s) URL, e.g. https://github.com/org/lab"))
    if not BRANCH.match(branch) or ".." in branch:
        raise ValueError(_("the branch: letters, digits, . _ / -"))
    if not REPO_PATH.match(path) or ".." in path.split("/") or path.startswith("/"):
        raise ValueError(
            _("the path: a notebook's path inside the repository, e.g. week1/lab.ipynb")
        )
    folder = parts.path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "repo"
    pull = "/hub/user-redirect/git-pull?" + urlencode(
        {
            "repo": repo,
            "branch": branch,
            "targetpath": folder,
            "urlpath": f"lab/tree/{folder}/{path}".rstrip("/"),
        }
    )
    options = {"opt-profile": profile, "opt-wallet": f"course:{course}"}
    if gpus:
        options[f"opt-gpus_{profile}"] = gpus
    return f"{hub_url.rstrip('/')}/hub/spawn?" + urlencode({**options, "next": pull})


def settings_form(course) -> dict:
    """The settings form's values as the instructor would type them."""
    expires = ""
    if course.expires_at is not None:
        last = datetime.datetime.fromtimestamp(
            course.expires_at - 1, labwindows.zone(course.timezone)
        )
        expires = f"{last:%Y-%m-%d}"
    lines = course.windows.splitlines()
    return {
        "amount": ""
        if course.allowance_micros is None
        else str(from_micros(course.allowance_micros).quantize(Decimal("0.01"))),
        "per": course.allowance_period,
        "expires": expires,
        "profiles": course.profiles,
        "weekly": "\n".join(w.removeprefix("weekly ") for w in lines if w.startswith("weekly ")),
        "on": "\n".join(w.removeprefix("on ") for w in lines if w.startswith("on ")),
        "timezone": course.timezone,
        "debug_outside_windows": course.debug_outside_windows,
    }


def allowance_phrase(course, money) -> str:
    """ "allowance ¥20.00 per month, ends 2027-06-30 15:59 UTC", as the console shows it
    ("" when the course has none)."""
    if course.allowance_micros is None:
        return ""
    values = {"amount": money(course.allowance_micros)}
    period = course.allowance_period
    if course.expires_at:
        values["ends"] = when(course.expires_at)
        if period == "week":
            return _("allowance %(amount)s per week, ends %(ends)s", **values)
        if period == "month":
            return _("allowance %(amount)s per month, ends %(ends)s", **values)
        return _("allowance %(amount)s in total, ends %(ends)s", **values)
    if period == "week":
        return _("allowance %(amount)s per week", **values)
    if period == "month":
        return _("allowance %(amount)s per month", **values)
    return _("allowance %(amount)s in total", **values)


class CoursePage(MeterhubPage):
    """GET /hub/courses/NAME: the course's console, for its staff; everyone else 403."""

    template = "course.html"
    course = ""
    students: tuple[str, ...] = ()

    async def authorize_course(self, course: str) -> None:
        name = fold(course)
        if not (GROUP_NAME.match(name) and teaches(self.expanded_scopes, name)):
            raise web.HTTPError(
                403, "%s", _("Only the course's TAs and instructors can open its console")
            )
        ledger = await self.billing.ledger_async()
        if await asyncio.to_thread(ledger.course, name) is None:
            raise web.HTTPError(404, "%s", _("No course %(name)s", name=name[:64]))
        self.course = name
        group = find_group(self.db, name)  # the hub's session: on the event loop's thread
        self.students = tuple(sorted(u.name for u in group.users)) if group is not None else ()

    async def page_data(self) -> dict:
        ledger = await self.billing.ledger_async()
        now = int(time.time())
        name = self.course
        link, link_error = self.built_link()
        local = "LocalGPUSpawner" in str(
            self.settings["config"].JupyterHub.get("spawner_class", "")
        )

        def read():
            view = ledger.course_view(name, now)
            course = view.course
            choices = course.profiles.split() or ["debug"]
            return {
                "view": view,
                "course": course,
                "runway": runway_phrase(runway(view.balance_micros, view.burn_micros)),
                "lab": lab_phrase(course, now) if course.windows else "",
                "allowance_phrase": allowance_phrase(course, self.money),
                "signed_up": set(self.students),
                "period_names": {p: cap_period_name(p) for p in CAP_PERIOD_NAMES},
                "running_count": sum(len(r.running) for r in view.roster),
                "may_stop": teaches(self.expanded_scopes, name),
                "instructor": instructs(self.expanded_scopes, name),
                "settings": settings_form(course),
                "choices": choices,
                "link": link,
                "link_error": link_error,
                "form": {k: self.get_argument(k, "") for k in ("repo", "branch", "path", "choice")},
                "archives": {
                    r.user: disk_archive.archives(archive_dir(self.settings["config"], r.user))
                    for r in view.roster
                    if r.role == "student"
                }
                if local
                else {},
                "local": local,
            }

        return await asyncio.to_thread(read)

    def built_link(self) -> tuple[str, str]:
        """The launch link the builder's form asked for (GET arguments), or why not."""
        repo = self.get_argument("repo", "").strip()
        if not repo:
            return "", ""
        choice = self.get_argument("choice", "debug").strip().lower()
        profile, _sep, gpus = choice.partition(":")
        # the hub's public URL when the operator set one; a request's Host header otherwise
        public = self.settings.get("public_url")
        origin = (
            f"{public.scheme}://{public.netloc}"
            if public
            else f"{self.request.protocol}://{self.request.host}"
        )
        hub_url = f"{origin}{self.base_url[: -len('hub/')]}"
        try:
            link = launch_link(
                hub_url,
                self.course,
                repo,
                self.get_argument("branch", "main").strip() or "main",
                self.get_argument("path", "").strip(),
                profile,
                gpus,
            )
        except ValueError as e:
            return "", str(e)
        return link, ""

    async def course_paid(self) -> set[tuple[str, str]]:
        """(student, server) the course pays for now."""
        ledger = await self.billing.ledger_async()
        view = await asyncio.to_thread(ledger.course_view, self.course)
        return {(r.user, s.server_name) for r in view.roster for s, _cost in r.running}

    @web.authenticated
    async def get(self, course):
        await self.authorize_course(course)
        await self.show()


class CourseSettingsPage(CoursePage):
    """POST /hub/courses/NAME/settings: an instructor changes the allowance, the profiles
    the course pays for and its lab windows (course_actions.change_course, as the API's
    PATCH); TAs 403."""

    @web.authenticated
    async def post(self, course):
        await self.authorize_course(course)
        if not instructs(self.expanded_scopes, self.course):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Changing a course needs its instructor"
                    " (custom:meterhub:course-instructor!group=%(course)s)",
                    course=self.course,
                ),
            )
        form = {k: self.get_body_argument(k, "").strip() for k in SETTINGS_FIELDS}
        body: dict = {
            "allowance": {
                "amount": None if form["amount"] in ("", "none") else form["amount"],
                "per": form["per"] or "total",
                "expires": form["expires"] or None,
            },
            "profiles": form["profiles"].replace(",", " ").split() or ["any"],
            "windows": {
                "weekly": [w for w in form["weekly"].splitlines() if w.strip()],
                "on": [w for w in form["on"].splitlines() if w.strip()],
                "clear": True,
                "timezone": form["timezone"] or None,
            },
            "debug_outside_windows": form["debug_outside_windows"] == "yes",
        }
        if body["windows"]["timezone"] is None:
            del body["windows"]["timezone"]
        ledger = await self.billing.ledger_async()
        catalog = await asyncio.to_thread(priced_catalog, self.settings["config"], ledger)
        try:
            await asyncio.to_thread(
                course_actions.change_course, ledger, catalog, self.course, body
            )
        except actions.ActionError as e:
            await self.show(error=e.message, status=e.status)
            return
        await self.show(message=_("Saved %(course)s's settings.", course=self.course))


#: the settings form's fields
SETTINGS_FIELDS = (
    "amount",
    "per",
    "expires",
    "profiles",
    "weekly",
    "on",
    "timezone",
    "debug_outside_windows",
)


class CourseStopPage(CoursePage):
    """POST /hub/courses/NAME/stop: stop one server the course pays for."""

    @web.authenticated
    async def post(self, course):
        await self.authorize_course(course)
        name = self.get_body_argument("user", "").strip()
        server_name = self.get_body_argument("server", "")
        if (name, server_name) not in await self.course_paid():
            await self.show(
                error=_(
                    "%(user)s runs no server on %(course)s's money.",
                    user=repr(name[:64]),
                    course=self.course,
                ),
                status=404,
            )
            return
        message, error, status = await stop_server_for(self, name, server_name)
        await self.show(message=message, error=error, status=status)


class CourseStopAllPage(CoursePage):
    """POST /hub/courses/NAME/stop-all: stop every server the course pays for."""

    @web.authenticated
    async def post(self, course):
        await self.authorize_course(course)
        paid = sorted(await self.course_paid())
        stopped, errors = 0, []
        for name, server_name in paid:
            _message, error, _status = await stop_server_for(self, name, server_name)
            if error:
                errors.append(error)
            else:
                stopped += 1
        message = _("Stopped %(n)s server(s) the course paid for; their files are kept.", n=stopped)
        await self.show(message=message, error=" ".join(errors))


def archive_dir(config, user: str) -> str:
    """Where a user's disk archives are kept: `<data_dir>/archives/<disk folder>` (0700,
    the hub's alone: staff restore archives, never open them)."""
    return disk_archive.archive_dir(config.LocalGPUSpawner.data_dir, disk_dirname(user))


class CourseResetPage(CoursePage):
    """POST /hub/courses/NAME/reset: archive a student's disk, empty it, and copy the
    course's materials (`<public pool>/courses/NAME/`) into `NAME/` on it."""

    async def student_disk(self, name: str):
        """The stopped student's spawner on the local backend, or a page error."""
        if not any(
            r.user == name and r.role == "student"
            for r in (await asyncio.to_thread(self.ledger_view)).roster
        ):
            await self.show(
                error=_(
                    "%(user)s is not a student of %(course)s.",
                    user=repr(name[:64]),
                    course=self.course,
                ),
                status=404,
            )
            return None
        user = self.find_user(name)
        if user is None:
            await self.show(
                error=_("%(user)s has not signed in yet: no disk.", user=name), status=404
            )
            return None
        if any(spawner.active for spawner in user.spawners.values()):
            await self.show(error=_("Stop %(user)s's server first.", user=name), status=409)
            return None
        spawner = user.spawners[""]
        if not hasattr(spawner, "disk_path"):
            await self.show(error=_("Resetting a disk is for the local backend only."), status=400)
            return None
        return spawner

    def ledger_view(self):
        return self.billing.ledger().course_view(self.course)

    @web.authenticated
    async def post(self, course):
        await self.authorize_course(course)
        name = self.get_body_argument("user", "").strip()
        if self.get_body_argument("confirm", "") != "yes":
            await self.show(error=_("Tick the box to confirm the reset."), status=400)
            return
        spawner = await self.student_disk(name)
        if spawner is None:
            return
        materials = os.path.join(spawner.pool_dir or "", "courses", self.course)

        def reset() -> tuple[str, int]:
            disk, folder = spawner.disk_path, spawner.disk_archive_dir
            with disk_archive.DiskLock(spawner.data_dir, disk_dirname(name)):
                _refuse_running(spawner, disk)
                if not os.path.isdir(disk):
                    os.makedirs(disk, mode=0o700)
                    if spawner.run_as:
                        os.chown(disk, *spawner.run_as)
                saved = disk_archive.archive_disk(
                    disk, folder, f"reset-{self.course}", disk_archive.utcnow()
                )
                disk_archive.empty_disk(disk)
                # an idle-archived disk: its files stay in that archive, restorable from here
                disk_archive.forget_archived(folder)
                copied = 0
                if spawner.pool_dir and os.path.isdir(materials):
                    copied = disk_archive.copy_materials(
                        materials, os.path.join(disk, self.course), spawner.run_as
                    )
            return saved, copied

        try:
            saved, copied = await asyncio.to_thread(reset)
        except disk_archive.ArchiveBusy as e:
            await self.show(error=_busy(name, e), status=409)
            return
        except (disk_archive.ArchiveError, OSError) as e:
            await self.show(error=_("The reset failed: %(error)s", error=e), status=500)
            return
        self.log.info("%s reset %s's disk (archive %s)", self.current_user.name, name, saved)
        if copied:
            message = _(
                "Reset %(user)s's environment: archived as %(archive)s; the course materials"
                " (%(n)s files) are in %(folder)s/.",
                user=name,
                archive=saved,
                n=copied,
                folder=self.course,
            )
        else:
            message = _(
                "Reset %(user)s's environment: archived as %(archive)s; the course has no"
                " materials folder, so the disk is empty.",
                user=name,
                archive=saved,
            )
        await self.show(message=message)


class CourseRestorePage(CourseResetPage):
    """POST /hub/courses/NAME/restore: put a student's archived disk back (the current
    state is archived first)."""

    @web.authenticated
    async def post(self, course):
        await self.authorize_course(course)
        name = self.get_body_argument("user", "").strip()
        wanted = self.get_body_argument("archive", "")
        spawner = await self.student_disk(name)
        if spawner is None:
            return
        folder = spawner.disk_archive_dir
        if wanted not in await asyncio.to_thread(disk_archive.archives, folder):
            await self.show(
                error=_(
                    "%(user)s has no archive %(archive)s.", user=name, archive=repr(wanted[:100])
                ),
                status=404,
            )
            return

        def restore() -> str:
            disk = spawner.disk_path
            with disk_archive.DiskLock(spawner.data_dir, disk_dirname(name)):
                _refuse_running(spawner, disk)
                os.makedirs(disk, mode=0o700, exist_ok=True)
                saved = disk_archive.archive_disk(
                    disk, folder, "before-restore", disk_archive.utcnow()
                )
                disk_archive.restore_disk(disk, os.path.join(folder, wanted), spawner.run_as)
                disk_archive.forget_archived(folder)  # what staff chose, not the idle archive
            return saved

        try:
            saved = await asyncio.to_thread(restore)
        except disk_archive.ArchiveBusy as e:
            await self.show(error=_busy(name, e), status=409)
            return
        except (disk_archive.ArchiveError, OSError) as e:
            await self.show(error=_("The restore failed: %(error)s", error=e), status=500)
            return
        await self.show(
            message=_(
                "Restored %(user)s's disk from %(archive)s; what it held is archived as %(saved)s.",
                user=name,
                archive=wanted,
                saved=saved,
            )
        )


class ServerRunning(disk_archive.ArchiveBusy):
    """A server started on the disk after the page looked (its runtime record names it)."""


def _refuse_running(spawner, disk: str) -> None:
    """Inside the disk's lock: a start that landed after `student_disk` looked holds the
    lock only until its runtime record names the disk, so the record is what says."""
    why = server_on_disk(spawner.data_dir, disk)
    if why:
        raise ServerRunning(why)


def _busy(name: str, e: disk_archive.ArchiveBusy) -> str:
    """Why a reset or restore was refused: the disk is busy (`e` says with what)."""
    if isinstance(e, ServerRunning):
        return _(
            "%(user)s's disk is busy: %(why)s. Stop %(user)s's server first; nothing was changed.",
            user=name,
            why=e,
        )
    return _(
        "%(user)s's disk is busy: %(why)s. Nothing was changed; try again in a moment.",
        user=name,
        why=e,
    )


class CourseUsageCsv(CoursePage):
    """GET /hub/courses/NAME/usage.csv: every session the course's allowances paid for."""

    @web.authenticated
    async def get(self, course):
        await self.authorize_course(course)
        ledger = await self.billing.ledger_async()
        try:
            text = await asyncio.to_thread(actions.group_usage_csv, ledger, self.course)
        except actions.ActionError as e:
            raise web.HTTPError(e.status, "%s", e.message) from None
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="meterhub-{self.course}.csv"')
        self.finish(text)
