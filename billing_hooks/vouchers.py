"""Vouchers: codes a user redeems once for credit, kept only as hashes, and their rate limit.

A code is 20 characters of Crockford's base32 (100 random bits) shown in groups of five,
`7KQ2M-X9D4R-…`; people may type it in either case, with or without the dashes, with O for
0 and I or L for 1. The ledger keeps its SHA-256 and its last four characters (to tell
vouchers apart in a list), never the code. Redeeming claims the voucher with a conditional
UPDATE and writes its one entry (kind `topup`, key `voucher:ID`, UNIQUE) in the same
transaction: a code credits one wallet once, however many redeem it at the same moment.

Failed redemptions (unknown, used, expired or revoked codes) are rows in
`redeem_failures`, counted per user and for the whole site over a window: in the ledger
database, so the hub's Wallet page and the billing API share one count that a restart does
not reset.
"""

from __future__ import annotations

import datetime
import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import delete, func, or_, select, text, update

from meterhub.i18n import _

from .money import format_money
from .orm import Entry, RedeemFailure, Voucher, Wallet
from .postings import LedgerError, LedgerPart, Posted, request_digest

if TYPE_CHECKING:
    from sqlalchemy.engine import CursorResult
    from sqlalchemy.orm import Session


#: Crockford's base32: no I, L, O or U (nothing to misread)
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CODE_LENGTH = 20
GROUP = 5
HINT_LENGTH = 4
#: what people may type for what they meant (Crockford's decoding)
_READ_AS = str.maketrans({"O": "0", "I": "1", "L": "1"})
#: the most vouchers one command makes
MAX_VOUCHERS = 1000
#: the most a list shows
MAX_LIST = 10_000
KEY_PREFIX = "voucher:"
STATES = ("unused", "used", "expired", "revoked")


class VoucherRefused(LedgerError):
    """A code that does not redeem; `status` is the HTTP status the API answers."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class RedeemLimited(LedgerError):
    """Too many failed codes in the window; try again after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class UnknownVoucher(LedgerError):
    """A voucher id or batch the ledger does not have."""


class MalformedCode(ValueError):
    """Text that is not a voucher code at all (nothing was looked up)."""


@dataclass(frozen=True)
class RedeemLimits:
    """Failed redemptions allowed in `window_seconds`: per user, and for the whole site."""

    per_user: int = 10
    overall: int = 500
    window_seconds: int = 900


DEFAULT_LIMITS = RedeemLimits()


class NewVoucher(NamedTuple):
    voucher: Voucher
    #: the code, shown once: the ledger keeps only its hash
    code: str


def new_code() -> str:
    """A fresh code, 100 random bits, in readable groups: `7KQ2M-X9D4R-0BN3S-W8TZE`."""
    raw = "".join(secrets.choice(ALPHABET) for _i in range(CODE_LENGTH))
    return "-".join(raw[i : i + GROUP] for i in range(0, CODE_LENGTH, GROUP))


def normalize(text: object) -> str:
    """The code as the ledger hashes it (20 characters, upper case, no dashes or spaces);
    MalformedCode for anything that cannot be one."""
    if not isinstance(text, str) or len(text) > 64:
        raise MalformedCode(text)
    raw = "".join(text.split()).replace("-", "").upper().translate(_READ_AS)
    if len(raw) != CODE_LENGTH or any(ch not in ALPHABET for ch in raw):
        raise MalformedCode(text)
    return raw


def code_hash(code: str) -> str:
    """What the ledger keeps of a code: SHA-256 of its normalized form. With 100 random
    bits per code a stolen hash cannot be turned back into one, so no secret key is
    needed (and the hub and the billing service need not share one)."""
    return hashlib.sha256(f"meterhub-voucher:{normalize(code)}".encode()).hexdigest()


def hint_of(code: str) -> str:
    return normalize(code)[-HINT_LENGTH:]


