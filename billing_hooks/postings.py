"""Postings: every write that moves credit or changes a session, each in one transaction.

Every movement of credit is an entry with a deterministic key under a UNIQUE constraint,
written in the same transaction as the wallet's cached balance (and, for a charge, the
session's metered-through time, advanced only from the value read under the lock). So a
retry, a duplicate tick, a second meter or a crash between statements can neither lose nor
double a charge. Every entry names its actor. All methods are blocking: the hub and the
meter call them off their event loops.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import bindparam, func, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from meterhub.i18n import DEFAULT as DEFAULT_LANGUAGE
from meterhub.i18n import _, in_every_language

from .clock import utcnow
from .db import Direct, direct_transaction
from .money import MICROS, accrued, format_duration, format_money, seconds_covered, window_charge
from .orm import (
    Entry,
    GroupSettings,
    MemberCap,
    MeteredSession,
    Notification,
    Pass,
    Price,
    Reconciliation,
    Wallet,
)
from .wallets import WalletRef, as_ref, pass_period_name, period_phrase, period_start

if TYPE_CHECKING:
    from sqlalchemy.engine import CursorResult

#: who wrote an entry when no person or token did
SYSTEM = "system"
METER = "meter"
HUB = "hub"


class LedgerError(Exception):
    """A ledger operation that cannot be done; the message is for people."""


class InsufficientCredit(LedgerError):
    pass


class CapReached(InsufficientCredit):
    """A member's cap on a group wallet does not cover the spawn."""


class UnknownWallet(LedgerError):
    """A group wallet that does not exist (no such meterhub group)."""


class KeyConflict(LedgerError):
    """The same idempotency key was used for a different movement: refused, nothing written."""


class ConcurrentUpdate(LedgerError):
    """Another writer advanced the same session first; the transaction was rolled back."""


class NoCapacity(LedgerError):
    """A pass that the GPUs cannot honour beside the passes already sold."""


def covered_until(passes, now: int) -> int | None:
    """Until when passes (start, end) cover a session starting now without a gap; None
    if none covers now."""
    end = None
    for start, stop in sorted(passes):
        if start <= (now if end is None else end) and stop > (now if end is None else end):
            end = stop
    return end


def session_runway(
    covered_until: int | None,
    now: int,
    available_micros: int,
    rate_micros_per_hour: int,
    max_cost_micros: int | None,
    max_seconds: int | None,
) -> int | None:
    """The longest a session can run paid (a backend's time limit: a job the hub loses
    sight of cannot run free): its pass's time, then the credit at its rate, within its
    own caps. An upper bound: the wallet's other sessions spend the same credit."""
    passed = max(0, covered_until - now) if covered_until is not None else 0
    limits = []
    credit = seconds_covered(available_micros, rate_micros_per_hour)
    if credit is not None:
        limits.append(passed + credit)
    if max_cost_micros is not None:
        paid = seconds_covered(max_cost_micros, rate_micros_per_hour)
        if paid is not None:
            limits.append(passed + paid)
    if max_seconds is not None:
        limits.append(max_seconds)
    return min(limits) if limits else None


@dataclass(frozen=True)
class Authorization:
    session_id: int
    balance_micros: int
    rate_micros_per_hour: int
    #: the longest the session can run paid: a pass covering it, then the wallet's credit
    #: (with the overdraft) at its rate, within the session's own caps; None: no limit
    runway_seconds: int | None = None


class Posted(NamedTuple):
    """What a keyed write did: the entry (or pass), and whether it was a replay of the key."""

    value: object
    replayed: bool


def request_digest(operation: str, **fields) -> str:
    """What a keyed request asked for: a replay must ask for the same, else it is a 409."""
    return hashlib.sha256(json.dumps([operation, fields], sort_keys=True).encode()).hexdigest()


def _no_fault(point: str) -> None:
    pass


#: the users whose own wallet this process has seen made, by ledger database: wallets are
#: never deleted, so a spawn skips the transaction that would make one (`open_session`
#: still makes it in its own, should it be missing)
_WALLETS_MADE: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()

