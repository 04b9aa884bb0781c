"""A payment provider's webhook wired to meterhub's top-up hook, with Stripe Checkout as the
example (docs/billing.md, "Top-ups from a payment provider").

Stripe POSTs `checkout.session.completed` here. The adapter checks Stripe's own signature
(the `Stripe-Signature` header, keyed with the endpoint's `whsec_…` secret), and forwards a
paid session to `POST /services/billing/api/v1/topups`, signed with `billing.topup_secret`;
the Checkout Session's id is the transaction, its `client_reference_id` the user (a Payment
Link as `billing.topup_url`: `https://buy.stripe.com/…?client_reference_id={user}`). It
answers Stripe 200 only once meterhub has the top-up (201, or 200 for one it already had), so
Stripe's retries carry a payment through a hub that was down. Only the standard library:

    STRIPE_WEBHOOK_SECRET=whsec_… METERHUB_TOPUP_SECRET_FILE=/etc/meterhub/topup.key \\
    METERHUB_URL=https://hub.example.edu python3 topup_adapter_stripe.py 8400

Other providers (Alipay, WeChat Pay, PayPal …) differ only in `provider_event` and
`topup_for`: check their notification as they document it, then sign and forward the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: how old a Stripe signature may be (Stripe's own libraries allow 300 s)
TOLERANCE_SECONDS = 300
#: currencies whose smallest unit is a hundredth (Stripe's amounts are in the smallest unit)
TWO_DECIMALS = {"cny", "usd", "eur", "hkd", "sgd", "gbp"}
MAX_BODY = 64 * 1024


class Refused(ValueError):
    """A notification that is not Stripe's, or not one to credit."""


def provider_event(payload: bytes, header: str | None, secret: str, now: int) -> dict:
    """The Stripe event in `payload`, once `Stripe-Signature` (`t=…,v1=…`) proves it is
    Stripe's: HMAC-SHA256 of "t." + the raw body, keyed with the endpoint's secret."""
    parts = [p.split("=", 1) for p in (header or "").split(",") if "=" in p]
    stamps = [v for k, v in parts if k == "t"]
    signatures = [v for k, v in parts if k == "v1"]
    if len(stamps) != 1 or not stamps[0].isdigit() or not signatures:
        raise Refused("no Stripe-Signature with t= and v1=")
    if abs(now - int(stamps[0])) > TOLERANCE_SECONDS:
        raise Refused("a stale Stripe-Signature")
    signed = stamps[0].encode() + b"." + payload
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise Refused("Stripe-Signature does not match")
    return json.loads(payload)


def topup_for(event: dict) -> dict | None:
    """The meterhub top-up for a paid Checkout Session; None for any other event."""
    if event.get("type") != "checkout.session.completed":
        return None
    session = event["data"]["object"]
    if session.get("payment_status") != "paid":
        return None  # a delayed payment method: Stripe sends async_payment_succeeded later
    currency = str(session["currency"]).lower()
    if currency not in TWO_DECIMALS:
        raise Refused(f"currency {currency}: convert its amounts here first")
    user = session.get("client_reference_id")
    if not user:
        raise Refused(f"session {session['id']} has no client_reference_id (the user)")
    amount = (Decimal(int(session["amount_total"])) / 100).quantize(Decimal("0.01"))
    return {
        "transaction": session["id"],
        "user": user,
        "amount": str(amount),
        "currency": currency.upper(),
        "note": f"Stripe {session['id']}",
    }


def signed_request(topup: dict, secret: bytes, now: int) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the POST to meterhub: X-Meterhub-Signature is the HMAC-SHA256
    of "TIMESTAMP." + exactly these bytes, keyed with billing.topup_secret."""
    body = json.dumps(topup).encode()
    mac = hmac.new(secret, f"{now}.".encode() + body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-Meterhub-Timestamp": str(now),
        "X-Meterhub-Signature": f"sha256={mac}",
    }


def forward(hub_url: str, topup: dict, secret: bytes) -> int:
    """POST the top-up to meterhub; its HTTP status (201 new, 200 already credited)."""
    body, headers = signed_request(topup, secret, int(time.time()))
    url = hub_url.rstrip("/") + "/services/billing/api/v1/topups"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        print(f"meterhub refused {topup['transaction']}: {e.code} {e.read()[:500]!r}")
        return e.code
    except OSError as e:
        print(f"meterhub unreachable for {topup['transaction']}: {e}")
        return 502


def topup_secret() -> bytes:
    path = os.environ.get("METERHUB_TOPUP_SECRET_FILE")
    if path:
        with open(path, "rb") as f:
            return f.readline().strip()
    return os.environ["METERHUB_TOPUP_SECRET"].encode()


class Webhook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            return self.answer(413 if length else 400)
        payload = self.rfile.read(length)
        try:
            event = provider_event(
                payload,
                self.headers.get("Stripe-Signature"),
                os.environ["STRIPE_WEBHOOK_SECRET"],
                int(time.time()),
            )
            topup = topup_for(event)
        except (Refused, ValueError, KeyError, TypeError) as e:
            print(f"refused a notification: {e}")
            return self.answer(400)
        if topup is None:
            return self.answer(200)  # an event we do not credit: Stripe need not retry it
        status = forward(os.environ["METERHUB_URL"], topup, topup_secret())
        # 2xx: meterhub has it. Anything else: Stripe retries (for up to three days)
        self.answer(200 if status in (200, 201) else 502)

    def answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8400
    ThreadingHTTPServer(("127.0.0.1", port), Webhook).serve_forever()
