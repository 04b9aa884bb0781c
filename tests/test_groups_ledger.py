"""Group wallets in the ledger and the meter: groups, wallet references, spawns from a
group with and without a member's cap, cap periods, the meter's stops, warnings and the
group admins' budget alerts, and what the group page reads."""

from __future__ import annotations

import datetime

import pytest

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.ledger import CapReached, InsufficientCredit, LedgerError, UnknownWallet
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros
from meterhub.billing_hooks.wallets import WalletRef, WalletRefError, parse_wallet, period_start

from .billing_support import make_ledger

RATE = to_micros("36.00")  # a cent a second
MIN = 60
#: Monday 1 February 2027 00:00 UTC: a week and a month begin
FEB_1 = int(datetime.datetime(2027, 2, 1, tzinfo=datetime.UTC).timestamp())


class FakeHub:
    """Which servers run (all ready), when each was last active, and which the meter asked
    to stop (a stop takes effect at once)."""

    def __init__(self):
        self.servers: dict[tuple[str, str], bool] = {}
        #: {(user, server): epoch} of the servers' last activity as the hub tells it
        self.last_activity: dict[tuple[str, str], int] = {}
        self.stop_requests: list[tuple[str, str]] = []
        self.http = self  # the meter POSTs group alerts with the hub client's HTTP client
        self.posted: list[str] = []

    async def fetch(self, request):
        self.posted.append(request.url)

    async def running_servers(self):
        return dict(self.servers)

    async def user_servers(self, user):
        return {n: r for (u, n), r in self.servers.items() if u == user} or None

    async def stop_server(self, user, server_name):
        self.stop_requests.append((user, server_name))
        self.servers.pop((user, server_name), None)


def setup(start: int = FEB_1 + 10 * 86_400, **meter_kwargs):
    ledger, clock = make_ledger(clock=FakeClock(start))
    ledger.create_group("Vision", "root", admins=["pi"])
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, warn_minutes=[2], clock=clock, **meter_kwargs)
    return ledger, clock, hub, meter


def start(ledger, hub, user, server="", rate=RATE, wallet="group:vision"):
    auth = ledger.open_session(user, server, "a800", 1, rate, MIN, wallet=wallet)
    ledger.mark_ready(auth.session_id)
    hub.servers[(user, server)] = True
    return auth.session_id


# ---------------------------------------------------------------------- groups and references


def test_a_group_is_created_once_with_its_name_folded_and_bad_names_write_nothing():
    ledger, clock = make_ledger()
    made = ledger.create_group("Vision", "root", admins=["pi", "pi"])
    assert made.name == "vision" and ledger.group("VISION").name == "vision"
    assert ledger.balance("group:vision") == 0
    assert ledger.group_admins() == {"vision": ["pi"]}
    for again in ("vision", "VISION", "ViSiOn"):
        with pytest.raises(LedgerError, match="exists already"):
            ledger.create_group(again, "root")
    for bad in ("", "-vision", ".x", "vi sion", "vi/sion", "a" * 65, "vision\n"):
        with pytest.raises(LedgerError, match="invalid group name"):
            ledger.create_group(bad, "root")
    assert [g.name for g in ledger.groups()] == ["vision"]
    assert ledger.audit() == []


def test_grants_go_to_group_wallets_by_reference_and_an_unknown_group_writes_nothing():
    ledger, _ = make_ledger()
    ledger.create_group("vision", "root")
    ledger.grant("group:vision", 5 * MICROS, key="g1")
    ledger.grant("group:Vision", 2 * MICROS, key="g2")  # the name is folded
    assert ledger.grant("group:vision", 5 * MICROS, key="g1").replayed
    assert ledger.balance("group:vision") == 7 * MICROS
    assert ledger.balance("vision") is None  # a bare name is a user: nobody's wallet was made
    with pytest.raises(UnknownWallet):
        ledger.grant("group:audio", MICROS, key="g3")
    assert ledger.balance("group:audio") is None
    assert ledger.audit() == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ann", WalletRef("user", "ann")),
        ("user:ann", WalletRef("user", "ann")),
        ("group:vision", WalletRef("group", "vision")),
        ("group:Vision", WalletRef("group", "vision")),
        ("group:lab.7_b-x", WalletRef("group", "lab.7_b-x")),
        ("user:a@b.c", WalletRef("user", "a@b.c")),
    ],
)
def test_parse_wallet_reads_good_references(text, expected):
    ref = parse_wallet(text)
    assert ref == expected and str(ref) == f"{expected.kind}:{expected.name}"
    assert ref.is_group == (expected.kind == "group")


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "a wallet is"),
        (None, "a wallet is"),
        (7, "a wallet is"),
        ("x" * 81, "a wallet is"),
        ("allowance:ml/amy", "unknown wallet kind"),
        (":ann", "unknown wallet kind"),
        ("group:", "invalid group name"),
        ("group:a b", "invalid group name"),
        ("group:-x", "invalid group name"),
        ("group:a:b", "invalid group name"),
        ("user:Ann", "invalid user name"),
        ("user:", "invalid user name"),
        ("Ann", "invalid user name"),
    ],
)
def test_parse_wallet_refuses_bad_references_saying_why(text, says):
    with pytest.raises(WalletRefError, match=says):
        parse_wallet(text)