# The statements of a spawn's path (open_session, mark_ready), built once with bound
# parameters: building a statement from its columns' operators cost about as much as
# running it (a burst of 200 spawns, bench/spawn_burst.py; bench/ledger_spawn.py)
_WALLET = (
    select(Wallet)
    .where(Wallet.owner_kind == bindparam("kind"), Wallet.owner_name == bindparam("name"))
    .execution_options(populate_existing=True)
)
_WALLET_LOCKED = _WALLET.with_for_update()
_BALANCE = select(Wallet.id, Wallet.balance_micros)
_WALLET_BALANCE_LOCKED = Direct(
    _BALANCE.where(
        Wallet.owner_kind == bindparam("kind"), Wallet.owner_name == bindparam("name")
    ).with_for_update()
)
#: a wallet's balance again, under the lock this transaction holds on it
_WALLET_BALANCE = Direct(_BALANCE.where(Wallet.id == bindparam("wallet")))
#: a wallet's passes that have not ended at `now`: those valid now and those to come
_PASSES_NOT_ENDED = Direct(
    select(Pass.profile, Pass.gpus, Pass.starts_at, Pass.ends_at).where(
        Pass.wallet_id == bindparam("wallet"), Pass.ends_at > bindparam("now")
    )
)
_OPEN_ON_WALLET = Direct(
    select(
        MeteredSession.user_name,
        MeteredSession.profile,
        MeteredSession.gpus,
        MeteredSession.rate_micros_per_hour,
    ).where(MeteredSession.wallet_id == bindparam("wallet"), MeteredSession.stopped_at.is_(None))
)
_OPEN_OF_SERVER = Direct(
    select(MeteredSession.id).where(
        MeteredSession.user_name == bindparam("user"),
        MeteredSession.server_name == bindparam("server"),
        MeteredSession.stopped_at.is_(None),
    )
)
#: the columns a new session is given (every one, so that no column's default is needed)
_NEW_SESSION_COLUMNS = (
    "wallet_id",
    "user_name",
    "server_name",
    "profile",
    "gpus",
    "rate_micros_per_hour",
    "started_at",
    "max_cost_micros",
    "max_seconds",
    "environment",
)
_NEW_SESSION = Direct(
    insert(MeteredSession).values({name: bindparam(name) for name in _NEW_SESSION_COLUMNS}),
    returning=MeteredSession.id,
)
_MARK_READY = Direct(
    update(MeteredSession)
    .where(
        MeteredSession.id == bindparam("session"),
        MeteredSession.ready_at.is_(None),
        MeteredSession.stopped_at.is_(None),  # too late: it already stopped
    )
    .values(
        ready_at=bindparam("at"), metered_through=bindparam("at"), last_seen_running=bindparam("at")
    )
)


