"""LTI 1.3 sign-in from an LMS (jupyterhub-ltiauthenticator), making and updating courses.

A launch is an OpenID Connect implicit flow that the LMS (the platform) starts: the hub
redirects to the platform's authorization endpoint, which posts back a signed id_token. The
library verifies it: the signature against the platform's JWKS, the issuer, the audience,
the nonce and the state. Then this authenticator reads the launch's context:

- The course is keyed by issuer + deployment id + context id. Context ids are unique only
  within one deployment. The first launch from a context makes the course, named after the
  context's label. A later launch finds it by its key, even if the label has changed.
- The person's role in it comes from the course-level membership roles only: Instructor,
  its TeachingAssistant sub-role, and Learner. Institution and system roles are not course
  roles: an "institution Instructor" launching as a Learner is a student.
- Each launch refreshes the person's line in the roster. Someone who launches with no
  course role is taken off it.

The state and nonce cookies must come back on the platform's cross-site POST. Over https
they are `SameSite=None; Secure`; the hub's other cookies stay `Lax`.
"""

from __future__ import annotations

import asyncio
import logging

from jupyterhub import orm
from ltiauthenticator.lti13.auth import LTI13Authenticator
from ltiauthenticator.lti13.handlers import LTI13LoginInitHandler
from tornado import web

from meterhub.billing_hooks.settings import billing_settings_of
from meterhub.billing_hooks.wallets import USER_NAME
from meterhub.i18n import _

log = logging.getLogger("meterhub.lti")

LTI = "https://purl.imsglobal.org/spec/lti/claim/"
MEMBERSHIP = "http://purl.imsglobal.org/vocab/lis/v2/membership#"
TA_SUB_ROLE = "http://purl.imsglobal.org/vocab/lis/v2/membership/Instructor#TeachingAssistant"


def course_role(roles: object) -> str | None:
    """The roster role that a launch's roles claim gives: "instructor", "ta", "student",
    or None when it has no course-level membership role. The TA sub-role wins over
    Instructor: a platform may send both for a TA, and a TA must not get the instructor's
    powers."""
    if not isinstance(roles, list):
        return None
    held = {r for r in roles if isinstance(r, str)}
    if TA_SUB_ROLE in held:
        return "ta"
    if f"{MEMBERSHIP}Instructor" in held:
        return "instructor"
    if f"{MEMBERSHIP}Learner" in held:
        return "student"
    return None


def launch_facts(claims: dict) -> tuple[str, str, str, str] | None:
    """(issuer, deployment id, context id, label) of a launch that has a context, else None."""
    context = claims.get(f"{LTI}context")
    deployment = claims.get(f"{LTI}deployment_id")
    issuer = claims.get("iss")
    if not isinstance(context, dict) or not isinstance(context.get("id"), str):
        return None
    if not isinstance(deployment, str) or not isinstance(issuer, str):
        return None
    label = context.get("label") or context.get("title") or context["id"]
    return issuer, deployment, context["id"], str(label)


class MeterLTI13LoginInitHandler(LTI13LoginInitHandler):
    def _set_oauth_cookie(self, key: str, value):
        cross_site = (
            {"samesite": "None", "secure": True} if self.request.protocol == "https" else {}
        )
        self._set_cookie(key, value, expires_days=1, httponly=True, encrypted=True, **cross_site)


class MeterLTI13Authenticator(LTI13Authenticator):
    """LTI 1.3 sign-in whose launches make and update meterhub courses."""

    login_handler = MeterLTI13LoginInitHandler

    async def authenticate(self, handler, data=None):
        result = await super().authenticate(handler, data)
        name = str(result["name"]).strip().lower()
        if not USER_NAME.match(name):
            raise web.HTTPError(
                403,
                "%s",
                _("The LMS sent a user name this hub cannot use: ask its admin about username_key"),
            )
        result["name"] = name
        facts = launch_facts(data or {})
        if facts is not None:
            role = course_role((data or {}).get(f"{LTI}roles"))
            # the hub's own groups (not courses') are no course's name: the sync would
            # hand their scopes and profiles to the roster
            taken = {
                g.name
                for g in handler.db.query(orm.Group)
                if not (g.properties or {}).get("course")
            }
            ledger = await billing_settings_of(self.config).ledger_async()
            course = await asyncio.to_thread(ledger.lti_launch, *facts, name, role, taken)
            log.info("LTI launch by %s into course %s as %s", name, course, role or "no role")
        return result
