"""Top-ups from a payment provider: the signature scheme (the Python and the openssl way
agree), where the secret comes from (config, file, environment; never shown), the site
config keys, the ledger's one entry per transaction, and the example Stripe adapter that
docs/billing.md shows."""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator
from traitlets.config import Config

from meterhub.billing_hooks import topup_actions
from meterhub.billing_hooks.api import request_schema
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import KeyConflict
from meterhub.billing_hooks.money import MICROS
from meterhub.billing_hooks.settings import BillingSettings
from meterhub.billing_hooks.topups import SignatureError, read_secret, sign, verify
from meterhub.hub.config import ConfigError, apply_config, load_site_config

from .billing_support import make_ledger

SECRET = b"k" * 32
BODY = b'{"transaction": "pay_1", "user": "amy", "amount": "12.50"}'
NOW = 1_800_000_000


def test_the_signature_is_the_hmac_of_timestamp_dot_body():
    expected = hmac.new(SECRET, b"1800000000." + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, NOW, BODY) == f"sha256={expected}"
    verify(SECRET, str(NOW), sign(SECRET, NOW, BODY), BODY, NOW + 300)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_openssl_computes_the_same_signature_as_docs_billing_md_shows():
    # docs/billing.md: printf '%s.%s' "$ts" "$body" | openssl dgst -sha256 -hmac "$secret"
    out = subprocess.run(
        ["openssl", "dgst", "-sha256", "-hmac", SECRET.decode()],
        input=b"1800000000." + BODY,
        capture_output=True,
        check=True,
    )
    assert f"sha256={out.stdout.decode().split()[-1]}" == sign(SECRET, NOW, BODY)


@pytest.mark.parametrize(
    "timestamp,signature,body,says",
    [
        (None, "sha256=00", BODY, "required"),
        (str(NOW), None, BODY, "required"),
        ("1.8e9", sign(SECRET, NOW, BODY), BODY, "Unix seconds"),
        (str(NOW - 301), sign(SECRET, NOW - 301, BODY), BODY, "stale"),
        (str(NOW + 301), sign(SECRET, NOW + 301, BODY), BODY, "stale"),
        (str(NOW), sign(b"x" * 32, NOW, BODY), BODY, "does not match"),
        (str(NOW), sign(SECRET, NOW, BODY), BODY + b" ", "does not match"),
        (str(NOW), sign(SECRET, NOW + 1, BODY), BODY, "does not match"),
        (str(NOW), sign(SECRET, NOW, BODY).upper(), BODY, "does not match"),
        (str(NOW), "sha256=é", BODY, "does not match"),
    ],
)
def test_bad_signatures_are_refused_saying_which_check(timestamp, signature, body, says):
    with pytest.raises(SignatureError, match=says) as refused:
        verify(SECRET, timestamp, signature, body, NOW)
    assert SECRET.decode() not in str(refused.value)


def test_the_secret_from_the_config_or_a_file_never_short_never_shown(tmp_path):
    assert read_secret(None, None) is None
    assert read_secret("v" * 32, str(tmp_path / "ignored")) == b"v" * 32
    path = tmp_path / "secret"
    path.write_bytes(b"f" * 40 + b"\nsecond line\n")
    assert read_secret(None, str(path)) == b"f" * 40
    path.write_bytes(b"short-secret\n")
    with pytest.raises(ValueError, match="at least 32 bytes") as short:
        read_secret(None, str(path))
    assert "short-secret" not in str(short.value)
    with pytest.raises(OSError):
        read_secret(None, str(tmp_path / "missing"))


def config_for(tmp_path, billing: dict) -> Config:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": "data", "billing": billing}))
    return apply_config(load_site_config(path, cwd=str(tmp_path)), Config())


def test_site_config_keys_become_billing_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("METERHUB_TOPUP_SECRET", raising=False)
    (tmp_path / "topup.key").write_text("z" * 64 + "\n")
    c = config_for(
        tmp_path,
        {
            "topup_url": "https://pay.example/?u={user}",
            "topup_secret_file": "topup.key",
            "max_topup": "500",
            "redeem_failures_per_user": 4,
            "redeem_window_seconds": 120,
        },
    )
    settings = BillingSettings(config=c)
    assert settings.topup_url == "https://pay.example/?u={user}"
    assert settings.topup_secret_file == str(tmp_path / "topup.key")  # resolved
    assert settings.topup_key() == b"z" * 64
    assert settings.max_topup == "500"
    limits = settings.redeem_limits
    assert (limits.per_user, limits.overall, limits.window_seconds) == (4, 500, 120)
    # the environment wins over the file, as for the OAuth client secret
    monkeypatch.setenv("METERHUB_TOPUP_SECRET", "e" * 32)
    assert BillingSettings(config=config_for(tmp_path, {})).topup_key() == b"e" * 32
    monkeypatch.delenv("METERHUB_TOPUP_SECRET")
    assert BillingSettings(config=config_for(tmp_path, {})).topup_key() is None


@pytest.mark.parametrize(
    "billing,says",
    [
        ({"topup_secret": "too-short"}, "billing.topup_secret"),
        ({"topup_url": "javascript:alert(1)"}, "billing.topup_url"),
        ({"redeem_failures_per_user": 0}, "billing.redeem_failures_per_user"),
        ({"max_topup": "1.001"}, "billing.max_topup"),
    ],
)
def test_bad_billing_keys_are_refused_naming_the_key(tmp_path, billing, says):
    with pytest.raises(ConfigError, match=says):
        config_for(tmp_path, billing)


