"""The bubblewrap command: what a server can and cannot see."""

import os
import subprocess

import pytest

from meterhub.spawner.sandbox import SandboxSpec, bwrap_command, bwrap_works


def spec(**kw):
    base = dict(
        disk="/data/disks/alice",
        disk_mount="/home/jovyan",
        pool="/data/pool",
        pool_mount="/public",
        ro_paths=("/srv/meterhub/venv",),
        hidden=("/srv/meterhub/venv/data", "/elsewhere"),
        devices=("/dev/nvidia1", "/dev/nvidiactl"),
        files={"/etc/passwd": "/data/run/alice/passwd"},
    )
    base.update(kw)
    return SandboxSpec(**base)


def pairs(cmd, flag):
    return [tuple(cmd[i + 1 : i + 3]) for i, a in enumerate(cmd) if a == flag]


def test_binds_disk_rw_pool_ro_and_only_given_devices():
    cmd = bwrap_command(spec(), ["jupyterhub-singleuser"])
    assert ("/data/disks/alice", "/home/jovyan") in pairs(cmd, "--bind")
    ro = pairs(cmd, "--ro-bind")
    assert ("/data/pool", "/public") in ro
    assert ("/srv/meterhub/venv", "/srv/meterhub/venv") in ro
    assert ("/usr", "/usr") in ro
    assert ("/data/run/alice/passwd", "/etc/passwd") in ro
    assert pairs(cmd, "--dev-bind") == [
        ("/dev/nvidia1", "/dev/nvidia1"),
        ("/dev/nvidiactl", "/dev/nvidiactl"),
    ]
    assert "--unshare-pid" in cmd
    # a private /tmp and /home: nothing of the host's users
    assert cmd[cmd.index("/tmp") - 1] == "--tmpfs"
    assert cmd.index("/home") < cmd.index("/home/jovyan")
    assert cmd[-1] == "jupyterhub-singleuser"


def test_hidden_paths_inside_a_bound_path_get_an_empty_tmpfs():
    cmd = bwrap_command(spec(), ["x"])
    tmpfs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tmpfs"]
    assert "/srv/meterhub/venv/data" in tmpfs
    assert "/elsewhere" not in tmpfs  # never bound, nothing to hide


def test_root_hub_drops_to_the_user_inside_with_no_capabilities():
    cmd = bwrap_command(spec(run_as=(200007, 200007)), ["x"])
    i = cmd.index("setpriv")
    assert cmd[i:] == [
        "setpriv",
        "--reuid=200007",
        "--regid=200007",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        "x",
    ]
    assert pairs(cmd, "--cap-add") == [("CAP_SETUID", "--cap-add"), ("CAP_SETGID", "--")]
    plain = bwrap_command(spec(), ["x"])
    assert "setpriv" not in plain and "--cap-add" not in plain


def test_group_folders_are_bound_rw_after_the_disk_with_their_gids():
    binds = (("/data/shared/vision", "/home/jovyan/shared/vision"),)
    cmd = bwrap_command(spec(rw_binds=binds, groups=(300007,), run_as=(200001, 200001)), ["x"])
    rw = pairs(cmd, "--bind")
    assert rw == [("/data/disks/alice", "/home/jovyan"), *binds]  # inside the disk: after it
    assert "--groups=300007" in cmd and "--clear-groups" not in cmd
    plain = bwrap_command(spec(), ["x"])
    assert pairs(plain, "--bind") == [("/data/disks/alice", "/home/jovyan")]


@pytest.mark.skipif(bwrap_works() != "", reason="bubblewrap cannot run here")
def test_sandbox_really_hides_and_protects(tmp_path):
    """Run a real sandbox: the disk is writable, the pool is not, the data dir is gone."""
    data = tmp_path / "data"
    disk, pool = data / "disks" / "u", data / "pool"
    disk.mkdir(parents=True)
    pool.mkdir()
    (pool / "model.txt").write_text("weights\n")
    env = tmp_path / "env"  # an environment below /tmp, as in a fresh clone under /tmp
    env.mkdir()
    (env / "marker").write_text("env\n")
    run_as = (200099, 200099) if os.geteuid() == 0 else None
    if run_as:
        os.chown(disk, *run_as)
    cmd = bwrap_command(
        SandboxSpec(
            disk=str(disk),
            disk_mount="/home/jovyan",
            pool=str(pool),
            pool_mount="/public",
            hidden=(str(data),),
            ro_paths=(str(env),),
            run_as=run_as,
        ),
        [
            "/bin/sh",
            "-c",
            f"id -u; cat /public/model.txt; echo hi > note && cat note; cat {env}/marker;"
            f" touch /public/x 2>/dev/null || echo pool-ro; ls {data} 2>/dev/null || echo no-data",
        ],
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 6, (out.stdout, out.stderr)
    uid, weights, note, marker, pool_ro, no_data = out.stdout.split()
    assert int(uid) == (run_as[0] if run_as else os.getuid())
    assert (weights, note, marker) == ("weights", "hi", "env")
    assert (pool_ro, no_data) == ("pool-ro", "no-data")
    assert (disk / "note").read_text() == "hi\n"


def test_environment_paths_include_a_venvs_base_interpreter(tmp_path):
    from meterhub.spawner.local import environment_paths

    base = tmp_path / "python3.11"
    (base / "bin").mkdir(parents=True)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\n")
    assert environment_paths(str(venv)) == [str(venv), str(base)]
    assert environment_paths(str(base)) == [str(base)]


def test_an_unsandboxed_start_warns_once_a_reason_and_at_debug_after(caplog, monkeypatch):
    """The hub's start-up and pages already say servers run unsandboxed; each start's own
    warning would be one line a start (200 in a burst): the first for each reason only."""
    import logging

    from meterhub.spawner import local

    monkeypatch.setattr(local, "_warned_without_sandbox", set())
    log = logging.getLogger("meterhub.test.sandbox")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for name in ("amy", "bob"):
            local._warn_without_sandbox(log, "sandbox = off", name)
        local._warn_without_sandbox(log, "bwrap cannot run: no user namespaces", "cy")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    warnings = [text for level, text in said if level == logging.WARNING]
    assert len(warnings) == 2
    assert "amy" in warnings[0] and "sandbox = off" in warnings[0]
    assert "cy" in warnings[1] and "no user namespaces" in warnings[1]
    assert (logging.DEBUG, "Starting bob WITHOUT a sandbox (sandbox = off)") in said
