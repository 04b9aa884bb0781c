"""The one clock billing reads: whole UTC epoch seconds. Tests move it instead of sleeping."""

from __future__ import annotations

import time


def utcnow() -> int:
    return int(time.time())


class FakeClock:
    """A clock tests move by hand: `clock.advance(60)`."""

    def __init__(self, start: int = 1_800_000_000):
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: int) -> int:
        self.now += seconds
        return self.now
