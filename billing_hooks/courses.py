"""Courses: a group of kind "course" whose wallet funds each student's allowance.

- The roster (students, TAs, instructors) is the ledger's: it comes from a CSV or an LMS,
  and may name people who have no hub account yet. The hub mirrors the students into the
  JupyterHub group of the course's name when their accounts exist (hub/group_sync.py).
- A student's allowance is a wallet of its own (`allowance:COURSE/USER`), filled from the
  course wallet by a pair of "allowance" entries: the course's, negative, and the
  allowance's, positive, of one amount. Each period (week, month, total) it is set back to
  the allowance: the first settle in a period moves what is owed (what the course has, if
  less; the rest when the course is topped up). At expiry what is left moves back to the
  course in one pair.
- Students pay from the allowance; the course's profiles and lab windows say what it pays
  for, and when.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError

from meterhub.i18n import _

from . import labwindows
from .db import Direct, direct_transaction
from .orm import (
    AT_WINDOW_END,
    CAP_PERIODS,
    COURSE_ROLES,
    CourseMember,
    CourseSettings,
    Entry,
    GroupSettings,
    MeteredSession,
    Wallet,
)
from .postings import (
    SYSTEM,
    InsufficientCredit,
    LedgerError,
    LedgerPart,
    UnknownWallet,
    group_settings,
)
from .wallets import USER_NAME, WalletRef, allowance_ref, fold, period_start

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from .db import PooledConnection

#: built once (every spawn without a named wallet asks it, bench/ledger_spawn.py)
_STUDENT_COURSES = Direct(
    select(CourseMember.course_name)
    .where(CourseMember.user_name == bindparam("user"), CourseMember.role == "student")
    .order_by(CourseMember.course_name)
)


@dataclass(frozen=True)
class RosterLine:
    user: str
    role: str = "student"
    full_name: str = ""
    email: str = ""


@dataclass
class RosterChange:
    added: list[str]
    removed: list[str]
    changed: list[str]
    unchanged: int


@dataclass(frozen=True)
class AllowanceState:
    """What a student may spend from a course now."""

    course: str
    user: str
    #: the allowance per period (None: the course set none)
    amount_micros: int | None
    period: str
    #: the allowance wallet's balance, as it will be once settled now
    left_micros: int
    expires_at: int | None
    expired: bool


def check_choices(choices: Iterable[str]) -> list[str]:
    """Course profile choices as written ("debug", "a800", "rtx4090:1"), checked for form
    (the catalog checks the profiles exist); LedgerError says what is wrong."""
    result = []
    for choice in choices:
        slug, sep, count = choice.strip().lower().partition(":")
        if not slug or len(slug) > 32 or not USER_NAME.match(slug):
            raise LedgerError(
                _("%(choice)s: a choice is a profile, or PROFILE:GPUS", choice=repr(choice[:40]))
            )
        if sep and (not count.isdigit() or not 0 < int(count) <= 64):
            raise LedgerError(
                _("%(choice)s: the GPU count is a whole number from 1", choice=repr(choice[:40]))
            )
        result.append(f"{slug}:{int(count)}" if sep else slug)
    return list(dict.fromkeys(result))


def allows(profiles: str, profile: str, gpus: int) -> bool:
    """Whether a course's choices ("" for any) include this profile and GPU count."""
    choices = profiles.split()
    return not choices or profile in choices or f"{profile}:{gpus}" in choices


@dataclass
class RosterRow:
    """One person on a course's roster as its console shows them."""

    user: str
    #: student | ta | instructor, or "former": off the roster, still running on the course
    role: str
    full_name: str
    email: str
    #: (session, cost so far) of their servers the course pays for now
    running: list = field(default_factory=list)
    #: what their allowance paid in its current period
    spent_micros: int = 0
    #: what they may still spend from the course (None: staff)
    left_micros: int | None = None
    #: when they last ran any server on the hub (epoch seconds; None: never)
    last_active: int | None = None


@dataclass
class CourseView:
    course: CourseSettings
    balance_micros: int
    in_allowances_micros: int
    #: net spend of the course's students of the last RUNWAY_DAYS days
    burn_micros: int
    roster: list[RosterRow]


