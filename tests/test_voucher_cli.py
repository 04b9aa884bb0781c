"""`meterhub voucher create|list|revoke`: codes on standard output only, refusals in one
line with exit status 2 that write nothing, a revoke that names a wrong id revokes nothing."""

from __future__ import annotations

import yaml

from meterhub.billing_hooks.settings import BillingSettings
from meterhub.hub.billing_cli import load_settings

from .clirun import run_cli


def site(tmp_path):
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    return path


def cli(config, *args):
    return run_cli(["voucher", *args, "--config", str(config)], cwd=config.parent)


def ledger_of(config):
    class Args:
        pass

    args = Args()
    args.config = str(config)
    _c, settings = load_settings(args)
    assert isinstance(settings, BillingSettings)
    return settings.ledger()


def test_create_prints_only_codes_and_list_counts_them(tmp_path):
    config = site(tmp_path)
    made = cli(config, "create", "50", "--count", "3", "--expires", "2099-12-31", "--note", "ML")
    assert made.returncode == 0, made.stderr
    codes = made.stdout.splitlines()
    assert len(codes) == 3 and len(set(codes)) == 3
    assert "expiring at 2100-01-01T00:00Z" in made.stderr
    listed = cli(config, "list", "--state", "unused")
    lines = listed.stdout.splitlines()
    assert len(lines) == 5 and lines[-1] == "3 voucher(s): 3 unused, 0 used, 0 expired, 0 revoked"
    assert all("50.00" in line and "ML" in line for line in lines[1:-1])
    # the list shows no code, only its last four characters
    assert not any(code in listed.stdout for code in codes)


def test_refusals_are_one_line_exit_2_and_write_nothing(tmp_path):
    config = site(tmp_path)
    for args, says in (
        (["create", "0"], "must be positive"),
        (["create", "5", "--count", "0"], "--count"),
        (["create", "5", "--count", "lots"], "--count"),
        (["create", "5", "--expires", "2001-01-01"], "not in the future"),
        (["create", "5", "--expires", "31/01/2099"], "--expires"),
        (["create", "100000"], "below"),
        (["revoke"], "their ids, or --batch"),
        (["revoke", "x1"], "whole number"),
        (["revoke", "--batch", "none-such"], "no voucher in batch"),
    ):
        out = cli(config, *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""
    assert ledger_of(config).vouchers() == []


def test_revoke_with_one_wrong_id_revokes_nothing_and_a_used_one_stays_used(tmp_path):
    config = site(tmp_path)
    codes = cli(config, "create", "5", "--count", "2").stdout.split()
    ledger = ledger_of(config)
    ids = sorted(v.id for v in ledger.vouchers())
    wrong = cli(config, "revoke", str(ids[0]), "999")
    assert wrong.returncode == 2 and "no voucher 999" in wrong.stderr
    assert len(ledger.vouchers(state="unused")) == 2
    ledger.redeem_voucher("amy", codes[1], "amy")
    both = cli(config, "revoke", *map(str, ids))
    assert both.returncode == 0, both.stderr
    assert f"revoked voucher {ids[0]}" in both.stdout
    assert "already redeemed by amy" in both.stdout
    states = {v.id: (v.revoked_at is not None, v.redeemed_by) for v in ledger.vouchers()}
    assert states == {ids[0]: (True, None), ids[1]: (False, "amy")}
    assert ledger.audit() == []
