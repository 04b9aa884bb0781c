"""One machine left running for a semester: the systemd unit, a reboot, HTTPS, moving the
ledger to PostgreSQL, and a health check that notices a meter that stopped metering."""

from __future__ import annotations

import csv
import datetime
import io
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from sqlalchemy import select
from traitlets.config import Config

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.courses import RosterLine
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.meter import UNHEALTHY_AFTER_INTERVALS, Meter
from meterhub.billing_hooks.migrate import TABLES, table_digest
from meterhub.billing_hooks.money import MICROS, to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession
from meterhub.billing_hooks.service import make_app
from meterhub.billing_hooks.vouchers import VoucherRefused, new_code
from meterhub.hub.cli import main
from meterhub.hub.config import ConfigError, apply_config, load_site_config
from meterhub.hub.systemd import quote_arg, unit_text

from .hubprocess import HubProcess, until

METERHUB = str(Path(sys.executable).parent / "meterhub")


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([METERHUB, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


# ---------------------------------------------------------------------- systemd unit


def test_the_unit_runs_serve_restarts_on_failure_and_spares_servers():
    unit = unit_text(
        ["/opt/mh/.venv/bin/meterhub", "serve", "--config", "/etc/meterhub/meterhub.yaml"],
        "/var/lib/meterhub",
    )
    assert unit == (
        "[Unit]\n"
        "Description=meterhub: GPU notebooks by the hour (JupyterHub)\n"
        "Documentation=https://jupyterhub.readthedocs.io/\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "ExecStart=/opt/mh/.venv/bin/meterhub serve --config /etc/meterhub/meterhub.yaml\n"
        "WorkingDirectory=/var/lib/meterhub\n"
        "Environment=PYTHONUNBUFFERED=1\n"
        "Restart=on-failure\n"
        "RestartSec=5s\n"
        "# Stop (or restart) the hub only: the users' servers keep running (after a crash, the\n"
        "# proxy too), and the restarted hub takes them over. The billing service exits with the"
        " hub and is restarted by it.\n"
        "KillMode=process\n"
        "TimeoutStopSec=60s\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("/etc/meterhub/site.yaml", "/etc/meterhub/site.yaml"),
        ("/srv/my lab/site.yaml", '"/srv/my lab/site.yaml"'),
        ("/srv/100%/x", "/srv/100%%/x"),
        ('/srv/a"b$c', '"/srv/a\\"b$$c"'),
    ],
)
def test_unit_arguments_are_quoted_for_systemd(arg, quoted):
    assert quote_arg(arg) == quoted


def test_systemd_unit_command_uses_absolute_paths(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "meterhub.yaml").write_text("data_dir: /var/lib/meterhub\n")
    out = cli("systemd-unit", "--config", "lab/meterhub.yaml", "--port", "8443", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    config = tmp_path / "lab" / "meterhub.yaml"
    assert f"ExecStart={METERHUB} serve --config {config} --ip 127.0.0.1 --port 8443" in lines
    assert f"WorkingDirectory={tmp_path}" in lines
    assert "KillMode=process" in lines and "Restart=on-failure" in lines
    assert os.path.isabs(METERHUB) and os.access(METERHUB, os.X_OK)


def test_systemd_unit_refuses_a_config_that_cannot_serve(tmp_path):
    (tmp_path / "bad.yaml").write_text("https: {cert_file: c.pem, key_file: k.pem}\n")
    out = cli("systemd-unit", "--config", "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert f"https.cert_file: {tmp_path}/c.pem does not exist" in out.stderr


# ---------------------------------------------------------------------- a reboot


def billing_is_down(hub: HubProcess) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", hub.site["hub"]["billing_port"])) != 0


def test_after_a_reboot_the_session_is_closed_when_last_seen(tmp_path):
    hub = HubProcess(
        tmp_path,
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "3.60"}},
            "billing": {"meter_interval_seconds": 1, "trial_credit": "1.00"},
        },
    )
    try:
        hub.start()
        hub.spawn("rob", {"profile": "debug"})
        ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))

        def session() -> MeteredSession:
            with ledger.begin() as db:
                (row,) = db.scalars(select(MeteredSession).filter_by(user_name="rob")).all()
                return row

        until(lambda: session().metered_through > session().ready_at, "a meter pass", timeout=30)
        # the power goes: the hub, its proxy and billing service, and the server die at once
        hub.stop(signal.SIGKILL)
        hub.kill_leftovers()
        until(lambda: billing_is_down(hub), "the billing service to exit with the hub")
        seen = session()
        assert seen.stopped_at is None and seen.last_seen_running is not None
        hub.start()  # systemd starts it again at boot
        until(lambda: hub.server("rob") is None, "the hub to notice the server is gone")
        closed = until(lambda: (s := session()).stopped_at is not None and s, "the session closed")
        # charged until it was last seen running, not through the downtime
        assert seen.ready_at <= closed.stopped_at <= seen.last_seen_running, hub.log_tail()
        usage = cli("usage", "rob", "--csv", "--config", str(hub.config_path), cwd=tmp_path)
        (row,) = csv.DictReader(io.StringIO(usage.stdout))
        stopped = datetime.datetime.fromisoformat(row["stopped_at"])  # ISO 8601, UTC offset
        assert stopped.tzinfo is not None and int(stopped.timestamp()) == closed.stopped_at
        assert int(row["seconds"]) == closed.stopped_at - closed.ready_at
        audit = cli("billing", "audit", "--config", str(hub.config_path), cwd=tmp_path)
        assert audit.returncode == 0 and "audit: ok" in audit.stdout, audit.stdout
    finally:
        hub.teardown()


