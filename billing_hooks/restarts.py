"""Servers the meter stops to start again in debug mode on the same disk: an idle GPU server
(`on_idle: debug`), a session at its user's cap (`on_cap: debug`), a course's GPU server at
the end of its lab window (`at_window_end: debug`).

The billing service may stop servers, never start them. So the meter queues the restart
here and stops the server; the hub, in its own process, starts it again once it has stopped
(hub/restarts.py), with a short-lived token of the user's that can start that one server
only. One restart per session, however many passes ask.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from .orm import Restart

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import contextmanager

    from sqlalchemy.orm import Session

#: reasons a server is restarted in debug mode
REASONS = ("idle", "cap", "lab")
#: restarts the hub looks at in one sync
RESTARTS_BATCH = 100


def wallet_option(kind: str, owner: str) -> str:
    """The `wallet` user option that pays from the same wallet as a session did: a user's
    own, a group's, or (an allowance, owned "COURSE/STUDENT") the course's."""
    if kind == "group":
        return f"group:{owner}"
    if kind == "allowance":
        return f"course:{owner.partition('/')[0]}"
    return f"user:{owner}"


class Restarts:
    if TYPE_CHECKING:
        clock: Callable[[], int]

        @contextmanager
        def begin(self) -> Iterator[Session]: ...

    def request_restart(
        self,
        user: str,
        server_name: str,
        session_id: int,
        wallet: str,
        reason: str,
        environment: str | None = None,
    ) -> bool:
        """Queue a debug-mode restart of the server whose session `session_id` is being
        stopped, paid from `wallet`, in the same `environment` where debug mode can run it
        (the hub decides); False when that session's restart is queued already."""
        if reason not in REASONS:
            raise ValueError(f"unknown restart reason {reason!r}")
        options = {"profile": "debug", "wallet": wallet}
        if environment:
            options["environment"] = environment
        try:
            with self.begin() as db:
                db.add(
                    Restart(
                        user_name=user,
                        server_name=server_name,
                        session_id=session_id,
                        options=json.dumps(options, sort_keys=True),
                        reason=reason,
                        created_at=self.clock(),
                        outcome="",
                    )
                )
        except IntegrityError:
            return False
        return True

    def pending_restarts(self) -> list[Restart]:
        with self.begin() as db:
            return list(
                db.scalars(
                    select(Restart)
                    .where(Restart.applied_at.is_(None))
                    .order_by(Restart.id)
                    .limit(RESTARTS_BATCH)
                )
            )

    def restart_applied(self, restart_id: int, outcome: str = "") -> None:
        with self.begin() as db:
            db.execute(
                update(Restart)
                .where(Restart.id == restart_id, Restart.applied_at.is_(None))
                .values(applied_at=self.clock(), outcome=outcome[:500])
            )

    def restarts(self, user: str | None = None, limit: int = 50) -> list[Restart]:
        """The newest restarts (of one user), applied or not."""
        query = select(Restart).order_by(Restart.id.desc()).limit(limit)
        if user is not None:
            query = query.where(Restart.user_name == user)
        with self.begin() as db:
            return list(db.scalars(query))
