"""CPU and memory limits of local servers: the pure cgroup layout and writes with literal
expectations for v1 and v2, the debug limits from the site config, and a real server that
goes over its memory and is stopped as a whole."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from traitlets.config import Config

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.orm import MeteredSession
from meterhub.hub.config import SCHEMA, apply_config, complete
from meterhub.spawner import cgroups
from meterhub.spawner.catalog import DEBUG_CPU, DEBUG_MEMORY_GIB, Catalog
from meterhub.spawner.cgroups import CgroupLayout, CgroupsUnavailable, OwnCgroups

from .hubprocess import ADMIN_TOKEN, HubProcess, until
from .jupyter import execute

# ---------------------------------------------------------------- texts of real hosts

#: this project's machines: v1 memory and cpu, a unified hierarchy with no controllers
V1_CGROUP = """\
9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/43cac30a
1:cpu:/
2:cpuacct:/
0::/
"""
V1_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

#: a systemd host with the unified hierarchy only (Debian 12, Ubuntu 22.04 and later)
V2_CGROUP = "0::/system.slice/meterhub.service\n"
V2_MOUNTINFO = (
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4"
    " - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
)
V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc\n"

#: Docker without a cgroup namespace: each hierarchy's root is the container's cgroup,
#: cpu and cpuacct mounted together, and a mount point with a space in it
DOCKER_CGROUP = """\
5:memory:/docker/abc123
3:cpu,cpuacct:/docker/abc123
"""
DOCKER_MOUNTINFO = """\
700 690 0:40 /docker/abc123 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
701 690 0:41 /docker/abc123 /sys/fs/cgroup/cpu\\040and\\040acct ro - cgroup cgroup rw,cpu,cpuacct
"""


def test_v1_layout_of_this_kind_of_host():
    own = cgroups.own_cgroups(V1_CGROUP, V1_MOUNTINFO)
    assert own == OwnCgroups(
        unified="/sys/fs/cgroup/unified",
        v1={
            "memory": "/sys/fs/cgroup/memory/process_api/43cac30a",
            "cpu": "/sys/fs/cgroup/cpu",
            "cpuacct": "/sys/fs/cgroup/cpuacct",
        },
    )
    layout = cgroups.parse_layout(V1_CGROUP, V1_MOUNTINFO, unified_controllers="hugetlb\n")
    assert layout == CgroupLayout(
        1, memory="/sys/fs/cgroup/memory/process_api/43cac30a", cpu="/sys/fs/cgroup/cpu"
    )
    assert layout.server_dirs("ab12-3-2F") == (
        "/sys/fs/cgroup/memory/process_api/43cac30a/meterhub/ab12-3-2F",
        "/sys/fs/cgroup/cpu/meterhub/ab12-3-2F",
    )


def test_v1_writes():
    layout = CgroupLayout(1, memory="/cg/memory/hub", cpu="/cg/cpu")
    assert cgroups.limit_writes(layout, "s", cpu=12, memory_bytes=60 * 2**30) == [
        ("/cg/memory/hub/meterhub/s/memory.limit_in_bytes", "64424509440"),
        ("/cg/cpu/meterhub/s/cpu.cfs_period_us", "100000"),
        ("/cg/cpu/meterhub/s/cpu.cfs_quota_us", "1200000"),
    ]


def test_v2_layout_and_writes():
    layout = cgroups.parse_layout(V2_CGROUP, V2_MOUNTINFO, V2_CONTROLLERS)
    own = "/sys/fs/cgroup/system.slice/meterhub.service"
    assert layout == CgroupLayout(2, memory=own, cpu=own)
    assert layout.server_dirs("s") == (f"{own}/meterhub/s",)
    assert cgroups.limit_writes(layout, "s", cpu=1, memory_bytes=2**30) == [
        (f"{own}/meterhub/s/memory.max", "1073741824"),
        (f"{own}/meterhub/s/memory.oom.group", "1"),
        (f"{own}/meterhub/s/cpu.max", "100000 100000"),
    ]


def test_v2_wins_over_v1_only_when_it_offers_both_controllers():
    both = V1_MOUNTINFO
    assert cgroups.parse_layout(V1_CGROUP, both, "cpu memory pids").version == 2
    assert cgroups.parse_layout(V1_CGROUP, both, "memory pids").version == 1


def test_bind_mounted_roots_co_mounted_controllers_and_escaped_mount_points():
    layout = cgroups.parse_layout(DOCKER_CGROUP, DOCKER_MOUNTINFO)
    assert layout == CgroupLayout(
        1, memory="/sys/fs/cgroup/memory", cpu="/sys/fs/cgroup/cpu and acct"
    )


@pytest.mark.parametrize(
    "self_cgroup, mountinfo, controllers, why",
    [
        (V2_CGROUP, V2_MOUNTINFO, "cpuset io pids", "does not offer memory and cpu"),
        (V2_CGROUP, V2_MOUNTINFO, "cpu io pids", "does not offer memory to"),
        ("4:memory:/x\n", V1_MOUNTINFO, "", "no mounted cgroup hierarchy has the cpu controller"),
        ("", "", "", "has the memory and cpu controller"),
    ],
)
def test_no_layout_says_why(self_cgroup, mountinfo, controllers, why):
    with pytest.raises(CgroupsUnavailable, match=why):
        cgroups.parse_layout(self_cgroup, mountinfo, controllers)


def test_oom_kill_counts_of_v1_and_v2():
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n"
    assert (cgroups.parse_oom_kills(v1), cgroups.parse_oom_kills(v2)) == (3, 2)
    assert cgroups.parse_oom_kills("oom_kill_disable 0\n") == 0


@pytest.mark.parametrize("mode", ["cgroup", "auto"])
def test_a_cgroup_that_fails_half_made_is_removed_and_refuses_only_when_required(
    tmp_path, monkeypatch, mode
):
    """`resource_limits = cgroup`: a server whose limits cannot be set does not start (500,
    saying why); `auto`: it starts without them. Either way nothing of its cgroups is left."""
    from types import SimpleNamespace

    from tornado import web

    from meterhub.spawner import local

    layout = CgroupLayout(1, memory=str(tmp_path / "memory"), cpu=str(tmp_path / "cpu"))
    monkeypatch.setattr(local, "resource_limits_status", lambda mode: (layout, ""))

    def half_made(layout, name, cpu, memory_bytes):
        os.makedirs(layout.server_dirs(name)[0])
        raise PermissionError(13, "Permission denied", "cpu.cfs_quota_us")

    monkeypatch.setattr(cgroups, "create", half_made)
    ann = SimpleNamespace(name="ann", id=1, url="/user/ann/", groups=[])
    s = local.LocalGPUSpawner(
        user=ann, data_dir=str(tmp_path / "data"), starter_notebooks_dir="", resource_limits=mode
    )
    debug = s.catalog.parse({"profile": "debug"})
    if mode == "cgroup":
        with pytest.raises(web.HTTPError) as e:
            s._make_cgroups(debug)
        message = e.value.log_message % e.value.args
        assert e.value.status_code == 500 and "Permission denied" in message
    else:
        assert s._make_cgroups(debug) is None
    assert not any(os.path.exists(d) for d in layout.server_dirs(s.cgroup_name))
    assert os.listdir(tmp_path / "memory") == []  # its meterhub parent went too


# ---------------------------------------------------------------- debug limits config


def test_debug_limits_come_from_the_site_config():
    site = complete({"profiles": {"debug": {"cpu": 1, "memory_gib": 3}}}, cwd="/srv")
    c = apply_config(site, Config())
    assert (c.Catalog.debug_cpu, c.Catalog.debug_memory_gib) == (1, 3)
    choice = Catalog(config=c).choice("debug")
    assert (choice.cpu, choice.memory_gib) == (1, 3)
    # guarantees (Kubernetes requests) never above the limits
    assert (choice.cpu_guarantee, choice.memory_guarantee_gib) == (0.5, 2)
    small = Catalog(
        config=apply_config(complete({"profiles": {"debug": {"memory_gib": 1}}}), Config())
    )
    assert small.choice("debug").memory_guarantee_gib == 1
    # absent: the catalog's defaults, which the schema documents
    default = Catalog(config=apply_config(complete({}), Config())).choice("debug")
    assert (default.cpu, default.memory_gib) == (DEBUG_CPU, DEBUG_MEMORY_GIB)
    debug = SCHEMA["definitions"]["debug_profile"]["properties"]
    assert (debug["cpu"]["default"], debug["memory_gib"]["default"]) == (
        DEBUG_CPU,
        DEBUG_MEMORY_GIB,
    )
    # a GPU profile has no such keys
    assert "cpu" not in SCHEMA["definitions"]["profile"]["properties"]


# ---------------------------------------------------------------- a real server


def _host_limits() -> CgroupLayout:
    """What the spawner would use here, or a skip naming why there is none."""
    try:
        return cgroups.detect()
    except CgroupsUnavailable as e:
        pytest.skip(f"this host cannot give servers CPU/memory limits: {e}")


def _ledger(hub) -> Ledger:
    return Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))


def _paths(proc_cgroup: str) -> dict[str, str]:
    """The text of /proc/<pid>/cgroup as {controller: path} ("" for the unified one)."""
    paths = {}
    for line in filter(None, proc_cgroup.splitlines()):
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _cgroup_files(pid: int) -> dict[str, Path]:
    """The directory of `pid`'s cgroup per controller ("memory", "cpu"; "" for v2)."""
    own = cgroups.own_cgroups(
        Path(f"/proc/{pid}/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )
    dirs = {name: Path(d) for name, d in own.v1.items() if name in ("memory", "cpu")}
    if own.unified:
        dirs[""] = Path(own.unified)
    return dirs


def remove_hub_cgroups(data_dir: str) -> None:
    """Kill and remove what a failed test left: the cgroups of one hub's servers (their
    names start with a tag of its data_dir), so none outlives the test run."""
    try:
        layout = cgroups.detect()
    except CgroupsUnavailable:
        return
    tag = hashlib.sha256(os.path.abspath(data_dir).encode()).hexdigest()[:8]
    for parent in {os.path.join(d, cgroups.PARENT) for d in (layout.memory, layout.cpu)}:
        for name in os.listdir(parent) if os.path.isdir(parent) else ():
            if name.startswith(tag + "-"):
                path = os.path.join(parent, name)
                cgroups.kill_members([path])
                cgroups.remove([path])


@pytest.fixture(scope="module")
def limited(hub_factory):
    _host_limits()
    hub = hub_factory(
        {"gpus": [], "profiles": {"debug": {"memory_gib": 1, "cpu": 1}}}, name="limited"
    )
    yield hub
    hub.teardown()
    remove_hub_cgroups(hub.data_dir)


async def test_a_server_over_its_memory_is_stopped_as_a_whole(limited):
    layout = _host_limits()
    assert "CPU and memory limits for servers: cgroup" in limited.log_path.read_text()
    server = limited.spawn("mia", {"profile": "debug"})
    pid = server["state"]["pid"]
    assert server["state"]["cgroups"], "the server must have cgroups"

    # the sandbox and the kernel inside it are in the server's cgroup, with its limits
    dirs = _cgroup_files(pid)
    inside = await execute(
        limited.url, "mia", ADMIN_TOKEN, "print(open('/proc/self/cgroup').read())"
    )
    kernel_paths = _paths(inside)
    if layout.version == 1:
        memory, cpu = dirs["memory"], dirs["cpu"]
        assert int((memory / "memory.limit_in_bytes").read_text()) == 2**30
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == 100_000
        assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
        assert str(memory).endswith(kernel_paths["memory"])
        assert str(cpu).endswith(kernel_paths["cpu"])
    else:
        unified = dirs[""]
        assert (unified / "memory.max").read_text().strip() == str(2**30)
        assert (unified / "cpu.max").read_text().split() == ["100000", "100000"]
        assert (unified / "memory.oom.group").read_text().strip() == "1"
        assert str(unified).endswith(kernel_paths[""])
    # a cgroup of its own, below the hub's
    hub_paths = _paths(Path(f"/proc/{limited.proc.pid}/cgroup").read_text())
    server_paths = _paths(Path(f"/proc/{pid}/cgroup").read_text())
    for controller in ("memory", "cpu") if layout.version == 1 else ("",):
        below = hub_paths[controller].rstrip("/") + "/meterhub/"
        assert server_paths[controller].startswith(below), (server_paths, hub_paths)

    # 1.5 GiB, touched: over the limit
    hog = "x = b'x' * (1536 * 2**20)\nprint('survived', len(x))"
    try:
        out = await asyncio.wait_for(execute(limited.url, "mia", ADMIN_TOKEN, hog), 120)
    except Exception as e:  # the kernel, then the server, died under the request
        out = f"{type(e).__name__}: {e}"
    assert "survived" not in out, out

    # the whole server was stopped, the hub and this test live on
    until(lambda: limited.server("mia") is None, "the hub to find the server dead", timeout=60)
    assert limited.proc.poll() is None
    log = limited.log_path.read_text()
    assert "went over its memory limit of 1 GiB" in log, limited.log_tail()
    with _ledger(limited).begin() as db:
        (session,) = db.query(MeteredSession).filter_by(user_name="mia").all()
        assert session.stopped_at is not None
    for directory in server["state"]["cgroups"]:
        assert not os.path.exists(directory), "the server's cgroup must be removed"

    # the same user starts again with fresh limits
    server = limited.spawn("mia", {"profile": "debug"})
    assert await execute(limited.url, "mia", ADMIN_TOKEN, "print(1)") == "1\n"
    limited.stop_server("mia")


# ---------------------------------------------------------------- without the sandbox

#: a stand-in single-user server: the system Python's http.server at the URL the hub gives
#: it, answering 200 to everything. Stdlib only: a server without the sandbox runs as its own
#: uid, which may not traverse the test's virtual environment (a fresh clone's under /tmp)
STAND_IN = """#!{python}
import http.server, os, urllib.parse

url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{{}}")

    def log_message(self, *args):
        pass


http.server.HTTPServer((url.hostname, url.port), Answer).serve_forever()
"""


@pytest.fixture
def stand_in_prefix():
    """An environment prefix whose `jupyterhub-singleuser` is the stand-in server."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("a system python3 is needed: servers without the sandbox run as other uids")
    prefix = Path(tempfile.mkdtemp(prefix="meterhub-stand-in-"))
    prefix.chmod(0o755)
    script = prefix / "bin" / "jupyterhub-singleuser"
    script.parent.mkdir()
    script.write_text(STAND_IN.format(python=python))
    script.chmod(0o755)
    yield prefix
    shutil.rmtree(prefix)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}


@pytest.mark.skipif(os.geteuid() != 0, reason="a server runs as its own uid under a root hub")
def test_an_unsandboxed_server_starts_in_its_cgroups_as_its_own_uid(tmp_path, stand_in_prefix):
    """Without the sandbox, exec'd `sh` and `setpriv` put the server in its cgroups and
    make it its own uid (the hub's Popen has no preexec function, so it can vfork)."""
    _host_limits()
    hub = HubProcess(tmp_path / "hub", {"gpus": [], "local": {"sandbox": "off"}})
    extra = hub.workdir / "jupyterhub_config.d"
    extra.mkdir()
    (extra / "stand_in.py").write_text(
        f"c.LocalGPUSpawner.server_env_prefix = {str(stand_in_prefix)!r}\n"
    )
    hub.start()
    try:
        state = hub.spawn("una", {"profile": "debug"})["state"]
        pid = state["pid"]
        status = _status(pid)
        uids, gids = status["Uid"].split(), status["Gid"].split()
        assert len(set(uids)) == 1 and int(uids[0]) > 200000, uids  # real, effective, saved
        assert len(set(gids)) == 1 and gids[0] == uids[0], gids
        assert status["Groups"] == ""  # none of root's supplementary groups
        assert status["NoNewPrivs"] == "1" and int(status["CapBnd"], 16) == 0
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[1].endswith(b"/bin/jupyterhub-singleuser"), argv  # sh and setpriv exec'd
        assert state["cgroups"], "the server must have cgroups"
        for directory in state["cgroups"]:
            members = Path(directory, "cgroup.procs").read_text().split()
            assert str(pid) in members, (directory, members)
        hub.stop_server("una")
    finally:
        hub.teardown()
        remove_hub_cgroups(hub.data_dir)


def test_enter_command_refuses_a_cgroup_it_cannot_enter(tmp_path):
    """The exec'd shell stops with 125 before it runs the server when it cannot enter."""
    missing = tmp_path / "gone"
    command = cgroups.enter_command([str(missing)]) + ["echo", "server ran"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 125 and "server ran" not in result.stdout
    inside = tmp_path / "fake cgroup"  # a space, as in Docker's escaped mount points
    inside.mkdir()
    result = subprocess.run(cgroups.enter_command([str(inside)]) + ["true"])
    assert result.returncode == cgroups.ENTER_FAILED  # no cgroup.procs: not a cgroup
    (inside / "cgroup.procs").write_text("")
    command = cgroups.enter_command([str(inside)]) + ["echo", "server ran"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "server ran\n"
    assert (inside / "cgroup.procs").read_text() == "0\n"  # what a real cgroup reads as "me"


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_start_cancelled_while_its_cgroups_are_made_removes_them(tmp_path, monkeypatch, cancels):
    """JupyterHub cancels a start that runs past `start_timeout`; when that happens while the
    start's host work (disk, group folders, cgroups) runs in its thread, the thread goes on
    and the cgroups it makes are removed once it ends, not left for the next start. A start
    cancelled again while its cleanup waits for the thread cleans up all the same, and the
    cgroups go when the thread ends."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from meterhub.spawner import local

    layout = CgroupLayout(1, memory=str(tmp_path / "memory"), cpu=str(tmp_path / "cpu"))
    monkeypatch.setattr(local, "resource_limits_status", lambda mode: (layout, ""))
    making, made = threading.Event(), threading.Event()

    def slow_create(layout, name, cpu, memory_bytes):
        dirs = layout.server_dirs(name)
        for directory in dirs:
            os.makedirs(directory)
        making.set()
        assert made.wait(30)  # the start is cancelled meanwhile
        return dirs

    monkeypatch.setattr(cgroups, "create", slow_create)
    ann = SimpleNamespace(name="ann", id=1, url="/user/ann/", groups=[])
    s = local.LocalGPUSpawner(
        user=ann, data_dir=str(tmp_path / "data"), starter_notebooks_dir="", sandbox="off",
        server_env_prefix=sys.prefix, user_options={"profile": "debug"},
    )  # fmt: skip
    dirs = layout.server_dirs(s.cgroup_name)

    async def cancel_mid_start():
        start = asyncio.ensure_future(s.start())
        assert await asyncio.to_thread(making.wait, 30)
        start.cancel()
        await asyncio.sleep(0)  # the cancellation reaches the start, whose cleanup waits
        if cancels == 2:
            start.cancel()
            with pytest.raises(asyncio.CancelledError):
                await start
            assert all(os.path.exists(d) for d in dirs)  # the thread has not ended
        made.set()
        if cancels == 1:
            with pytest.raises(asyncio.CancelledError):
                await start
            assert s.cgroup_dirs == list(dirs)
        for _ in range(3000):  # the thread ends; its cgroups go (in a thread of their own)
            if not any(os.path.exists(d) for d in dirs):
                break
            await asyncio.sleep(0.01)

    asyncio.run(cancel_mid_start())
    assert not any(os.path.exists(d) for d in dirs)
    assert os.listdir(tmp_path / "memory") == []