class Postings:
    if TYPE_CHECKING:
        # Courses provides it; Ledger puts them together
        def _course_payer(self, db: Session, name: str, user: str, now: int) -> Wallet: ...

    def __init__(
        self,
        engine: Engine,
        currency: str = "CNY",
        trial_credit_micros: int = 10 * MICROS,
        overdraft_micros: int = 0,
        clock: Callable[[], int] = utcnow,
        fault: Callable[[str], None] = _no_fault,
    ):
        self.engine = engine
        self.currency = currency
        self.trial_credit_micros = trial_credit_micros
        self.overdraft_micros = overdraft_micros
        self.clock = clock
        #: called between the statements of a transaction; tests inject crashes here
        self.fault = fault
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def begin(self) -> Iterator[Session]:
        with self._sessions.begin() as db:
            yield db

    # ------------------------------------------------------------------ wallets

    def _wallet(self, db: Session, owner: str | WalletRef, lock: bool = False) -> Wallet | None:
        """The wallet of `owner`: a user name, `user:NAME` or `group:NAME`."""
        ref = as_ref(owner)
        query = _WALLET_LOCKED if lock else _WALLET
        return db.scalars(query, {"kind": ref.kind, "name": ref.name}).first()

    def _ensure_wallet(self, db: Session, owner: str | WalletRef) -> Wallet:
        """The wallet, locked; a user's is created with the trial credit exactly once, a
        group's exists from the group's creation (UnknownWallet otherwise)."""
        ref = as_ref(owner)
        wallet = self._wallet(db, ref, lock=True)
        if wallet is None:
            if ref.kind != "user":
                raise UnknownWallet(no_wallet_message(ref))
            user = ref.name
            wallet = self._new_wallet(db, ref)
            self.fault("wallet-created")
            if self.trial_credit_micros:
                self._post(
                    db,
                    wallet,
                    "trial",
                    self.trial_credit_micros,
                    f"trial:user:{user}",
                    SYSTEM,
                    note="trial credit",
                )
        return wallet

    def _new_wallet(self, db: Session, ref: WalletRef) -> Wallet:
        """An empty wallet for `ref`, in the caller's transaction (the one constructor of
        users', groups', courses' and allowances' wallets)."""
        wallet = Wallet(
            owner_kind=ref.kind,
            owner_name=ref.name,
            currency=self.currency,
            balance_micros=0,
            created_at=self.clock(),
        )
        db.add(wallet)
        db.flush()
        return wallet

    def ensure_user(self, user: str) -> int:
        """The user's wallet, created with the trial credit exactly once; returns the balance."""
        try:
            with self.begin() as db:
                balance = self._ensure_wallet(db, user).balance_micros
        except IntegrityError:
            # a concurrent first transaction made it (with the trial, once): read it
            with self.begin() as db:
                balance = self._ensure_wallet(db, user).balance_micros
        _WALLETS_MADE.setdefault(self.engine, set()).add(user)
        return balance

    def _replay(self, db: Session, key: str, digest: str) -> Entry | None:
        """The entry an idempotency key already wrote, if the request was the same; a key
        reused for another request is refused (409), before anything else is looked at."""
        existing = db.scalars(select(Entry).where(Entry.key == key)).first()
        if existing is not None and existing.request_digest != digest:
            raise KeyConflict(_("That idempotency key was already used for a different request"))
        return existing

    def _post(
        self,
        db: Session,
        wallet: Wallet,
        kind: str,
        amount: int,
        key: str,
        actor: str,
        note: str = "",
        **fields,
    ) -> Entry:
        """Append an entry and move the cached balance, in the caller's transaction."""
        existing = db.scalars(select(Entry).where(Entry.key == key)).first()
        if existing is not None:
            if existing.amount_micros != amount or existing.wallet_id != wallet.id:
                raise KeyConflict(
                    f"key {key!r} already moved {existing.amount_micros} on wallet"
                    f" {existing.wallet_id}; refusing {amount} on wallet {wallet.id}"
                )
            return existing
        db.execute(
            update(Wallet)
            .where(Wallet.id == wallet.id)
            .values(balance_micros=Wallet.balance_micros + amount)
        )
        self.fault("balance-updated")
        balance = db.scalar(select(Wallet.balance_micros).where(Wallet.id == wallet.id))
        assert balance is not None  # the row the UPDATE above just moved
        entry = Entry(
            wallet_id=wallet.id,
            kind=kind,
            amount_micros=amount,
            balance_after_micros=balance,
            key=key,
            note=note,
            actor=actor,
            created_at=self.clock(),
            **fields,
        )
        db.add(entry)
        db.flush()
        self.fault("entry-written")
        wallet.balance_micros = balance
        return entry

    def _keyed_post(
        self,
        user: str,
        kind: str,
        amount: int,
        key: str,
        actor: str,
        digest: str,
        note: str = "",
        **fields,
    ) -> Posted:
        with self.begin() as db:
            existing = self._replay(db, key, digest)
            if existing is not None:
                return Posted(existing, True)
            wallet = self._ensure_wallet(db, user)
            entry = self._post(
                db, wallet, kind, amount, key, actor, note=note, request_digest=digest, **fields
            )
            return Posted(entry, False)

    def grant(
        self,
        user: str,
        amount_micros: int,
        key: str,
        note: str = "",
        actor: str = SYSTEM,
    ) -> Posted:
        """Credit from nothing (an admin's grant): positive."""
        if amount_micros <= 0:
            raise LedgerError(_("a grant must be positive"))
        digest = request_digest("grant", user=user, amount=amount_micros, note=note)
        return self._keyed_post(user, "grant", amount_micros, key, actor, digest, note)

    def adjust(self, user: str, amount_micros: int, key: str, reason: str, actor: str) -> Posted:
        """A signed correction with its reason: how a mistake in the ledger is fixed."""
        if amount_micros == 0:
            raise LedgerError(_("an adjustment must not be zero"))
        if not reason.strip():
            raise LedgerError(_("an adjustment needs a reason"))
        digest = request_digest("adjustment", user=user, amount=amount_micros, reason=reason)
        return self._keyed_post(user, "adjustment", amount_micros, key, actor, digest, reason)

    def refund(
        self,
        session_id: int,
        amount_micros: int | None,
        key: str,
        reason: str,
        actor: str,
    ) -> Posted:
        """Give back (part of) what a session was charged: never more than was charged and
        not yet refunded. `None` refunds all of that."""
        if not reason.strip():
            raise LedgerError(_("a refund needs a reason"))
        if amount_micros is not None and amount_micros <= 0:
            raise LedgerError(_("a refund must be positive"))
        digest = request_digest("refund", session=session_id, amount=amount_micros, reason=reason)
        with self.begin() as db:
            existing = self._replay(db, key, digest)
            if existing is not None:
                return Posted(existing, True)
            session = self._lock_session(db, session_id)
            if session is None:
                raise LedgerError(_("no session %(id)s", id=session_id))
            moved = dict(
                db.execute(
                    select(Entry.kind, func.sum(Entry.amount_micros))
                    .where(Entry.session_id == session_id, Entry.kind.in_(("charge", "refund")))
                    .group_by(Entry.kind)
                ).all()
            )
            refundable = -int(moved.get("charge") or 0) - int(moved.get("refund") or 0)
            amount = refundable if amount_micros is None else amount_micros
            if refundable <= 0:
                raise LedgerError(_("session %(id)s has nothing left to refund", id=session_id))
            if amount > refundable:
                raise LedgerError(
                    _(
                        "session %(id)s can be refunded at most %(amount)s",
                        id=session_id,
                        amount=format_money(refundable, self.currency),
                    )
                )
            wallet = db.get(Wallet, session.wallet_id, populate_existing=True)
            assert wallet is not None  # a session's wallet_id is a foreign key
            entry = self._post(
                db,
                wallet,
                "refund",
                amount,
                key,
                actor,
                note=reason,
                session_id=session_id,
                request_digest=digest,
            )
            return Posted(entry, False)

    # ------------------------------------------------------------------ sessions

    def open_session(
        self,
        user: str,
        server_name: str,
        profile: str,
        gpus: int,
        rate_micros_per_hour: int,
        min_seconds: int,
        label: str = "",
        wallet: str | WalletRef | None = None,
        max_cost_micros: int | None = None,
        max_seconds: int | None = None,
        environment: str | None = None,
    ) -> Authorization:
        """Authorize a spawn and open its session, or refuse with what to do.

        `wallet` pays (default: the user's own); the hub has checked that the user may pay
        from it (a group's member). The wallet must cover `min_seconds` at this rate on top
        of the same minimum for the other open sessions it pays for, so concurrent spawns
        (two of one user, or many members of one group) cannot together overspend. From a
        group wallet the member's cap, if any, must cover the same, on top of what they
        spent in the cap's period and their other sessions on it.

        `max_cost_micros` and `max_seconds` are the user's own caps on this session (the
        spawn page's "stop after"): it is never charged past either. `environment` is
        what it runs (recorded for its usage rows; it does not change the price).
        """
        now = self.clock()
        payer = as_ref(user if wallet is None else wallet)
        # the user's own wallet (and trial) exists, made in a transaction of its own: two
        # first spawns at once may race to make it; and from a group, this one then locks
        # one wallet only (two would deadlock against the meter's batch)
        if user not in _WALLETS_MADE.get(self.engine, ()):
            self.ensure_user(user)
        with self.begin() as db:
            connection = db.connection()
            # the wallet, locked: its id and balance, read without the ORM where it exists
            account: Any = None
            if not payer.is_course:
                account = _WALLET_BALANCE_LOCKED.first(
                    connection, {"kind": payer.kind, "name": payer.name}
                )
            if account is None:
                if payer.is_course:
                    account = self._course_payer(db, payer.name, user, now)
                else:
                    account = self._ensure_wallet(db, payer)
            # a session left open for this server (the hub died mid-spawn) cannot be running
            left_open = _OPEN_OF_SERVER.rows(connection, {"user": user, "server": server_name})
            for (stale_id,) in left_open:
                stale = db.get_one(MeteredSession, stale_id)
                charged = self._close(db, stale, stale.last_seen_running or stale.started_at, HUB)
                db.flush()  # the reads below go to the database: they see only what is flushed
                if charged is not None and charged.wallet_id == account.id:
                    # its last window was charged to this wallet: the balance read above is
                    # stale (an ORM wallet was moved by the charge; a Core row is not)
                    account = _WALLET_BALANCE.first(connection, {"wallet": account.id})
                    assert account is not None  # locked by this transaction: still there
            # the passes not ended: those valid now, and those that cover this one later on
            passes = _PASSES_NOT_ENDED.rows(connection, {"wallet": account.id, "now": now})
            valid = [p for p in passes if p.starts_at <= now]
            open_sessions = [
                other
                for other in _OPEN_ON_WALLET.rows(connection, {"wallet": account.id})
                # a server a valid pass pays for needs no credit
                if not any(p.profile == other.profile and p.gpus >= other.gpus for p in valid)
            ]
            open_rates = [other.rate_micros_per_hour for other in open_sessions]
            # of the valid passes (no second query): one for this choice past the minimum
            covered_now = any(
                p.profile == profile and p.gpus >= gpus and p.ends_at > now + min_seconds
                for p in valid
            )
            new_rate = 0 if covered_now else rate_micros_per_hour
            needed = sum(accrued(rate, min_seconds) for rate in [*open_rates, new_rate])
            available = account.balance_micros + self.overdraft_micros
            minutes = min_seconds // 60
            # with no minimum minutes, an empty wallet still starts nothing it would pay for
            if available < needed or (new_rate and available <= 0):
                raise InsufficientCredit(
                    not_enough_credit(
                        payer,
                        with_running=bool(open_rates),
                        balance=format_money(account.balance_micros, self.currency),
                        label=label or profile,
                        rate=format_money(rate_micros_per_hour, self.currency),
                        minutes=minutes,
                        needed=format_money(needed, self.currency),
                    )
                )
            if payer.is_group:
                cap = db.scalars(
                    select(MemberCap).where(
                        MemberCap.wallet_id == account.id, MemberCap.user_name == user
                    )
                ).first()
                if cap is not None:
                    spent = member_spent(db, account.id, user, period_start(cap.period, now))
                    mine = sum(
                        accrued(o.rate_micros_per_hour, min_seconds)
                        for o in open_sessions
                        if o.user_name == user
                    )
                    left = cap.amount_micros - spent
                    if left < mine + accrued(new_rate, min_seconds) or (new_rate and left <= 0):
                        values = {
                            "group": payer.name,
                            "period": period_phrase(cap.period),
                            "cap": format_money(cap.amount_micros, self.currency),
                            "left": format_money(max(0, left), self.currency),
                            "label": label or profile,
                            "minutes": minutes,
                            "needed": format_money(
                                mine + accrued(new_rate, min_seconds), self.currency
                            ),
                        }
                        if mine:
                            message = _(
                                "Your %(group)s cap %(period)s is %(cap)s and %(left)s of it is"
                                " left; %(label)s needs at least %(minutes)s minutes (%(needed)s"
                                " with your running servers). Ask the group's admin to raise your"
                                " cap, or pay from your own wallet.",
                                **values,
                            )
                        else:
                            message = _(
                                "Your %(group)s cap %(period)s is %(cap)s and %(left)s of it is"
                                " left; %(label)s needs at least %(minutes)s minutes"
                                " (%(needed)s). Ask the group's admin to raise your cap, or pay"
                                " from your own wallet.",
                                **values,
                            )
                        raise CapReached(message)
            session_id = _NEW_SESSION.inserted(
                connection,
                {
                    "wallet_id": account.id,
                    "user_name": user,
                    "server_name": server_name,
                    "profile": profile,
                    "gpus": gpus,
                    "rate_micros_per_hour": rate_micros_per_hour,
                    "started_at": now,
                    "max_cost_micros": max_cost_micros,
                    "max_seconds": max_seconds,
                    "environment": environment,
                },
            )
            covering = [p for p in passes if p.profile == profile and p.gpus >= gpus]
            runway = session_runway(
                covered_until=covered_until(((p.starts_at, p.ends_at) for p in covering), now),
                now=now,
                available_micros=available,
                rate_micros_per_hour=rate_micros_per_hour,
                max_cost_micros=max_cost_micros,
                max_seconds=max_seconds,
            )
            return Authorization(session_id, account.balance_micros, rate_micros_per_hour, runway)

    def mark_ready(self, session_id: int, at: int | None = None) -> None:
        """Charging starts here. Idempotent: the first ready time wins."""
        at = self.clock() if at is None else at
        with direct_transaction(self.engine, write=True) as connection:  # one statement
            _MARK_READY.count(connection, {"session": session_id, "at": at})

    def charge(self, session_id: int, until: int, actor: str = METER) -> Entry | None:
        """Charge [metered_through, until) of a session; None when there is nothing to charge."""
        with self.begin() as db:
            session = self._lock_session(db, session_id)
            if session is None:
                return None
            return self._charge(db, session, until, actor)

    def _lock_session(self, db: Session, session_id: int) -> MeteredSession | None:
        """Lock a session's wallet, then the session: every writer locks in this order."""
        wallet_id = db.scalar(
            select(MeteredSession.wallet_id).where(MeteredSession.id == session_id)
        )
        if wallet_id is None:
            return None
        db.execute(select(Wallet.id).where(Wallet.id == wallet_id).with_for_update())
        return db.get(MeteredSession, session_id, with_for_update=True, populate_existing=True)

    def _charge(self, db: Session, session: MeteredSession, until: int, actor: str) -> Entry | None:
        if session.ready_at is None:
            return None
        self.fault("session-read")
        end = until if session.stopped_at is None else min(until, session.stopped_at)
        start = session.metered_through
        assert start is not None  # set together with ready_at
        covered = covering_passes(db, session)
        end = capped_end(session, start, end, covered)
        if end <= start:
            return None
        amount = window_amount(
            session.rate_micros_per_hour,
            session.ready_at,
            start,
            end,
            covered,
        )
        moved = cast(
            "CursorResult[Any]",
            db.execute(
                update(MeteredSession)
                .where(MeteredSession.id == session.id, MeteredSession.metered_through == start)
                .values(metered_through=end)
                .execution_options(synchronize_session=False)
            ),
        )
        if moved.rowcount != 1:
            raise ConcurrentUpdate(f"session {session.id} was metered by someone else")
        session.metered_through = end
        self.fault("metered-through-advanced")
        wallet = db.get(Wallet, session.wallet_id, populate_existing=True)
        assert wallet is not None  # a session's wallet_id is a foreign key
        return self._post(
            db,
            wallet,
            "charge",
            amount,
            f"charge:{session.id}:{start}-{end}",
            actor,
            session_id=session.id,
            window_start=start,
            window_end=end,
        )

    def close_session(
        self, session_id: int, at: int | None = None, actor: str = METER
    ) -> Entry | None:
        """Stop the clock at `at` and charge the last window, in one transaction.

        A failed spawn that never got ready costs nothing.
        """
        at = self.clock() if at is None else at
        with self.begin() as db:
            session = self._lock_session(db, session_id)
            if session is None or session.stopped_at is not None:
                return None
            return self._close(db, session, at, actor)

    def close_server(
        self,
        user: str,
        server_name: str,
        at: int | None = None,
        actor: str = HUB,
        at_last_seen: bool = False,
    ) -> list[int]:
        """Close every open session of one server (the hub's post-stop hook); with
        `at_last_seen`, each when the meter last saw it running (a server found dead after
        a reboot), as the meter closes a vanished one."""
        at = self.clock() if at is None else at
        with self.begin() as db:
            ids = list(db.scalars(_OPEN_OF_SERVER.statement, {"user": user, "server": server_name}))
            closed = []
            for session_id in ids:
                session = self._lock_session(db, session_id)
                if session is not None and session.stopped_at is None:
                    end = (session.last_seen_running or session.started_at) if at_last_seen else at
                    self._close(db, session, end, actor)
                    closed.append(session_id)
            return closed

    def _close(self, db: Session, session: MeteredSession, at: int, actor: str) -> Entry | None:
        if session.ready_at is not None:
            assert session.metered_through is not None  # set together with ready_at
            at = max(at, session.metered_through)
        session.stopped_at = at
        db.flush()
        return self._charge(db, session, at, actor)

    # ------------------------------------------------------------------ passes

    def buy_pass(
        self,
        user: str,
        profile: str,
        gpus: int,
        period: str,
        price_micros: int,
        duration_seconds: int,
        key: str,
        label: str = "",
        actor: str = SYSTEM,
        capacity: int | None = None,
    ) -> Posted:
        """Buy a pass from the wallet; it starts now, or when the same pass already held ends.

        Refused without funds (the overdraft does not pay for passes), and when `capacity`
        (the GPUs of this type the site has) cannot hold it beside every other pass valid in
        the same time. Returns Posted(pass, replayed).
        """
        now = self.clock()
        digest = request_digest("pass", user=user, profile=profile, gpus=gpus, period=period)
        with self.begin() as db:
            existing = self._replay(db, key, digest)
            if existing is not None:
                return Posted(db.scalars(select(Pass).where(Pass.entry_key == key)).one(), True)
            if db.get_bind().dialect.name == "postgresql":
                # one pass sale at a time: the capacity check reads every wallet's passes
                db.execute(text("SELECT pg_advisory_xact_lock(hashtext('meterhub-passes'))"))
            wallet = self._ensure_wallet(db, user)
            latest_end = db.scalar(
                select(func.max(Pass.ends_at)).where(
                    Pass.wallet_id == wallet.id,
                    Pass.profile == profile,
                    Pass.gpus == gpus,
                    Pass.ends_at > now,
                )
            )
            starts = latest_end or now
            ends = starts + duration_seconds
            if capacity == 0:
                raise NoCapacity(
                    _("This site sells no passes for %(label)s.", label=label or profile)
                )
            if capacity is not None:
                peak = _peak_reserved(db, profile, starts, ends)
                if peak + gpus > capacity:
                    free = max(0, capacity - peak)
                    raise NoCapacity(
                        _(
                            "A %(period)s pass for %(label)s cannot be sold: this site has"
                            " %(capacity)s such GPU(s) and passes already reserve %(peak)s of"
                            " them in that time (%(free)s left).",
                            period=pass_period_name(period),
                            label=label or profile,
                            capacity=capacity,
                            peak=peak,
                            free=free,
                        )
                    )
            if wallet.balance_micros < price_micros:
                raise InsufficientCredit(
                    _(
                        "Your balance is %(balance)s; a %(period)s pass for %(label)s costs"
                        " %(price)s. Top up first.",
                        balance=format_money(wallet.balance_micros, self.currency),
                        period=pass_period_name(period),
                        label=label or profile,
                        price=format_money(price_micros, self.currency),
                    )
                )
            self._post(
                db,
                wallet,
                "pass",
                -price_micros,
                key,
                actor,
                note=f"{period} pass {label or profile}",
                request_digest=digest,
            )
            bought = Pass(
                wallet_id=wallet.id,
                profile=profile,
                gpus=gpus,
                period=period,
                price_micros=price_micros,
                starts_at=starts,
                ends_at=ends,
                entry_key=key,
            )
            db.add(bought)
            db.flush()
            return Posted(bought, False)

    # ------------------------------------------------------------------ prices

    def set_price(
        self,
        profile: str,
        micros_per_hour: int,
        actor: str = "unknown",
        effective_from: int | None = None,
    ) -> Price:
        """An admin's price for new sessions of a profile, from `effective_from` (now when
        None). Adds a row to the price history; running sessions keep their captured rate."""
        if micros_per_hour < 0:
            raise LedgerError(
                _("A price cannot be negative: %(micros)s micros per hour", micros=micros_per_hour)
            )
        now = self.clock()
        with self.begin() as db:
            price = Price(
                profile=profile,
                micros_per_hour=micros_per_hour,
                effective_from=now if effective_from is None else effective_from,
                set_by=actor,
                created_at=now,
            )
            db.add(price)
            db.flush()
            return price

    # ------------------------------------------------------------------ notifications

    def notify(self, user: str, key: str, kind: str, message: str | Callable[[], str]) -> bool:
        """Keep a message for the user, once per key; True if it is new. A `message` that
        is a function composing it (with meterhub.i18n's `_`) is kept in every language."""
        with self.begin() as db:
            if db.scalars(select(Notification.id).where(Notification.key == key)).first():
                return False
            translations = None
            if callable(message):
                said = in_every_language(message)
                message = said.pop(DEFAULT_LANGUAGE)
                translations = json.dumps(said, ensure_ascii=False, sort_keys=True)
            db.add(
                Notification(
                    user_name=user,
                    key=key,
                    kind=kind,
                    message=message,
                    translations=translations,
                    created_at=self.clock(),
                )
            )
            return True

    def mark_read(self, user: str, ids: list[int]) -> int:
        """Mark some of `user`'s own notifications read (others' are left alone)."""
        if not ids:
            return 0
        with self.begin() as db:
            result = cast(
                "CursorResult[Any]",
                db.execute(
                    update(Notification)
                    .where(
                        Notification.user_name == user,
                        Notification.id.in_(ids),
                        Notification.read_at.is_(None),
                    )
                    .values(read_at=self.clock())
                ),
            )
            return result.rowcount

    # ------------------------------------------------------------------ reconciliation

    def reconciled(
        self, kind: str, user: str, server_name: str, session_id: int | None, detail: str
    ) -> None:
        """Record what the meter corrected against the hub's view, for the audit."""
        with self.begin() as db:
            db.add(
                Reconciliation(
                    kind=kind,
                    user_name=user,
                    server_name=server_name,
                    session_id=session_id,
                    detail=detail,
                    created_at=self.clock(),
                )
            )


