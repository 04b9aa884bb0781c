"""LTI 1.3 launches in Chromium against an LMS platform this test runs itself: its own RSA
key and JWKS on loopback, an OIDC authorization endpoint that signs the id_token with the
nonce the hub sent, and auto-submitted forms, as a real platform's pages do. Nothing calls
meterhub's functions: the browser goes through the hub's /hub/lti13/oauth_login and
/hub/lti13/oauth_callback, and the outcome is read from the ledger and the hub.
"""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger

from .hubprocess import until
from .test_pages import CHROMIUM

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)

CLIENT_ID = "meterhub-tool"
LTI = "https://purl.imsglobal.org/spec/lti/claim/"
ROLE = {
    "Learner": "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner",
    "Instructor": "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor",
    "TA": "http://purl.imsglobal.org/vocab/lis/v2/membership/Instructor#TeachingAssistant",
    "InstitutionInstructor": "http://purl.imsglobal.org/vocab/lis/v2/institution/person#Instructor",
    "SystemAdmin": "http://purl.imsglobal.org/vocab/lis/v2/system/person#Administrator",
}


class Platform:
    """An LMS as far as a launch goes: a page that starts it, an authorization endpoint
    that answers with a signed id_token, and the JWKS. `key` signs; `jwks_key` is published
    (a different one makes a forged launch)."""

    def __init__(self):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.jwks_key = self.key
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.hub_url = ""
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def launch_url(self, user, roles, context="ctx-1", deployment="dep-1", label="ML101"):
        hint = json.dumps(
            {
                "user": user,
                "roles": [ROLE[r] for r in roles],
                "context": context,
                "deployment": deployment,
                "label": label,
            }
        )
        return f"{self.url}/launch?" + urlencode({"user": user, "hint": hint})

    def id_token(self, hint: dict, nonce: str) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": CLIENT_ID,
            "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, hint["user"])),
            "email": f"{hint['user']}@uni.edu",
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            f"{LTI}message_type": "LtiResourceLinkRequest",
            f"{LTI}version": "1.3.0",
            f"{LTI}deployment_id": hint["deployment"],
            f"{LTI}target_link_uri": f"{self.hub_url}/hub/home",
            f"{LTI}resource_link": {"id": "week-1"},
            f"{LTI}roles": hint["roles"],
            f"{LTI}context": {"id": hint["context"], "label": hint["label"], "title": "ML"},
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "k1"})

    def _handler(self):
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, body: str, ctype: str = "text/html"):
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def form(self, action: str, fields: dict) -> str:
                inputs = "".join(
                    f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                    for k, v in fields.items()
                )
                return (
                    f'<form id="f" method="post" action="{html.escape(action)}">{inputs}</form>'
                    "<script>document.getElementById('f').submit()</script>"
                )

            def do_GET(self):
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                if parts.path == "/jwks":
                    jwk = json.loads(
                        jwt.algorithms.RSAAlgorithm.to_jwk(platform.jwks_key.public_key())
                    )
                    jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
                    self.send(json.dumps({"keys": [jwk]}), "application/json")
                elif parts.path == "/launch":  # third-party initiated login
                    hint = json.loads(query["hint"])
                    self.send(
                        self.form(
                            f"{platform.hub_url}/hub/lti13/oauth_login",
                            {
                                "iss": platform.url,
                                "login_hint": query["user"],
                                "target_link_uri": f"{platform.hub_url}/hub/home",
                                "lti_message_hint": query["hint"],
                                "client_id": CLIENT_ID,
                                "lti_deployment_id": hint["deployment"],
                            },
                        )
                    )
                elif parts.path == "/auth":  # the authorization endpoint: form_post back
                    hint = json.loads(query["lti_message_hint"])
                    token = platform.id_token(hint, query["nonce"])
                    self.send(
                        self.form(
                            query["redirect_uri"], {"id_token": token, "state": query["state"]}
                        )
                    )
                else:
                    self.send_response(404)
                    self.end_headers()

        return Handler


@pytest.fixture(scope="module")
def platform():
    p = Platform()
    yield p
    p.close()


