"""The ledger's tables: wallets, append-only entries, sessions, passes, notifications, prices
(dated, append-only), the meter's reconciliations, the scheduled audit's runs, groups:
their settings, admins, members' caps and the membership changes the hub applies, and
vouchers with the failed redemptions their rate limit counts.

Money columns are integer micro-units (BigInteger); times are integer UTC epoch seconds.
Schema changes go through alembic (billing_hooks/migrations); never edit a released one.
"""

from __future__ import annotations

import json

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from meterhub.i18n import pick

#: violations an audit run keeps (its problems_count counts them all)
AUDIT_PROBLEM_LINES = 50

ENTRY_KINDS = (
    "trial",
    "grant",
    "topup",
    "charge",
    "pass",
    "refund",
    "adjustment",
    # a course's credit moved to (positive) or back from (negative) a student's allowance,
    # written as a pair: the course wallet's entry and the allowance wallet's, same amount
    "allowance",
)
#: an allowance wallet is a student's in one course, named "COURSE/USER"
OWNER_KINDS = ("user", "group", "course", "allowance")
COURSE_ROLES = ("student", "ta", "instructor")
AT_WINDOW_END = ("stop", "debug")
CAP_PERIODS = ("week", "month", "total")
#: membership changes the CLI asks of the hub (applied by the hub, in its own process)
HUB_CHANGE_ACTIONS = ("create", "add", "remove")


class Base(DeclarativeBase):
    pass


