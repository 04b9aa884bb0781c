"""The meter's batch: charge a thousand running sessions in one transaction.

This is the hot path of billing. It keeps every guarantee of a single charge (locks in the
order every writer uses, deterministic window keys, balances and metered-through times in
the same transaction) while writing with a few statements per batch instead of a few per
session: see `MeterBatch.charge_running`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import Table, and_, bindparam, case, func, or_, select

from .money import window_charge
from .orm import MeteredSession, Pass, Wallet
from .postings import METER, LedgerPart, capped_end, session_cost, window_amount

if TYPE_CHECKING:
    pass


@dataclass
class WalletView:
    """What the meter needs of a wallet after a pass: whose, what is left, what pays.

    `user` is the owner's name: a user's, or for `kind` "group" the group's (each paying
    session names the member who runs it).
    """

    user: str
    balance_micros: int
    paying: list
    ended_passes: list
    kind: str = "user"
    #: (session, what it has cost after this pass) of the sessions with a user's cap ("stop
    #: after ¥X / N hours") that this wallet pays for; metered through where the cap let it
    capped: list = field(default_factory=list)
    #: every running session charged to this wallet in the pass (passes' too)
    sessions: list = field(default_factory=list)


CHARGE_COLUMNS = (
    "wallet_id",
    "amount_micros",
    "balance_after_micros",
    "key",
    "session_id",
    "window_start",
    "window_end",
    "actor",
    "created_at",
)

#: PostgreSQL: the whole batch in one statement, one array a column, in the batch's order
#: (entry ids must follow it: a wallet's latest entry carries its balance)
PG_INSERT_CHARGES = """
INSERT INTO entries (wallet_id, kind, amount_micros, balance_after_micros, key, session_id,
                     window_start, window_end, note, actor, created_at)
SELECT wallet_id, 'charge', amount_micros, balance_after_micros, key, session_id,
       window_start, window_end, '', actor, created_at
FROM unnest(%(wallet_id)s::integer[], %(amount_micros)s::bigint[],
            %(balance_after_micros)s::bigint[], %(key)s::text[], %(session_id)s::integer[],
            %(window_start)s::bigint[], %(window_end)s::bigint[], %(actor)s::text[],
            %(created_at)s::bigint[])
     WITH ORDINALITY AS batch(wallet_id, amount_micros, balance_after_micros, key, session_id,
                              window_start, window_end, actor, created_at, position)
ORDER BY position
"""
PG_SET_BALANCES = """
UPDATE wallets SET balance_micros = batch.balance_micros
FROM unnest(%(wallet_id)s::integer[], %(balance_micros)s::bigint[])
     AS batch(wallet_id, balance_micros)
WHERE wallets.id = batch.wallet_id
"""
#: SQLite: the driver's executemany is a loop in C over one prepared statement
SQLITE_INSERT_CHARGES = """
INSERT INTO entries (wallet_id, kind, amount_micros, balance_after_micros, key, session_id,
                     window_start, window_end, note, actor, created_at)
VALUES (?, 'charge', ?, ?, ?, ?, ?, ?, '', ?, ?)
"""
SQLITE_SET_BALANCES = "UPDATE wallets SET balance_micros = ? WHERE id = ?"


def _write_charges(conn, entries: list[tuple]) -> None:
    """Insert the batch's charge entries (CHARGE_COLUMNS order), in their order."""
    if conn.dialect.name == "postgresql":
        arrays = zip(CHARGE_COLUMNS, map(list, zip(*entries, strict=True)), strict=True)
        conn.exec_driver_sql(PG_INSERT_CHARGES, dict(arrays))
    else:
        conn.exec_driver_sql(SQLITE_INSERT_CHARGES, entries)