class Courses(LedgerPart):
    # ------------------------------------------------------------------ the registry

    def create_course(
        self,
        name: str,
        actor: str,
        instructors: Sequence[str] = (),
        tas: Sequence[str] = (),
        timezone: str = "UTC",
        lti_key: str | None = None,
    ) -> CourseSettings:
        """A course with an empty wallet and its staff; refused when a group or course of
        that name exists (or, from an LMS, one with that `lti_key`)."""
        from .groups import check_group_name

        name = check_group_name(name)
        labwindows.zone(timezone)
        for user in (*instructors, *tas):
            _check_user(user)
        now = self.clock()
        with self.begin() as db:
            if group_settings(db, name) is not None:
                raise LedgerError(
                    _("a group or course named %(name)s exists already", name=repr(name))
                )
            db.add(
                GroupSettings(
                    name=name,
                    kind="course",
                    default_for_members=False,
                    created_by=actor,
                    created_at=now,
                )
            )
            course = CourseSettings(
                name=name,
                allowance_period="total",
                profiles="",
                windows="",
                timezone=timezone,
                debug_outside_windows=True,
                at_window_end="stop",
                lti_key=lti_key,
            )
            db.add(course)
            self._new_wallet(db, WalletRef("course", name))
            staff = {**{u: "ta" for u in tas}, **{u: "instructor" for u in instructors}}
            for user, role in staff.items():
                db.add(CourseMember(course_name=name, user_name=user, role=role, added_at=now))
            db.flush()
            return course

    def lti_launch(
        self,
        issuer: str,
        deployment: str,
        context: str,
        label: str,
        user: str,
        role: str | None,
        taken: Iterable[str] = (),
    ) -> str:
        """An LTI 1.3 launch: the course of (issuer, deployment, context), made the first
        time and named after the context's label (never one of `taken`: the hub's groups
        that are not courses); `user`'s roster line set to `role` (None: taken off it).
        Returns the course's name."""
        _check_user(user)
        if role is not None and role not in COURSE_ROLES:
            raise LedgerError(_("role: one of %(roles)s", roles=", ".join(COURSE_ROLES)))
        if any(len(part) > 255 for part in (issuer, deployment, context)):
            raise LedgerError(_("an LTI issuer, deployment or context id is too long"))
        key = json.dumps([issuer, deployment, context])
        for _attempt in range(2):
            with self.begin() as db:
                found = db.scalars(
                    select(CourseSettings).where(CourseSettings.lti_key == key)
                ).first()
                name = found.name if found is not None else _lti_name(db, label, key, taken)
            if found is not None:
                break
            try:
                self.create_course(name, f"lti:{issuer}"[:255], lti_key=key)
                break
            except (LedgerError, IntegrityError):
                continue  # a concurrent first launch made it: find it by its key
        else:
            raise LedgerError(
                _(
                    "cannot make a course for the LTI context %(context)s",
                    context=repr(context[:64]),
                )
            )
        with self.begin() as db:
            member = _member(db, name, user)
            if role is None:
                if member is not None:
                    db.delete(member)
            elif member is None:
                db.add(
                    CourseMember(course_name=name, user_name=user, role=role, added_at=self.clock())
                )
            else:
                member.role = role
        return name

    def course(self, name: str) -> CourseSettings | None:
        with self.begin() as db:
            return _course(db, fold(name))

    def courses(self) -> list[CourseSettings]:
        with self.begin() as db:
            return list(db.scalars(select(CourseSettings).order_by(CourseSettings.name)))

    def _require_course(self, db: Session, name: str) -> CourseSettings:
        course = _course(db, fold(name))
        if course is None:
            raise UnknownWallet(_("There is no course %(name)s", name=repr(name[:64])))
        return course

    def import_roster(self, name: str, lines: Sequence[RosterLine], actor: str) -> RosterChange:
        """Make the course's students exactly the file's; add or update the TAs and
        instructors it names (staff it does not name stay). Idempotent: the same file again
        changes nothing."""
        seen: dict[str, RosterLine] = {}
        for line in lines:
            _check_user(line.user)
            if line.role not in COURSE_ROLES:
                raise LedgerError(
                    _(
                        "%(user)s: role %(role)s is not one of %(roles)s",
                        user=line.user,
                        role=repr(line.role[:20]),
                        roles=", ".join(COURSE_ROLES),
                    )
                )
            if line.user in seen and seen[line.user] != line:
                raise LedgerError(_("%(user)s is in the roster twice, differently", user=line.user))
            seen[line.user] = line
        now = self.clock()
        added, removed, changed = [], [], []
        unchanged = 0
        with self.begin() as db:
            course = self._require_course(db, name)
            current = {
                m.user_name: m
                for m in db.scalars(
                    select(CourseMember).where(CourseMember.course_name == course.name)
                )
            }
            for user, line in seen.items():
                member = current.get(user)
                if member is None:
                    db.add(
                        CourseMember(
                            course_name=course.name,
                            user_name=user,
                            role=line.role,
                            full_name=line.full_name,
                            email=line.email,
                            added_at=now,
                        )
                    )
                    added.append(user)
                elif (member.role, member.full_name, member.email) != (
                    line.role,
                    line.full_name,
                    line.email,
                ):
                    member.role, member.full_name, member.email = (
                        line.role,
                        line.full_name,
                        line.email,
                    )
                    changed.append(user)
                else:
                    unchanged += 1
            for user, member in current.items():
                if user not in seen and member.role == "student":
                    db.delete(member)
                    removed.append(user)
        return RosterChange(sorted(added), sorted(removed), sorted(changed), unchanged)

    def course_member(self, name: str, user: str) -> CourseMember | None:
        with self.begin() as db:
            return _member(db, fold(name), user)

    def roster(self, name: str) -> list[CourseMember]:
        with self.begin() as db:
            course = self._require_course(db, name)
            return list(
                db.scalars(
                    select(CourseMember)
                    .where(CourseMember.course_name == course.name)
                    .order_by(CourseMember.user_name)
                )
            )

    def course_rosters(self) -> dict[str, dict[str, list[str]]]:
        """{course: {role: [users]}} of every course (the hub mirrors it)."""
        result: dict[str, dict[str, list[str]]] = {}
        with self.begin() as db:
            for name in db.scalars(select(CourseSettings.name).order_by(CourseSettings.name)):
                result[name] = {role: [] for role in COURSE_ROLES}
            for course, user, role in db.execute(
                select(
                    CourseMember.course_name, CourseMember.user_name, CourseMember.role
                ).order_by(CourseMember.user_name)
            ):
                result.setdefault(course, {r: [] for r in COURSE_ROLES})[role].append(user)
        return result

    def student_courses(self, user: str) -> list[str]:
        """The courses `user` is a student of."""
        with direct_transaction(self.engine) as connection:
            return self._student_courses(connection, user)

    def _student_courses(self, connection: PooledConnection, user: str) -> list[str]:
        return [name for (name,) in _STUDENT_COURSES.rows(connection, {"user": user})]

    def staff_courses(self, user: str) -> list[str]:
        """The courses `user` is a TA or an instructor of."""
        with self.begin() as db:
            return list(
                db.scalars(
                    select(CourseMember.course_name)
                    .where(CourseMember.user_name == user, CourseMember.role != "student")
                    .order_by(CourseMember.course_name)
                )
            )

    # ------------------------------------------------------------------ settings

    def set_allowance(
        self,
        name: str,
        amount_micros: int | None,
        period: str,
        expires_at: int | None,
    ) -> CourseSettings:
        """Each student's allowance per period. A change applies at each student's next
        settle (their next spawn or the meter's pass while they run): they hold the new
        allowance less what they spent in its period, the excess of a lowered one returning
        to the course. None removes it (no one pays from the course)."""
        if period not in CAP_PERIODS:
            raise LedgerError(
                _(
                    "--per: one of %(periods)s, not %(period)s",
                    periods=", ".join(CAP_PERIODS),
                    period=repr(period),
                )
            )
        if amount_micros is not None and amount_micros <= 0:
            raise LedgerError(_("an allowance is positive (`none` removes it)"))
        with self.begin() as db:
            course = self._require_course(db, name)
            course.allowance_micros = amount_micros
            course.allowance_period = period
            course.expires_at = expires_at
            db.flush()
            return course

    def set_course_profiles(self, name: str, choices: Sequence[str]) -> CourseSettings:
        """The profile choices the course pays for (none: any the student may start)."""
        checked = check_choices(choices)
        with self.begin() as db:
            course = self._require_course(db, name)
            course.profiles = " ".join(checked)
            db.flush()
            return course

    def set_course_windows(
        self,
        name: str,
        add: Sequence[str] = (),
        clear: bool = False,
        timezone: str | None = None,
        gpus: Mapping[str, int] | None = None,
    ) -> CourseSettings:
        """Add lab windows (stored lines, labwindows.weekly/once), after clearing them all
        when `clear`; set the course's time zone; set the GPUs its windows reserve for its
        students ({gpu type: count}; {} for none; the caller checks them against the
        inventory)."""
        if timezone is not None:
            labwindows.zone(timezone)
        if gpus is not None and any(
            not isinstance(n, int) or n < 0 or not check_choices([t]) for t, n in gpus.items()
        ):
            raise LedgerError(_("window GPUs: TYPE:COUNT with a whole count"))
        with self.begin() as db:
            course = self._require_course(db, name)
            lines = [] if clear else [w for w in course.windows.splitlines() if w]
            course.windows = "\n".join(dict.fromkeys([*lines, *add]))
            if timezone is not None:
                course.timezone = timezone
            if gpus is not None:
                course.window_gpus = " ".join(f"{t}:{n}" for t, n in sorted(gpus.items()) if n)
            db.flush()
            return course

    def window_reservations(self, now: int | None = None) -> dict[str, dict[str, tuple]]:
        """{gpu type: {"course:NAME": (count, its students)}} of the courses in a lab window
        now that reserve GPUs, for the local allocator (a pool: what the class does not use
        is held back from everyone else)."""
        now = self.clock() if now is None else now
        result: dict[str, dict[str, tuple]] = {}
        rosters = None
        for course in self.courses():
            if not course.window_gpus or not course.windows:
                continue
            if labwindows.current(course.windows.splitlines(), course.timezone, now) is None:
                continue
            if rosters is None:
                rosters = self.course_rosters()
            students = tuple(rosters.get(course.name, {}).get("student", ()))
            for gpu_type, count in window_gpus(course).items():
                result.setdefault(gpu_type, {})[f"course:{course.name}"] = (count, students)
        return result

    def set_course_options(
        self,
        name: str,
        debug_outside_windows: bool | None = None,
        at_window_end: str | None = None,
    ) -> CourseSettings:
        if at_window_end is not None and at_window_end not in AT_WINDOW_END:
            raise LedgerError(
                _("at window end: one of %(choices)s", choices=", ".join(AT_WINDOW_END))
            )
        with self.begin() as db:
            course = self._require_course(db, name)
            if debug_outside_windows is not None:
                course.debug_outside_windows = debug_outside_windows
            if at_window_end is not None:
                course.at_window_end = at_window_end
            db.flush()
            return course

    # ------------------------------------------------------------------ allowances

    def _allowance_wallet(self, db: Session, course: str, user: str) -> Wallet:
        """The student's allowance wallet, locked; made (empty) the first time."""
        ref = allowance_ref(course, user)
        return self._wallet(db, ref, lock=True) or self._new_wallet(db, ref)

    def _move(
        self,
        db: Session,
        course_wallet: Wallet,
        allowance: Wallet,
        amount: int,
        key: str,
        note: str,
        period_start: int | None = None,
    ) -> None:
        """`amount` from the course to the allowance (negative: back), as a pair of entries."""
        fields = {"window_start": period_start}
        self._post(db, course_wallet, "allowance", -amount, f"{key}:course", SYSTEM, note, **fields)
        self._post(db, allowance, "allowance", amount, f"{key}:student", SYSTEM, note, **fields)

    def _settle_allowance(
        self, db: Session, course: CourseSettings, user: str, now: int
    ) -> tuple[Wallet, Wallet]:
        """Lock the course's wallet, then the student's allowance, and bring the allowance
        to what it should hold now: renewed for this period (as far as the course's credit
        goes), or emptied back into the course once expired. Returns (course, allowance)."""
        course_wallet = self._wallet(db, WalletRef("course", course.name), lock=True)
        assert course_wallet is not None  # made with the course, in one transaction
        allowance = self._allowance_wallet(db, course.name, user)
        base = f"allowance:{course.name}/{user}"
        member = _member(db, course.name, user)
        if member is None or member.role != "student":
            # no longer a student: the course pays nothing more, and takes back what is left
            if allowance.balance_micros != 0:
                self._move(
                    db,
                    course_wallet,
                    allowance,
                    -allowance.balance_micros,
                    f"{base}:left:{now}",
                    "off the roster: what was left returns to the course",
                )
            return course_wallet, allowance
        if course.expires_at is not None and now >= course.expires_at:
            key = f"{base}:expired:{course.expires_at}"
            done = db.scalar(select(Entry.id).where(Entry.key == f"{key}:student"))
            if done is None and allowance.balance_micros != 0:
                self._move(
                    db,
                    course_wallet,
                    allowance,
                    -allowance.balance_micros,
                    key,
                    "allowance expired: what was left returns to the course",
                )
            return course_wallet, allowance
        if course.allowance_micros is None:
            return course_wallet, allowance
        start = _allowance_start(course, now)
        spent = _spent_since(db, allowance.id, start)
        amount = _due(course.allowance_micros, allowance.balance_micros, spent, course_wallet)
        if amount:
            self._move(
                db,
                course_wallet,
                allowance,
                amount,
                f"{base}:{start}:{_move_count(db, allowance.id, start)}",
                f"allowance for the {course.allowance_period}"
                if course.allowance_period != "total"
                else "allowance",
                period_start=start,
            )
        return course_wallet, allowance

    def _course_payer(self, db: Session, name: str, user: str, now: int) -> Wallet:
        """The allowance a student's spawn pays from, settled and locked (open_session; the
        hub has checked they are a student of the course). InsufficientCredit says why
        when it cannot pay."""
        course = _course(db, name)
        if course is None:
            raise UnknownWallet(_("There is no course %(name)s", name=repr(name[:64])))
        if course.expires_at is not None and now >= course.expires_at:
            when = datetime.datetime.fromtimestamp(course.expires_at, datetime.UTC)
            ended = when.strftime("%Y-%m-%d %H:%M")
            raise InsufficientCredit(
                _(
                    "Your allowance from %(course)s ended on %(when)s UTC. Pay from your own"
                    " wallet.",
                    course=course.name,
                    when=ended,
                )
            )
        if course.allowance_micros is None:
            raise InsufficientCredit(
                _(
                    "%(course)s has no allowance for its students yet. Ask your instructor,"
                    " or pay from your own wallet.",
                    course=course.name,
                )
            )
        _course_wallet, allowance = self._settle_allowance(db, course, user, now)
        return allowance

    def settle_allowance(self, name: str, user: str, now: int | None = None) -> int:
        """Settle one student's allowance now; returns its balance."""
        now = self.clock() if now is None else now
        with self.begin() as db:
            course = self._require_course(db, name)
            _course_wallet, allowance = self._settle_allowance(db, course, user, now)
            return allowance.balance_micros

    def settle_allowances(self, now: int | None = None) -> dict[int, int]:
        """The meter's pass over allowances: renew those paying for open sessions whose
        period has turned (and top up any the course could not fill before), and return
        what is left of expired courses' allowances. One transaction per course; returns
        {allowance wallet id: balance} of those settled."""
        now = self.clock() if now is None else now
        settled: dict[int, int] = {}
        for course in self.courses():
            expired = course.expires_at is not None and now >= course.expires_at
            if course.allowance_micros is None and not expired:
                continue
            prefix = f"{course.name}/"
            with self.begin() as db:
                W = Wallet
                owners = select(W.owner_name).where(
                    W.owner_kind == "allowance", W.owner_name.startswith(prefix, autoescape=True)
                )
                holding = {
                    owner[len(prefix) :]
                    for owner in db.scalars(owners.where(W.balance_micros != 0))
                }
                if expired:
                    users = sorted(holding)
                else:
                    paying = owners.where(
                        W.id.in_(
                            select(MeteredSession.wallet_id).where(
                                MeteredSession.stopped_at.is_(None)
                            )
                        )
                    )
                    students = set(
                        db.scalars(
                            select(CourseMember.user_name).where(
                                CourseMember.course_name == course.name,
                                CourseMember.role == "student",
                            )
                        )
                    )
                    # those paying for a server now, and what the course's former students
                    # still hold (it returns to the course)
                    users = sorted(
                        {owner[len(prefix) :] for owner in db.scalars(paying)}
                        | (holding - students)
                    )
                if not users:
                    continue
                locked = self._require_course(db, course.name)
                for user in users:
                    _course_wallet, allowance = self._settle_allowance(db, locked, user, now)
                    settled[allowance.id] = allowance.balance_micros
        return settled

    def allowance_state(self, name: str, user: str, now: int | None = None) -> AllowanceState:
        """What `user` has to spend from the course now, as a settle now would leave it
        (read only: nothing is moved)."""
        now = self.clock() if now is None else now
        with self.begin() as db:
            course = self._require_course(db, name)
            allowance = self._wallet(db, allowance_ref(course.name, user))
            course_wallet = self._wallet(db, WalletRef("course", course.name))
            assert course_wallet is not None
            balance = 0 if allowance is None else allowance.balance_micros
            expired = course.expires_at is not None and now >= course.expires_at
            allowance_id = None if allowance is None else allowance.id
            left = self._left(db, course, allowance_id, balance, course_wallet, now)
            return AllowanceState(
                course=course.name,
                user=user,
                amount_micros=course.allowance_micros,
                period=course.allowance_period,
                left_micros=left,
                expires_at=course.expires_at,
                expired=expired,
            )

    def default_course(
        self,
        user: str,
        profile: str,
        gpus: int,
        now: int | None = None,
        student_courses: Sequence[str] | None = None,
    ) -> str:
        """The course a student's spawn pays from when they name no wallet: the first (by
        name) they are a student of whose allowance has something left and which pays for
        this choice now; "" when none. `student_courses`: theirs, when already read
        (`Queries.spawn_reads`)."""
        now = self.clock() if now is None else now
        if student_courses is None:
            student_courses = self.student_courses(user)
        for name in student_courses:
            course = self.course(name)
            if course is None or course.allowance_micros is None:
                continue
            if course_refusal(course, profile, gpus, now):
                continue
            state = self.allowance_state(name, user, now)
            if not state.expired and state.left_micros > 0:
                return name
        return ""

    def course_view(self, name: str, now: int | None = None) -> CourseView:
        """The console's view: the wallet, and each person on the roster with what they run
        on the course, spend and have left, and when they were last active."""
        from .groups import DAY, RUNWAY_DAYS, _session_costs

        now = self.clock() if now is None else now
        with self.begin() as db:
            course = self._require_course(db, name)
            members = list(
                db.scalars(
                    select(CourseMember)
                    .where(CourseMember.course_name == course.name)
                    .order_by(CourseMember.user_name)
                )
            )
            prefix = f"{course.name}/"
            wallets = {
                owner[len(prefix) :]: (wid, balance)
                for wid, owner, balance in db.execute(
                    select(Wallet.id, Wallet.owner_name, Wallet.balance_micros).where(
                        Wallet.owner_kind == "allowance",
                        Wallet.owner_name.startswith(prefix, autoescape=True),
                    )
                )
            }
            ids = [wid for wid, _balance in wallets.values()]
            running = list(
                db.scalars(
                    select(MeteredSession)
                    .where(MeteredSession.wallet_id.in_(ids), MeteredSession.stopped_at.is_(None))
                    .order_by(MeteredSession.id)
                )
            )
            costs = _session_costs(db, [s.id for s in running])
            start = _allowance_start(course, now)
            spent = dict(
                db.execute(
                    select(Entry.wallet_id, func.sum(Entry.amount_micros))
                    .where(
                        Entry.wallet_id.in_(ids),
                        Entry.kind.in_(("charge", "refund")),
                        Entry.created_at >= start,
                    )
                    .group_by(Entry.wallet_id)
                ).all()
            )
            burn = db.scalar(
                select(func.coalesce(func.sum(Entry.amount_micros), 0)).where(
                    Entry.wallet_id.in_(ids),
                    Entry.kind.in_(("charge", "refund")),
                    Entry.created_at >= now - RUNWAY_DAYS * DAY,
                )
            )
            S = MeteredSession
            seen = func.coalesce(S.stopped_at, S.last_seen_running, S.ready_at, S.started_at)
            active = dict(
                db.execute(
                    select(S.user_name, func.max(seen))
                    .where(S.user_name.in_([m.user_name for m in members]))
                    .group_by(S.user_name)
                ).all()
            )
            course_wallet = self._wallet(db, WalletRef("course", course.name))
            assert course_wallet is not None
            rows = []
            for m in members:
                wid, balance = wallets.get(m.user_name, (None, 0))
                row = RosterRow(m.user_name, m.role, m.full_name, m.email)
                row.last_active = active.get(m.user_name)
                if m.role == "student":
                    row.running = [(s, costs.get(s.id, 0)) for s in running if s.wallet_id == wid]
                    row.spent_micros = 0 if wid is None else -int(spent.get(wid) or 0)
                    row.left_micros = self._left(db, course, wid, balance, course_wallet, now)
                rows.append(row)
            listed = {m.user_name for m in members}
            for user, (wid, _balance) in sorted(wallets.items()):
                mine = [(s, costs.get(s.id, 0)) for s in running if s.wallet_id == wid]
                if user not in listed and mine:
                    # off the roster since, still on the course's money until the meter stops it
                    row = RosterRow(user, "former", "", "", running=mine)
                    row.last_active = active.get(user)
                    rows.append(row)
            return CourseView(
                course=course,
                balance_micros=course_wallet.balance_micros,
                in_allowances_micros=sum(balance for _wid, balance in wallets.values()),
                burn_micros=-int(burn or 0),
                roster=rows,
            )

    def _left(
        self,
        db: Session,
        course: CourseSettings,
        allowance_id: int | None,
        balance: int,
        course_wallet: Wallet,
        now: int,
    ) -> int:
        """What a student may spend from the course now, as a settle now would leave it."""
        if course.expires_at is not None and now >= course.expires_at:
            return min(0, balance)  # what is left goes back to the course
        if course.allowance_micros is None:
            return balance
        start = _allowance_start(course, now)
        spent = 0 if allowance_id is None else _spent_since(db, allowance_id, start)
        return balance + _due(course.allowance_micros, balance, spent, course_wallet)

    def course_balance(self, name: str) -> int:
        with self.begin() as db:
            course = self._require_course(db, name)
            wallet = self._wallet(db, WalletRef("course", course.name))
            assert wallet is not None
            return wallet.balance_micros

    def allowances_total(self, name: str) -> int:
        """What the course's students hold in their allowances now."""
        with self.begin() as db:
            course = self._require_course(db, name)
            return int(
                db.scalar(
                    select(func.coalesce(func.sum(Wallet.balance_micros), 0)).where(
                        Wallet.owner_kind == "allowance",
                        Wallet.owner_name.startswith(f"{course.name}/", autoescape=True),
                    )
                )
                or 0
            )