def uncovered(start: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) outside every covered interval."""
    pieces = [(start, end)]
    for cover_start, cover_end in covered:
        next_pieces = []
        for a, b in pieces:
            if cover_end <= a or cover_start >= b:
                next_pieces.append((a, b))
                continue
            if a < cover_start:
                next_pieces.append((a, cover_start))
            if cover_end < b:
                next_pieces.append((cover_end, b))
        pieces = next_pieces
    return pieces


def window_amount(
    rate_micros_per_hour: int, ready_at: int, start: int, end: int, covered: list[tuple[int, int]]
) -> int:
    """The (negative) charge for [start, end) of a session, passes' time excluded."""
    return -sum(
        window_charge(rate_micros_per_hour, ready_at, a, b)
        for a, b in uncovered(start, end, covered)
    )


def session_cost(session, until: int, covered) -> int:
    """What the session's charges add up to once it is metered through `until` (positive
    micros): its windows telescope from ready, passes' time excluded, and passes never
    change once bought, so no entry need be read."""
    return -window_amount(
        session.rate_micros_per_hour, session.ready_at, session.ready_at, until, covered
    )


def capped_end(session, start: int, end: int, covered) -> int:
    """Where charging [start, end) must stop for the session's own caps: never after
    `max_seconds` from ready, never past `max_cost_micros` in all (the last whole second
    that fits: the session costs exactly its cap whenever the cap buys whole seconds)."""
    if session.max_seconds is not None:
        end = min(end, session.ready_at + session.max_seconds)
    cap = session.max_cost_micros
    if cap is None or end <= start or session_cost(session, end, covered) <= cap:
        return max(start, end)
    low, high = start, end  # cost(low) <= cap < cost(high)
    while high - low > 1:
        middle = (low + high) // 2
        if session_cost(session, middle, covered) <= cap:
            low = middle
        else:
            high = middle
    return low