@pytest.fixture(scope="module")
def lti_hub(hub_factory, platform):
    hub = hub_factory(
        {
            "auth": {
                "type": "lti13",
                "lti13": {
                    "issuer": platform.url,
                    "client_id": [CLIENT_ID],
                    "authorize_url": f"{platform.url}/auth",
                    "jwks_endpoint": f"{platform.url}/jwks",
                    "username_key": "email",
                },
            },
            "gpus": [],
            "groups": {"sync_interval_seconds": 1},
        },
        name="lti",
    )
    platform.hub_url = hub.url
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    return hub


def launch(browser, platform, *args, **kwargs):
    """A launch in a fresh browser; returns the page where it ended."""
    page = browser.new_context().new_page()
    page.goto(platform.launch_url(*args, **kwargs))
    page.wait_for_load_state("networkidle")
    return page


def roster(hub, course: str) -> dict[str, str]:
    return {m.user_name: m.role for m in hub.ledger.roster(course)}


def test_a_launch_makes_the_course_signs_in_and_each_launch_refreshes_the_role(
    lti_hub, platform, browser
):
    page = launch(browser, platform, "amy", ["Learner"])
    assert "/hub/" in page.url and "/lti13/" not in page.url, page.url
    assert page.locator("#login-main").count() == 0  # signed in, not at a login page
    assert lti_hub.api("GET", "/users/amy@uni.edu").status_code == 200
    (course,) = lti_hub.ledger.courses()
    assert course.name == "ml101"
    assert json.loads(course.lti_key) == [platform.url, "dep-1", "ctx-1"]
    assert roster(lti_hub, "ml101") == {"amy@uni.edu": "student"}
    until(
        lambda: lti_hub.api("GET", "/groups/ml101").json().get("users") == ["amy@uni.edu"],
        "the hub to put amy in the course's group",
    )
    page.context.close()
    # the instructor's launch: the course's staff, with the console
    page = launch(browser, platform, "prof", ["Instructor", "SystemAdmin"])
    assert roster(lti_hub, "ml101")["prof@uni.edu"] == "instructor"
    until(
        lambda: (
            "meterhub-course-instructor-ml101"
            in lti_hub.api("GET", "/users/prof@uni.edu").json()["roles"]
        ),
        "prof's instructor role",
    )
    assert page.goto(f"{lti_hub.url}/hub/courses/ml101").status == 200
    page.context.close()
    # a relaunch as a TA (the sub-role, with the principal role too) refreshes the line
    launch(browser, platform, "prof", ["Instructor", "TA"]).context.close()
    assert roster(lti_hub, "ml101")["prof@uni.edu"] == "ta"
    # institution and system roles are not course roles: off the roster
    launch(browser, platform, "prof", ["InstitutionInstructor", "SystemAdmin"]).context.close()
    assert "prof@uni.edu" not in roster(lti_hub, "ml101")


def test_the_same_context_id_in_another_deployment_is_another_course(lti_hub, platform, browser):
    launch(browser, platform, "bob", ["Learner"], deployment="dep-2").context.close()
    courses = {c.name: json.loads(c.lti_key) for c in lti_hub.ledger.courses()}
    other = [name for name, key in courses.items() if key[1] == "dep-2"]
    assert len(other) == 1 and other[0].startswith("ml101-")  # the label's name is taken
    assert roster(lti_hub, other[0]) == {"bob@uni.edu": "student"}
    assert "bob@uni.edu" not in roster(lti_hub, "ml101")
    # the label changes in the LMS: the course is found by its key, not renamed
    launch(
        browser, platform, "bob", ["Learner"], deployment="dep-2", label="ML 101 (Spring)"
    ).context.close()
    assert len(lti_hub.ledger.courses()) == len(courses)


def test_a_forged_launch_signs_no_one_in_and_writes_nothing(lti_hub, platform, browser):
    before = [(c.name, roster(lti_hub, c.name)) for c in lti_hub.ledger.courses()]
    platform.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    try:
        page = launch(browser, platform, "mallory", ["Instructor"], context="ctx-evil")
        assert lti_hub.api("GET", "/users/mallory@uni.edu").status_code == 404
        page.context.close()
    finally:
        platform.key = platform.jwks_key
    assert [(c.name, roster(lti_hub, c.name)) for c in lti_hub.ledger.courses()] == before