# ---------------------------------------------------------------------- HTTPS


def test_https_maps_to_jupyterhubs_own_traits(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"https": {"cert_file": "tls/hub.pem", "key_file": "/k.pem"}}))
    c = apply_config(load_site_config(path, cwd="/srv/lab"), Config())
    assert c.JupyterHub.ssl_cert == "/srv/lab/tls/hub.pem"
    assert c.JupyterHub.ssl_key == "/k.pem"
    plain = apply_config(load_site_config(None, cwd="/srv/lab"), Config())
    assert "ssl_cert" not in plain.JupyterHub and "ssl_key" not in plain.JupyterHub


@pytest.mark.parametrize("given", ["cert_file", "key_file"])
def test_https_needs_both_files(tmp_path, given):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"https": {given: "x.pem"}}))
    other = {"cert_file": "key_file", "key_file": "cert_file"}[given]
    with pytest.raises(ConfigError, match=rf"https\.{other}: missing \(https needs both"):
        load_site_config(path)


def test_serve_refuses_a_missing_key_file(tmp_path, capsys):
    (tmp_path / "hub.pem").write_text("not checked here")
    path = tmp_path / "site.yaml"
    site = {"https": {"cert_file": str(tmp_path / "hub.pem"), "key_file": str(tmp_path / "no")}}
    path.write_text(yaml.safe_dump({**site, "data_dir": str(tmp_path / "data")}))
    assert main(["serve", "--config", str(path)]) == 2
    assert f"https.key_file: {tmp_path}/no does not exist" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # refused before anything was made


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "hub.pem", folder / "hub.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_a_hub_with_a_certificate_answers_https(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path)
    hub = HubProcess(
        tmp_path / "hub", {"gpus": [], "https": {"cert_file": str(cert), "key_file": str(key)}}
    )
    hub.url = hub.url.replace("http://", "https://")
    # HubProcess polls with requests, which then trusts our certificate (and only it)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    try:
        hub.start()
        r = requests.get(f"{hub.url}/hub/api/", verify=str(cert), timeout=10)
        assert r.status_code == 200 and "version" in r.json()
        with pytest.raises(requests.ConnectionError):
            requests.get(hub.url.replace("https://", "http://") + "/hub/api/", timeout=10)
    finally:
        hub.teardown()


# ---------------------------------------------------------------------- ledger migration