def _write_balances(conn, balances: dict[int, int]) -> None:
    """Set the cached balances of the wallets the batch charged (their rows are locked)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            PG_SET_BALANCES,
            {"wallet_id": list(balances), "balance_micros": list(balances.values())},
        )
    else:
        conn.exec_driver_sql(SQLITE_SET_BALANCES, [(b, w) for w, b in balances.items()])


class Running(NamedTuple):
    """A session the batch charged, with its ready time (now, for one the hub could not note
    ready), where the pass leaves it metered through, and its user's caps: what the idle
    and cap checks read."""

    id: int
    wallet_id: int
    user_name: str
    server_name: str
    profile: str
    gpus: int
    rate_micros_per_hour: int
    ready_at: int
    metered_through: int
    max_cost_micros: int | None
    max_seconds: int | None
    #: what it runs (a debug-mode restart keeps it where it can)
    environment: str | None = None


class MeterBatch(LedgerPart):
    def charge_running(self, session_ids: list[int], now: int) -> dict[int, WalletView]:
        """Charge many running sessions up to `now` in one transaction (the meter's pass).

        Locks the wallets, then the sessions (the order every writer uses), charges each
        session's window with its passes' time excluded, notes it ready if the hub could
        not, and writes all entries, session times and balances together. Returns, per
        wallet, the balance and the sessions it pays for now (a valid pass pays for others).

        This is the meter's hot path: it selects by the id range of the batch (no long IN
        lists; open sessions in the range that were not asked for are locked, not charged),
        and writes with one statement a table: every session advanced to `now`, the charges
        inserted (PostgreSQL: one INSERT … SELECT FROM unnest of arrays; SQLite: the
        driver's executemany), and every charged wallet's balance, computed here from the
        balance read under its lock, set (the same unnest / executemany shapes).
        """
        if not session_ids:
            return {}
        S, W, P = (cast(Table, t.__table__) for t in (MeteredSession, Wallet, Pass))
        wanted = set(session_ids)
        in_range = and_(S.c.id.between(min(wanted), max(wanted)), S.c.stopped_at.is_(None))
        with self.begin() as db:
            conn = db.connection()
            owners = select(S.c.wallet_id).where(in_range)
            columns = (
                S.c.id,
                S.c.wallet_id,
                S.c.user_name,
                S.c.server_name,
                S.c.profile,
                S.c.gpus,
                S.c.rate_micros_per_hour,
                S.c.ready_at,
                S.c.metered_through,
                S.c.max_cost_micros,
                S.c.max_seconds,
                S.c.environment,
            )
            width = len(columns)
            in_range_rows: Sequence[Any]
            if conn.dialect.name == "postgresql":
                wallets = {
                    wid: [name, balance, kind]
                    for wid, name, balance, kind in conn.execute(
                        select(W.c.id, W.c.owner_name, W.c.balance_micros, W.c.owner_kind)
                        .where(W.c.id.in_(owners))
                        .order_by(W.c.id)
                        .with_for_update()
                    )
                }
                in_range_rows = conn.execute(
                    select(*columns).where(in_range).order_by(S.c.id).with_for_update()
                ).all()
            else:
                # SQLite: BEGIN IMMEDIATE already holds the database's one write lock, so
                # sessions and wallets are read together
                in_range_rows = conn.execute(
                    select(*columns, W.c.owner_name, W.c.balance_micros, W.c.owner_kind)
                    .join_from(S, W, W.c.id == S.c.wallet_id)
                    .where(in_range)
                    .order_by(S.c.id)
                ).all()
                wallets = {row[1]: list(row[width : width + 3]) for row in in_range_rows}
            sessions = [s for s in in_range_rows if s[0] in wanted]
            #: {session id: metered through} of the sessions their users capped
            capped_through: dict[int, int] = {}
            passes: dict[int, list] = {}
            for held in conn.execute(select(P).where(P.c.wallet_id.in_(owners))):
                passes.setdefault(held.wallet_id, []).append(held)
            self.fault("session-read")
            views: dict[int, WalletView] = {}
            entries = []
            for session in sessions:
                sid, wid, user, server, profile, gpus, rate, ready_at, metered = session[:9]
                if ready_at is None:  # ready now: charging starts here
                    ready = start = now
                else:
                    ready, start = ready_at, metered
                covering = None
                if wid in passes:
                    covering = [p for p in passes[wid] if p.profile == profile and p.gpus >= gpus]
                end = max(start, now)
                wallet = wallets[wid]
                intervals = [(p.starts_at, p.ends_at) for p in covering or ()]
                running = Running(sid, wid, user, server, profile, gpus, rate, ready, end,
                                  *session[9:12])  # fmt: skip
                capped = running.max_cost_micros is not None or running.max_seconds is not None
                if capped:
                    end = capped_through[sid] = capped_end(running, start, end, intervals)
                    running = running._replace(metered_through=max(start, end))
                if end > start:
                    if covering:
                        amount = window_amount(rate, ready, start, end, intervals)
                    else:
                        amount = -window_charge(rate, ready, start, end)
                    balance = wallet[1] = wallet[1] + amount
                    key = f"charge:{sid}:{start}-{end}"
                    entries.append((wid, amount, balance, key, sid, start, end, METER, now))
                view = views.get(wid)
                if view is None:
                    view = views[wid] = WalletView(wallet[0], 0, [], [], wallet[2])
                view.sessions.append(running)
                if capped:
                    view.capped.append((running, session_cost(running, end, intervals)))
                if not covering:
                    view.paying.append(session)
                elif not any(p.starts_at <= now < p.ends_at for p in covering):
                    view.paying.append(session)
                    ended = [p for p in covering if ready < p.ends_at <= now]
                    if ended:
                        view.ended_passes.append((session, max(ended, key=lambda p: p.ends_at)))
            if sessions:
                # every session read ends at `now` (or stays where it is, if the clock went
                # back): one statement for the batch, not one per session
                charged = in_range
                if len(sessions) < len(in_range_rows):
                    charged = and_(in_range, S.c.id.in_([s.id for s in sessions]))
                if capped_through:
                    # a capped session is metered only up to its cap: one statement for
                    # them all, executed for each (the driver's executemany)
                    charged = and_(charged, S.c.id.notin_(list(capped_through)))
                    conn.execute(
                        S.update()
                        .where(S.c.id == bindparam("b_id"))
                        .values(
                            ready_at=func.coalesce(S.c.ready_at, bindparam("b_now")),
                            metered_through=bindparam("b_through"),
                            last_seen_running=bindparam("b_now"),
                        ),
                        [
                            {"b_id": sid, "b_through": through, "b_now": now}
                            for sid, through in capped_through.items()
                        ],
                    )
                conn.execute(
                    S.update()
                    .where(charged)
                    .values(
                        ready_at=func.coalesce(S.c.ready_at, now),
                        metered_through=case(
                            (or_(S.c.ready_at.is_(None), S.c.metered_through < now), now),
                            else_=S.c.metered_through,
                        ),
                        last_seen_running=now,
                    )
                )
            self.fault("metered-through-advanced")
            if entries:
                _write_charges(conn, entries)
            self.fault("entry-written")
            if entries:
                # a wallet's balance is its latest entry's balance_after (audit checks it)
                _write_balances(conn, {entry[0]: entry[2] for entry in entries})
            self.fault("balance-updated")
            for wid, view in views.items():
                view.balance_micros = wallets[wid][1]
            return views
