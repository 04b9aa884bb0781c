"""Who may call what: every billing route × method and every money page × actor, in one table.

The rows are checked against the route tables themselves (billing's `api.ROUTES` and the
hub's `PAGE_HANDLERS`): a route or method without a row here fails the test, so a new money
route cannot be born without deciding who may call it.

Actors act on amy's data: `user` is amy's own API token, `other` is ben's, `admin` a hub
admin's full token, `admin_narrow` the same admin's token scoped only to reach billing,
`kernel` the token amy's running server holds (what code in a notebook can read),
`billing` the billing service's own token, `admin_service` the operator's service token
(METERHUB_ADMIN_TOKEN), `group_admin` the token of pia, the admin (PI) of the group `lab`
that amy belongs to and ben does not — no hub admin; `instructor` and `ta` the tokens of ira
and tom, the instructor and the TA of the course `ml101` whose student amy is. On the hub's pages, `user_cookie` and `admin_cookie` are amy and the
admin signed in with a browser session; tokens do not open pages.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
from tornado import web

from meterhub.billing_hooks import api
from meterhub.hub.config import PAGE_HANDLERS

from .hubprocess import ADMIN_TOKEN, until
from .test_pages import METERHUB, PASSWORD, admin_password, session_of

USER, OTHER, PI, GROUP = "amy", "ben", "pia", "lab"
INSTRUCTOR, TA, COURSE = "ira", "tom", "ml101"
A = (
    "anonymous",
    "user",
    "other",
    "admin",
    "admin_narrow",
    "kernel",
    "billing",
    "admin_service",
    "group_admin",
    "instructor",
    "ta",
)


def row(
    anonymous,
    user,
    other,
    admin,
    admin_narrow,
    kernel,
    billing,
    admin_service,
    group_admin=None,
    instructor=None,
    ta=None,
) -> dict:
    """Expected statuses; the group admin and the course's staff are, to amy's own data
    and where not given, just other users."""
    staff = tuple(other if v is None else v for v in (group_admin, instructor, ta))
    values = (anonymous, user, other, admin, admin_narrow, kernel, billing, admin_service)
    return dict(zip(A, (*values, *staff), strict=True))


PUBLIC = row(200, 200, 200, 200, 200, 200, 200, 200)
#: amy's data: amy (any of her tokens), billing admins; nobody else
OWN = row(403, 200, 403, 200, 403, 200, 403, 200)

A_PASS = {"profile": "a800", "gpus": 1, "period": "daily"}
#: a well-formed voucher code no voucher has
UNKNOWN_CODE = "7KQ2M-X9D4R-0BN3S-W8TZE"

#: (method, path in openapi.yaml) -> (body, expected status per actor)
API = {
    ("GET", "/health"): (None, PUBLIC),
    ("GET", "/openapi.json"): (None, PUBLIC),
    # the caller's own wallet; a service has none
    ("GET", "/wallet"): (None, row(403, 200, 200, 200, 200, 200, 403, 400)),
    # redeeming a voucher into one's own wallet: any of a user's spend-scoped tokens (an
    # unknown code: 404, nothing written); not a server's token, not a service (no wallet)
    ("POST", "/wallet/redeem"): (
        {"code": UNKNOWN_CODE},
        row(403, 404, 404, 404, 403, 403, 403, 400),
    ),
    # the payment provider's hook: its HMAC signature, never a hub token, whoever's it is
    ("POST", "/topups"): (
        {"transaction": "matrix", "user": USER, "amount": "0.01"},
        row(401, 401, 401, 401, 401, 401, 401, 401, 401, 401, 401),
    ),
    ("GET", "/users/{name}/wallet"): (None, OWN),
    ("GET", "/users/{name}/usage"): (None, OWN),
    ("GET", "/users/{name}/notifications"): (None, OWN),
    ("GET", "/users/{name}/passes"): (None, OWN),
    # the owner only, from any of her tokens (JupyterLab marks with the server's token)
    ("POST", "/users/{name}/notifications/read"): (
        {"ids": []},
        row(403, 200, 403, 403, 403, 200, 403, 403),
    ),
    # spending: amy's spend-scoped token or a billing admin; the kernel's token may not.
    # 402: amy's ¥10 trial credit does not buy a ¥97.20 pass, so nothing is written
    ("POST", "/users/{name}/passes"): (A_PASS, row(403, 402, 403, 402, 403, 403, 403, 402)),
    ("POST", "/users/{name}/grants"): (
        {"amount": "0.01"},
        row(403, 403, 403, 201, 403, 403, 403, 201),
    ),
    ("POST", "/users/{name}/adjustments"): (
        {"amount": "0.01", "reason": "matrix"},
        row(403, 403, 403, 201, 403, 403, 403, 201),
    ),
    # an admin gets past the gate to the session, which does not exist
    ("POST", "/sessions/{session_id}/refunds"): (
        {"reason": "matrix"},
        row(403, 403, 403, 404, 403, 403, 403, 404),
    ),
    ("GET", "/prices"): (None, row(403, 200, 200, 200, 200, 200, 403, 200)),
    ("GET", "/prices/{profile}"): (None, row(403, 200, 200, 200, 200, 200, 403, 200)),
    ("PUT", "/prices/{profile}"): (
        {"price_per_hour": "0.10"},
        row(403, 403, 403, 200, 403, 403, 403, 200),
    ),
    # the group lab: its members read it (any token of amy's, as her own wallet: reading
    # only), its admin and billing admins manage it; only billing admins make money
    ("GET", "/groups/{group}"): (None, row(403, 200, 403, 200, 403, 200, 403, 200, 200)),
    ("POST", "/groups/{group}/grants"): (
        {"amount": "0.01"},
        row(403, 403, 403, 201, 403, 403, 403, 201, 403),
    ),
    ("PUT", "/groups/{group}/caps/{name}"): (
        {"amount": "1.00"},
        row(403, 403, 403, 200, 403, 403, 403, 200, 200),
    ),
    ("GET", "/groups/{group}/usage"): (None, row(403, 403, 403, 200, 403, 403, 403, 200, 200)),
    # the course ml101: its TA and instructor, billing admins; not its students, nor a PI
    ("GET", "/courses/{course}"): (
        None,
        row(403, 403, 403, 200, 403, 403, 403, 200, 403, 200, 200),
    ),
    ("GET", "/courses/{course}/usage"): (
        None,
        row(403, 403, 403, 200, 403, 403, 403, 200, 403, 200, 200),
    ),
    # changing it: its instructor and billing admins; not its TA
    ("PATCH", "/courses/{course}"): (
        {"debug_outside_windows": True},
        row(403, 403, 403, 200, 403, 403, 403, 200, 403, 200, 403),
    ),
    ("PUT", "/courses/{course}/roster"): (
        {"roster": [{"username": USER}]},
        row(403, 403, 403, 200, 403, 403, 403, 200, 403, 200, 403),
    ),
}

#: (method, path under /services/billing) -> (body, expected status per actor): the billing
#: service's routes outside the REST API (api.SERVICE_ROUTES)
SERVICE = {
    # Prometheus metrics: JupyterHub's read:metrics scope, which hub admins (and the
    # operator's admin service) have; nobody else here. Never a redirect to a login page
    ("GET", "/metrics"): (None, row(403, 403, 403, 200, 403, 403, 403, 200)),
}

#: hub pages take a browser session (cookie + XSRF), never a token: a token there is anonymous
P = (
    "anonymous",
    "user_cookie",
    "admin_cookie",
    "pi_cookie",
    "instructor_cookie",
    "user",
    "admin",
    "kernel",
)


def page_row(anonymous, user_cookie, admin_cookie, pi_cookie=None, instructor_cookie=None) -> dict:
    """Expected statuses; to amy's own pages the PI and the instructor are just other
    signed-in users."""
    pi_cookie = user_cookie if pi_cookie is None else pi_cookie
    instructor_cookie = user_cookie if instructor_cookie is None else instructor_cookie
    tokens = {"user": anonymous, "admin": anonymous, "kernel": anonymous}
    cookies = (anonymous, user_cookie, admin_cookie, pi_cookie, instructor_cookie)
    return dict(zip(P[:5], cookies, strict=True)) | tokens


OWN_PAGE = page_row(302, 200, 200)
ADMIN_PAGE = page_row(302, 403, 200)
#: the group lab's page: its member amy, its admin pia and the hub admin; not ira
GROUP_PAGE = page_row(302, 200, 200, 200, 403)

#: (method, hub page) -> (form, expected status per actor); each acts as its own user
PAGES = {
    ("GET", "/wallet"): (None, OWN_PAGE),
    ("GET", "/wallet/passes"): (None, OWN_PAGE),
    ("GET", "/wallet/usage.csv"): (None, OWN_PAGE),
    # 402: nobody here can afford the pass, and nothing is written
    ("POST", "/wallet/passes"): ({"offer": "a800:1:daily"}, page_row(403, 402, 402)),
    ("GET", "/wallet/redeem"): (None, OWN_PAGE),
    # an unknown code: refused for each signed-in user, into their own wallet only
    ("POST", "/wallet/redeem"): ({"code": UNKNOWN_CODE}, page_row(403, 404, 404)),
    # the prices: for anyone, signed in or not (the sign-in page links them)
    ("GET", "/prices"): (None, page_row(200, 200, 200)),
    ("GET", "/billing-admin"): (None, ADMIN_PAGE),
    ("GET", "/billing-admin/grant"): (None, ADMIN_PAGE),
    ("POST", "/billing-admin/grant"): (
        {"user": USER, "amount": "0.01", "note": "matrix"},
        page_row(403, 403, 200),
    ),
    ("GET", "/groups/([^/]+)"): (None, GROUP_PAGE),
    ("GET", "/groups/([^/]+)/caps"): (None, GROUP_PAGE),
    ("GET", "/groups/([^/]+)/stop"): (None, GROUP_PAGE),
    # a member may not set caps or stop servers; the group's admin and the hub admin may
    ("POST", "/groups/([^/]+)/caps"): (
        {"user": USER, "amount": "1.00", "period": "month"},
        page_row(403, 403, 200, 200, 403),
    ),
    # a server amy does not have (stopping her real one would end the kernel's rows): the
    # admins get past every gate to the 404
    ("POST", "/groups/([^/]+)/stop"): (
        {"user": USER, "server": "none-such"},
        page_row(403, 403, 404, 404, 403),
    ),
    ("GET", "/groups/([^/]+)/statement.csv"): (None, page_row(302, 403, 200, 200, 403)),
    # the course ml101's console: its staff and the hub admin; not its student amy, nor a PI
    ("GET", "/courses/([^/]+)"): (None, page_row(302, 403, 200, 403, 200)),
    ("GET", "/courses/([^/]+)/usage.csv"): (None, page_row(302, 403, 200, 403, 200)),
    ("GET", "/courses/([^/]+)/stop"): (None, page_row(302, 403, 200, 403, 200)),
    ("GET", "/courses/([^/]+)/stop-all"): (None, page_row(302, 403, 200, 403, 200)),
    # amy's server runs on her own money: the staff get past every gate to the 404
    ("POST", "/courses/([^/]+)/stop"): (
        {"user": USER, "server": ""},
        page_row(403, 403, 404, 403, 404),
    ),
    ("POST", "/courses/([^/]+)/stop-all"): ({}, page_row(403, 403, 200, 403, 200)),
    # amy's server runs: the staff get past every gate to "stop it first"
    # the settings form: the instructor and the hub admin (an empty allowance: none)
    ("GET", "/courses/([^/]+)/settings"): (None, page_row(302, 403, 200, 403, 200)),
    ("POST", "/courses/([^/]+)/settings"): (
        {"per": "total", "debug_outside_windows": "yes"},
        page_row(403, 403, 200, 403, 200),
    ),
    ("GET", "/courses/([^/]+)/reset"): (None, page_row(302, 403, 200, 403, 200)),
    ("POST", "/courses/([^/]+)/reset"): (
        {"user": USER, "confirm": "yes"},
        page_row(403, 403, 409, 403, 409),
    ),
    ("GET", "/courses/([^/]+)/restore"): (None, page_row(302, 403, 200, 403, 200)),
    ("POST", "/courses/([^/]+)/restore"): (
        {"user": USER, "archive": "20270101T000000Z-x.tar.gz"},
        page_row(403, 403, 409, 403, 409),
    ),
}

METHODS = ("get", "post", "put", "patch", "delete")


def implemented(handler: type) -> set[str]:
    """The HTTP methods a tornado handler class implements itself."""
    return {
        m.upper()
        for m in METHODS
        if getattr(handler, m, None) is not getattr(web.RequestHandler, m)
    }


def test_every_billing_route_and_method_has_a_row():
    routes = {(method, path) for path, _pattern, handler in api.ROUTES for method in handler.access}
    for path, _pattern, handler in api.ROUTES:
        assert implemented(handler) == set(handler.access), (path, "access and methods differ")
    assert routes == set(API), f"rows missing: {routes - set(API)}; stale rows: {set(API) - routes}"


def test_every_billing_service_route_and_method_has_a_row():
    routes = {
        (method, path)
        for path, _pattern, handler in api.SERVICE_ROUTES
        for method in handler.access
    }
    for path, _pattern, handler in api.SERVICE_ROUTES:
        assert implemented(handler) == set(handler.access), (path, "access and methods differ")
    assert routes == set(SERVICE), (
        f"missing: {routes - set(SERVICE)}; stale: {set(SERVICE) - routes}"
    )


def test_every_money_page_and_method_has_a_row():
    pages = set()
    for pattern, dotted in PAGE_HANDLERS:
        module, name = dotted.rsplit(".", 1)
        handler = getattr(importlib.import_module(module), name)
        pages |= {(method, pattern) for method in implemented(handler)}
    assert pages == set(PAGES), f"rows missing: {pages - set(PAGES)}; stale: {set(PAGES) - pages}"


def process_env(match) -> dict:
    """The environment of the first process whose environment satisfies `match`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
        if match(env):
            return env
    raise AssertionError("no such process")


