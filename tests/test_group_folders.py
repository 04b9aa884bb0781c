"""Group shared folders on the local backend: which groups get one, the host folder's
owner and mode, the mount points on a member's disk, the sandbox's binds, and (for real,
in bubblewrap) that members share the folder and nobody else reaches it."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from types import SimpleNamespace

import pytest

from meterhub.spawner.local import GROUP_DEFAULT_ACL, LocalGPUSpawner
from meterhub.spawner.options import SharedGroup, shared_folder_groups
from meterhub.spawner.sandbox import SandboxSpec, bwrap_command, bwrap_works

VISION = SimpleNamespace(name="vision", id=7, properties={"shared_folder": True})
NLP = SimpleNamespace(name="nlp", id=8, properties={"shared_folder": True})
STAFF = SimpleNamespace(name="staff", id=9, properties={})  # a group without a folder


def user(name: str, uid: int, *groups) -> SimpleNamespace:
    return SimpleNamespace(name=name, id=uid, url=f"/user/{name}/", groups=list(groups))


def spawner(data, who, **traits) -> LocalGPUSpawner:
    return LocalGPUSpawner(user=who, data_dir=str(data), starter_notebooks_dir="", **traits)


@pytest.fixture(params=["hub user", "root hub"])
def as_root(request, monkeypatch) -> bool:
    """Both ways servers run: as the hub's own user, or (a root hub) as uids of their own."""
    root = request.param == "root hub"
    if root and os.geteuid() != 0:
        pytest.skip("needs root (chown)")
    if not root:
        monkeypatch.setattr(LocalGPUSpawner, "run_as", property(lambda self: None))
    return root


def test_only_groups_marked_shared_with_folder_names_count(caplog):
    odd = SimpleNamespace(name="Lab A", id=3, properties={"shared_folder": True})
    truthy = SimpleNamespace(name="lab-b", id=4, properties={"shared_folder": "yes"})
    none = SimpleNamespace(name="lab-c", id=5, properties=None)
    with caplog.at_level(logging.WARNING):
        found = shared_folder_groups(user("ann", 1, VISION, STAFF, odd, truthy, none, NLP))
    assert found == [SharedGroup("nlp", 8), SharedGroup("vision", 7)]
    assert "'Lab A'" in caplog.text and "skipped" in caplog.text
    # groups as render-k8s fakes them, without properties: no folder
    assert shared_folder_groups(user("ann", 1, SimpleNamespace(name="x", id=1))) == []


def test_members_get_a_folder_a_mount_point_and_a_bind(tmp_path, as_root):
    ann = spawner(tmp_path, user("ann", 1, VISION, STAFF))
    disk = ann._prepare_disk(True)
    folders = ann._prepare_group_folders(disk, True, ann.shared_groups())
    host = tmp_path / "shared" / "vision"
    assert folders.binds == ((str(host), "/home/jovyan/shared/vision"),)
    assert os.listdir(tmp_path / "shared") == ["vision"]  # staff has no folder
    mode = os.stat(host).st_mode
    mount_point = os.lstat(os.path.join(disk, "shared", "vision"))
    assert stat.S_ISDIR(mount_point.st_mode) and not os.listdir(os.path.join(disk, "shared"))[1:]
    if as_root:
        gid = 300000 + 7
        assert stat.S_IMODE(mode) == 0o2770 and os.stat(host).st_gid == gid
        assert os.getxattr(host, "system.posix_acl_default") == GROUP_DEFAULT_ACL
        assert folders.gids == (gid,) and folders.names == ((gid, "vision"),)
        assert mount_point.st_uid == ann.run_as[0]  # the member's own, on their own disk
        group_file = ann._write_identity_files(folders.names)["/etc/group"]
        assert f"vision:x:{gid}:jovyan" in open(group_file).read()
    else:
        assert stat.S_IMODE(mode) == 0o700 and os.stat(host).st_uid == os.getuid()
        assert folders.gids == () and folders.names == ()
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o700


def test_a_non_member_and_a_switched_off_trait_get_nothing(tmp_path, as_root):
    bob = spawner(tmp_path, user("bob", 2, STAFF))
    disk = bob._prepare_disk(True)
    assert bob._prepare_group_folders(disk, True, bob.shared_groups()).binds == ()
    assert not os.path.exists(os.path.join(disk, "shared"))
    off = spawner(tmp_path, user("ann", 1, VISION), group_folders=False)
    disk = off._prepare_disk(True)
    assert off._prepare_group_folders(disk, True, off.shared_groups()).binds == ()
    assert not os.path.exists(tmp_path / "shared" / "vision")


def test_a_removed_member_gets_no_mount_and_the_files_stay(tmp_path, as_root):
    ann = user("ann", 1, VISION, NLP)
    first = spawner(tmp_path, ann)
    disk = first._prepare_disk(True)
    assert len(first._prepare_group_folders(disk, True, first.shared_groups()).binds) == 2
    (tmp_path / "shared" / "vision" / "results.csv").write_text("1,2\n")
    ann.groups.remove(VISION)  # `meterhub group remove vision ann`
    again = spawner(tmp_path, ann)
    folders = again._prepare_group_folders(again._prepare_disk(True), True, again.shared_groups())
    assert [inside for _, inside in folders.binds] == ["/home/jovyan/shared/nlp"]
    assert os.listdir(os.path.join(disk, "shared")) == ["nlp"]  # the empty mount point went
    assert (tmp_path / "shared" / "vision" / "results.csv").read_text() == "1,2\n"


