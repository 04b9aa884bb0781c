"""Local accounts for the embedded default and small deployments.

NativeAuthenticator (maintained by the JupyterHub community) keeps the accounts: sign-up,
bcrypt-hashed passwords, admin approval, password changes. Its own /login handler times
sign-ins with the statsd client JupyterHub 6 removed, so it fails there; JupyterHub's own
login page calls the same `authenticate()`, and is what this subclass leaves in place.

Three of its handlers are replaced. Sign-up says which user names are allowed instead of
a generic "something went wrong". Approving, revoking and discarding an account changed
state on a GET (`/hub/authorize/NAME` toggled approval, `/hub/discard/NAME` deleted), so
any page an admin opened could approve an account; here they are XSRF-checked POSTs from
the Authorize users page (`hub/templates/authorization-area.html`), and a GET answers 405.
"""

from __future__ import annotations

from jupyterhub.scopes import needs_scope
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import DiscardHandler as NativeDiscardHandler
from nativeauthenticator.handlers import LocalBase, ToggleAuthorizationHandler
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler
from nativeauthenticator.handlers import SignUpHandler as NativeSignUpHandler
from nativeauthenticator.orm import UserInfo
from tornado import web

from meterhub.i18n import N_, _

from .accounts import USERNAME_RULE

#: what approval and discard answer to a GET
POST_ONLY = "POST"

#: what JupyterHub's login and NativeAuthenticator's sign-up say, translated where the pages
#: show them (`{{ _(login_error) }}`, `{{ _(result_message) }}`)
UPSTREAM_MESSAGES = (
    N_("Invalid username or password"),
    N_("You failed the reCAPTCHA. Please try again"),
    N_(
        "Something went wrong!\nIt appears that this username is already in use. Please try"
        " again with a different username."
    ),
    N_("Your password did not match the confirmation. Please try again."),
    N_(
        "Something went wrong!\nBe sure your username does not contain spaces, commas or"
        " slashes and your password is not too common."
    ),
    N_("The signup was successful! You can now go to the home page and log in to the system."),
    N_("Your information has been sent to the admin."),
    N_("The signup was successful! Check your email to authorize your access."),
)


class SignUpHandler(NativeSignUpHandler):
    """/hub/signup: a name outside the rule is refused with the rule, and a name the hub
    already has is refused, before anything else."""

    async def post(self):
        if not self.authenticator.enable_signup:
            raise web.HTTPError(404)
        raw = self.get_body_argument("username", "", strip=False)
        name = self.authenticator.normalize_username(raw)
        if not self.authenticator.validate_username(name):
            message = _("That user name is not allowed: use %(rule)s.", rule=_(USERNAME_RULE))
        elif self.find_user(name) is not None:
            # an account the hub already has (made by an admin, with no password yet) is
            # not anyone's to claim by signing up with its name
            message = _("That user name is already in use.")
        else:
            return await super().post()
        self.set_status(400)
        html = await self.render_template(
            "signup.html",
            ask_email=self.authenticator.ask_email_on_signup,
            result_message=message,
            alert="alert-danger",
            two_factor_auth=self.authenticator.allow_2fa,
            recaptcha_key=self.authenticator.recaptcha_key,
            tos=self.authenticator.tos,
        )
        self.finish(html)


class _AdminPostHandler(LocalBase):
    """A state change on one account: a POST (XSRF-checked by JupyterHub's BaseHandler for
    cookie-authenticated requests) by a holder of `admin:users`; a GET answers 405."""

    def get(self, name):
        raise web.HTTPError(
            405, "%s", _("This changes an account: use the buttons on the Authorize users page.")
        )

    head = get

    def write_error(self, status_code, **kwargs):
        # send_error() clears the headers set before it: add Allow here
        if status_code == 405:
            self.set_header("Allow", POST_ONLY)
        super().write_error(status_code, **kwargs)

    def find_account(self, name: str) -> UserInfo:
        info = UserInfo.find(self.db, name)
        if info is None:
            raise web.HTTPError(
                404, "%s", _("No account %(name)s is waiting or approved.", name=repr(name))
            )
        return info

    def back_to_authorize(self):
        self.redirect(self.hub.base_url + "authorize")


class ApproveHandler(_AdminPostHandler):
    """POST /hub/authorize/NAME with `action=approve` or `action=revoke`."""

    # `name`, not `user_name`: the unfiltered admin:users scope is needed, not one filtered
    # to the user (a pending account has no hub user yet)
    @needs_scope("admin:users")
    async def post(self, name):
        action = self.get_body_argument("action", "")
        if action not in ("approve", "revoke"):
            raise web.HTTPError(400, "action must be 'approve' or 'revoke'")
        if action == "revoke" and name == self.current_user.name:
            raise web.HTTPError(400, "%s", _("You cannot revoke your own account."))
        info = self.find_account(name)
        info.is_authorized = action == "approve"
        self.db.commit()
        self.log.info("%s %s the account %r", self.current_user.name, action + "d", name)
        self.back_to_authorize()


class DiscardHandler(_AdminPostHandler):
    """POST /hub/discard/NAME: deletes a sign-up that is still waiting for approval.

    Only NativeAuthenticator's row goes; a hub user of the same name (made by the admin API,
    say) is not NativeAuthenticator's to delete.
    """

    @needs_scope("admin:users")
    async def post(self, name):
        info = self.find_account(name)
        if info.is_authorized:
            raise web.HTTPError(
                409,
                _(
                    "%(name)s is approved: revoke it first, or delete the user as admin.",
                    name=repr(name),
                ),
            )
        self.db.delete(info)
        self.db.commit()
        self.log.info("%s discarded the sign-up %r", self.current_user.name, name)
        self.back_to_authorize()


#: NativeAuthenticator's handler classes and what replaces them (None: dropped)
REPLACED_HANDLERS = {
    NativeLoginHandler: None,
    NativeSignUpHandler: SignUpHandler,
    ToggleAuthorizationHandler: ApproveHandler,
    NativeDiscardHandler: DiscardHandler,
}


class MeterNativeAuthenticator(NativeAuthenticator):
    def get_handlers(self, app):
        handlers = []
        for path, handler in super().get_handlers(app):
            handler = REPLACED_HANDLERS.get(handler, handler)
            if handler is not None:
                handlers.append((path, handler))
        return handlers