# ---------------------------------------------------------------------- spawns and caps


def test_a_spawn_from_a_group_without_a_cap_is_limited_by_the_wallet_only():
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", accrued(RATE, 2 * MIN), key="g")
    auth = ledger.open_session("ann", "", "a800", 1, RATE, MIN, wallet="group:vision")
    ledger.open_session("bo", "", "a800", 1, RATE, MIN, wallet="group:vision")
    with pytest.raises(InsufficientCredit) as refused:
        ledger.open_session("cy", "", "a800", 1, RATE, MIN, wallet="group:vision")
    assert not isinstance(refused.value, CapReached)
    assert "The vision group's balance is ¥1.20" in str(refused.value)
    assert "with its running servers" in str(refused.value)
    assert "Ask the group's admin to top it up" in str(refused.value)
    assert ledger.session(auth.session_id).wallet_id == ledger.group_view("vision", []).wallet_id
    assert ledger.balance("ann") == 10 * MICROS  # her own wallet exists and pays nothing
    with pytest.raises(UnknownWallet):
        ledger.open_session("ann", "x", "a800", 1, RATE, MIN, wallet="group:audio")


def test_a_spawn_from_a_group_is_refused_past_the_members_cap_and_set_cap_none_removes_it():
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", 100 * MICROS, key="g")
    ledger.set_cap("vision", "ann", accrued(RATE, MIN) + 1, "month", "pi")
    first = start(ledger, hub, "ann")
    with pytest.raises(CapReached) as refused:
        ledger.open_session("ann", "two", "a800", 1, RATE, MIN, wallet="group:vision")
    message = str(refused.value)
    assert message.startswith("Your vision cap for this month is ¥0.60 and ¥0.60 of it is left")
    assert "with your running servers" in message and "raise your cap" in message
    start(ledger, hub, "bo")  # bo has no cap
    clock.advance(30)
    ledger.close_session(first)  # spent 0.30 of 0.60: not enough for another minute
    with pytest.raises(CapReached, match="¥0.30 of it is left"):
        ledger.open_session("ann", "two", "a800", 1, RATE, MIN, wallet="group:vision")
    assert ledger.set_cap("vision", "ann", None, "month", "pi") is None
    assert ledger.cap_states([ledger.group_view("vision", []).wallet_id]) == []
    start(ledger, hub, "ann", "two")
    for bad in ((-1, "month"), (MICROS, "day")):
        with pytest.raises(LedgerError):
            ledger.set_cap("vision", "ann", *bad, "pi")
    with pytest.raises(UnknownWallet):
        ledger.set_cap("audio", "ann", MICROS, "month", "pi")


def test_cap_periods_start_monday_and_the_first_in_utc():
    wednesday = int(datetime.datetime(2027, 2, 10, 15, 30, tzinfo=datetime.UTC).timestamp())
    assert period_start("week", wednesday) == FEB_1 + 7 * 86_400  # Monday 8 February
    assert period_start("month", wednesday) == FEB_1
    assert period_start("total", wednesday) == 0
    assert (
        period_start("week", FEB_1) == FEB_1
        and period_start("week", FEB_1 - 1) == FEB_1 - 7 * 86_400
    )
    assert period_start("month", FEB_1 - 1) == int(
        datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC).timestamp()
    )
    with pytest.raises(ValueError):
        period_start("day", wednesday)