def _allowance_start(course: CourseSettings, now: int) -> int:
    """The start of the allowance's period holding `now`, on the course's clock: a week
    begins Monday 00:00 and a month the 1st 00:00 where the class is."""
    return period_start(course.allowance_period, now, labwindows.zone(course.timezone))


def _move_count(db: Session, allowance_id: int, start: int) -> int:
    """How many moves the allowance had in the period starting at `start` (the next one's
    key)."""
    return int(
        db.scalar(
            select(func.count()).where(
                Entry.wallet_id == allowance_id,
                Entry.kind == "allowance",
                Entry.window_start == start,
            )
        )
        or 0
    )


def _spent_since(db: Session, allowance_id: int, start: int) -> int:
    """What the allowance paid for time from `start` on: charges whose window starts then
    or later (a window across the boundary belongs to the period it began in), net of
    refunds written since."""
    charged = db.scalar(
        select(func.coalesce(func.sum(Entry.amount_micros), 0)).where(
            Entry.wallet_id == allowance_id, Entry.kind == "charge", Entry.window_start >= start
        )
    )
    refunded = db.scalar(
        select(func.coalesce(func.sum(Entry.amount_micros), 0)).where(
            Entry.wallet_id == allowance_id, Entry.kind == "refund", Entry.created_at >= start
        )
    )
    return -int(charged or 0) - int(refunded or 0)