def cap_left_seconds(session, spent_micros: int, now: int) -> int | None:
    """Seconds until the session's own caps stop it, at its rate (negative: past; None: no
    cap that time runs down). The time since it was last metered is spent already."""
    lefts = []
    if session.max_seconds is not None:
        lefts.append(session.ready_at + session.max_seconds - now)
    if session.max_cost_micros is not None:
        covered = seconds_covered(
            session.max_cost_micros - spent_micros, session.rate_micros_per_hour
        )
        if covered is not None:
            lefts.append(covered - (now - (session.metered_through or now)))
    return min(lefts) if lefts else None


def cap_phrase(session, currency: str, spent_micros: int | None = None) -> str:
    """ "stop after ¥12.00 (¥3.40 left) or 3 h": the caps a user set, as pages and
    notifications say them."""
    money = time = None
    if session.max_cost_micros is not None:
        money = format_money(session.max_cost_micros, currency)
        if spent_micros is not None:
            left = format_money(max(0, session.max_cost_micros - spent_micros), currency)
            money = _("%(cost)s (%(left)s left)", cost=money, left=left)
    if session.max_seconds is not None:
        time = format_duration(session.max_seconds)
    if money is not None and time is not None:
        return _("stop after %(cost)s or %(time)s", cost=money, time=time)
    return _("stop after %(limit)s", limit=money if money is not None else time)


