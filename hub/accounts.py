"""Local accounts: NativeAuthenticator's users, made from the command line or at first start.

`meterhub user add NAME [--admin] --password-stdin` writes the same rows NativeAuthenticator
writes at sign-up (a bcrypt hash in its `users_info` table, authorized) plus the hub's user
row, in the hub's database, so the account signs in on the normal login page at once. It
also opens the wallet with the trial credit, as the hub does for accounts it creates.
"""

from __future__ import annotations

import logging
import os
import re

import bcrypt

from meterhub.i18n import N_, _

#: The one user-name rule, for every way in: sign-up, the login page, OAuth, the admin API
#: (`Authenticator.username_pattern`) and `meterhub user add`. JupyterHub lower-cases a name
#: before it checks it. No whitespace, quotes or markup can pass, so a name is safe in HTML,
#: in a URL path and in the sandbox's passwd line; `@` lets OpenID Connect providers that
#: name people by e-mail (Azure AD's `preferred_username`, Google) sign in. `\Z`, not `$`:
#: `$` also matches before a trailing newline.
USERNAME_PATTERN = r"^[a-z0-9][a-z0-9._@-]{0,63}\Z"
USERNAME_RULE = N_(
    "lower-case letters, digits, '.', '_', '-' or '@', starting with a letter or digit,"
    " at most 64 characters"
)
NAME = re.compile(USERNAME_PATTERN)


class AccountError(ValueError):
    """An account that cannot be made; the message is for people."""


def hub_db_url(site: dict) -> str:
    return "sqlite:///" + os.path.join(site["data_dir"], "jupyterhub.sqlite")


def check_password(site: dict, password: str) -> None:
    minimum = site["auth"]["minimum_password_length"]
    if len(password) < minimum:
        raise AccountError(
            _("the password is too short: at least %(minimum)s characters", minimum=minimum)
        )
    from nativeauthenticator import NativeAuthenticator

    if NativeAuthenticator(add_new_table=False).is_password_common(password):
        raise AccountError(_("that password is one of the most common ones; choose another"))


def add_user(site: dict, name: str, password: str, admin: bool = False, replace: bool = False):
    """Create (or with `replace`, reset) a local account that can sign in; returns created."""
    if not NAME.match(name):
        raise AccountError(
            _("invalid user name %(name)s: %(rule)s", name=repr(name), rule=_(USERNAME_RULE))
        )
    check_password(site, password)
    from jupyterhub import orm
    from nativeauthenticator.orm import UserInfo

    os.makedirs(site["data_dir"], mode=0o711, exist_ok=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # no migration chatter in the CLI
    # JupyterHub's own factory: creates (and stamps) a new hub database exactly as the hub would
    db = orm.new_session_factory(hub_db_url(site))()
    try:
        info = UserInfo.find(db, name)
        if info is not None and not replace:
            raise AccountError(_("user %(name)s already exists", name=repr(name)))
        user = orm.User.find(db, name)
        if user is None:
            user = orm.User(name=name)
            db.add(user)
        if admin:
            user.admin = True
        if orm.Role.find(db, "user") is not None:
            # the hub has run: give the account its roles now, as JupyterHub does for the
            # users it creates (a new database gets them when the hub first starts)
            from jupyterhub import roles

            db.flush()
            roles.assign_default_roles(db, entity=user)
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        created = info is None
        if created:
            db.add(UserInfo(username=name, password=hashed, is_authorized=True))
        else:
            info.password = hashed
            info.is_authorized = True
        db.commit()
        return created
    finally:
        db.close()
