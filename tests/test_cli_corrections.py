"""Correcting money from the command line: keyed grants, signed adjustments, refunds.

Every test runs `meterhub`'s own entry point (`meterhub.hub.cli.main`, in this process: a
subprocess per command cost a second and a half of imports each; one test runs the
installed script) against a site in a temporary folder (no hub running: `meterhub user
add` makes the accounts, as an operator would) and reads the result back from the ledger. Sessions to refund are opened and closed
through the ledger's own API on a fake clock: the charge is known to the micro.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.settings import BillingSettings
from meterhub.hub.billing_cli import DatabaseUnreadable, require_user
from meterhub.hub.config import apply_config, load_site_config

from .clirun import run_cli

METERHUB = str(Path(sys.executable).parent / "meterhub")
OPERATOR = "ops-ann"  # the OS user the CLI runs as (LOGNAME), recorded as the actor
TRIAL = to_micros("1.00")
UUID = re.compile(r"^key: ([0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})$", re.M)


class Site:
    def __init__(self, root: Path):
        self.root = root
        self.billing_url = f"sqlite:///{root}/billing.sqlite"
        self.config_path = root / "meterhub.yaml"
        self.config_path.write_text(
            f"data_dir: {root}/data\n"
            f"billing: {{trial_credit: '1.00', db_url: '{self.billing_url}'}}\n"
        )
        self._ledger = None

    def cli(self, *args, config: Path | None = None, logname: str = OPERATOR, stdin=None):
        argv = [*args, "--config", str(config or self.config_path)]
        return run_cli(argv, cwd=self.root, env={"LOGNAME": logname}, stdin=stdin)

    def script(self, *args, logname: str = OPERATOR):
        """The installed `meterhub` script itself, in a subprocess."""
        env = {**os.environ, "LOGNAME": logname}
        return subprocess.run(
            [METERHUB, *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
            env=env,
        )

    def add_user(self, name: str) -> str:
        out = self.cli("user", "add", name, "--password-stdin", stdin="correct horse battery")
        assert out.returncode == 0, out.stderr
        return name

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            site = load_site_config(str(self.config_path))
            self._ledger = BillingSettings(config=apply_config(site, Config())).ledger()
        return self._ledger

    def balance(self, user: str) -> int:
        return self.ledger.balance(user)

    def entries(self, user: str) -> list:
        return self.ledger.wallet_entries(user)

    def charged_session(self, user: str, price_per_hour: str, seconds: int) -> int:
        """A session that ran `seconds` at the price and was charged for it (fake clock)."""
        ledger = Ledger(connect(self.billing_url), clock=lambda: 1_000_000)
        auth = ledger.open_session(user, "", "debug", 0, to_micros(price_per_hour), 0)
        ledger.mark_ready(auth.session_id, at=1_000_000)
        ledger.close_session(auth.session_id, at=1_000_000 + seconds)
        return auth.session_id


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    return Site(tmp_path_factory.mktemp("cli-site"))


def refused(out, *words: str, code: int = 2) -> None:
    """One readable line on stderr, the CLI's exit status for a refusal, no traceback."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meterhub: "), out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_grant_prints_its_new_key_and_a_retry_with_it_is_a_no_op(site):
    user = site.add_user("gia")
    # the installed script, once: the rest run its entry point in this process
    out = site.script("credit", "grant", user, "12.34", "--note", "course lab")
    assert out.returncode == 0, out.stderr
    (key,) = UUID.findall(out.stdout)
    assert out.stdout.splitlines()[0] == f"key: {key}"  # printed before the grant is tried
    assert "granted 12.34 CNY to gia; balance 13.34 CNY" in out.stdout
    assert site.balance(user) == TRIAL + to_micros("12.34")
    entry = site.entries(user)[-1]
    assert (entry.kind, entry.amount_micros, entry.actor, entry.note) == (
        "grant",
        12_340_000,
        f"cli:{OPERATOR}",
        "course lab",
    )

    again = site.cli("credit", "grant", user, "12.34", "--note", "course lab", "--key", key)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"already done (key {key}): entry {entry.id}"
    assert site.balance(user) == 13_340_000
    assert len(site.entries(user)) == 2  # trial + one grant