def _due(allowance: int, balance: int, spent: int, course_wallet: Wallet) -> int:
    """What to move into an allowance now so that it holds the period's allowance less what
    was spent in the period: as far as the course's credit goes; negative (back to the
    course) when it holds more, as after a lowered allowance."""
    due = allowance - spent - balance
    if due > 0:
        return min(due, max(0, course_wallet.balance_micros))
    return due


def course_refusal(course: CourseSettings, profile: str, gpus: int, now: int) -> str:
    """Why the course does not pay for this choice now ("" when it does): a profile it does
    not pay for, or a GPU (or, if the course says so, debug mode) outside its lab windows."""
    if not allows(course.profiles, profile, gpus):
        choice = profile if not gpus else f"{gpus}x {profile}"
        return _(
            "%(course)s pays for %(profiles)s only; pay from your own wallet to start %(choice)s.",
            course=course.name,
            profiles=", ".join(course.profiles.split()),
            choice=choice,
        )
    lines = course.windows.splitlines()
    if not lines or (gpus == 0 and course.debug_outside_windows):
        return ""
    if labwindows.current(lines, course.timezone, now) is not None:
        return ""
    values = {"course": course.name, "when": lab_phrase(course, now)}
    if gpus and course.debug_outside_windows:
        return _(
            "%(course)s pays for GPUs during its lab hours only (%(when)s). Debug mode is open"
            " at any time. Or pay from your own wallet.",
            **values,
        )
    if gpus:
        return _(
            "%(course)s pays for GPUs during its lab hours only (%(when)s). Or pay from your"
            " own wallet.",
            **values,
        )
    return _(
        "%(course)s pays for servers during its lab hours only (%(when)s). Or pay from your"
        " own wallet.",
        **values,
    )