def state_of(voucher: Voucher, now: int) -> str:
    if voucher.redeemed_at is not None:
        return "used"
    if voucher.revoked_at is not None:
        return "revoked"
    if voucher.expires_at is not None and voucher.expires_at <= now:
        return "expired"
    return "unused"


def _moment(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


class Vouchers(LedgerPart):
    def create_vouchers(
        self,
        amount_micros: int,
        count: int,
        actor: str,
        expires_at: int | None = None,
        note: str = "",
    ) -> list[NewVoucher]:
        """Make `count` vouchers of `amount_micros` each, in one transaction (one batch);
        the codes are returned here and nowhere else."""
        if amount_micros <= 0:
            raise LedgerError(_("a voucher's amount must be positive"))
        if not 1 <= count <= MAX_VOUCHERS:
            raise LedgerError(
                _(
                    "make 1 to %(most)s vouchers at a time, not %(count)s",
                    most=MAX_VOUCHERS,
                    count=count,
                )
            )
        now = self.clock()
        if expires_at is not None and expires_at <= now:
            raise LedgerError(_("a voucher must expire in the future"))
        batch = uuid.uuid4().hex[:12]
        made = []
        with self.begin() as db:
            for _i in range(count):
                code = new_code()
                voucher = Voucher(
                    code_hash=code_hash(code),
                    hint=hint_of(code),
                    amount_micros=amount_micros,
                    batch=batch,
                    note=note,
                    created_by=actor,
                    created_at=now,
                    expires_at=expires_at,
                )
                db.add(voucher)
                made.append(NewVoucher(voucher, code))
            db.flush()
        return made

    def redeem_voucher(
        self, user: str, code: str, actor: str, limits: RedeemLimits = DEFAULT_LIMITS
    ) -> Posted:
        """Credit `user`'s wallet with the voucher `code` names: Posted(entry), replayed when
        this user redeemed it before (a retry). VoucherRefused for a code that is unknown,
        used by someone else, revoked or expired (each counts against the limits);
        RedeemLimited, before the code is looked at, once the limits are reached;
        MalformedCode for text that is no code (not counted, nothing looked up)."""
        digest_of = code_hash(code)  # MalformedCode before anything else
        now = self.clock()
        with self.begin() as db:
            if db.get_bind().dialect.name == "postgresql":
                # one redemption at a time, as SQLite's BEGIN IMMEDIATE has it: otherwise
                # requests sent at once each count only the failures committed before them,
                # and N parallel guesses all pass a limit below N
                db.execute(text("SELECT pg_advisory_xact_lock(hashtext('meterhub-redeem'))"))
            self._check_limits(db, user, now, limits)
            self.fault("redeem-limits-checked")
            refusal = None
            for _attempt in range(2):  # a claim lost to a concurrent one is looked at again
                voucher = db.scalars(
                    select(Voucher)
                    .where(Voucher.code_hash == digest_of)
                    .execution_options(populate_existing=True)
                ).first()
                if voucher is not None and voucher.redeemed_by == user:
                    entry = db.get(Entry, voucher.entry_id)
                    assert entry is not None  # claimed and entered in one transaction
                    return Posted(entry, True)
                refusal = self._refusal(voucher, now)
                if refusal is not None:
                    break
                assert voucher is not None
                if self._claim(db, voucher, user, now):
                    return Posted(self._enter(db, voucher, user, actor), False)
            if refusal is None:  # lost twice: the row changes under us; nothing was written
                raise VoucherRefused(_("This voucher is being redeemed right now."), 409)
            db.add(RedeemFailure(user_name=user, created_at=now))
            db.execute(
                delete(RedeemFailure).where(RedeemFailure.created_at <= now - limits.window_seconds)
            )
        raise refusal

    def _claim(self, db: Session, voucher: Voucher, user: str, now: int) -> bool:
        """Mark the voucher redeemed by `user`, only if it still may be: the database, not
        what this transaction read, decides between two redemptions at the same moment."""
        result = cast(
            "CursorResult[Any]",
            db.execute(
                update(Voucher)
                .where(
                    Voucher.id == voucher.id,
                    Voucher.redeemed_at.is_(None),
                    Voucher.revoked_at.is_(None),
                    or_(Voucher.expires_at.is_(None), Voucher.expires_at > now),
                )
                .values(redeemed_at=now, redeemed_by=user)
            ),
        )
        return result.rowcount == 1

    def _enter(self, db: Session, voucher: Voucher, user: str, actor: str) -> Entry:
        """The claimed voucher's one entry (key `voucher:ID`), in the claim's transaction."""
        self.fault("voucher-claimed")
        wallet = self._ensure_wallet(db, user)
        entry = self._post(
            db,
            wallet,
            "topup",
            voucher.amount_micros,
            f"{KEY_PREFIX}{voucher.id}",
            actor,
            note=_voucher_note(voucher),
            request_digest=request_digest("voucher", user=user, voucher=voucher.id),
        )
        db.execute(update(Voucher).where(Voucher.id == voucher.id).values(entry_id=entry.id))
        return entry

    def _refusal(self, voucher: Voucher | None, now: int) -> VoucherRefused | None:
        if voucher is None:
            return VoucherRefused(
                _("No voucher has this code. Check it letter by letter and try again."), 404
            )
        if voucher.redeemed_at is not None:
            return VoucherRefused(
                _(
                    "This voucher was already redeemed, on %(when)s.",
                    when=_moment(voucher.redeemed_at),
                ),
                409,
            )
        if voucher.revoked_at is not None:
            return VoucherRefused(_("This voucher was revoked and no longer gives credit."), 410)
        if voucher.expires_at is not None and voucher.expires_at <= now:
            return VoucherRefused(
                _("This voucher expired on %(when)s.", when=_moment(voucher.expires_at)), 410
            )
        return None

    def _check_limits(self, db: Session, user: str, now: int, limits: RedeemLimits) -> None:
        """RedeemLimited when the user, or the whole site, failed too often in the window."""
        since = now - limits.window_seconds
        for mine, most in ((True, limits.per_user), (False, limits.overall)):
            query = select(RedeemFailure.created_at).where(RedeemFailure.created_at > since)
            if mine:
                query = query.where(RedeemFailure.user_name == user)
            failed = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            if failed < most:
                continue
            # the oldest failures leave the window first: below the limit once this one has
            leaving = db.scalars(
                query.order_by(RedeemFailure.created_at).offset(failed - most).limit(1)
            ).one()
            retry_after = max(1, leaving + limits.window_seconds - now)
            minutes = -(-retry_after // 60)
            if mine:
                message = _(
                    "Too many voucher codes that did not work: try again in %(minutes)s"
                    " min. Check the code letter by letter.",
                    minutes=minutes,
                )
            else:
                message = _(
                    "Too many voucher codes that did not work on this site just now: try"
                    " again in %(minutes)s min.",
                    minutes=minutes,
                )
            raise RedeemLimited(message, retry_after)

    def revoke_vouchers(
        self, actor: str, ids: list[int] | None = None, batch: str | None = None
    ) -> tuple[list[Voucher], list[Voucher]]:
        """Revoke unused vouchers (by id, or a whole batch): (revoked now, left as they
        were: used or revoked before). A used voucher stays used; its credit was given
        (take it back with `meterhub credit adjust`)."""
        now = self.clock()
        with self.begin() as db:
            query = select(Voucher)
            if batch is not None:
                query = query.where(Voucher.batch == batch)
            if ids is not None:
                query = query.where(Voucher.id.in_(ids))
            found = list(db.scalars(query.order_by(Voucher.id).with_for_update()))
            missing = sorted(set(ids or ()) - {v.id for v in found})
            if missing or not found:
                # nothing is revoked when one of the ids is wrong: the operator looks again
                raise UnknownVoucher(
                    _("no voucher %(ids)s", ids=", ".join(map(str, missing)))
                    if missing
                    else _("no voucher in batch %(batch)s", batch=batch)
                )
            revoked, kept = [], []
            for voucher in found:
                if voucher.redeemed_at is None and voucher.revoked_at is None:
                    voucher.revoked_at, voucher.revoked_by = now, actor
                    revoked.append(voucher)
                else:
                    kept.append(voucher)
            db.flush()
            return revoked, kept

    def vouchers(
        self, state: str | None = None, batch: str | None = None, limit: int = MAX_LIST
    ) -> list[Voucher]:
        """Vouchers, newest first; `state` one of STATES (as of now), `batch` one batch."""
        now = self.clock()
        with self.begin() as db:
            query = select(Voucher).order_by(Voucher.id.desc())
            if batch is not None:
                query = query.where(Voucher.batch == batch)
            if state == "used":
                query = query.where(Voucher.redeemed_at.is_not(None))
            elif state == "revoked":
                query = query.where(Voucher.redeemed_at.is_(None), Voucher.revoked_at.is_not(None))
            elif state == "expired":
                query = query.where(
                    Voucher.redeemed_at.is_(None),
                    Voucher.revoked_at.is_(None),
                    Voucher.expires_at <= now,
                )
            elif state == "unused":
                query = query.where(
                    Voucher.redeemed_at.is_(None),
                    Voucher.revoked_at.is_(None),
                    or_(Voucher.expires_at.is_(None), Voucher.expires_at > now),
                )
            return list(db.scalars(query.limit(limit)))


def _voucher_note(voucher: Voucher) -> str:
    note = f"voucher #{voucher.id} …{voucher.hint}"
    return f"{note}: {voucher.note}" if voucher.note else note


def voucher_problems(db: Session, currency: str = "CNY") -> list[str]:
    """The audit's checks of vouchers: each redeemed voucher has exactly its one entry
    (kind topup, its amount, on its redeemer's wallet), no other has one, and none was
    redeemed after it expired or was revoked."""
    problems = []
    entries = {e.key: e for e in db.scalars(select(Entry).where(Entry.key.like(f"{KEY_PREFIX}%")))}
    wallets = {w.id: w for w in db.scalars(select(Wallet).where(Wallet.owner_kind == "user"))}
    for voucher in db.scalars(select(Voucher).order_by(Voucher.id)):
        where = f"voucher {voucher.id} (…{voucher.hint})"
        entry = entries.pop(f"{KEY_PREFIX}{voucher.id}", None)
        if voucher.redeemed_at is None:
            if entry is not None or voucher.entry_id is not None:
                problems.append(f"{where}: has an entry but was never redeemed")
            continue
        if entry is None or voucher.entry_id != entry.id:
            problems.append(f"{where}: redeemed by {voucher.redeemed_by} without its entry")
            continue
        wallet = wallets.get(entry.wallet_id)
        if wallet is None or wallet.owner_name != voucher.redeemed_by:
            problems.append(
                f"{where}: its entry {entry.id} is not on {voucher.redeemed_by}'s wallet"
            )
        if entry.kind != "topup" or entry.amount_micros != voucher.amount_micros:
            problems.append(
                f"{where}: entry {entry.id} moved {format_money(entry.amount_micros, currency)}"
                f" as {entry.kind}, the voucher is worth"
                f" {format_money(voucher.amount_micros, currency)}"
            )
        if voucher.expires_at is not None and voucher.redeemed_at >= voucher.expires_at:
            problems.append(f"{where}: redeemed after it expired")
        if voucher.revoked_at is not None and voucher.revoked_at <= voucher.redeemed_at:
            problems.append(f"{where}: redeemed after it was revoked")
    for key, entry in entries.items():
        problems.append(f"entry {entry.id} ({key}) names no redeemed voucher")
    for entry in db.scalars(select(Entry).where(Entry.kind == "topup")):
        if entry.amount_micros <= 0:
            problems.append(f"top-up entry {entry.id} is not positive")
        if not entry.key.startswith((KEY_PREFIX, "topup:")):
            problems.append(f"top-up entry {entry.id} has the key {entry.key!r}")
    return problems
