"""The notebook widgets, without a server: what they show for a given status and GPUs."""

from __future__ import annotations

from meterhub.extensions.widgets import CreditMeter, GpuInfo, credit_html, level

STATUS = {
    "user": "zed",
    "currency": "CNY",
    "balance": "9.87",
    "rate_per_hour": "0.10",
    "minutes_left": 5922,
    "warn_minutes": [30, 10, 2],
    "notifications": [],
}


def test_credit_meter_shows_balance_rate_and_time_left():
    meter = CreditMeter(interval=0, fetch=lambda: STATUS)
    assert "¥9.87" in meter.value and "¥0.10/h" in meter.value and "98 h 42 min left" in meter.value
    assert "color:inherit" in meter.value


def test_credit_meter_turns_red_near_the_end_and_shows_warnings():
    low = dict(STATUS, balance="0.01", minutes_left=6)
    low["notifications"] = [{"message": "10 minutes of credit left — your server will stop"}]
    html = credit_html(low)
    assert "--jp-error-color1" in html and "6 min left" in html
    assert "your server will stop" in html
    assert "--jp-warn-color1" in credit_html(dict(STATUS, minutes_left=25))


def test_the_colour_follows_the_sites_thresholds():
    """The site's billing.warn_minutes, passed on by the status endpoint, decide the colour."""
    site = dict(STATUS, warn_minutes=[60, 20])
    assert "--jp-warn-color1" in credit_html(dict(site, minutes_left=45))
    assert "--jp-error-color1" in credit_html(dict(site, minutes_left=20))
    assert "color:inherit" in credit_html(dict(site, minutes_left=61))
    assert "color:inherit" in credit_html(dict(STATUS, minutes_left=6, warn_minutes=[]))


def test_level_is_the_status_bars_rule():
    assert [level(m, [30, 10, 2]) for m in (31, 30, 11, 10, 0)] == [
        "ok",
        "warning",
        "warning",
        "critical",
        "critical",
    ]
    assert level(45, [5, 60]) == "warning" and level(5, [5, 60]) == "critical"
    assert level(15, [15]) == "critical" and level(16, [15]) == "ok"
    assert level(None, [30]) == "ok" and level(1, []) == "ok"


def test_credit_meter_reports_an_unreachable_billing_api():
    def broken():
        raise OSError("connection refused")

    meter = CreditMeter(interval=0, fetch=broken)
    assert "Credit status unavailable: connection refused" in meter.value


def test_gpu_info_lists_held_gpus_or_says_there_are_none(monkeypatch):
    held = [
        {
            "index": 0,
            "name": "NVIDIA A800-SXM4-80GB",
            "memory_used_mib": 1024,
            "memory_total_mib": 81920,
            "utilisation_percent": 37,
        }
    ]
    info = GpuInfo(probe=lambda: held)
    assert "NVIDIA A800-SXM4-80GB" in info.value and "1024 / 81920 MiB" in info.value
    monkeypatch.setenv("METERHUB_PROFILE", "debug")
    assert "debug mode: no GPU" in GpuInfo(probe=list).value


async def test_credit_meter_stops_refreshing_itself_and_sends_only_changes():
    """Each update the meter shows reaches the browser through the kernel, which counts as
    the server's activity: it refreshes itself for `refresh_minutes` after it was shown or
    refreshed by hand, then stops, and sends nothing when the text did not change."""
    now = [0.0]
    balance = ["9.87"]
    fetched: list[float] = []

    def fetch():
        fetched.append(now[0])
        return dict(STATUS, balance=balance[0])

    meter = CreditMeter(interval=30, fetch=fetch, refresh_minutes=10, clock=lambda: now[0])
    sent: list[str] = []
    meter.text.observe(lambda change: sent.append(change["new"]), "value")
    assert meter._timer is not None, "it refreshes itself on the kernel's loop"

    now[0] = 300
    meter._tick()
    assert len(fetched) == 2 and sent == [], "an unchanged text was sent"
    balance[0] = "9.80"
    now[0] = 330
    meter._tick()
    assert len(sent) == 1 and "¥9.80" in meter.value

    now[0] = 600  # 10 minutes since it was shown
    meter._tick()
    assert len(fetched) == 3 and meter._timer is None, "it kept refreshing itself"
    assert "¥9.80" in meter.value and "not updating" in meter.value and len(sent) == 2

    # by hand: the button starts another 10 minutes
    balance[0] = "9.75"
    now[0] = 5000
    meter.button.click()
    assert "¥9.75" in meter.value and "not updating" not in meter.value
    assert meter._timer is not None
    now[0] = 5000 + 599
    meter._tick()
    assert meter._timer is not None
    meter.close()
    assert meter._timer is None
