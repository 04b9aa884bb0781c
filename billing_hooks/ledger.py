"""The ledger: wallets, append-only entries and metered sessions, exact and idempotent.

`Ledger` is one object over one database, assembled from one module per concern:

- postings.py — every write that moves credit or changes a session (one transaction each)
- meter_batch.py — the meter's pass over many running sessions (the hot path)
- audit.py — the invariants, checked on demand
- queries.py — what pages, the CLI and the REST API read
"""

from __future__ import annotations

from .audit import Audit
from .meter_batch import MeterBatch, WalletView
from .postings import (
    HUB,
    METER,
    SYSTEM,
    Authorization,
    ConcurrentUpdate,
    InsufficientCredit,
    KeyConflict,
    LedgerError,
    NoCapacity,
    Posted,
    Postings,
    uncovered,
    window_amount,
)
from .queries import Queries


class Ledger(Queries, Audit, MeterBatch, Postings):
    """All methods are blocking: the hub and the meter call them off their event loops."""


__all__ = [
    "HUB",
    "METER",
    "SYSTEM",
    "Authorization",
    "ConcurrentUpdate",
    "InsufficientCredit",
    "KeyConflict",
    "Ledger",
    "LedgerError",
    "NoCapacity",
    "Posted",
    "WalletView",
    "uncovered",
    "window_amount",
]