def test_a_key_reused_for_another_request_is_refused_and_writes_nothing(site):
    user = site.add_user("kai")
    other = site.add_user("kim")
    first = site.cli("credit", "grant", user, "5.00", "--key", "ticket-812")
    assert first.returncode == 0, first.stderr
    assert "key:" not in first.stdout  # the operator's own key is not echoed as new
    for args in (
        (user, "5.01"),  # another amount
        (user, "5.00", "--note", "other"),  # another note
        (other, "5.00"),  # another wallet
    ):
        refused(
            site.cli("credit", "grant", *args, "--key", "ticket-812"),
            "already used for a different grant",
        )
    assert site.balance(user) == TRIAL + 5_000_000
    assert site.balance(other) == TRIAL


def test_a_negative_adjustment_takes_credit_back_exactly(site):
    user = site.add_user("bo")
    out = site.cli("credit", "adjust", user, "-1.50", "--reason", "double grant on 3 May")
    assert out.returncode == 0, out.stderr
    (key,) = UUID.findall(out.stdout)
    assert "adjusted bo by -1.50 CNY; balance -0.50 CNY" in out.stdout
    assert site.balance(user) == TRIAL - 1_500_000 == -500_000
    entry = site.entries(user)[-1]
    assert (entry.kind, entry.amount_micros, entry.note, entry.actor) == (
        "adjustment",
        -1_500_000,
        "double grant on 3 May",
        f"cli:{OPERATOR}",
    )
    replay = site.cli("credit", "adjust", user, "-1.50", "--reason", "double grant on 3 May")
    assert replay.returncode == 0 and site.balance(user) == -2_000_000  # a new key: a new entry
    same = site.cli(
        "credit", "adjust", user, "-1.50", "--reason", "double grant on 3 May", "--key", key
    )
    assert same.stdout.strip() == f"already done (key {key}): entry {entry.id}"
    refused(
        site.cli("credit", "adjust", user, "-1.49", "--reason", "x", "--key", key),
        "already used for a different adjustment",
    )
    up = site.cli("credit", "adjust", user, "0.01", "--reason", "rounding", "--key", "r-1")
    assert up.returncode == 0, up.stderr
    assert site.balance(user) == -1_990_000


BAD_INPUT = [
    (("credit", "grant", "ed", "1.001"), "amount: ", "two decimals"),
    (("credit", "grant", "ed", "-3"), "amount: ", "'-3'"),
    (("credit", "grant", "ed", "0"), "amount: ", "positive"),
    (("credit", "grant", "ed", "1e3"), "amount: ", "'1e3'"),
    (("credit", "grant", "ed", "100000"), "amount: ", "below 100000"),
    (("credit", "grant", "ed", "1", "--key", "has space"), "printable ASCII"),
    (("credit", "grant", "ed", "1", "--key", ""), "printable ASCII"),
    (("credit", "grant", "ed", "1", "--key", "k" * 121), "printable ASCII"),
    (("credit", "grant", "ed", "1", "--key", "ключ"), "printable ASCII"),
    (("credit", "adjust", "ed", "0", "--reason", "x"), "amount: ", "'0'"),
    (("credit", "adjust", "ed", "-1.505", "--reason", "x"), "amount: ", "two decimals"),
    (("credit", "adjust", "ed", "１", "--reason", "x"), "amount: ", "ASCII digits"),  # full-width
    (("credit", "adjust", "ed", "2", "--reason", "  "), "reason: must not be empty"),
    (("credit", "adjust", "ed", "2", "--reason", "r" * 501), "reason: "),
]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(site):
    user = site.add_user("ed")
    before = [(e.id, e.amount_micros) for e in site.entries(user)]
    for args, *why in BAD_INPUT:
        refused(site.cli(*args), *why)
    assert [(e.id, e.amount_micros) for e in site.entries(user)] == before
    assert site.balance(user) == TRIAL


