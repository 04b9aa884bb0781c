"""Top-ups from a payment provider: a signed webhook credits a user's wallet once per
transaction.

The provider (or the site's small adapter in front of it) POSTs JSON to
`/services/billing/api/v1/topups` with two headers:

    X-Meterhub-Timestamp: 1800000000                  (Unix seconds, when it was sent)
    X-Meterhub-Signature: sha256=<hex HMAC-SHA256 of "TIMESTAMP." + the raw body>

keyed with the site's `billing.topup_secret`. The HMAC is the whole authentication: no
JupyterHub token is asked for or accepted in its place. A request more than
TOLERANCE_SECONDS away from the billing clock is refused, so a recorded request cannot be
played back later; within that time a replay finds its transaction already written. The
provider's transaction id is the entry's idempotency key (`topup:ID`, UNIQUE): the same
transaction again answers with the entry it wrote, another user or amount under a used id
is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

from meterhub.i18n import _

from .postings import LedgerError, LedgerPart, Posted, request_digest

if TYPE_CHECKING:
    pass

TIMESTAMP_HEADER = "X-Meterhub-Timestamp"
SIGNATURE_HEADER = "X-Meterhub-Signature"
SCHEME = "sha256="
#: how far a request's timestamp may be from the billing clock, either way
TOLERANCE_SECONDS = 300
KEY_PREFIX = "topup:"
#: who the entries name as their actor
ACTOR = "topup-hook"
#: a secret shorter than this is refused (an HMAC key is only as strong as it is long)
MIN_SECRET_BYTES = 32


class SignatureError(ValueError):
    """A request that is not the provider's: the message says which check failed (never
    anything of the secret)."""


def sign(secret: bytes, timestamp: int | str, body: bytes) -> str:
    """The `X-Meterhub-Signature` value for `body` sent at `timestamp`."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256)
    return SCHEME + mac.hexdigest()


def verify(
    secret: bytes, timestamp: str | None, signature: str | None, body: bytes, now: int
) -> None:
    """Refuse (SignatureError) a request whose headers are missing, whose timestamp is
    stale or whose signature does not match; compared in constant time."""
    if not timestamp or not signature:
        raise SignatureError(f"the {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers are required")
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise SignatureError(f"{TIMESTAMP_HEADER}: Unix seconds, e.g. {now}")
    if abs(int(timestamp) - now) > TOLERANCE_SECONDS:
        raise SignatureError(
            f"{TIMESTAMP_HEADER} is more than {TOLERANCE_SECONDS} s from the billing"
            " service's clock: a stale or replayed request (or a clock to fix)"
        )
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode("utf-8", "replace")):
        raise SignatureError(
            f"{SIGNATURE_HEADER} does not match the body: expected"
            f" {SCHEME}<hex HMAC-SHA256 of 'TIMESTAMP.' + the raw body>, keyed with"
            " billing.topup_secret"
        )


def read_secret(value: str | None, path: str | None) -> bytes | None:
    """The secret from the site config's value, else from its file (the first line, without
    the line end); None when neither is set. OSError or ValueError when the file cannot be
    read or the secret is too short; their messages never hold the secret."""
    if value:
        secret = value.encode()
    elif path:
        with open(path, "rb") as f:
            lines = f.read(4096).splitlines()
        secret = lines[0].strip() if lines else b""
    else:
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"billing.topup_secret must be at least {MIN_SECRET_BYTES} bytes"
            f" (it is {len(secret)}); make one with `openssl rand -hex 32`"
        )
    return secret


class TopUps(LedgerPart):
    def topup(
        self, user: str, amount_micros: int, transaction: str, note: str = "", actor: str = ACTOR
    ) -> Posted:
        """Credit a provider's transaction to `user`'s wallet, once per transaction id:
        Posted(entry), replayed for the same transaction again; KeyConflict for another
        user or amount under a used id."""
        if amount_micros <= 0:
            raise LedgerError(_("a top-up must be positive"))
        digest = request_digest("topup", user=user, amount=amount_micros)
        shown = f"top-up {transaction}"
        return self._keyed_post(
            user,
            "topup",
            amount_micros,
            f"{KEY_PREFIX}{transaction}",
            actor,
            digest,
            f"{shown}: {note}" if note else shown,
        )