def semester_ledger(url: str) -> tuple[Ledger, FakeClock]:
    """A ledger with one of everything: grants, charged sessions, a pass, an adjustment,
    a refund, notifications, reconciliations, a group with a wallet, an admin, a cap and
    a queued membership change, a course with a roster and a student's allowance, a
    session with its own cap that fell back to debug mode (a queued restart), vouchers
    (one redeemed), a failed redemption and a provider's top-up."""
    clock = FakeClock()
    ledger = Ledger(connect(url), clock=clock)
    rate = to_micros("4.50")
    ledger.grant("ann", 50 * MICROS, "grant:ann", "course allowance", "cli:root")
    ledger.ensure_user("bo")
    first = ledger.open_session("ann", "", "a800", 1, rate, min_seconds=600).session_id
    ledger.mark_ready(first)
    clock.advance(90)
    ledger.charge_running([first], clock.now)
    clock.advance(30)
    ledger.close_session(first)
    ledger.buy_pass("bo", "rtx4090", 1, "daily", to_micros("2.70"), 86400, "pass:bo")
    second = ledger.open_session("bo", "lab", "rtx4090", 1, to_micros("1.25"), 60).session_id
    ledger.mark_ready(second)
    clock.advance(60)
    ledger.charge_running([second], clock.now)
    ledger.adjust("ann", -to_micros("1.50"), "adjust:ann", "double grant", "cli:root")
    ledger.refund(first, None, "refund:1", "the GPU was faulty", "cli:root")
    ledger.notify("ann", "warn:1:30", "warning", "30 min left")
    ledger.reconciled("closed-vanished", "bo", "old", None, "closed at its last sight")
    ledger.set_price("a800", to_micros("4.00"), "cli:root")
    ledger.create_group("lab", "cli:root", admins=["ann"])
    ledger.grant("group:lab", 20 * MICROS, "grant:lab", "", "cli:root")
    ledger.set_cap("lab", "bo", 5 * MICROS, "month", "ann")
    ledger.create_course("ml101", "cli:root", instructors=["ann"], timezone="Asia/Shanghai")
    ledger.import_roster("ml101", [RosterLine("bo", full_name="Bo")], "cli:root")
    ledger.grant("course:ml101", 30 * MICROS, "grant:ml101", "", "cli:root")
    ledger.set_allowance("ml101", 3 * MICROS, "week", None)
    ledger.settle_allowance("ml101", "bo")
    capped = ledger.open_session(
        "ann", "gpu", "a800", 1, rate, 60, max_cost_micros=MICROS, max_seconds=3600
    ).session_id
    ledger.mark_ready(capped)
    clock.advance(30)
    ledger.close_session(capped)
    ledger.request_restart("ann", "gpu", capped, "user:ann", "cap")
    # a voucher redeemed, one left, a code that did not work, and a provider's top-up
    used, _unused = ledger.create_vouchers(5 * MICROS, 2, "cli:root", note="open day")
    ledger.redeem_voucher("ann", used.code, "ann")
    with pytest.raises(VoucherRefused):
        ledger.redeem_voucher("bo", new_code(), "bo")
    ledger.topup("bo", 12 * MICROS, "pay_1", "Alipay")
    ledger.record_audit()
    return ledger, clock


def snapshot(ledger: Ledger, now: int) -> dict:
    with ledger.begin() as db:
        entries = [
            (e.id, e.key, e.amount_micros) for e in db.scalars(select(Entry).order_by(Entry.id))
        ]
        digests = {t.name: table_digest(db.connection(), t) for t in TABLES}
    return {
        "audit": ledger.audit(now),
        "balances": {u: ledger.balance(u) for u in ("ann", "bo")},
        "entries": entries,
        "tables": digests,
    }


