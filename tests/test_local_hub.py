"""A real hub spawning real sandboxed servers: profiles, GPUs, disks, /public, restarts."""

from __future__ import annotations

import json
import os

import pytest
import requests

from meterhub.spawner.local import group_has_live_members

from .hubprocess import ADMIN_TOKEN, until
from .jupyter import KernelError, execute

PROBE = """
import json, os
print(json.dumps({
    "uid": os.getuid(),
    "gid": os.getgid(),
    "cwd": os.getcwd(),
    "home": os.environ.get("HOME"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "nvidia": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    "profile": os.environ.get("METERHUB_PROFILE"),
    "gpus": os.environ.get("METERHUB_GPUS"),
    "public": sorted(os.listdir("/public")),
    "home_dirs": sorted(os.listdir("/home")),
}))
"""


async def probe(hub, user: str) -> dict:
    return json.loads(await execute(hub.url, user, ADMIN_TOKEN, PROBE))


async def test_debug_server_is_sandboxed_unprivileged_and_gpu_less(hub):
    hub.spawn("dora", {"profile": "debug"})
    facts = await probe(hub, "dora")
    assert facts["uid"] != 0 and facts["gid"] != 0
    if os.geteuid() == 0:
        assert facts["uid"] > 200000  # uid_base + the user's id
    assert facts["cwd"] == facts["home"] == "/home/jovyan"
    assert facts["cuda"] == "" and facts["nvidia"] == "void"
    assert facts["profile"] == "debug" and facts["gpus"] == "0"
    assert "catalog.yaml" in facts["public"] and "models" in facts["public"]
    assert facts["home_dirs"] == ["jovyan"], "other users' disks must be invisible"
    hub.stop_server("dora")


async def test_public_is_read_only_and_data_dir_hidden(hub):
    hub.spawn("pia", {"profile": "debug"})
    code = f"""
import os
try:
    open("/public/catalog.yaml", "a").write("x")
    print("WROTE")
except OSError as e:
    print("refused", e.errno)
print(open("/public/catalog.yaml").read().startswith("models:"))
print(os.path.exists({hub.data_dir!r}))
print(os.path.islink("public"), os.readlink("public"), sorted(os.listdir("public")) == sorted(os.listdir("/public")))
print([line.split()[3].split(",")[0] for line in open("/proc/self/mounts") if line.split()[1] == "/public"])
"""
    out = (await execute(hub.url, "pia", ADMIN_TOKEN, code)).split("\n")
    assert out[0] in ("refused 13", "refused 30"), out  # EACCES or EROFS
    assert out[1] == "True"
    assert out[2] == "False", "the hub's data directory must not be visible in the sandbox"
    assert out[3] == "True /public True"
    assert out[4] == "['ro']", "the pool must be mounted read-only"
    hub.stop_server("pia")


async def test_gpu_spawn_exhaustion_release_and_disk_across_profiles(hub):
    # debug first, leave a file on the disk
    hub.spawn("gus", {"profile": "debug"})
    await execute(hub.url, "gus", ADMIN_TOKEN, "open('notes.txt', 'w').write('kept')")
    hub.stop_server("gus")

    # the same disk on 2 × A800, which sees exactly its GPUs
    server = hub.spawn("gus", {"profile": "a800", "gpus": "2"})
    assert server["state"]["gpu_indices"] == [0, 1]
    facts = await probe(hub, "gus")
    assert facts["cuda"] == "0,1" and facts["nvidia"] == "0,1"
    assert facts["profile"] == "a800" and facts["gpus"] == "2"
    assert await execute(hub.url, "gus", ADMIN_TOKEN, "print(open('notes.txt').read())") == "kept\n"

    # all A800s are taken: refused with what is free, nothing allocated
    hub.ensure_user("hal")
    r = hub.api("POST", "/users/hal/server", json={"profile": "a800", "gpus": "1"})
    assert r.status_code == 409
    assert "All 2 A800 GPUs are in use" in r.json()["message"]
    assert hub.server("hal") is None

    # the RTX 4090 is still free
    server = hub.spawn("hal", {"profile": "rtx4090", "gpus": "1"})
    assert server["state"]["gpu_indices"] == [2]
    hub.stop_server("hal")

    # stopping releases: now hal gets an A800
    hub.stop_server("gus")
    server = hub.spawn("hal", {"profile": "a800", "gpus": "1"})
    assert server["state"]["gpu_indices"] == [0]
    hub.stop_server("hal")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"profile": "a800", "gpus": "3"}, "'gpus' must be one of 1, 2, 4, 8"),
        ({"profile": "a100", "gpus": "1"}, "Unknown profile 'a100'"),
        ({"profile": "a800"}, "needs 'gpus'"),
        ({"profile": "debug", "gpus": "1"}, "Debug mode has no GPUs"),
        ({"profile": "debug", "image": "evil:latest"}, "Unknown option 'image'"),
        ({"profile": "h800", "gpus": "1"}, "H800 is limited to the groups staff"),
        ({"profile": "a800", "gpus": "8"}, "8 × A800 is limited to the groups staff"),
    ],
)
def test_bad_options_are_refused_with_a_message(hub, options, message):
    hub.ensure_user("ivy")
    r = hub.api("POST", "/users/ivy/server", json=options)
    assert 400 <= r.status_code < 500, r.text
    assert message in r.json()["message"]
    assert hub.server("ivy") is None
    free = until(lambda: _free_gpus(hub) == 3 and 3, "GPUs to be free")
    assert free == 3