def test_the_users_own_files_are_never_covered_or_removed(tmp_path, as_root, caplog):
    ann = spawner(tmp_path, user("ann", 1, VISION))
    disk = ann._prepare_disk(True)
    os.makedirs(os.path.join(disk, "shared", "vision"))
    open(os.path.join(disk, "shared", "vision", "mine.txt"), "w").close()
    os.makedirs(os.path.join(disk, "shared", "old-group"))
    open(os.path.join(disk, "shared", "old-group", "keep.txt"), "w").close()
    with caplog.at_level(logging.WARNING):
        folders = ann._prepare_group_folders(disk, True, ann.shared_groups())
    assert folders.binds == () and "holds the user's own files" in caplog.text
    assert os.path.exists(os.path.join(disk, "shared", "old-group", "keep.txt"))


def test_a_planted_link_is_never_followed(tmp_path, as_root):
    """The disk is the user's: `shared` made a link elsewhere must not make the hub (root)
    create or chown anything there."""
    ann = spawner(tmp_path, user("ann", 1, VISION))
    disk = ann._prepare_disk(True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(disk, "shared"))
    assert ann._prepare_group_folders(disk, True, ann.shared_groups()).binds == ()
    assert os.listdir(elsewhere) == []


def test_without_the_sandbox_the_mount_point_is_a_link(tmp_path, as_root):
    ann = spawner(tmp_path, user("ann", 1, VISION))
    disk = ann._prepare_disk(False)
    folders = ann._prepare_group_folders(disk, False, ann.shared_groups())
    link = os.path.join(disk, "shared", "vision")
    assert folders.binds == () and os.readlink(link) == str(tmp_path / "shared" / "vision")
    if as_root:  # the server's uid opens it by path: the root is traversable, not listable
        assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o711
        assert folders.gids == (300007,)
    # back in the sandbox, the link becomes a mount point again
    assert ann._prepare_group_folders(disk, True, ann.shared_groups()).binds
    assert os.path.isdir(link) and not os.path.islink(link)


def _server(data, who) -> SandboxSpec:
    s = spawner(data, who)
    disk = s._prepare_disk(True)
    folders = s._prepare_group_folders(disk, True, s.shared_groups())
    return SandboxSpec(
        disk=disk,
        disk_mount="/home/jovyan",
        pool=None,
        pool_mount="/public",
        hidden=(str(data),),
        files=s._write_identity_files(folders.names),
        run_as=s.run_as,
        rw_binds=folders.binds,
        groups=folders.gids,
    )


def _run(spec: SandboxSpec, script: str) -> str:
    out = subprocess.run(
        bwrap_command(spec, ["/bin/sh", "-c", script]), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(bwrap_works() != "", reason="bubblewrap cannot run here")
def test_members_share_the_folder_for_real_and_others_cannot_reach_it(tmp_path):
    data = tmp_path / "data"
    ann = _server(data, user("ann", 1, VISION))
    ben = _server(data, user("ben", 2, VISION))
    cat = _server(data, user("cat", 3, STAFF))
    folder = "/home/jovyan/shared/vision"
    _run(ann, f"echo from-ann > {folder}/notes.txt")
    assert _run(ben, f"cat {folder}/notes.txt; echo from-ben >> {folder}/notes.txt") == "from-ann\n"
    assert _run(ann, f"cat {folder}/notes.txt") == "from-ann\nfrom-ben\n"
    # cat's server has no such folder, and the hub's data directory is hidden from it
    assert _run(
        cat, f"ls {folder} 2>/dev/null || echo none; ls {data} 2>/dev/null || echo hidden"
    ) == ("none\nhidden\n")
    if os.geteuid() == 0:
        # servers run as uids of their own: without the group's gid even a bind of the
        # folder (were the sandbox given one) would not let a non-member in
        import dataclasses

        intruder = dataclasses.replace(cat, rw_binds=ann.rw_binds)
        os.makedirs(os.path.join(cat.disk, "shared", "vision"), exist_ok=True)
        assert _run(intruder, f"cat {folder}/notes.txt 2>/dev/null || echo denied") == "denied\n"


def test_start_binds_the_folders_of_the_groups_the_user_is_in_now(tmp_path, monkeypatch):
    """start() reads membership and hands the binds (and gids) to the sandbox; the process
    itself is not started (Popen is the one part replaced: a server needs a hub)."""
    import asyncio

    from meterhub.spawner import local

    if bwrap_works():
        pytest.skip("bubblewrap cannot run here")
    commands: list[list[str]] = []

    class Started(Exception):
        pass

    def popen(cmd, **kwargs):
        commands.append(cmd)
        raise Started

    monkeypatch.setattr(local, "Popen", popen)
    ann = user("ann", 1, VISION)
    hub = SimpleNamespace(
        public_host="", url="http://127.0.0.1:8081/hub/", base_url="/hub/", api_url=""
    )
    s = spawner(tmp_path, ann, hub=hub, resource_limits="off", gpus=[], sandbox="bwrap")
    s.api_token = "token"
    for _ in range(2):
        s.user_options = {"profile": "debug"}
        with pytest.raises(Started):
            asyncio.run(s.start())
        ann.groups.clear()  # removed: the next start binds nothing
    host = str(tmp_path / "shared" / "vision")
    first, second = commands
    i = first.index(host)
    assert first[i - 1 : i + 2] == ["--bind", host, "/home/jovyan/shared/vision"]
    if os.geteuid() == 0:
        assert "--groups=300007" in first and "--clear-groups" in second
    assert host not in second
