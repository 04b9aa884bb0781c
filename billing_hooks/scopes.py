"""Who may do what to money: JupyterHub scopes, decided from the token, never its owner.

Billing reads the scopes JupyterHub reports for the token a request carries:

- `custom:meterhub:admin` (or JupyterHub's unfiltered `admin:users`): grant, adjust,
  refund, set prices, act on anyone's wallet.
- `custom:meterhub:spend`: spend the token owner's own credit (buy passes) and redeem
  vouchers into it. The `user` role has it; a server's own token (what code in a kernel
  holds) does not, so a notebook can read its owner's wallet but neither spend it nor use
  up (or guess at) voucher codes in its owner's name.
- `custom:meterhub:group-admin!group=NAME`: manage group NAME's wallet as its admin (a PI):
  see its balance, members' spend and running servers, set members' caps, download its
  statements. Never grant money from nothing, never another group. With it, the group's
  role gives JupyterHub's `list:users`, `read:users`, `read:servers` and `delete:servers`
  filtered to the group: a PI may stop a member's server, never start or open one.
- `custom:meterhub:course-staff!group=NAME` (TAs and instructors) and
  `custom:meterhub:course-instructor!group=NAME` (instructors: money and settings): a
  course's console, its roster's state and usage, stopping what the course pays for; their
  roles give JupyterHub's read scopes filtered to the course's group (its students), never
  delete:servers (a student's own-money server is not the course's to stop).
- `custom:meterhub:ssh!user=NAME`: open NAME's running servers through the SSH front door
  (hub/ssh.py), together with `access:servers` for them. The `user` role has it for the
  user's own servers; a server's own token does not, so code in a kernel cannot hand its
  server to an SSH client, and neither can a browser's cookie.
- JupyterHub's `read:metrics`: scrape the billing service's Prometheus metrics, as it
  scrapes the hub's own `/hub/metrics` (a Prometheus service's role; hub admins have it).
  A token with it needs no `access:services` to reach them.
- any token that reaches the billing service may read its owner's own wallet, usage and
  notifications, and mark its owner's notifications read.
"""

from __future__ import annotations

from collections.abc import Sequence

BILLING_SERVICE = "billing"
ADMIN_SCOPE = "custom:meterhub:admin"
SPEND_SCOPE = "custom:meterhub:spend"
GROUP_ADMIN_SCOPE = "custom:meterhub:group-admin"
GROUP_ADMIN_ROLE_PREFIX = "meterhub-group-admin-"
COURSE_STAFF_SCOPE = "custom:meterhub:course-staff"
COURSE_INSTRUCTOR_SCOPE = "custom:meterhub:course-instructor"
COURSE_ROLE_PREFIX = "meterhub-course-"
#: the roles the hub makes from the ledger (and removes when the ledger no longer has them)
LEDGER_ROLE_PREFIXES = (GROUP_ADMIN_ROLE_PREFIX, COURSE_ROLE_PREFIX)
BILLING_ACCESS = f"access:services!service={BILLING_SERVICE}"
BILLING_ADMIN_ROLE = "meterhub-billing-admin"
METRICS_SCOPE = "read:metrics"
SSH_SCOPE = "custom:meterhub:ssh"
#: the JupyterHub service whose token Prometheus sends (the chart's hub.services entry)
METRICS_SERVICE = "meterhub-metrics"

CUSTOM_SCOPES = {
    ADMIN_SCOPE: {
        "description": "Manage everyone's credit in meterhub: grants, adjustments, refunds,"
        " prices and passes for any user."
    },
    SPEND_SCOPE: {
        "description": "Spend your own meterhub credit (buy passes) and redeem vouchers into it."
    },
    GROUP_ADMIN_SCOPE: {
        "description": "Manage a group's meterhub wallet as its admin: members' caps, spend"
        " and statements (filtered by !group=)."
    },
    COURSE_STAFF_SCOPE: {
        "description": "A course's console in meterhub: its students' state and usage, stop"
        " their servers (filtered by !group=)."
    },
    SSH_SCOPE: {
        "description": "Open servers through meterhub's SSH front door: a shell, commands,"
        " SFTP and port forwarding (filtered by !user=, with access:servers to them)."
    },
    COURSE_INSTRUCTOR_SCOPE: {
        "description": "A course's money and settings in meterhub: allowances, profiles, lab"
        " windows (filtered by !group=)."
    },
}


def user_role() -> dict:
    """JupyterHub's `user` role, plus reaching billing and spending one's own credit."""
    return {"name": "user", "scopes": ["self", BILLING_ACCESS, SPEND_SCOPE, f"{SSH_SCOPE}!user"]}