@pytest.fixture(scope="module")
def matrix_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "a800", "count": 1}],
            "billing": {"trial_credit": "10.00", "topup_secret": "matrix-" + "s" * 32},
        },
        name="matrix",
    )
    for name in (USER, OTHER, PI, INSTRUCTOR, TA):
        add = [METERHUB, "user", "add", name, "--password-stdin", "--config", str(hub.config_path)]
        out = subprocess.run(add, input=PASSWORD, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    api_url = f"http://127.0.0.1:{hub.site['hub']['api_port']}"

    def token(name, **body):
        r = hub.api("POST", f"/users/{name}/tokens", json={"note": "matrix", **body})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    config = ["--config", str(hub.config_path)]
    for command in (["create", GROUP, "--admin", PI], ["add", GROUP, USER]):
        out = subprocess.run([METERHUB, "group", *command, *config], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    course = ["create", COURSE, "--instructor", INSTRUCTOR, "--ta", TA]
    out = subprocess.run([METERHUB, "course", *course, *config], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    roster = hub.workdir / "roster.csv"
    roster.write_text(f"username\n{USER}\n")
    out = subprocess.run(
        [METERHUB, "course", "roster", COURSE, str(roster), *config], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    until(
        lambda: (
            hub.api("GET", f"/groups/{GROUP}").json().get("users") == [USER]
            and hub.api("GET", f"/groups/{COURSE}").json().get("users") == [USER]
            and f"meterhub-course-ta-{COURSE}" in hub.api("GET", f"/users/{TA}").json()["roles"]
        ),
        "the hub to apply the group and the course",
    )
    hub.spawn(USER, {"profile": "debug"})
    kernel = process_env(
        lambda e: (
            e.get("JUPYTERHUB_USER") == USER
            and e.get("JUPYTERHUB_API_URL", "").startswith(api_url)
            and "JUPYTERHUB_API_TOKEN" in e
        )
    )["JUPYTERHUB_API_TOKEN"]
    billing = process_env(
        lambda e: (
            e.get("JUPYTERHUB_SERVICE_NAME") == "billing"
            and e.get("JUPYTERHUB_API_URL", "").startswith(api_url)
        )
    )["JUPYTERHUB_API_TOKEN"]
    hub.tokens = {
        "anonymous": None,
        "user": token(USER),
        "other": token(OTHER),
        "admin": token("admin"),
        "admin_narrow": token("admin", scopes=["access:services!service=billing"]),
        "kernel": kernel,
        "billing": billing,
        "admin_service": ADMIN_TOKEN,
        "group_admin": token(PI),
        "instructor": token(INSTRUCTOR),
        "ta": token(TA),
    }
    yield hub
    hub.stop_server(USER)


def xsrf(session) -> str:
    """The hub's XSRF token for this session (its cookie on the hub's path)."""
    return next(c.value for c in session.cookies if c.name == "_xsrf" and c.path == "/hub/")


def concrete(path: str) -> str:
    return path.format(name=USER, session_id=999999, profile="debug", group=GROUP, course=COURSE)


def token_headers(hub, actor: str) -> dict:
    token = hub.tokens[actor]
    return {"Authorization": f"token {token}"} if token else {}


@pytest.mark.parametrize("method,path", sorted(API))
def test_billing_api_answers_each_actor_as_the_table_says(matrix_hub, method, path):
    body, expected = API[(method, path)]
    url = f"{matrix_hub.url}/services/billing/api/v1{concrete(path)}"
    got = {
        actor: requests.request(
            method,
            url,
            headers=token_headers(matrix_hub, actor),
            json=body,
            allow_redirects=False,
            timeout=60,
        ).status_code
        for actor in A
    }
    assert got == expected


@pytest.mark.parametrize("method,path", sorted(SERVICE))
def test_billing_service_answers_each_actor_as_the_table_says(matrix_hub, method, path):
    body, expected = SERVICE[(method, path)]
    url = f"{matrix_hub.url}/services/billing{path}"
    got = {
        actor: requests.request(
            method,
            url,
            headers=token_headers(matrix_hub, actor),
            json=body,
            allow_redirects=False,
            timeout=60,
        ).status_code
        for actor in A
    }
    assert got == expected


def page_status(hub, actor: str, method: str, path: str, form: dict | None) -> int:
    """What the page answers this actor: a signed-in browser session (with the form's
    XSRF token) or a bare request with the actor's token."""
    if actor.endswith("_cookie"):
        who = {
            "admin_cookie": ("admin", admin_password(hub)),
            "pi_cookie": (PI, PASSWORD),
            "instructor_cookie": (INSTRUCTOR, PASSWORD),
            "user_cookie": (USER, PASSWORD),
        }[actor]
        session, headers = session_of(hub, *who), {}
        data = None if form is None else {**form, "_xsrf": xsrf(session)}
    else:
        session, headers, data = requests.Session(), token_headers(hub, actor), form
    if data is not None:
        data = {**data, "key": str(uuid.uuid4())}
    r = session.request(
        method,
        f"{hub.url}/hub{path.replace('([^/]+)', COURSE if 'courses' in path else GROUP)}",
        headers=headers,
        data=data,
        allow_redirects=False,
        timeout=60,
    )
    return r.status_code


@pytest.mark.parametrize("method,path", sorted(PAGES))
def test_money_pages_answer_each_actor_as_the_table_says(matrix_hub, method, path):
    form, expected = PAGES[(method, path)]
    got = {actor: page_status(matrix_hub, actor, method, path, form) for actor in P}
    assert got == expected


def test_a_signed_in_admin_cannot_be_made_to_post_without_the_xsrf_token(matrix_hub):
    session = session_of(matrix_hub, "admin", admin_password(matrix_hub))
    r = session.post(
        f"{matrix_hub.url}/hub/billing-admin/grant",
        data={"user": USER, "amount": "5", "key": "csrf"},
        allow_redirects=False,
    )
    assert r.status_code == 403


def test_an_admin_made_by_user_add_stays_admin_and_new_accounts_get_their_roles(hub_factory):
    """`meterhub user add --admin` is kept across restarts although the operator's service
    token defines the admin role; an account added while the hub runs has the user role
    (its server's token can reach billing) before it ever signs in."""
    hub = hub_factory({"gpus": []}, name="roles")

    def add(name, *extra):
        add = [METERHUB, "user", "add", name, "--password-stdin", "--config", str(hub.config_path)]
        out = subprocess.run(
            [*add, *extra], input=PASSWORD, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr

    add("pat")
    assert "user" in hub.api("GET", "/users/pat").json()["roles"]
    add("boss", "--admin")
    hub.restart()
    boss = hub.api("GET", "/users/boss").json()
    assert boss["admin"] is True and "admin" in boss["roles"]
    # and billing sees boss's token as an admin's, pat's as a user's
    tokens = {}
    for name in ("boss", "pat"):
        r = hub.api("POST", f"/users/{name}/tokens", json={"note": "roles"})
        tokens[name] = r.json()["token"]
    url = f"{hub.url}/services/billing/api/v1/users/pat/grants"
    for name, status in (("pat", 403), ("boss", 201)):
        r = requests.post(
            url,
            headers={"Authorization": f"token {tokens[name]}"},
            json={"amount": "1.00"},
            timeout=60,
        )
        assert r.status_code == status, (name, r.text)