@pytest.mark.parametrize("period, boundary", [("week", FEB_1 + 7 * 86_400), ("month", FEB_1)])
def test_a_new_period_resets_the_members_spend(period, boundary):
    ledger, clock, hub, meter = setup(start=boundary - 3600)
    ledger.grant("group:vision", 100 * MICROS, key="g")
    cap = accrued(RATE, MIN)
    ledger.set_cap("vision", "ann", cap, period, "pi")
    session = start(ledger, hub, "ann")
    clock.advance(MIN)
    ledger.close_session(session)
    with pytest.raises(CapReached):
        ledger.open_session("ann", "b", "a800", 1, RATE, MIN, wallet="group:vision")
    clock.now = boundary - 1
    with pytest.raises(CapReached):
        ledger.open_session("ann", "b", "a800", 1, RATE, MIN, wallet="group:vision")
    clock.now = boundary  # 00:00 UTC: the spend starts again
    ledger.open_session("ann", "b", "a800", 1, RATE, MIN, wallet="group:vision")
    wid = ledger.group_view("vision", []).wallet_id
    assert [s.spent_micros for s in ledger.cap_states([wid])] == [0]


def test_a_total_cap_never_resets():
    ledger, clock, hub, meter = setup(start=FEB_1 - 3600)
    ledger.grant("group:vision", 100 * MICROS, key="g")
    ledger.set_cap("vision", "ann", accrued(RATE, MIN), "total", "pi")
    session = start(ledger, hub, "ann")
    clock.advance(MIN)
    ledger.close_session(session)
    clock.advance(40 * 86_400)
    with pytest.raises(CapReached, match="Your vision cap in total"):
        ledger.open_session("ann", "b", "a800", 1, RATE, MIN, wallet="group:vision")


# ---------------------------------------------------------------------- the meter


async def test_the_meter_warns_then_stops_a_member_at_their_cap_while_another_keeps_running():
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", 100 * MICROS, key="g")
    cap = to_micros("3.00")  # 300 s at a cent a second
    ledger.set_cap("vision", "ann", cap, "month", "pi")
    start(ledger, hub, "ann")
    start(ledger, hub, "bo")
    clock.advance(180)
    await meter.tick()  # 120 s of ann's cap left: the 2-minute warning, to ann
    warnings = ledger.notifications("ann")
    assert [n.kind for n in warnings] == ["warning"]
    assert "2 min left of your vision cap for this month" in warnings[0].message
    assert ledger.notifications("vision") == [] and ledger.notifications("bo") == []
    clock.advance(120)
    result = await meter.tick()
    assert result.to_stop == [("ann", "")] and hub.stop_requests == [("ann", "")]
    stopped = ledger.notifications("ann")[-1]
    assert stopped.kind == "stopped"
    assert stopped.message.startswith("Your vision cap for this month (¥3.00) is used up")
    assert "Your files are kept" in stopped.message
    clock.advance(60)
    ledger.close_server("ann", "")  # the hub's post-stop hook
    assert (await meter.tick()).to_stop == []
    assert ("bo", "") in hub.servers and ledger.open_sessions("bo")
    assert ledger.notifications("bo") == []
    assert ledger.audit() == []


async def test_group_credit_warnings_and_stops_go_to_the_members():
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", to_micros("3.00"), key="g")  # 150 s for two at a cent each
    start(ledger, hub, "ann")
    start(ledger, hub, "bo")
    clock.advance(60)
    await meter.tick()
    for member in ("ann", "bo"):
        assert "of the vision group's credit left" in ledger.notifications(member)[0].message
    clock.advance(120)
    result = await meter.tick()
    assert sorted(result.to_stop) == [("ann", ""), ("bo", "")]
    assert "The vision group's credit ran out" in ledger.notifications("bo")[-1].message
    assert ledger.notifications("vision") == []
    # the admin hears of the group's budget (the runway), not of the members' servers
    assert {n.kind for n in ledger.notifications("pi")} == {"group-alert"}


@pytest.mark.parametrize("offset", [0, 1, 29, 59])
@pytest.mark.parametrize("stop_latency", [0, 5, 30])
async def test_a_members_overshoot_is_at_most_rate_times_interval_plus_stop_latency(
    offset, stop_latency
):
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", 100 * MICROS, key="g")
    cap = to_micros("1.00")
    ledger.set_cap("vision", "ann", cap, "month", "pi")
    session = start(ledger, hub, "ann", rate=to_micros("18.00"))
    start(ledger, hub, "ann", "two", rate=to_micros("9.00"))
    clock.advance(offset)
    while not hub.stop_requests:
        clock.advance(meter.interval_seconds)
        await meter.tick()
    clock.advance(stop_latency)
    ledger.close_session(session)
    ledger.close_server("ann", "two")
    wid = ledger.group_view("vision", []).wallet_id
    (state,) = ledger.cap_states([wid])
    overshoot = state.spent_micros - cap
    assert 0 <= overshoot <= accrued(to_micros("27.00"), meter.interval_seconds + stop_latency)
    assert ledger.audit() == []