def billing_admin_role(users: Sequence[str] = (), services: Sequence[str] = ()) -> dict:
    """Billing admins who need not be hub admins (hub admins are billing admins already)."""
    return {
        "name": BILLING_ADMIN_ROLE,
        "description": "Manage everyone's credit, prices, passes and refunds in meterhub.",
        "scopes": [ADMIN_SCOPE, BILLING_ACCESS, "list:users", "read:users:name"],
        "users": list(users),
        "services": list(services),
    }


def metrics_role(services: Sequence[str] = (METRICS_SERVICE,)) -> dict:
    """Prometheus's role: read the hub's and the billing service's metrics, nothing else."""
    return {
        "name": METRICS_SERVICE,
        "description": "Prometheus: read the hub's and the billing service's metrics, nothing else.",
        "scopes": [METRICS_SCOPE],
        "services": list(services),
    }


def is_billing_admin(scopes) -> bool:
    scopes = set(scopes or ())
    return ADMIN_SCOPE in scopes or "admin:users" in scopes


def may_read_metrics(scopes) -> bool:
    """Whether these scopes read the billing service's metrics (JupyterHub's own scope for
    /hub/metrics: it has no filters)."""
    return METRICS_SCOPE in set(scopes or ())


def may_spend(scopes) -> bool:
    return SPEND_SCOPE in set(scopes or ()) or is_billing_admin(scopes)


def group_admin_role(group: str, users: Sequence[str] = ()) -> dict:
    """The role a group's admins (PIs) hold: JupyterHub's scopes filtered to the group, plus
    the group-admin scope billing enforces. No `servers` (start), no `access:servers` (open
    a server, read its files), no grants."""
    only = f"!group={group}"
    return {
        "name": f"{GROUP_ADMIN_ROLE_PREFIX}{group}",
        "description": f"Admin of the meterhub group {group}: caps, spend, stop servers.",
        "scopes": [
            f"list:users{only}",
            f"read:users{only}",
            f"read:servers{only}",
            f"delete:servers{only}",
            f"read:groups{only}",
            f"{GROUP_ADMIN_SCOPE}{only}",
            BILLING_ACCESS,
        ],
        "users": list(users),
    }


def course_role(course: str, role: str, users: Sequence[str] = ()) -> dict:
    """The role of a course's TAs ("ta") or instructors ("instructor"): JupyterHub's read
    scopes filtered to the course's group (its students), the course-staff scope and, for
    instructors, the course-instructor scope. Never start, open or stop a student's server
    through JupyterHub: the console stops only what the course pays for (a student's own
    money is theirs), deciding from the course-staff scope."""
    only = f"!group={course}"
    scopes = [
        f"list:users{only}",
        f"read:users{only}",
        f"read:servers{only}",
        f"read:groups{only}",
        f"{COURSE_STAFF_SCOPE}{only}",
        BILLING_ACCESS,
    ]
    if role == "instructor":
        scopes.append(f"{COURSE_INSTRUCTOR_SCOPE}{only}")
    return {
        "name": f"{COURSE_ROLE_PREFIX}{role}-{course}",
        "description": f"{'Instructor' if role == 'instructor' else 'TA'} of the meterhub"
        f" course {course}.",
        "scopes": scopes,
        "users": list(users),
    }


def administers(scopes, group: str) -> bool:
    """Whether these scopes manage group `group`'s wallet: its group-admin scope, or a
    billing admin's (who manages every wallet)."""
    scopes = set(scopes or ())
    return (
        f"{GROUP_ADMIN_SCOPE}!group={group}" in scopes
        or GROUP_ADMIN_SCOPE in scopes
        or is_billing_admin(scopes)
    )


def may_stop_in(scopes, group: str) -> bool:
    """Whether these scopes may stop the servers of members of `group` (JupyterHub's
    delete:servers, unfiltered or filtered to the group)."""
    scopes = set(scopes or ())
    return "delete:servers" in scopes or f"delete:servers!group={group}" in scopes


def teaches(scopes, course: str) -> bool:
    """Whether these scopes open course `course`'s console (its TAs and instructors, or a
    billing admin)."""
    scopes = set(scopes or ())
    return (
        f"{COURSE_STAFF_SCOPE}!group={course}" in scopes
        or COURSE_STAFF_SCOPE in scopes
        or is_billing_admin(scopes)
    )


def instructs(scopes, course: str) -> bool:
    """Whether these scopes change course `course`'s money and settings (its instructors,
    or a billing admin); a TA's do not."""
    scopes = set(scopes or ())
    return (
        f"{COURSE_INSTRUCTOR_SCOPE}!group={course}" in scopes
        or COURSE_INSTRUCTOR_SCOPE in scopes
        or is_billing_admin(scopes)
    )
