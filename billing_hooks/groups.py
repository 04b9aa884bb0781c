"""Groups with wallets: the registry (settings, admins, caps), the membership changes the hub
applies for the CLI, and what the group page, the REST API and the meter read of a group.

Membership itself is JupyterHub's: callers pass the members they got from the hub.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select, update

from meterhub.i18n import N_, _

from .money import SECONDS_PER_HOUR
from .orm import (
    CAP_PERIODS,
    HUB_CHANGE_ACTIONS,
    Entry,
    GroupAdmin,
    GroupSettings,
    HubChange,
    MemberCap,
    MeteredSession,
    Wallet,
)
from .postings import LedgerError, LedgerPart, UnknownWallet, group_settings, member_spent
from .wallets import GROUP_NAME, GROUP_RULE, WalletRef, fold, period_start

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

DAY = 86_400
#: the burn the runway is measured at: the last 7 days
RUNWAY_DAYS = 7
#: pending hub changes applied in one go
HUB_CHANGES_BATCH = 200
MONTH = re.compile(r"^([0-9]{4})-([0-9]{2})\Z")
#: a cap's period as a person reads it ("¥50.00 / month")
CAP_PERIOD_NAMES = {"week": N_("week"), "month": N_("month"), "total": N_("total")}


def month_bounds(text: str) -> tuple[int, int]:
    """[start, end) (UTC epoch seconds) of the month written YYYY-MM: a statement's period.
    ValueError when it is not one."""
    match = MONTH.match(text)
    if match is None or not 1 <= int(match[2]) <= 12 or not 1970 <= int(match[1]) <= 9998:
        raise ValueError(_("month: YYYY-MM, e.g. 2026-03"))
    year, month = int(match[1]), int(match[2])
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return int(start.timestamp()), int(end.timestamp())


def runway(balance_micros: int, burn_micros: int) -> int | None:
    """Seconds the balance lasts at the last RUNWAY_DAYS days' burn (None: nothing spent)."""
    if burn_micros <= 0:
        return None
    return max(0, balance_micros) * RUNWAY_DAYS * DAY // burn_micros


@dataclass
class MemberSpend:
    """One member's spend from a group wallet: in their cap's period (the month without one)."""

    user: str
    spent_micros: int
    period: str
    cap_micros: int | None = None

    @property
    def left_micros(self) -> int | None:
        return None if self.cap_micros is None else self.cap_micros - self.spent_micros


@dataclass
class GroupView:
    name: str
    wallet_id: int
    balance_micros: int
    default_for_members: bool
    webhook_url: str | None
    admins: list[str]
    members: list[MemberSpend]
    #: (session, cost so far in micros) of the servers the wallet pays for now
    running: list = field(default_factory=list)
    #: net spend of the last RUNWAY_DAYS days
    burn_micros: int = 0

    @property
    def runway_seconds(self) -> int | None:
        return runway(self.balance_micros, self.burn_micros)


@dataclass(frozen=True)
class AlertFacts:
    """A group wallet as budget alerts see it."""

    wallet_id: int
    name: str
    balance_micros: int
    burn_micros: int
    admins: list[str]
    webhook_url: str | None
    #: the latest entry that added credit: an alert is sent once per top-up
    last_credit_entry: int

    @property
    def runway_seconds(self) -> int | None:
        return runway(self.balance_micros, self.burn_micros)


@dataclass(frozen=True)
class CapState:
    wallet_id: int
    user: str
    cap_micros: int
    period: str
    spent_micros: int


def check_group_name(name: str) -> str:
    folded = fold(name)
    if not GROUP_NAME.match(folded):
        raise LedgerError(
            _("invalid group name %(name)s: %(rule)s", name=repr(name[:64]), rule=_(GROUP_RULE))
        )
    return folded