class Wallet(Base):
    """An account holding credit: a user's, a group's, a course's, or a student's allowance
    carved from a course's (owner "COURSE/USER")."""

    __tablename__ = "wallets"
    __table_args__ = (UniqueConstraint("owner_kind", "owner_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_kind: Mapped[str] = mapped_column(String(16))
    owner_name: Mapped[str] = mapped_column(String(255))
    currency: Mapped[str] = mapped_column(String(3))
    #: cached sum of this wallet's entries, updated in the same transaction as each entry
    balance_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)


class Entry(Base):
    """One movement of credit. Append-only: a mistake is fixed by a correcting entry."""

    __tablename__ = "entries"
    __table_args__ = (Index("ix_entries_wallet_id", "wallet_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    wallet_id: Mapped[int] = mapped_column(ForeignKey("wallets.id"))
    kind: Mapped[str] = mapped_column(String(16))
    #: signed: credits positive, charges negative
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    balance_after_micros: Mapped[int] = mapped_column(BigInteger)
    #: deterministic idempotency key, e.g. "charge:17:1700000000-1700000060"
    key: Mapped[str] = mapped_column(String(200), unique=True)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("sessions.id"), nullable=True)
    window_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    window_end: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    #: who wrote it: "user:NAME", "service:NAME", "cli:OSUSER", "meter", "hub", "system"
    actor: Mapped[str] = mapped_column(String(255), default="")
    #: for client-keyed requests: a digest of what was asked, so a replay can be told from
    #: a key reused for something else
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class MeteredSession(Base):
    """One run of one server, from spawn to stop, with the rate captured at start."""

    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_open", "stopped_at", "user_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    wallet_id: Mapped[int] = mapped_column(ForeignKey("wallets.id"))
    user_name: Mapped[str] = mapped_column(String(255))
    server_name: Mapped[str] = mapped_column(String(255), default="")
    profile: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    rate_micros_per_hour: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int] = mapped_column(BigInteger)
    ready_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    stopped_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: charged up to here (exclusive); advanced only together with a charge entry
    metered_through: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_seen_running: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pass_id: Mapped[int | None] = mapped_column(ForeignKey("passes.id"), nullable=True)
    #: the user's cap on this session ("stop after ¥X"): charges never pass it
    max_cost_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the user's time cap ("stop after N hours"), counted from ready: nothing is charged after
    max_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the environment it ran (`pytorch`, `minimal`...); None for sessions from before them
    environment: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Pass(Base):
    """A daily, weekly or monthly purchase covering one GPU type × count."""

    __tablename__ = "passes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    wallet_id: Mapped[int] = mapped_column(ForeignKey("wallets.id"))
    profile: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    period: Mapped[str] = mapped_column(String(16))
    price_micros: Mapped[int] = mapped_column(BigInteger)
    starts_at: Mapped[int] = mapped_column(BigInteger)
    ends_at: Mapped[int] = mapped_column(BigInteger)
    #: the key of the ledger entry that paid for it
    entry_key: Mapped[str] = mapped_column(String(200), unique=True)


class Notification(Base):
    """A message for a user (credit warnings, stops); shown inside JupyterLab."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[int] = mapped_column(BigInteger)
    read_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the message in the other languages meterhub speaks, JSON {"zh_CN": "..."}; `message`
    #: is the English (meterhub.i18n.in_every_language)
    translations: Mapped[str | None] = mapped_column(Text, nullable=True)

    def text(self, language: str | None = None) -> str:
        """The message in `language` (default: the language of the moment)."""
        others = json.loads(self.translations) if self.translations else None
        return pick(others, self.message, language)


class Reconciliation(Base):
    """Something the meter corrected against the hub's view: a session closed because its
    server had vanished, or a server stopped because it ran without a session."""

    __tablename__ = "reconciliations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: "vanished" or "unbilled"
    kind: Mapped[str] = mapped_column(String(16))
    user_name: Mapped[str] = mapped_column(String(255))
    server_name: Mapped[str] = mapped_column(String(255), default="")
    session_id: Mapped[int | None] = mapped_column(ForeignKey("sessions.id"), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[int] = mapped_column(BigInteger)


class Price(Base):
    """A price for new sessions of a profile (per GPU-hour; per hour for debug), from a time.

    Append-only: a change adds a row. A profile's current price is its row with the latest
    effective_from at or before now (the later row on a tie); none: the site config's price.
    Running sessions keep the rate they captured at start.
    """

    __tablename__ = "prices"
    __table_args__ = (Index("ix_prices_profile", "profile", "effective_from", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(32))
    micros_per_hour: Mapped[int] = mapped_column(BigInteger)
    effective_from: Mapped[int] = mapped_column(BigInteger)
    #: who set it, as entries name their actor ("unknown" for prices set before 0003)
    set_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[int] = mapped_column(BigInteger)


class AuditRun(Base):
    """One scheduled run of the audit (billing service), for the admin page."""

    __tablename__ = "audit_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[int] = mapped_column(BigInteger)
    finished_at: Mapped[int] = mapped_column(BigInteger)
    problems_count: Mapped[int] = mapped_column(Integer)
    #: the first AUDIT_PROBLEM_LINES violations, one a line ("" when sound)
    problems: Mapped[str] = mapped_column(Text, default="")


class GroupSettings(Base):
    """A group with a wallet: meterhub's side of a JupyterHub group (same name, lower case).

    Membership is JupyterHub's; this row holds what only billing needs.
    """

    __tablename__ = "group_settings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    #: "group" (a research group) or "course" (its own settings in course_settings)
    kind: Mapped[str] = mapped_column(String(16), default="group")
    #: members who name no wallet at spawn pay from this group
    default_for_members: Mapped[bool] = mapped_column(Boolean, default=False)
    #: POSTed JSON budget alerts (None: in-hub notifications only)
    webhook_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[int] = mapped_column(BigInteger)


class GroupAdmin(Base):
    """A group admin (a PI): the hub gives them the group's delegated role."""

    __tablename__ = "group_admins"
    __table_args__ = (UniqueConstraint("group_name", "user_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    group_name: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(255))


class MemberCap(Base):
    """How much one member may spend from a group wallet per period (week, month, total).

    Periods are calendar periods in UTC: weeks start on Monday 00:00, months on the 1st.
    """

    __tablename__ = "member_caps"
    __table_args__ = (UniqueConstraint("wallet_id", "user_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    wallet_id: Mapped[int] = mapped_column(ForeignKey("wallets.id"))
    user_name: Mapped[str] = mapped_column(String(255))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    period: Mapped[str] = mapped_column(String(8))
    set_by: Mapped[str] = mapped_column(String(255))
    set_at: Mapped[int] = mapped_column(BigInteger)


class HubChange(Base):
    """A membership change asked for outside the hub (the CLI), applied once by the hub in
    its own process (JupyterHub expects no other writer of its database)."""

    __tablename__ = "hub_changes"
    __table_args__ = (Index("ix_hub_changes_pending", "applied_at", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[str] = mapped_column(String(16))
    group_name: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    actor: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[int] = mapped_column(BigInteger)
    applied_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: what applying it found ("" when it did what was asked)
    outcome: Mapped[str] = mapped_column(Text, default="")


class CourseSettings(Base):
    """A course: a group of kind "course" whose wallet pays students' allowances, with the
    profiles it pays for and the lab windows that gate its GPUs."""

    __tablename__ = "course_settings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    #: each student's allowance per period (None: none set; students cannot pay from it)
    allowance_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: week | month | total (CAP_PERIODS)
    allowance_period: Mapped[str] = mapped_column(String(8), default="total")
    #: when allowances end: what is left returns to the course (None: never)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the choices the course pays for, space-separated ("debug rtx4090:1"); "": any
    profiles: Mapped[str] = mapped_column(Text, default="")
    #: lab windows, a line each ("weekly Tue 14:00-16:00", "on 2027-01-12T14:00/16:00")
    windows: Mapped[str] = mapped_column(Text, default="")
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    #: whether debug mode paid by the course may run outside the windows
    debug_outside_windows: Mapped[bool] = mapped_column(Boolean, default=True)
    #: GPUs reserved for the course's students during its windows ("rtx4090:2 a800:1")
    window_gpus: Mapped[str] = mapped_column(Text, default="", server_default="")
    #: what happens to course-paid GPU servers when a window ends: stop | debug
    at_window_end: Mapped[str] = mapped_column(String(8), default="stop")
    #: an LTI 1.3 context: "ISSUER DEPLOYMENT CONTEXT" (None: not from an LMS)
    lti_key: Mapped[str | None] = mapped_column(String(700), nullable=True, unique=True)


class CourseMember(Base):
    """One line of a course's roster: a student, TA or instructor, who may have no hub
    account yet (they join the hub group when they first sign in)."""

    __tablename__ = "course_members"
    __table_args__ = (UniqueConstraint("course_name", "user_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    course_name: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(255))
    #: student | ta | instructor
    role: Mapped[str] = mapped_column(String(16))
    full_name: Mapped[str] = mapped_column(Text, default="")
    email: Mapped[str] = mapped_column(Text, default="")
    added_at: Mapped[int] = mapped_column(BigInteger)


class Restart(Base):
    """A server the meter stopped to start again in debug mode on the same disk (idle, a
    session cap, a lab window's end). The hub starts it, in its own process, with a
    short-lived token of the user's limited to that one server: the billing service itself
    never holds the right to start servers."""

    __tablename__ = "restarts"
    __table_args__ = (
        Index("ix_restarts_pending", "applied_at", "id"),
        UniqueConstraint("session_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255))
    server_name: Mapped[str] = mapped_column(String(255), default="")
    #: the stopped session: one restart per session, whichever pass asks twice
    session_id: Mapped[int | None] = mapped_column(ForeignKey("sessions.id"), nullable=True)
    #: the user options to start with, JSON ({"profile": "debug", "wallet": "group:lab"})
    options: Mapped[str] = mapped_column(Text)
    #: idle | cap | lab
    reason: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[int] = mapped_column(BigInteger)
    applied_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: what starting it found ("" when it started)
    outcome: Mapped[str] = mapped_column(Text, default="")


class Voucher(Base):
    """A code a user redeems once for credit (`meterhub voucher create`). Only the code's
    hash is kept: the code itself is printed once, when it is made. Redeeming it claims the
    row and writes its one entry (key `voucher:ID`) in the same transaction."""

    __tablename__ = "vouchers"
    __table_args__ = (Index("ix_vouchers_batch", "batch", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: SHA-256 of the normalized code (billing_hooks.vouchers.code_hash)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    #: the code's last characters, to tell vouchers apart in a list (not enough to guess it)
    hint: Mapped[str] = mapped_column(String(8))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    #: the vouchers made by one command share it
    batch: Mapped[str] = mapped_column(String(32))
    note: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[int] = mapped_column(BigInteger)
    #: it cannot be redeemed from this moment on (None: never expires)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    redeemed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the user whose wallet it credited
    redeemed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    entry_id: Mapped[int | None] = mapped_column(
        ForeignKey("entries.id"), nullable=True, unique=True
    )


class RedeemFailure(Base):
    """A voucher code that did not redeem (unknown, used, expired, revoked): what the rate
    limit counts, per user and for the whole site. Rows older than the limit's window are
    deleted as new ones come; nothing here is money."""

    __tablename__ = "redeem_failures"
    __table_args__ = (
        Index("ix_redeem_failures_user", "user_name", "created_at"),
        Index("ix_redeem_failures_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[int] = mapped_column(BigInteger)
