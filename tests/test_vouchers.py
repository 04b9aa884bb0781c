"""Vouchers in the ledger: a code credits one wallet once (also when redeemed at the same
moment, on SQLite and PostgreSQL), expiry and withdrawal, the rate limit on codes that do not
work, only hashes kept, and an audit that stays clean and catches a broken voucher."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, text

from meterhub.billing_hooks import topup_actions
from meterhub.billing_hooks.actions import ActionError
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.money import MICROS, to_micros
from meterhub.billing_hooks.orm import Entry, RedeemFailure, Voucher
from meterhub.billing_hooks.vouchers import (
    ALPHABET,
    MalformedCode,
    RedeemLimited,
    RedeemLimits,
    VoucherRefused,
    code_hash,
    new_code,
    normalize,
)

from .billing_support import make_ledger as make_memory_ledger


@pytest.fixture
def make_ledger(ledger_url):
    """A factory of ledgers on a fresh database: SQLite, then PostgreSQL."""
    engines = []

    def make(**kwargs):
        engines.append(connect(ledger_url))
        return make_memory_ledger(engine=engines[-1], **kwargs)

    yield make
    for engine in engines:
        engine.dispose()


def one_voucher(ledger, amount="50.00", **kwargs) -> str:
    (made,) = ledger.create_vouchers(to_micros(amount), 1, "cli:op", **kwargs)
    return made.code


def test_codes_are_random_readable_and_typed_loosely():
    codes = {new_code() for _i in range(200)}
    assert len(codes) == 200
    for code in codes:
        groups = code.split("-")
        assert [len(g) for g in groups] == [5, 5, 5, 5]
        assert set("".join(groups)) <= set(ALPHABET)
    code = "7KQ2M-X9D4R-0BN3S-W8TZE"
    # lower case, no dashes, spaces, O for 0 and I/L for 1 all read as the same code
    for typed in ("7kq2mx9d4r0bn3sw8tze", " 7KQ2M X9D4R OBN3S W8TZE ", "7KQ2M-X9D4R-0BN3S-W8TZE"):
        assert normalize(typed) == "7KQ2MX9D4R0BN3SW8TZE"
    assert normalize("1111L-IIIII-00000-OOOOO") == "11111111110000000000"
    for bad in (
        "",
        "7KQ2M-X9D4R-0BN3S",
        "7KQ2M-X9D4R-0BN3S-W8TZU",
        "７KQ2MX9D4R0BN3SW8TZE",
        7,
        None,
    ):
        with pytest.raises(MalformedCode):
            normalize(bad)
    assert code_hash(code) == code_hash(code.lower().replace("-", ""))


def test_a_voucher_credits_once_and_only_its_hash_is_kept(make_ledger):
    ledger, clock = make_ledger()
    made = ledger.create_vouchers(to_micros("50.00"), 3, "cli:op", note="course ML101")
    assert len({m.code for m in made}) == 3 and len({m.voucher.batch for m in made}) == 1
    code = made[0].code
    first = ledger.redeem_voucher("amy", code.lower(), "amy")
    assert not first.replayed
    entry = first.value
    assert (entry.kind, entry.amount_micros, entry.actor) == ("topup", 50 * MICROS, "amy")
    assert entry.key == f"voucher:{made[0].voucher.id}"
    assert entry.note.endswith(": course ML101") and code[-4:] in entry.note
    assert ledger.balance("amy") == 60 * MICROS  # the trial, and the voucher
    # a retry by the same user is the same entry; nobody else can use it again
    again = ledger.redeem_voucher("amy", code, "amy")
    assert again.replayed and again.value.id == entry.id
    with pytest.raises(VoucherRefused, match="already redeemed") as refused:
        ledger.redeem_voucher("ben", code, "ben")
    assert refused.value.status == 409
    assert ledger.balance("amy") == 60 * MICROS and ledger.balance("ben") is None
    # the database holds no code, in any spelling
    with ledger.begin() as db:
        dump = " ".join(
            str(v)
            for table in ("vouchers", "entries")
            for row in db.execute(text(f"SELECT * FROM {table}"))
            for v in row
        )
    for m in made:
        assert m.code not in dump and normalize(m.code) not in dump
    listed = {v.id: v for v in ledger.vouchers()}
    assert listed[made[0].voucher.id].redeemed_by == "amy"
    assert [v.id for v in ledger.vouchers(state="used")] == [made[0].voucher.id]
    assert len(ledger.vouchers(state="unused")) == 2
    assert ledger.audit() == []


def test_unknown_expired_and_withdrawn_codes_give_nothing(make_ledger):
    ledger, clock = make_ledger()
    expiring = one_voucher(ledger, expires_at=clock.now + 60)
    withdrawn = one_voucher(ledger)
    with pytest.raises(VoucherRefused, match="No voucher has this code") as unknown:
        ledger.redeem_voucher("amy", new_code(), "amy")
    assert unknown.value.status == 404
    clock.advance(60)  # expiry is exclusive: at that second it is over
    with pytest.raises(VoucherRefused, match="expired on") as expired:
        ledger.redeem_voucher("amy", expiring, "amy")
    assert expired.value.status == 410
    (voucher,) = [v for v in ledger.vouchers() if v.hint == normalize(withdrawn)[-4:]]
    revoked, kept = ledger.revoke_vouchers("cli:op", ids=[voucher.id])
    assert [v.id for v in revoked] == [voucher.id] and kept == []
    with pytest.raises(VoucherRefused, match="revoked"):
        ledger.redeem_voucher("amy", withdrawn, "amy")
    # nothing was written but the failures the rate limit counts
    assert ledger.balance("amy") is None
    with ledger.begin() as db:
        assert db.scalars(select(Entry).where(Entry.kind == "topup")).all() == []
        assert len(db.scalars(select(RedeemFailure)).all()) == 3
    assert len(ledger.vouchers(state="expired")) == 1
    assert len(ledger.vouchers(state="revoked")) == 1
    assert ledger.audit() == []


def test_a_used_voucher_cannot_be_withdrawn(make_ledger):
    ledger, _clock = make_ledger()
    code = one_voucher(ledger)
    ledger.redeem_voucher("amy", code, "amy")
    (voucher,) = ledger.vouchers()
    revoked, kept = ledger.revoke_vouchers("cli:op", ids=[voucher.id])
    assert revoked == [] and [v.id for v in kept] == [voucher.id]
    assert ledger.vouchers(state="used")[0].revoked_at is None
    assert ledger.audit() == []


def test_failed_codes_are_rate_limited_per_user_and_for_the_site(make_ledger):
    ledger, clock = make_ledger()
    good = one_voucher(ledger)
    limits = RedeemLimits(per_user=3, overall=5, window_seconds=600)
    for _i in range(3):
        with pytest.raises(VoucherRefused):
            ledger.redeem_voucher("eve", new_code(), "eve", limits)
        clock.advance(10)
    # the fourth is refused before the code is looked at, even a good one
    with pytest.raises(RedeemLimited) as limited:
        ledger.redeem_voucher("eve", good, "eve", limits)
    assert limited.value.retry_after == 600 - 30  # when the first failure leaves the window
    assert ledger.balance("eve") is None
    # a malformed text is refused without counting (and without a lookup)
    with pytest.raises(MalformedCode):
        ledger.redeem_voucher("eve", "nonsense", "eve", limits)
    # others are not limited by eve; two more failures reach the site's limit
    for name in ("mal", "mal"):
        with pytest.raises(VoucherRefused):
            ledger.redeem_voucher(name, new_code(), name, limits)
    with pytest.raises(RedeemLimited, match="on this site"):
        ledger.redeem_voucher("amy", good, "amy", limits)
    clock.advance(600 - 30)  # eve's first failure leaves the window: the site is under
    posted = ledger.redeem_voucher("amy", good, "amy", limits)
    assert posted.value.amount_micros == 50 * MICROS
    with pytest.raises(VoucherRefused):  # each failure clears what left the window
        ledger.redeem_voucher("mal", new_code(), "mal", limits)
    with ledger.begin() as db:
        assert all(f.created_at > clock.now - 600 for f in db.scalars(select(RedeemFailure)))
    assert ledger.audit() == []


@pytest.mark.parametrize("same_user", [False, True])
def test_two_redemptions_of_one_code_at_once_credit_once(make_ledger, same_user):
    ledger, _clock = make_ledger()
    code = one_voucher(ledger, "25.00")
    for name in ("amy", "ben"):
        ledger.ensure_user(name)
    users = ("amy", "amy") if same_user else ("amy", "ben")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def redeem(i, user):
        # a ledger of its own per thread, on the same database: two processes' worth
        mine, _c = make_ledger()
        barrier.wait()
        try:
            results[i] = mine.redeem_voucher(user, code, user)
        except VoucherRefused as e:
            results[i] = e

    threads = [threading.Thread(target=redeem, args=(i, u)) for i, u in enumerate(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    outcomes = sorted(
        type(r).__name__ + (":replayed" if getattr(r, "replayed", False) else "")
        for r in results.values()
    )
    if same_user:
        assert outcomes == ["Posted", "Posted:replayed"], results
    else:
        assert outcomes == ["Posted", "VoucherRefused"], results
        (refused,) = [r for r in results.values() if isinstance(r, VoucherRefused)]
        assert refused.status == 409
    with ledger.begin() as db:
        entries = db.scalars(select(Entry).where(Entry.kind == "topup")).all()
    assert len(entries) == 1
    assert sum(ledger.balance(n) for n in ("amy", "ben")) == 20 * MICROS + 25 * MICROS
    assert ledger.audit() == []


def test_failed_codes_sent_at_once_are_counted_against_the_limit_one_after_another(make_ledger):
    """Parallel guesses must not all pass the check before any failure is written: on
    PostgreSQL (READ COMMITTED) each transaction counted the failures committed before it
    began, so N requests at once got N guesses past a limit of 2."""
    per_user, parallel = 2, 6
    limits = RedeemLimits(per_user=per_user, overall=100, window_seconds=600)
    checked = threading.Barrier(parallel, timeout=3)

    def wait_for_the_others(point: str) -> None:
        # hold every redemption between the limit check and its write, as a busy server
        # would; once one waits alone (the others are held off) go on
        if point == "redeem-limits-checked":
            try:
                checked.wait()
            except threading.BrokenBarrierError:
                pass

    ledger, _clock = make_ledger()
    results: list[object] = []

    def guess():
        mine, _c = make_ledger(fault=wait_for_the_others)
        try:
            mine.redeem_voucher("eve", new_code(), "eve", limits)
        except (VoucherRefused, RedeemLimited) as e:
            results.append(type(e).__name__)

    threads = [threading.Thread(target=guess) for _i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert (
        sorted(results) == ["RedeemLimited"] * (parallel - per_user) + ["VoucherRefused"] * per_user
    ), results
    with ledger.begin() as db:
        failures = db.scalars(select(RedeemFailure).where(RedeemFailure.user_name == "eve"))
        assert len(failures.all()) == per_user


def test_the_audit_catches_a_voucher_without_its_entry_and_an_entry_without_its_voucher(
    make_ledger,
):
    ledger, clock = make_ledger()
    ledger.redeem_voucher("amy", one_voucher(ledger), "amy")
    one_voucher(ledger)
    with ledger.begin() as db:
        used, unused = sorted(db.scalars(select(Voucher)), key=lambda v: v.redeemed_at is None)
        # the used one forgets it was redeemed; the unused one says it was, with no entry
        db.execute(
            text(
                "UPDATE vouchers SET redeemed_at = NULL, redeemed_by = NULL, entry_id = NULL"
                " WHERE id = :i"
            ),
            {"i": used.id},
        )
        db.execute(
            text("UPDATE vouchers SET redeemed_at = :t, redeemed_by = 'ben' WHERE id = :i"),
            {"t": clock.now, "i": unused.id},
        )
    problems = ledger.audit()
    assert any(f"voucher {used.id} " in p and "never redeemed" in p for p in problems), problems
    assert any(f"voucher {unused.id} " in p and "without its entry" in p for p in problems)


def test_creating_vouchers_refuses_bad_input_and_writes_nothing(make_ledger):
    ledger, clock = make_ledger()
    max_grant = to_micros("100000") // MICROS
    for amount, count, expires, why in (
        ("0", 1, None, "positive"),
        ("1.001", 1, None, "two"),
        ("100000", 1, None, "below"),
        ("5", 0, None, "--count"),
        ("5", 1001, None, "--count"),
        ("5", "x", None, "--count"),
        ("5", 1, "2020-01-01", "not in the future"),
        ("5", 1, "tomorrow", "--expires"),
        ("5", 1, "2030-01-01T10:00", "--expires"),
    ):
        with pytest.raises(ActionError, match=why) as e:
            topup_actions.create_vouchers(ledger, amount, count, expires, "", max_grant, "cli:op")
        assert e.value.status == 400
    assert ledger.vouchers() == []
    made = topup_actions.create_vouchers(ledger, "5", "2", "2030-01-31", "", max_grant, "cli:op")
    # valid through the day it names, in UTC
    assert {m.voucher.expires_at for m in made} == {1896048000 + 86400}