class Groups(LedgerPart):
    # ------------------------------------------------------------------ the registry

    def create_group(
        self,
        name: str,
        actor: str,
        admins: Sequence[str] = (),
        default_for_members: bool = False,
    ) -> GroupSettings:
        """A group with an empty wallet; the hub creates the JupyterHub group (a queued
        change). Refused when it exists."""
        name = check_group_name(name)
        now = self.clock()
        with self.begin() as db:
            if group_settings(db, name) is not None:
                raise LedgerError(_("the group %(name)s exists already", name=repr(name)))
            settings = GroupSettings(
                name=name,
                kind="group",
                default_for_members=default_for_members,
                created_by=actor,
                created_at=now,
            )
            db.add(settings)
            self._new_wallet(db, WalletRef("group", name))
            for user in dict.fromkeys(admins):
                db.add(GroupAdmin(group_name=name, user_name=user))
            db.add(HubChange(action="create", group_name=name, actor=actor, created_at=now))
            db.flush()
            return settings

    def group(self, name: str, kinds: Sequence[str] = ("group",)) -> GroupSettings | None:
        """A research group's settings (with `kinds`, a course's too: a course is a group of
        kind "course", whose own settings are course_settings)."""
        with self.begin() as db:
            settings = group_settings(db, fold(name))
            return settings if settings is not None and settings.kind in kinds else None

    def groups(self) -> list[GroupSettings]:
        with self.begin() as db:
            return list(
                db.scalars(
                    select(GroupSettings)
                    .where(GroupSettings.kind == "group")
                    .order_by(GroupSettings.name)
                )
            )

    def _require(self, db: Session, name: str, kinds: Sequence[str] = ("group",)) -> GroupSettings:
        settings = group_settings(db, fold(name))
        if settings is None or settings.kind not in kinds:
            raise UnknownWallet(_("There is no group %(name)s with a wallet", name=repr(name[:64])))
        return settings

    def set_group_admins(self, name: str, users: Sequence[str]) -> list[str]:
        """Make exactly `users` the group's admins; returns them."""
        with self.begin() as db:
            settings = self._require(db, name)
            db.execute(delete(GroupAdmin).where(GroupAdmin.group_name == settings.name))
            for user in dict.fromkeys(users):
                db.add(GroupAdmin(group_name=settings.name, user_name=user))
            return list(dict.fromkeys(users))

    def group_admins(self) -> dict[str, list[str]]:
        """{group: [admins]} of every group (the hub's roles are made from it)."""
        result: dict[str, list[str]] = {}
        with self.begin() as db:
            for settings in db.scalars(
                select(GroupSettings)
                .where(GroupSettings.kind == "group")
                .order_by(GroupSettings.name)
            ):
                result[settings.name] = []
            rows = db.execute(
                select(GroupAdmin.group_name, GroupAdmin.user_name).order_by(
                    GroupAdmin.group_name, GroupAdmin.user_name
                )
            )
            for group, user in rows:
                result.setdefault(group, []).append(user)
        return result

    def set_group_options(
        self,
        name: str,
        default_for_members: bool | None = None,
        webhook_url: str | None = None,
        clear_webhook: bool = False,
    ) -> GroupSettings:
        with self.begin() as db:
            settings = self._require(db, name)
            if default_for_members is not None:
                settings.default_for_members = default_for_members
            if webhook_url is not None:
                settings.webhook_url = webhook_url
            if clear_webhook:
                settings.webhook_url = None
            db.flush()
            return settings

    def default_group_wallets(self, groups: Iterable[str]) -> list[str]:
        """Of `groups` (a user's), those whose members pay from the group by default."""
        names = sorted({fold(g) for g in groups})
        if not names:
            return []
        with self.begin() as db:
            return list(
                db.scalars(
                    select(GroupSettings.name)
                    .where(
                        GroupSettings.name.in_(names),
                        GroupSettings.kind == "group",
                        GroupSettings.default_for_members.is_(True),
                    )
                    .order_by(GroupSettings.name)
                )
            )

    def known_groups(self, groups: Iterable[str]) -> list[str]:
        """Of `groups` (a user's JupyterHub groups), those with a wallet, lower case."""
        names = sorted({fold(g) for g in groups})
        if not names:
            return []
        with self.begin() as db:
            return list(
                db.scalars(
                    select(GroupSettings.name)
                    .where(GroupSettings.name.in_(names), GroupSettings.kind == "group")
                    .order_by(GroupSettings.name)
                )
            )

    # ------------------------------------------------------------------ caps

    def set_cap(
        self, name: str, user: str, amount_micros: int | None, period: str, actor: str
    ) -> MemberCap | None:
        """Set (or with None remove) what `user` may spend from the group per `period`."""
        if period not in CAP_PERIODS:
            raise LedgerError(
                _(
                    "a cap period is one of %(periods)s, not %(period)s",
                    periods=", ".join(CAP_PERIODS),
                    period=repr(period),
                )
            )
        if amount_micros is not None and amount_micros < 0:
            raise LedgerError(_("a cap cannot be negative"))
        with self.begin() as db:
            settings = self._require(db, name)
            wallet_id = _wallet_id(db, settings.name)
            existing = db.scalars(
                select(MemberCap).where(
                    MemberCap.wallet_id == wallet_id, MemberCap.user_name == user
                )
            ).first()
            if amount_micros is None:
                if existing is not None:
                    db.delete(existing)
                return None
            if existing is None:
                existing = MemberCap(wallet_id=wallet_id, user_name=user)
                db.add(existing)
            existing.amount_micros = amount_micros
            existing.period = period
            existing.set_by = actor
            existing.set_at = self.clock()
            db.flush()
            return existing

    def cap_states(self, wallet_ids: Iterable[int], now: int | None = None) -> list[CapState]:
        """Every cap on these wallets with what its member spent in its period (the meter):
        one query for the caps and one per kind of period, however many members."""
        now = self.clock() if now is None else now
        ids = list(wallet_ids)
        if not ids:
            return []
        with self.begin() as db:
            caps = db.execute(
                select(
                    MemberCap.wallet_id,
                    MemberCap.user_name,
                    MemberCap.amount_micros,
                    MemberCap.period,
                ).where(MemberCap.wallet_id.in_(ids))
            ).all()
            spent: dict[tuple[str, int, str], int] = {}
            for period in {cap.period for cap in caps}:
                rows = db.execute(
                    select(Entry.wallet_id, MeteredSession.user_name, func.sum(Entry.amount_micros))
                    .join(MeteredSession, MeteredSession.id == Entry.session_id)
                    .where(
                        Entry.wallet_id.in_({c.wallet_id for c in caps if c.period == period}),
                        Entry.kind.in_(("charge", "refund")),
                        Entry.created_at >= period_start(period, now),
                    )
                    .group_by(Entry.wallet_id, MeteredSession.user_name)
                )
                for wallet_id, user, total in rows:
                    spent[(period, wallet_id, user)] = -int(total or 0)
            return [
                CapState(
                    cap.wallet_id,
                    cap.user_name,
                    cap.amount_micros,
                    cap.period,
                    spent.get((cap.period, cap.wallet_id, cap.user_name), 0),
                )
                for cap in caps
            ]

    def alert_facts(self, wallet_ids: Iterable[int], now: int | None = None) -> list[AlertFacts]:
        """What budget alerts need of these group wallets, in four queries (the meter)."""
        now = self.clock() if now is None else now
        ids = list(wallet_ids)
        if not ids:
            return []
        with self.begin() as db:
            wallets = db.execute(
                select(Wallet.id, Wallet.owner_name, Wallet.balance_micros).where(
                    Wallet.id.in_(ids), Wallet.owner_kind == "group"
                )
            ).all()
            names = [name for _id, name, _b in wallets]
            settings = {
                g.name: g
                for g in db.scalars(select(GroupSettings).where(GroupSettings.name.in_(names)))
            }
            admins: dict[str, list[str]] = {}
            for group, user in db.execute(
                select(GroupAdmin.group_name, GroupAdmin.user_name)
                .where(GroupAdmin.group_name.in_(names))
                .order_by(GroupAdmin.user_name)
            ):
                admins.setdefault(group, []).append(user)
            burns = dict(
                db.execute(
                    select(Entry.wallet_id, func.sum(Entry.amount_micros))
                    .where(
                        Entry.wallet_id.in_(ids),
                        Entry.kind.in_(("charge", "refund")),
                        Entry.created_at >= now - RUNWAY_DAYS * DAY,
                    )
                    .group_by(Entry.wallet_id)
                ).all()
            )
            credits = dict(
                db.execute(
                    select(Entry.wallet_id, func.max(Entry.id))
                    .where(Entry.wallet_id.in_(ids), Entry.amount_micros > 0)
                    .group_by(Entry.wallet_id)
                ).all()
            )
            return [
                AlertFacts(
                    wallet_id=wid,
                    name=name,
                    balance_micros=balance,
                    burn_micros=-int(burns.get(wid) or 0),
                    admins=admins.get(name, []),
                    webhook_url=settings[name].webhook_url if name in settings else None,
                    last_credit_entry=int(credits.get(wid) or 0),
                )
                for wid, name, balance in wallets
            ]

    # ------------------------------------------------------------------ what is shown

    def member_allowance(self, name: str, user: str, now: int | None = None) -> MemberSpend:
        """What `user` may still spend from group `name`: their spend in the cap's period
        and the cap (the month and no cap when none is set). The group's balance is apart."""
        now = self.clock() if now is None else now
        with self.begin() as db:
            settings = self._require(db, name)
            wallet_id = _wallet_id(db, settings.name)
            cap = db.scalars(
                select(MemberCap).where(
                    MemberCap.wallet_id == wallet_id, MemberCap.user_name == user
                )
            ).first()
            period = cap.period if cap is not None else "month"
            return MemberSpend(
                user,
                member_spent(db, wallet_id, user, period_start(period, now)),
                period,
                None if cap is None else cap.amount_micros,
            )

    def group_view(self, name: str, members: Iterable[str], now: int | None = None) -> GroupView:
        """The group's wallet, each member's spend and cap (members are the hub's, plus
        anyone with a cap or a running server on the wallet), and what runs on it now."""
        now = self.clock() if now is None else now
        with self.begin() as db:
            settings = self._require(db, name)
            wallet = db.scalars(
                select(Wallet).where(
                    Wallet.owner_kind == "group", Wallet.owner_name == settings.name
                )
            ).one()
            caps = {
                cap.user_name: cap
                for cap in db.scalars(select(MemberCap).where(MemberCap.wallet_id == wallet.id))
            }
            running = list(
                db.scalars(
                    select(MeteredSession)
                    .where(
                        MeteredSession.wallet_id == wallet.id,
                        MeteredSession.stopped_at.is_(None),
                    )
                    .order_by(MeteredSession.id)
                )
            )
            costs = _session_costs(db, [s.id for s in running])
            spends = []
            for user in sorted({*members, *caps, *(s.user_name for s in running)}):
                cap = caps.get(user)
                period = cap.period if cap is not None else "month"
                spends.append(
                    MemberSpend(
                        user,
                        member_spent(db, wallet.id, user, period_start(period, now)),
                        period,
                        None if cap is None else cap.amount_micros,
                    )
                )
            burn = db.scalar(
                select(func.coalesce(func.sum(Entry.amount_micros), 0)).where(
                    Entry.wallet_id == wallet.id,
                    Entry.kind.in_(("charge", "refund")),
                    Entry.created_at >= now - RUNWAY_DAYS * DAY,
                )
            )
            admins = list(
                db.scalars(
                    select(GroupAdmin.user_name)
                    .where(GroupAdmin.group_name == settings.name)
                    .order_by(GroupAdmin.user_name)
                )
            )
            return GroupView(
                name=settings.name,
                wallet_id=wallet.id,
                balance_micros=wallet.balance_micros,
                default_for_members=settings.default_for_members,
                webhook_url=settings.webhook_url,
                admins=admins,
                members=spends,
                running=[(s, costs.get(s.id, 0)) for s in running],
                burn_micros=-int(burn or 0),
            )

    def group_sessions(
        self, name: str, since: int | None = None, until: int | None = None, limit: int = 10_000
    ) -> list[tuple[MeteredSession, int]]:
        """Sessions the group's wallet paid for (started in [since, until)), newest first,
        with what each cost it: the statement."""
        with self.begin() as db:
            settings = self._require(db, name, kinds=("group", "course"))
            S = MeteredSession
            query = select(S).where(
                S.wallet_id.in_(_paying_wallets(db, settings)), S.ready_at.is_not(None)
            )
            if since is not None:
                query = query.where(S.started_at >= since)
            if until is not None:
                query = query.where(S.started_at < until)
            sessions = list(db.scalars(query.order_by(S.id.desc()).limit(limit)))
            costs = _session_costs(db, [s.id for s in sessions])
            return [(s, costs.get(s.id, 0)) for s in sessions]

    def group_daily_costs(self, name: str, now: int, days: int) -> list[dict]:
        """Net charges to the group of the last `days` days, per UTC day and member."""
        first = (now // DAY - days + 1) * DAY
        totals: dict[tuple[int, str], int] = {}
        with self.begin() as db:
            settings = self._require(db, name)
            wallet_id = _wallet_id(db, settings.name)
            rows = db.execute(
                select(Entry.created_at, Entry.amount_micros, MeteredSession.user_name)
                .join(MeteredSession, MeteredSession.id == Entry.session_id)
                .where(
                    Entry.wallet_id == wallet_id,
                    Entry.kind.in_(("charge", "refund")),
                    Entry.created_at >= first,
                )
            ).all()
        for created, amount, user in rows:
            key = ((created - first) // DAY, user)
            totals[key] = totals.get(key, 0) - amount
        return [
            {"day": day, "member": user, "micros": micros}
            for (day, user), micros in sorted(totals.items())
            if micros > 0
        ]

    def last_credit_entry(self, wallet_id: int) -> int:
        """The id of the wallet's latest entry that added credit (0: none): budget alerts
        are re-armed by a top-up."""
        with self.begin() as db:
            return int(
                db.scalar(
                    select(func.coalesce(func.max(Entry.id), 0)).where(
                        Entry.wallet_id == wallet_id, Entry.amount_micros > 0
                    )
                )
                or 0
            )

    # ------------------------------------------------------------------ the hub's changes

    def queue_hub_change(self, action: str, group: str, user: str | None, actor: str) -> int:
        if action not in HUB_CHANGE_ACTIONS:
            raise LedgerError(f"unknown hub change {action!r}")
        with self.begin() as db:
            settings = self._require(db, group)
            change = HubChange(
                action=action,
                group_name=settings.name,
                user_name=user,
                actor=actor,
                created_at=self.clock(),
                outcome="",
            )
            db.add(change)
            db.flush()
            return change.id

    def pending_hub_changes(self) -> list[HubChange]:
        with self.begin() as db:
            return list(
                db.scalars(
                    select(HubChange)
                    .where(HubChange.applied_at.is_(None))
                    .order_by(HubChange.id)
                    .limit(HUB_CHANGES_BATCH)
                )
            )

    def hub_change_applied(self, change_id: int, outcome: str = "") -> None:
        with self.begin() as db:
            db.execute(
                update(HubChange)
                .where(HubChange.id == change_id, HubChange.applied_at.is_(None))
                .values(applied_at=self.clock(), outcome=outcome[:500])
            )

    def hub_change(self, change_id: int) -> HubChange | None:
        with self.begin() as db:
            return db.get(HubChange, change_id)


def _wallet_id(db: Session, group: str) -> int:
    wallet_id = db.scalar(
        select(Wallet.id).where(Wallet.owner_kind == "group", Wallet.owner_name == group)
    )
    assert wallet_id is not None  # made with the group's settings, in one transaction
    return wallet_id


def _paying_wallets(db: Session, settings: GroupSettings):
    """What pays for a group's sessions: its wallet; for a course, its students' allowances."""
    if settings.kind == "course":
        return select(Wallet.id).where(
            Wallet.owner_kind == "allowance",
            Wallet.owner_name.startswith(f"{settings.name}/", autoescape=True),
        )
    return [_wallet_id(db, settings.name)]


def _session_costs(db: Session, ids: list[int]) -> dict[int, int]:
    costs: dict[int, int] = {}
    if not ids:
        return costs
    for session_id, amount in db.execute(
        select(Entry.session_id, Entry.amount_micros).where(Entry.session_id.in_(ids))
    ):
        assert session_id is not None  # selected by session id
        costs[session_id] = costs.get(session_id, 0) - amount
    return costs


def runway_phrase(seconds: int | None) -> str:
    """ "≈ 12 days left", "≈ 5 h left", "more than a year left", or "" when nothing is
    being spent (in the language of the moment)."""
    if seconds is None:
        return ""
    if seconds >= 365 * DAY:
        return _("more than a year left")
    if seconds >= 2 * DAY:
        return _("≈ %(days)s days left", days=seconds // DAY)
    return _("≈ %(hours)s h left", hours=max(1, seconds // SECONDS_PER_HOUR))


def cap_period_name(period: str) -> str:
    """ "week", "month", "total": a cap's period as a person reads it."""
    return _(CAP_PERIOD_NAMES[period]) if period in CAP_PERIOD_NAMES else period
