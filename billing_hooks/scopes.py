"""Who may do what to money: JupyterHub scopes, decided from the token, never its owner.

Billing reads the scopes JupyterHub reports for the token a request carries:

- `custom:meterhub:admin` (or JupyterHub's unfiltered `admin:users`): grant, adjust,
  refund, set prices, act on anyone's wallet.
- `custom:meterhub:spend`: spend the token owner's own credit (buy passes). The `user` role
  has it; a server's own token (what code in a kernel holds) does not, so a notebook can
  read its owner's wallet but not spend it.
- any token that reaches the billing service may read its owner's own wallet, usage and
  notifications, and mark its owner's notifications read.
"""

from __future__ import annotations

from collections.abc import Sequence

BILLING_SERVICE = "billing"
ADMIN_SCOPE = "custom:meterhub:admin"
SPEND_SCOPE = "custom:meterhub:spend"
BILLING_ACCESS = f"access:services!service={BILLING_SERVICE}"
BILLING_ADMIN_ROLE = "meterhub-billing-admin"

CUSTOM_SCOPES = {
    ADMIN_SCOPE: {
        "description": "Manage everyone's credit in meterhub: grants, adjustments, refunds,"
        " prices and passes for any user."
    },
    SPEND_SCOPE: {"description": "Spend your own meterhub credit: buy passes."},
}


def user_role() -> dict:
    """JupyterHub's `user` role, plus reaching billing and spending one's own credit."""
    return {"name": "user", "scopes": ["self", BILLING_ACCESS, SPEND_SCOPE]}


def billing_admin_role(users: Sequence[str] = (), services: Sequence[str] = ()) -> dict:
    """Billing admins who need not be hub admins (hub admins are billing admins already)."""
    return {
        "name": BILLING_ADMIN_ROLE,
        "description": "Manage everyone's credit, prices, passes and refunds in meterhub.",
        "scopes": [ADMIN_SCOPE, BILLING_ACCESS, "list:users", "read:users:name"],
        "users": list(users),
        "services": list(services),
    }


def is_billing_admin(scopes) -> bool:
    scopes = set(scopes or ())
    return ADMIN_SCOPE in scopes or "admin:users" in scopes


def may_spend(scopes) -> bool:
    return SPEND_SCOPE in set(scopes or ()) or is_billing_admin(scopes)
