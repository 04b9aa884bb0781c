"""The ledger: wallets, append-only entries and metered sessions, exact and idempotent.

`Ledger` is one object over one database, assembled from one module per concern:

- postings.py — every write that moves credit or changes a session (one transaction each)
- meter_batch.py — the meter's pass over many running sessions (the hot path)
- audit.py — the invariants, checked on demand
- queries.py — what pages, the CLI and the REST API read
- groups.py — groups with wallets: settings, admins, caps, the hub's membership changes
- courses.py — courses: rosters, allowances carved from the course wallet, profiles, windows
- vouchers.py, topups.py — credit from outside: codes redeemed once, a provider's top-ups
"""

from __future__ import annotations

from .audit import Audit
from .courses import Courses
from .groups import Groups
from .meter_batch import MeterBatch, WalletView
from .postings import (
    HUB,
    METER,
    SYSTEM,
    Authorization,
    CapReached,
    ConcurrentUpdate,
    InsufficientCredit,
    KeyConflict,
    LedgerError,
    NoCapacity,
    Posted,
    Postings,
    UnknownWallet,
    uncovered,
    window_amount,
)
from .queries import Queries
from .restarts import Restarts
from .topups import TopUps
from .vouchers import Vouchers


class Ledger(Vouchers, TopUps, Courses, Groups, Restarts, Queries, Audit, MeterBatch, Postings):
    """All methods are blocking: the hub and the meter call them off their event loops."""


__all__ = [
    "HUB",
    "METER",
    "SYSTEM",
    "Authorization",
    "CapReached",
    "ConcurrentUpdate",
    "InsufficientCredit",
    "KeyConflict",
    "Ledger",
    "LedgerError",
    "NoCapacity",
    "Posted",
    "UnknownWallet",
    "WalletView",
    "uncovered",
    "window_amount",
]