def test_group_restrictions_hold_whatever_is_posted(hub):
    hub.ensure_user("ora")
    r = hub.api("POST", "/users/ora/server", json={"profile": "h800", "gpus": "1"})
    assert r.status_code == 403 and "limited to the groups staff" in r.json()["message"]
    r = hub.api("POST", "/groups/staff", json={"users": ["ora"]})
    assert r.status_code in (201, 409), r.text
    if r.status_code == 409:
        assert hub.api("POST", "/groups/staff/users", json={"users": ["ora"]}).ok
    # a member passes the group check and meets the machine's limits instead
    r = hub.api("POST", "/users/ora/server", json={"profile": "h800", "gpus": "1"})
    assert r.status_code == 409 and "This machine has no H800 GPUs" in r.json()["message"]
    r = hub.api("POST", "/users/ora/server", json={"profile": "a800", "gpus": "8"})
    assert r.status_code == 409, r.text
    assert hub.server("ora") is None


def _free_gpus(hub) -> int:
    import sqlite3

    db = sqlite3.connect(os.path.join(hub.data_dir, "gpu-allocations.sqlite"))
    try:
        taken = db.execute("SELECT count(*) FROM gpu_allocation").fetchone()[0]
    finally:
        db.close()
    return 3 - taken


def test_progress_events_name_each_step(hub):
    import threading

    hub.ensure_user("pat")
    post = threading.Thread(
        target=hub.api,
        args=("POST", "/users/pat/server"),
        kwargs={"json": {"profile": "a800", "gpus": "1"}},
    )
    post.start()
    until(lambda: hub.server("pat"), "pat's spawn to be pending", interval=0.02)
    with hub.api("GET", "/users/pat/server/progress", stream=True) as events:
        messages = [
            json.loads(line[len(b"data: ") :]).get("message", "")
            for line in events.iter_lines()
            if line.startswith(b"data: ")
        ]
    text = "\n".join(messages)
    for step in ("Allocating 1 × A800", "Preparing disk", "Starting JupyterLab"):
        assert step in text, text
    post.join()
    until(lambda: (s := hub.server("pat")) and s["ready"], "pat's server")
    hub.stop_server("pat")


async def test_hub_restart_keeps_servers_and_their_gpus(hub):
    hub.spawn("rex", {"profile": "a800", "gpus": "1"})
    await execute(hub.url, "rex", ADMIN_TOKEN, "open('before.txt', 'w').write('1')")
    pid = hub.server("rex")["state"]["pid"]

    hub.restart()

    server = hub.server("rex")
    assert server and server["ready"], "the server must survive a hub restart"
    assert server["state"]["pid"] == pid
    assert server["state"]["gpu_indices"] == [0]
    out = await execute(hub.url, "rex", ADMIN_TOKEN, "print(open('before.txt').read())")
    assert out == "1\n"
    # its GPU is not handed out twice: only one A800 is left
    hub.ensure_user("sam")
    r = hub.api("POST", "/users/sam/server", json={"profile": "a800", "gpus": "2"})
    assert r.status_code == 409 and "Only 1 of 2 A800 GPUs are free" in r.json()["message"]
    server = hub.spawn("sam", {"profile": "a800", "gpus": "1"})
    assert server["state"]["gpu_indices"] == [1]
    hub.stop_server("sam")
    hub.stop_server("rex")


def test_spawn_form_posts_a_profile(hub):
    """The HTML form path: sign in as admin, read the form, post it, get a server."""
    s = login(hub)
    form = s.get(f"{hub.url}/hub/spawn").content.decode()
    for text in ("RTX 4090", "A800", "H800", "Debug mode", "¥4.50/GPU-hour", "¥0.10/h"):
        assert text in form
    assert "Not allowed for your group" in form  # H800 is for the group staff here
    assert 'data-free="2"' in form  # A800s free now
    r = s.post(
        f"{hub.url}/hub/spawn",
        data={"profile": "rtx4090", "gpus_rtx4090": "1", "_xsrf": s.cookies.get("_xsrf")},
    )
    assert r.status_code < 400, r.text
    server = until(lambda: (v := hub.server("admin")) and v["ready"] and v, "admin's server")
    assert server["user_options"] == {"profile": "rtx4090", "gpus": "1"}
    # without the XSRF token the form is refused
    r = s.post(f"{hub.url}/hub/spawn", data={"profile": "debug"})
    assert r.status_code == 403
    hub.stop_server("admin")