def not_enough_credit(payer: WalletRef, with_running: bool, **values) -> str:
    """Why a spawn is refused for credit: whose money, what it costs, what to do."""
    values["name"] = payer.name
    if payer.is_group:
        if with_running:
            return _(
                "The %(name)s group's balance is %(balance)s; %(label)s costs %(rate)s/h and"
                " needs at least %(minutes)s minutes of credit (%(needed)s with its running"
                " servers). Ask the group's admin to top it up, or pay from your own wallet.",
                **values,
            )
        return _(
            "The %(name)s group's balance is %(balance)s; %(label)s costs %(rate)s/h and needs"
            " at least %(minutes)s minutes of credit (%(needed)s). Ask the group's admin to top"
            " it up, or pay from your own wallet.",
            **values,
        )
    if payer.kind == "course":
        if with_running:
            return _(
                "Your allowance from %(name)s is %(balance)s; %(label)s costs %(rate)s/h and"
                " needs at least %(minutes)s minutes of credit (%(needed)s with your running"
                " servers). Ask your instructor, or pay from your own wallet.",
                **values,
            )
        return _(
            "Your allowance from %(name)s is %(balance)s; %(label)s costs %(rate)s/h and needs"
            " at least %(minutes)s minutes of credit (%(needed)s). Ask your instructor, or pay"
            " from your own wallet.",
            **values,
        )
    if with_running:
        return _(
            "Your balance is %(balance)s; %(label)s costs %(rate)s/h and needs at least"
            " %(minutes)s minutes of credit (%(needed)s with your running servers). Top up, or"
            " choose debug mode.",
            **values,
        )
    return _(
        "Your balance is %(balance)s; %(label)s costs %(rate)s/h and needs at least"
        " %(minutes)s minutes of credit (%(needed)s). Top up, or choose debug mode.",
        **values,
    )


