"""Groups in the hub: the membership changes the CLI asked for, the group admins' roles, and
courses' students and staff roles, mirrored from the ledger's rosters.

JupyterHub expects no other writer of its database, and roles come only from its config
(it deletes the others at start-up). So the CLI never writes the hub's database for groups:
it queues changes in the ledger (`hub_changes`), and the hub applies them in its own process
and session, every `sync_interval_seconds`; the group admins' roles are made from the
ledger's `group_admins`, both at start-up (`load_roles`) and by the same sync while running.
A course's roster is the ledger's (students may have no account yet): each sync makes the
hub group of the course's name hold exactly its students who have an account, so one who
signs in for the first time joins within a sync.
"""

from __future__ import annotations

import asyncio
import logging

from jupyterhub import orm, roles

from meterhub.billing_hooks.scopes import (
    LEDGER_ROLE_PREFIXES,
    course_role,
    group_admin_role,
)
from meterhub.billing_hooks.wallets import fold

log = logging.getLogger("meterhub.groups")


def group_admin_roles(ledger) -> list[dict]:
    """One role per group with a wallet, held by its admins, and two per course, held by
    its TAs and its instructors (blocking: reads the ledger)."""
    roles = [group_admin_role(group, admins) for group, admins in ledger.group_admins().items()]
    for course, roster in ledger.course_rosters().items():
        roles.append(course_role(course, "ta", roster["ta"]))
        roles.append(course_role(course, "instructor", roster["instructor"]))
    return roles


def find_group(db, name: str) -> orm.Group | None:
    """The hub's group of a wallet: the one of exactly its (lower-case) name, the group its
    admins' `!group=` scopes name (a hub group "Vision" is another group)."""
    return orm.Group.find(db, fold(name))


def apply_change(db, change) -> str:
    """Apply one queued change to the hub's groups; what it found ("" when it did it)."""
    group = find_group(db, change.group_name)
    if change.action == "create":
        if group is None:
            group = orm.Group(name=change.group_name, properties={})
            db.add(group)
        properties = dict(group.properties or {})
        properties["shared_folder"] = True
        group.properties = properties
        return ""
    if group is None:
        return f"no group {change.group_name!r} in the hub"
    user = orm.User.find(db, change.user_name)
    if user is None:
        return f"no user {change.user_name!r} in the hub"
    if change.action == "add":
        if user not in group.users:
            group.users.append(user)
            return ""
        return "already a member"
    if user in group.users:
        group.users.remove(user)
        return ""
    return "not a member"


def sync_roles(db, wanted: list[dict]) -> None:
    """Make the hub's group-admin roles exactly `wanted` (specs with their users)."""
    names = {spec["name"] for spec in wanted}
    for prefix in LEDGER_ROLE_PREFIXES:
        for role in db.query(orm.Role).filter(orm.Role.name.startswith(prefix)):
            if role.name not in names:
                log.info("Removing the role %s: the ledger no longer has it", role.name)
                # stripped from its holders first: their loaded role lists (the scopes the
                # hub computes) would keep a deleted role until they are reloaded
                _hold(db, role, role.users, (), orm.User)
                _hold(db, role, role.services, (), orm.Service)
                db.delete(role)
    for spec in wanted:
        role = roles.create_role(
            db, {k: spec[k] for k in ("name", "description", "scopes")}, commit=False
        )
        _hold(db, role, role.users, spec["users"], orm.User)
        _hold(db, role, role.services, spec.get("services", ()), orm.Service)
    db.commit()


def _hold(db, role, holding, wanted, kind) -> None:
    """Make exactly the `wanted` users (or services) that exist hold `role`."""
    names = set(wanted)
    for holder in list(holding):
        if holder.name not in names:
            roles.strip_role(db, holder, role, commit=False)
    for name in names:
        holder = kind.find(db, name)
        if holder is not None:
            roles.grant_role(db, holder, role, commit=False)


async def sync_groups(db, ledger) -> int:
    """Apply pending membership changes and the admins' roles; returns changes applied.

    Ledger reads and writes run in threads; the hub's session is used on the event loop's
    thread only, as JupyterHub itself uses it.
    """
    pending = await asyncio.to_thread(ledger.pending_hub_changes)
    for change in pending:
        outcome = apply_change(db, change)
        db.commit()
        if outcome:
            log.info(
                "Group change %s (%s %s %s): %s",
                change.id,
                change.action,
                change.group_name,
                change.user_name or "",
                outcome,
            )
        await asyncio.to_thread(ledger.hub_change_applied, change.id, outcome)
    rosters = await asyncio.to_thread(ledger.course_rosters)
    for course, roster in rosters.items():
        mirror_students(db, course, roster["student"])
    db.commit()
    wanted = await asyncio.to_thread(group_admin_roles, ledger)
    sync_roles(db, wanted)
    return len(pending)


def mirror_students(db, course: str, students: list[str]) -> None:
    """Make the hub group `course` hold exactly those of `students` who have an account."""
    group = find_group(db, course)
    if group is None:
        group = orm.Group(name=course, properties={"course": True})
        db.add(group)
    elif not (group.properties or {}).get("course"):
        # a hub group of that name that the course did not make: replacing its members
        # would hand its scopes and allowed profiles to the roster
        log.warning(
            "Course %s: the hub has a group of that name that is not the course's; its"
            " students are not mirrored into it (rename the course or the group)",
            course,
        )
        return
    wanted = set(students)
    for user in list(group.users):
        if user.name not in wanted:
            group.users.remove(user)
    have = {user.name for user in group.users}
    for name in sorted(wanted - have):
        user = orm.User.find(db, name)
        if user is not None:
            group.users.append(user)