async def test_budget_alerts_go_to_the_admins_once_per_top_up_and_the_webhook_once():
    ledger, clock, hub, meter = setup(alert_balances_micros=[to_micros("5.00")])
    ledger.set_group_options("vision", webhook_url="https://hooks.example/vision")
    ledger.grant("group:vision", to_micros("6.00"), key="g1")
    start(ledger, hub, "ann")
    clock.advance(120)  # 4.80 left
    first = await meter.tick()
    alerts = ledger.notifications("pi")
    assert [n.kind for n in alerts] == ["group-alert"]  # 28 days of runway: no runway alert
    assert "The vision group's balance is ¥4.80, under ¥5.00" in alerts[0].message
    assert ledger.notifications("ann") == [] and ledger.notifications("vision") == []
    assert [(url, body["alert"]) for url, body in first.webhooks] == [
        ("https://hooks.example/vision", "balance")
    ]
    assert hub.posted == ["https://hooks.example/vision"]
    assert (
        first.webhooks[0][1]["balance"] == "4.80 CNY" and first.webhooks[0][1]["group"] == "vision"
    )
    clock.advance(60)
    again = await meter.tick()
    assert again.webhooks == [] and len(ledger.notifications("pi")) == 1
    ledger.grant("group:vision", to_micros("1.00"), key="g2")  # a top-up re-arms
    clock.advance(60)
    rearmed = await meter.tick()
    assert len(rearmed.webhooks) == 1 and len(ledger.notifications("pi")) == 2
    assert len(hub.posted) == 2


async def test_each_lower_balance_threshold_crossed_alerts_the_admins():
    thresholds = [to_micros("5.00"), to_micros("2.00")]
    ledger, clock, hub, meter = setup(alert_balances_micros=thresholds, alert_runway_days=0)
    ledger.grant("group:vision", to_micros("6.00"), key="g1")
    start(ledger, hub, "ann")
    clock.advance(120)  # 4.80
    await meter.tick()
    clock.advance(300)  # 1.80
    await meter.tick()
    messages = [n.message for n in ledger.notifications("pi")]
    assert len(messages) == 2 and "under ¥2.00" in messages[1]


def test_group_view_shows_each_members_spend_cap_and_the_runway_at_the_last_weeks_burn():
    ledger, clock, hub, meter = setup()
    ledger.grant("group:vision", 20 * MICROS, key="g")
    ledger.set_cap("vision", "ann", 5 * MICROS, "week", "pi")
    ann = start(ledger, hub, "ann")
    bo = start(ledger, hub, "bo")
    clock.advance(200)
    ledger.close_session(ann)  # 2.00
    ledger.charge(bo, clock.now)  # 2.00 so far, still running
    view = ledger.group_view("vision", ["ann", "bo", "cy"])
    assert view.balance_micros == 16 * MICROS and view.admins == ["pi"]
    spends = {m.user: (m.spent_micros, m.cap_micros, m.left_micros, m.period) for m in view.members}
    assert spends == {
        "ann": (2 * MICROS, 5 * MICROS, 3 * MICROS, "week"),
        "bo": (2 * MICROS, None, None, "month"),
        "cy": (0, None, None, "month"),
    }
    assert [(s.id, cost) for s, cost in view.running] == [(bo, 2 * MICROS)]
    assert view.burn_micros == 4 * MICROS
    assert view.runway_seconds == 16 * 7 * 86_400 // 4  # 28 days at 4.00 a week
    clock.advance(8 * 86_400)  # the burn is the last 7 days': nothing spent since
    assert ledger.group_view("vision", []).runway_seconds is None


def test_a_members_own_wallet_does_not_count_what_the_group_pays_for():
    from meterhub.billing_hooks.api import wallet_json

    ledger, _clock = make_ledger()
    ledger.create_group("vision", "test")
    ledger.grant("group:vision", 20 * MICROS, "g")
    ledger.open_session("ann", "", "a800", 1, to_micros("36.00"), 0, wallet="group:vision")
    wallet = wallet_json(ledger, "ann")
    assert wallet["running"] == [] and wallet["minutes_left"] is None
    assert wallet["summary"] == "¥10.00"


def test_the_runway_is_said_in_hours_days_or_more_than_a_year():
    from meterhub.billing_hooks.groups import runway_phrase

    assert runway_phrase(None) == ""
    assert runway_phrase(5 * 3600) == "≈ 5 h left"
    assert runway_phrase(12 * 86_400) == "≈ 12 days left"
    assert runway_phrase(364 * 86_400) == "≈ 364 days left"
    assert runway_phrase(365 * 86_400) == "more than a year left"