def window_gpus(course: CourseSettings) -> dict[str, int]:
    """{gpu type: count} the course's windows reserve."""
    result = {}
    for item in (course.window_gpus or "").split():
        gpu_type, _sep, count = item.partition(":")
        result[gpu_type] = int(count)
    return result


def lab_phrase(course: CourseSettings, now: int) -> str:
    """ "lab now, until 16:00 CST", "next lab: Tue 14:00 CST" or "no lab scheduled" (in the
    language of the moment)."""
    lines = course.windows.splitlines()
    current = labwindows.current(lines, course.timezone, now)
    if current is not None:
        return _("lab now, until %(end)s", end=labwindows.phrase(current[1], course.timezone, now))
    upcoming = labwindows.upcoming(lines, course.timezone, now)
    if upcoming is None:
        return _("no lab scheduled")
    return _("next lab: %(start)s", start=labwindows.phrase(upcoming[0], course.timezone, now))


def _lti_name(db: Session, label: str, key: str, taken: Iterable[str] = ()) -> str:
    """A free course name from an LMS context's label: lower case, other characters as
    "-", with a short digest of its key when the plain name is taken."""
    from .groups import check_group_name

    slug = re.sub(r"[^a-z0-9._-]+", "-", label.lower())[:50].strip("-._") or "course"
    digest = hashlib.sha256(key.encode()).hexdigest()[:6]
    reserved = set(taken)
    for name in (slug, f"{slug}-{digest}"):
        if group_settings(db, name) is None and name not in reserved:
            return check_group_name(name)
    other = f"{slug}-{digest!r}"
    raise LedgerError(
        _("the course names %(name)s and %(other)s are taken", name=repr(slug), other=other)
    )


def _course(db: Session, name: str) -> CourseSettings | None:
    return db.scalars(select(CourseSettings).where(CourseSettings.name == name)).first()


def _member(db: Session, course: str, user: str) -> CourseMember | None:
    return db.scalars(
        select(CourseMember).where(
            CourseMember.course_name == course, CourseMember.user_name == user
        )
    ).first()


def _check_user(user: str) -> None:
    if not isinstance(user, str) or not USER_NAME.match(user):
        raise LedgerError(_("invalid user name %(name)s", name=repr(str(user)[:64])))