def no_wallet_message(ref: WalletRef) -> str:
    if ref.kind == "group":
        return _("There is no group %(name)s with a wallet", name=repr(ref.name))
    if ref.kind == "course":
        return _("There is no course %(name)s with a wallet", name=repr(ref.name))
    return _("There is no %(kind)s %(name)s with a wallet", kind=ref.kind, name=repr(ref.name))


def covering_passes(db: Session, session: MeteredSession) -> list[tuple[int, int]]:
    """Validity intervals of the wallet's passes that cover this session's profile and GPUs."""
    return [
        (p.starts_at, p.ends_at)
        for p in db.scalars(
            select(Pass).where(
                Pass.wallet_id == session.wallet_id,
                Pass.profile == session.profile,
                Pass.gpus >= session.gpus,
            )
        )
    ]


def _peak_reserved(db: Session, profile: str, starts: int, ends: int) -> int:
    """The most GPUs of a type that passes (of every wallet) reserve at once in [starts, ends)."""
    overlapping = db.execute(
        select(Pass.starts_at, Pass.ends_at, Pass.gpus).where(
            Pass.profile == profile, Pass.starts_at < ends, Pass.ends_at > starts
        )
    ).all()
    # the sum only rises where a pass starts: look there (and at the window's start)
    moments = {starts, *(s for s, _e, _g in overlapping if starts < s < ends)}
    return max(
        (sum(g for s, e, g in overlapping if s <= t < e) for t in moments),
        default=0,
    )


def member_spent(db: Session, wallet_id: int, user: str, since: int) -> int:
    """What `user`'s sessions cost `wallet_id` from `since` on (charges net of refunds, by
    when each entry was written): a member's spend against their cap."""
    total = db.scalar(
        select(func.coalesce(func.sum(Entry.amount_micros), 0))
        .join(MeteredSession, MeteredSession.id == Entry.session_id)
        .where(
            Entry.wallet_id == wallet_id,
            Entry.kind.in_(("charge", "refund")),
            Entry.created_at >= since,
            MeteredSession.user_name == user,
        )
    )
    return -int(total or 0)


def group_settings(db: Session, name: str) -> GroupSettings | None:
    return db.scalars(select(GroupSettings).where(GroupSettings.name == name)).first()


#: the base of the Ledger's parts (Vouchers, TopUps, Courses): Postings for the type checker,
#: which then knows the helpers they call (begin, _post, _wallet, ...), and nothing at run
#: time, where Ledger puts the parts and Postings together
if TYPE_CHECKING:
    LedgerPart = Postings
else:
    LedgerPart = object