def test_a_transaction_credits_once_and_its_id_cannot_be_reused(ledger_url):
    engine = connect(ledger_url)
    try:
        ledger, _clock = make_ledger(engine=engine)
        first = ledger.topup("amy", 12 * MICROS, "pay_1", "Alipay")
        assert not first.replayed
        assert (first.value.kind, first.value.key) == ("topup", "topup:pay_1")
        assert first.value.note == "top-up pay_1: Alipay" and first.value.actor == "topup-hook"
        assert ledger.topup("amy", 12 * MICROS, "pay_1").replayed
        for user, amount in (("amy", 13 * MICROS), ("ben", 12 * MICROS)):
            with pytest.raises(KeyConflict):
                ledger.topup(user, amount, "pay_1")
        assert ledger.balance("amy") == 22 * MICROS and ledger.balance("ben") is None
        assert ledger.audit() == []
    finally:
        engine.dispose()


# ------------------------------------------------- docs/examples/topup_adapter_stripe.py


def adapter():
    """The example adapter docs/billing.md points to, loaded from its file."""
    path = Path(__file__).resolve().parent.parent / "docs" / "examples" / "topup_adapter_stripe.py"
    spec = importlib.util.spec_from_file_location("topup_adapter_stripe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stripe_event(**session) -> bytes:
    fields = {
        "id": "cs_test_a1B2c3",
        "client_reference_id": "amy",
        "amount_total": 5000,
        "currency": "cny",
        "payment_status": "paid",
        **session,
    }
    event = {"id": "evt_1", "type": "checkout.session.completed", "data": {"object": fields}}
    return json.dumps(event).encode()


def stripe_signature(payload: bytes, secret: str, at: int) -> str:
    # Stripe's scheme, written out here rather than taken from the adapter
    mac = hmac.new(secret.encode(), f"{at}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def test_the_example_adapter_checks_stripe_and_forwards_a_top_up_meterhub_accepts():
    stripe = adapter()
    whsec = "whsec_" + "w" * 32
    payload = stripe_event()
    header = stripe_signature(payload, whsec, NOW)
    event = stripe.provider_event(payload, header, whsec, NOW + 10)
    topup = stripe.topup_for(event)
    assert topup == {
        "transaction": "cs_test_a1B2c3",
        "user": "amy",
        "amount": "50.00",
        "currency": "CNY",
        "note": "Stripe cs_test_a1B2c3",
    }
    # not Stripe's, stale, tampered: refused before anything is forwarded
    for bad_header, bad_payload in (
        (None, payload),
        (stripe_signature(payload, "whsec_other", NOW), payload),
        (stripe_signature(payload, whsec, NOW - 301), payload),
        (header, payload.replace(b"5000", b"500000")),
    ):
        with pytest.raises(stripe.Refused):
            stripe.provider_event(bad_payload, bad_header, whsec, NOW)
    # events not to credit
    assert stripe.topup_for(json.loads(stripe_event(payment_status="unpaid"))) is None
    assert stripe.topup_for({"type": "charge.refunded", "data": {"object": {}}}) is None
    with pytest.raises(stripe.Refused, match="client_reference_id"):
        stripe.topup_for(json.loads(stripe_event(client_reference_id=None)))
    # what it forwards passes the hook's checks, its schema and the ledger's, once
    body, headers = stripe.signed_request(topup, SECRET, NOW)
    verify(SECRET, headers["X-Meterhub-Timestamp"], headers["X-Meterhub-Signature"], body, NOW)
    assert (
        list(Draft7Validator(request_schema("/topups", "post")).iter_errors(json.loads(body))) == []
    )
    ledger, _clock = make_ledger()
    posted = topup_actions.topup(ledger, json.loads(body), Decimal("10000"))
    assert posted.value.amount_micros == 50 * MICROS and posted.value.key == "topup:cs_test_a1B2c3"
    assert topup_actions.topup(ledger, json.loads(body), Decimal("10000")).replayed


@pytest.mark.parametrize(
    "text,says",
    [
        # a secret almost right (the operator adds to it) or right but of the wrong type
        ('billing: {topup_secret: "SECRET-almost-but-short"}', "billing.topup_secret: too short"),
        ("billing: {topup_secret: 12345678901234567890123456789012345}", "a string"),
        ("billing: {topup_secret: '" + "SECRET" * 700 + "'}", "too long"),
        ("auth: {type: github, oauth: {client_secret: 12345678}}", "auth.oauth.client_secret"),
        ("billing: {db_url: 5432}", "billing.db_url"),
        # a YAML mistake on the secret's line: the parser would show the line
        ("billing:\n  topup_secret: SECRET-in-a: broken line\n", "line 2"),
    ],
)
def test_a_refused_config_never_shows_a_secret(tmp_path, text, says):
    """The refusal goes to the hub's log (or a terminal): it names the key and what is wrong,
    never the value of a secret, which may be the real one or most of it."""
    path = tmp_path / "meterhub.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_site_config(path, cwd=str(tmp_path))
    message = str(refused.value)
    assert says in message
    for secret in ("SECRET", "12345678", "5432"):
        assert secret not in message, message
