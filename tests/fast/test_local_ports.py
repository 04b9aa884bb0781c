"""The local backend gives each starting server a port no other server of the hub has: a
free port found now is bound by its server only seconds (in a burst, a minute) later."""

from __future__ import annotations

import socket
import types

import pytest

from meterhub.spawner import local
from meterhub.spawner.local import LocalGPUSpawner


def _spawner(owner: str) -> types.SimpleNamespace:
    ns = types.SimpleNamespace(owner_key=owner)
    ns._forget_port = types.MethodType(LocalGPUSpawner._forget_port, ns)
    ns._unique_port = types.MethodType(LocalGPUSpawner._unique_port, ns)
    return ns


@pytest.fixture(autouse=True)
def _no_ports_taken(monkeypatch):
    monkeypatch.setattr(LocalGPUSpawner, "_ports", local.PortBook())


def test_two_starts_never_get_the_same_port_and_a_stop_frees_it(monkeypatch):
    offered = iter([5000, 5000, 5000, 5001, 5000])
    monkeypatch.setattr(local, "random_port", lambda: next(offered))
    amy, ben = _spawner("1/"), _spawner("2/")
    assert amy._unique_port() == 5000
    assert ben._unique_port() == 5001  # 5000 was offered twice more: amy's
    amy._forget_port()  # amy's server stopped
    assert _spawner("3/")._unique_port() == 5000


def test_a_restart_of_one_server_gives_back_its_old_port_first(monkeypatch):
    offered = iter([6000, 6001])
    monkeypatch.setattr(local, "random_port", lambda: next(offered))
    amy = _spawner("1/")
    assert amy._unique_port() == 6000
    assert amy._unique_port() == 6001
    assert LocalGPUSpawner._ports.owner_of == {6001: "1/"}
    assert LocalGPUSpawner._ports.port_of == {"1/": 6001}


def test_a_server_starts_without_a_preexec_function_so_popen_can_vfork(monkeypatch):
    """Entering the cgroups and dropping root are exec'd programs, not a preexec function:
    with one, Popen forks (copies the hub's page tables) instead of vforking."""
    ns = types.SimpleNamespace(
        cgroup_dirs=["/sys/fs/cgroup/memory/meterhub/x", "/sys/fs/cgroup/cpu/meterhub/x"],
        run_as=(200005, 200005),
        group_gids=[300001],
    )
    launch = types.MethodType(LocalGPUSpawner._launch, ns)
    monkeypatch.setattr(local.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    cmd, preexec = launch(["/env/bin/jupyterhub-singleuser", "--port=1"], sandboxed=False)
    assert preexec is None
    assert cmd[:6] == ["/bin/sh", "-c", cmd[2], "sh", "2", ns.cgroup_dirs[0] + "/cgroup.procs"]
    setpriv = cmd.index("/usr/bin/setpriv")
    assert cmd[setpriv : setpriv + 4] == [
        "/usr/bin/setpriv",
        "--reuid=200005",
        "--regid=200005",
        "--groups=300001",
    ]
    assert cmd[-3:] == ["--", "/env/bin/jupyterhub-singleuser", "--port=1"]
    # in the sandbox bwrap's own setpriv drops root: only the cgroups here
    cmd, preexec = launch(["bwrap", "--", "server"], sandboxed=True)
    assert (
        preexec is None and "/usr/bin/setpriv" not in cmd and cmd[-3:] == ["bwrap", "--", "server"]
    )
    # without setpriv, the preexec function does it (and Popen forks)
    monkeypatch.setattr(local.shutil, "which", lambda name, path=None: None)
    ns._drop_privileges_fn = lambda: lambda: None
    cmd, preexec = launch(["server"], sandboxed=False)
    assert cmd == ["server"] and callable(preexec)


async def test_a_port_is_seen_listening_refused_or_queued_without_the_event_loop():
    """The start's wait for its server's port: a non-blocking connect and a look."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert await local.accepts_connections("127.0.0.1", port) is False  # bound, not listening
        server.listen(1)
        assert await local.accepts_connections("127.0.0.1", port) is True
        assert await local.accepts_connections("localhost", port) is True  # a host name
        # a server too busy to accept: once its queue is full, a try gets no answer, which
        # counts as not listening yet (never as listening: it may be a closed port)
        answers = [await local.accepts_connections("127.0.0.1", port) for _ in range(6)]
        assert answers[-1] is False, answers
    assert await local.accepts_connections("127.0.0.1", port) is False  # closed
    with socket.socket(socket.AF_INET6) as server6:
        try:
            server6.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        server6.listen(1)
        assert await local.accepts_connections("::1", server6.getsockname()[1]) is True


def test_setpriv_is_not_trusted_with_ids_the_host_also_has_as_names(monkeypatch):
    """setpriv reads --reuid=200005 as the user named "200005" when one exists: then the
    hub drops root itself, by number (a preexec function)."""
    ns = types.SimpleNamespace(cgroup_dirs=[], run_as=(200005, 200005), group_gids=[300001])
    ns._drop_privileges_fn = lambda: lambda: None
    launch = types.MethodType(LocalGPUSpawner._launch, ns)
    monkeypatch.setattr(local.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    cmd, preexec = launch(["server"], sandboxed=False, ids_named=True)
    assert cmd == ["server"] and callable(preexec)
    names = {"300001"}
    monkeypatch.setattr(local.grp, "getgrnam", lambda n: n if n in names else {}[n])
    monkeypatch.setattr(local.pwd, "getpwnam", lambda n: {}[n])
    assert local.named_like_ids(200005, 200005, (300001,)) is True
    assert local.named_like_ids(200005, 200005, (300002,)) is False
