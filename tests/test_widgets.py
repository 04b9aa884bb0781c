"""The notebook widgets, without a server: what they show for a given status and GPUs."""

from __future__ import annotations

from meterhub.extensions.widgets import CreditMeter, GpuInfo, credit_html

STATUS = {
    "user": "zed",
    "currency": "CNY",
    "balance": "9.87",
    "rate_per_hour": "0.10",
    "minutes_left": 5922,
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
    assert "#c92a2a" in html and "6 min left" in html and "your server will stop" in html
    assert "#e67700" in credit_html(dict(STATUS, minutes_left=25))


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