def test_migrate_copies_the_ledger_to_postgresql_exactly(tmp_path, postgres):
    source_url = f"sqlite:///{tmp_path}/billing.sqlite"
    ledger, clock = semester_ledger(source_url)
    before = snapshot(ledger, clock.now)
    assert before["audit"] == [] and len(before["entries"]) >= 8
    assert all(rows for rows, _ in before["tables"].values())  # every table has rows
    config = tmp_path / "meterhub.yaml"
    config.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path), "billing": {"db_url": source_url}})
    )
    target_url = postgres.new_database()
    out = cli("billing", "migrate", "--to", target_url, "--config", str(config), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "audit and 5 balances identical" in out.stdout  # ann, bo, lab, ml101, its bo
    assert "now set billing.db_url to" in out.stdout and "password" not in out.stdout
    moved = Ledger(connect(target_url), clock=clock)
    assert snapshot(moved, clock.now) == before
    assert snapshot(ledger, clock.now) == before  # the source is untouched
    # the sequences moved past the copied ids: the target takes new writes
    posted = moved.grant("bo", MICROS, "grant:bo:after", "", "cli:root")
    assert posted.value.id == before["entries"][-1][0] + 1
    session = moved.open_session("bo", "", "debug", 0, to_micros("0.10"), 60).session_id
    assert session == 4  # three sessions were copied
    assert moved.audit() == []
    # a second migrate into the now non-empty database is refused, writing nothing
    again = cli("billing", "migrate", "--to", target_url, "--config", str(config), cwd=tmp_path)
    assert again.returncode == 2 and "already holds a ledger" in again.stderr, again.stderr
    assert moved.balance("bo") == before["balances"]["bo"] + MICROS


def test_migrate_refuses_what_it_cannot_copy(tmp_path):
    config = tmp_path / "meterhub.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    absent = cli(
        "billing", "migrate", "--to", f"sqlite:///{tmp_path}/t.sqlite", "--config", str(config)
    )
    assert absent.returncode == 2 and "nothing to migrate" in absent.stderr
    assert not (tmp_path / "t.sqlite").exists()
    semester_ledger(f"sqlite:///{tmp_path}/data/billing.sqlite")
    bad = cli("billing", "migrate", "--to", "no url", "--config", str(config))
    assert bad.returncode == 2 and "not a database URL" in bad.stderr
    itself = cli(
        "billing",
        "migrate",
        "--to",
        f"sqlite:///{tmp_path}/data/billing.sqlite",
        "--config",
        str(config),
    )
    assert itself.returncode == 2 and "itself" in itself.stderr


# ---------------------------------------------------------------------- meter health


class DeadHub:
    """A hub that never answers: every pass fails."""

    #: the servers' last activity as the hub tells it: none reported
    last_activity: dict = {}

    async def running_servers(self):
        raise ConnectionRefusedError("the hub is down")


class QuietHub:
    """A hub with no servers running: every pass succeeds."""

    #: the servers' last activity as the hub tells it: none reported
    last_activity: dict = {}

    async def running_servers(self):
        return {}


async def test_a_meter_whose_pass_fails_is_unhealthy_after_three_intervals(tmp_path):
    clock = FakeClock()
    ledger = Ledger(connect(f"sqlite:///{tmp_path}/l.sqlite"), clock=clock)
    meter = Meter(ledger, DeadHub(), interval_seconds=60, clock=clock)
    limit = UNHEALTHY_AFTER_INTERVALS * 60
    assert meter.healthy()  # just started: the first pass is not due yet
    for _ in range(UNHEALTHY_AFTER_INTERVALS):
        clock.advance(60)
        with pytest.raises(ConnectionRefusedError):
            await meter.tick()
    assert not meter.healthy() and meter.health()["seconds_since_pass"] == limit
    clock.advance(3600)
    with pytest.raises(ConnectionRefusedError):
        await meter.tick()
    assert not meter.healthy() and meter.last_pass_at is None  # stays unhealthy

    meter.hub = QuietHub()  # the hub is back: the next pass makes it healthy again
    await meter.tick()
    assert meter.healthy() and meter.last_pass_at == clock.now
    clock.advance(limit - 1)
    assert meter.healthy()
    clock.advance(1)
    assert not meter.healthy()


def test_the_billing_app_hands_its_meter_to_the_health_check(tmp_path):
    clock = FakeClock()
    ledger = Ledger(connect(f"sqlite:///{tmp_path}/l.sqlite"), clock=clock)
    meter = Meter(ledger, QuietHub(), clock=clock)

    class Hub:
        async def user_exists(self, name):
            return False

        async def group_members(self, name):
            return None

    app = make_app("/services/billing/", ledger, 0, Hub(), Config(), [30], meter)
    assert app.settings["meter"] is meter