def test_refunds_never_exceed_what_the_session_was_charged(site):
    user = site.add_user("ria")
    session = site.charged_session(user, "4.50", 20 * 60)  # exactly 1.50
    assert site.balance(user) == TRIAL - 1_500_000
    part = site.cli(
        "billing",
        "refund",
        str(session),
        "--amount",
        "1.00",
        "--reason",
        "GPU fault",
        "--key",
        "f1",
    )
    assert part.returncode == 0, part.stderr
    assert f"refunded 1.00 CNY of session {session} to ria; balance 0.50 CNY" in part.stdout
    assert site.balance(user) == 500_000
    entry = site.entries(user)[-1]
    assert (entry.kind, entry.amount_micros, entry.actor) == ("refund", 1_000_000, "cli:ops-ann")

    replay = site.cli(
        "billing",
        "refund",
        str(session),
        "--amount",
        "1.00",
        "--reason",
        "GPU fault",
        "--key",
        "f1",
    )
    assert replay.stdout.strip() == f"already done (key f1): entry {entry.id}"
    refused(
        site.cli("billing", "refund", str(session), "--amount", "0.51", "--reason", "more"),
        f"session {session} can be refunded at most ¥0.50",
    )
    assert site.balance(user) == 500_000
    rest = site.cli("billing", "refund", str(session), "--reason", "the rest")  # no --amount
    assert rest.returncode == 0, rest.stderr
    assert "refunded 0.50 CNY" in rest.stdout and UUID.search(rest.stdout)
    assert site.balance(user) == TRIAL
    refused(
        site.cli("billing", "refund", str(session), "--reason", "again"),
        "nothing left to refund",
    )
    refused(site.cli("billing", "refund", "99999", "--reason", "x"), "No session 99999")
    refused(site.cli("billing", "refund", "12a", "--reason", "x"), "session id must be")
    refused(site.cli("billing", "refund", str(session), "--reason", ""), "reason")
    assert site.balance(user) == TRIAL
    assert site.cli("billing", "audit").returncode == 0


def test_credit_show_names_each_entrys_actor(site):
    user = site.add_user("sho")
    assert site.cli("credit", "grant", user, "2", "--key", "s1").returncode == 0
    lines = site.cli("credit", "show", user).stdout.strip().splitlines()
    assert lines[-1] == "3.00 CNY"
    assert [line.split()[1] for line in lines[:-1]] == ["trial", "grant"]
    assert lines[0].split()[4] == "system" and lines[1].split()[4] == f"cli:{OPERATOR}"


def test_an_os_user_with_no_usable_name_is_recorded_by_uid(site):
    user = site.add_user("uid")
    out = site.cli("credit", "grant", user, "1", "--key", "u1", logname="not a name")
    assert out.returncode == 0, out.stderr
    assert site.entries(user)[-1].actor == f"cli:uid={os.getuid()}"


def test_an_unreadable_hub_database_is_not_an_unknown_user(site, tmp_path):
    user = site.add_user("out")
    broken = tmp_path / "broken.yaml"  # the same ledger, a hub database that is a folder
    (tmp_path / "data" / "jupyterhub.sqlite").mkdir(parents=True)
    broken.write_text(
        f"data_dir: {tmp_path}/data\n"
        f"billing: {{trial_credit: '1.00', db_url: '{site.billing_url}'}}\n"
    )
    hub_db = f"sqlite:///{tmp_path}/data/jupyterhub.sqlite"
    for args in (
        ("credit", "grant", user, "5"),
        ("credit", "adjust", user, "-1", "--reason", "x"),
        ("credit", "show", user),
    ):
        out = site.cli(*args, config=broken)
        refused(out, f"cannot read the hub database ({hub_db}): unable to open", code=3)
        assert "unknown user" not in out.stderr and "key:" not in out.stdout
    assert site.balance(user) == TRIAL
    missing = site.cli("credit", "grant", "nobody", "5")  # the query worked: found no one
    refused(missing, "unknown user 'nobody'")


def test_the_hub_database_url_is_shown_without_its_password():
    c = Config()
    c.JupyterHub.db_url = "postgresql+psycopg://hub:s3cret@127.0.0.1:1/jupyterhub"
    with pytest.raises(DatabaseUnreadable) as e:
        require_user(c, "anyone")
    message = str(e.value)
    assert message.startswith("cannot read the hub database (postgresql+psycopg://hub:***@")
    assert "s3cret" not in message