async def test_kernel_cannot_reach_another_users_disk(hub):
    hub.spawn("uma", {"profile": "debug"})
    await execute(hub.url, "uma", ADMIN_TOKEN, "open('secret.txt', 'w').write('uma only')")
    hub.stop_server("uma")
    hub.spawn("vic", {"profile": "debug"})
    code = f"""
import glob, os
roots = ["/home", "/tmp", "/var", "/run", "/work", "/root", "/public"]
hits = [p for r in roots for p in glob.glob(r + "/**/secret.txt", recursive=True)]
print(hits, os.path.exists({os.path.join(hub.data_dir, "disks", "uma")!r}))
"""
    assert (await execute(hub.url, "vic", ADMIN_TOKEN, code)).strip() == "[] False"
    with pytest.raises(KernelError):
        await execute(hub.url, "vic", ADMIN_TOKEN, "open('/public/new', 'w')")
    hub.stop_server("vic")
    disk = os.path.join(hub.data_dir, "disks", "uma")
    assert oct(os.stat(disk).st_mode & 0o777) == "0o700"


def login(hub) -> requests.Session:
    password = open(os.path.join(hub.data_dir, "admin-password")).read().strip()
    s = requests.Session()
    s.get(f"{hub.url}/hub/login")
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": "admin", "password": password, "_xsrf": s.cookies.get("_xsrf")},
    )
    assert r.ok and "/hub/login" not in r.url, r.status_code
    return s


def test_unsandboxed_hub_warns_in_log_and_on_admin_page(hub_factory):
    loud = hub_factory({"local": {"sandbox": "off"}, "gpus": []}, name="nosandbox")
    assert "WARNING: Servers run WITHOUT a sandbox" in loud.log_path.read_text()
    session = login(loud)
    for path in ("/hub/admin", "/hub/billing-admin"):
        page = session.get(f"{loud.url}{path}").text
        assert 'id="meterhub-sandbox-warning"' in page and "WITHOUT a sandbox" in page, path
    loud.teardown()


def test_sandboxed_hub_has_no_warning(hub):
    page = login(hub).get(f"{hub.url}/hub/admin").text
    assert "meterhub-sandbox-warning" not in page
    assert "react-admin-hook" in page  # it is the real admin page


def test_a_server_that_dies_at_start_fails_clearly_and_frees_its_gpus(hub_factory, tmp_path):
    pool = tmp_path / "nfs-pool"
    pool.mkdir()
    broken = hub_factory(
        {"public_dir": str(pool), "gpus": [{"type": "a800", "count": 1}]}, name="broken"
    )
    pool.rmdir()  # the pool's filesystem went away: bwrap cannot mount /public
    broken.ensure_user("zoe")
    r = broken.api("POST", "/users/zoe/server", json={"profile": "a800", "gpus": "1"})
    assert r.status_code == 500
    assert "exited during start-up" in r.json()["message"]
    assert broken.server("zoe") is None
    pool.mkdir()
    server = broken.spawn("zoe", {"profile": "a800", "gpus": "1"})  # its GPU was released
    assert server["state"]["gpu_indices"] == [0]
    broken.teardown()


def test_a_server_that_does_not_listen_in_time_fails_with_a_message_of_its_own():
    # JupyterHub's own start_timeout ends a start with a bare TimeoutError, which the spawn
    # page showed as "Spawn failed:" and nothing after it (seen on a busy machine)
    import asyncio
    import socket
    import time
    from types import SimpleNamespace

    from tornado import web

    from meterhub.spawner.local import START_TIMEOUT_MARGIN_SECONDS, LocalGPUSpawner

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once the socket is closed
    running = SimpleNamespace(poll=lambda: None)
    server = SimpleNamespace(ip="127.0.0.1", port=port, proc=running, start_timeout=60)
    wait = LocalGPUSpawner._wait_for_port_or_exit
    late = time.monotonic() - 60 + START_TIMEOUT_MARGIN_SECONDS - 0.5
    started = time.monotonic()
    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(wait(server, late))
    assert time.monotonic() - started < 5  # before JupyterHub's timeout, not at it
    assert refused.value.status_code == 503
    message = refused.value.log_message % refused.value.args
    assert message.startswith("JupyterLab did not answer within 60 seconds")
    assert "Your files are kept" in message
    # a server that listens in time is waited for as before
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        server.port = listening.getsockname()[1]
        asyncio.run(wait(server, time.monotonic()))


def test_a_server_that_dies_releases_its_gpus(hub):
    import signal as signals

    server = hub.spawn("wes", {"profile": "a800", "gpus": "2"})
    pid = server["state"]["pid"]
    os.killpg(pid, signals.SIGKILL)  # OOM killer, a crash, `kill -9`
    until(lambda: not group_has_live_members(pid), "the sandbox to die")
    # JupyterHub notices on its next poll (or here, the stop request) without calling stop()
    r = hub.api("DELETE", "/users/wes/server")
    assert r.status_code in (202, 204)
    until(lambda: hub.server("wes") is None, "wes's dead server to be cleaned up")
    assert _free_gpus(hub) == 3
    server = hub.spawn("xia", {"profile": "a800", "gpus": "2"})
    assert server["state"]["gpu_indices"] == [0, 1]
    hub.stop_server("xia")
