"""The Slurm backend, live: a real hub submits real jobs to a one-node Slurm cluster
(tests/slurm.py) whose jobs run real jupyterhub-singleuser servers as cluster accounts.

Debug and a800×1 run as jobs with their partition and GRES; a stop cancels the job; a job
killed from outside closes its session where it was last seen; a hub restart adopts the
running job; a job stuck in the queue shows its position and times out with a message;
every profile's `render-slurm` script is accepted by `sbatch --test-only`; the port
handler takes a port from the spawning server's own token and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import accrued

from .clirun import run_cli
from .hubprocess import ADMIN_TOKEN, HubProcess, until
from .jupyter import execute
from .slurm import SlurmCluster, slurm_missing
from .test_disk_idle_archive import progress_of_a_spawn
from .test_idle_hub import charges, closed

PREFIX = "mhs-"
START_TIMEOUT = 25

pytestmark = pytest.mark.skipif(bool(slurm_missing()), reason=slurm_missing() or "ok")


@pytest.fixture(scope="module")
def cluster():
    cluster = SlurmCluster()
    saved = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        for user in ("admin", "alice", "bob"):
            cluster.account(PREFIX + user)
        from meterhub.spawner.local import environment_paths

        for path in environment_paths(sys.prefix):
            cluster.open_path(path)
        os.environ.update(cluster.env())  # the hub and the CLI find the cluster
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        cluster.stop()


@pytest.fixture(scope="module")
def hub(cluster, tmp_path_factory):
    home_root = cluster.workdir / "disks"
    home_root.mkdir(mode=0o711)
    pool = cluster.workdir / "public"
    (pool / "models").mkdir(parents=True)
    (pool / "models" / "README").write_text("the pool\n")
    os.chmod(pool, 0o755)
    os.chmod(pool / "models", 0o755)
    hub = HubProcess(
        tmp_path_factory.mktemp("slurm-hub"),
        {
            "backend": "slurm",
            "public_dir": str(pool),
            "slurm": {
                "home_root": str(home_root),
                "user_map": f"prefix:{PREFIX}",
                "start_timeout": START_TIMEOUT,
                "poll_interval_seconds": 1,
            },
            "stop_grace_seconds": 2,
            "billing": {
                "trial_credit": "100.00",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
            },
        },
    )
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    hub.home_root = home_root
    try:
        hub.start()
        yield hub
    finally:
        hub.teardown()


def job_of(cluster: SlurmCluster, account: str) -> dict[str, str]:
    ids = cluster.run("squeue", "-h", "-u", account, "-o", "%i").stdout.split()
    assert len(ids) == 1, (account, ids)
    return cluster.job(ids[0])


def jobs_of(cluster: SlurmCluster, account: str) -> list[str]:
    return cluster.run("squeue", "-h", "-u", account, "-o", "%i").stdout.split()


def assert_charged_exactly(hub: HubProcess, user: str, profile: str):
    session, cost = until(lambda: closed(hub.ledger, user, profile), f"{user}'s session to close")
    assert session.ready_at is not None
    assert session.metered_through == session.stopped_at
    assert cost == accrued(session.rate_micros_per_hour, session.stopped_at - session.ready_at)
    assert cost == charges(hub.ledger, session.id)
    return session, cost


async def test_debug_and_a800_run_as_jobs_of_the_users_account_and_a_stop_cancels_them(
    hub, cluster
):
    hub.spawn("alice", {"profile": "debug"})
    job = job_of(cluster, PREFIX + "alice")
    assert job["JobState"] == "RUNNING"
    assert job["Partition"] == "debug"
    assert job["UserId"].startswith(PREFIX + "alice(")
    assert job.get("TresPerNode", "(null)") in ("", "(null)")  # no GPU at all
    out = await execute(
        hub.url,
        "alice",
        ADMIN_TOKEN,
        "import os, getpass\n"
        "print(os.getcwd(), repr(os.environ['CUDA_VISIBLE_DEVICES']), getpass.getuser())\n"
        "print(open('/public/models/README').read().strip())\n"
        "try:\n    open('/public/x', 'w')\nexcept OSError as e:\n    print('read-only', e.errno)\n"
        "open('kept.txt', 'w').write('on the shared disk')\n"
        "print(sorted(os.listdir('/home')))\n",
    )
    lines = out.splitlines()
    assert lines[0] == f"/home/jovyan '' {PREFIX}alice", out
    assert lines[1] == "the pool" and lines[2].startswith("read-only"), out
    assert lines[3] == "['jovyan']", out  # no other user's disk in the sandbox
    disk = hub.home_root / "alice"
    assert (disk / "kept.txt").read_text() == "on the shared disk"
    assert disk.stat().st_uid == cluster.account(PREFIX + "alice").pw_uid
    assert any(p.name.startswith("slurm-") for p in (disk / ".meterhub").iterdir())

    hub.stop_server("alice")
    until(lambda: not jobs_of(cluster, PREFIX + "alice"), "the job to leave the queue")
    assert_charged_exactly(hub, "alice", "debug")

    balance = hub.ledger.balance("alice")
    hub.spawn("alice", {"profile": "a800", "gpus": "1"})
    job = job_of(cluster, PREFIX + "alice")
    assert job["Partition"] == "a800"
    assert job["TresPerNode"] == "gres:gpu:a800:1"
    assert "cpu=16" in job["TRES"] and "mem=120G" in job["TRES"], job["TRES"]
    # never longer than the credit lasts at the captured rate (¥4.50/h)
    limit = job["TimeLimit"]
    hours, minutes, _ = (int(x) for x in limit.split(":"))
    assert hours * 60 + minutes == balance * 60 // 4_500_000, (limit, balance)
    # the same disk as in debug mode
    kept = await execute(hub.url, "alice", ADMIN_TOKEN, "print(open('kept.txt').read())")
    assert kept.strip() == "on the shared disk"
    hub.stop_server("alice")
    until(lambda: not jobs_of(cluster, PREFIX + "alice"), "the job to leave the queue")
    assert_charged_exactly(hub, "alice", "a800")
    assert hub.ledger.audit() == []


def test_a_job_killed_outside_the_hub_is_charged_until_it_was_last_seen(hub, cluster):
    hub.spawn("bob", {"profile": "a800", "gpus": "1"})
    job = job_of(cluster, PREFIX + "bob")
    killed_at = int(time.time())
    cluster.run("scancel", job["JobId"])  # preemption, a node failure, an admin: all alike
    until(lambda: hub.server("bob") is None, "the hub to see the job gone")
    session, cost = assert_charged_exactly(hub, "bob", "a800")
    assert session.stopped_at <= killed_at + 1
    time.sleep(2.5)  # two more meter passes: nothing more is charged for a gone job
    assert charges(hub.ledger, session.id) == cost
    assert hub.ledger.audit() == []


async def test_a_hub_restart_adopts_the_running_job(hub, cluster):
    hub.spawn("admin", {"profile": "debug"})
    job = job_of(cluster, PREFIX + "admin")
    hub.restart()
    assert (s := hub.server("admin")) and s["ready"], s
    assert job_of(cluster, PREFIX + "admin")["JobId"] == job["JobId"]
    assert (await execute(hub.url, "admin", ADMIN_TOKEN, "print(6 * 7)")).strip() == "42"
    hub.stop_server("admin")
    until(lambda: not jobs_of(cluster, PREFIX + "admin"), "the job to leave the queue")
    (session, _cost) = assert_charged_exactly(hub, "admin", "debug")
    assert hub.ledger.audit() == []


def test_the_port_handler_takes_only_a_port_from_the_spawning_servers_own_token(hub, cluster):
    import requests

    hub.spawn("bob", {"profile": "debug"})
    url = f"{hub.url}/hub/api/batchspawner"
    r = requests.post(url, json={"port": 9999}, headers={"Authorization": f"token {ADMIN_TOKEN}"})
    assert r.status_code == 403, r.text  # not a server's token, even an admin's
    token = hub.api("POST", "/users/bob/tokens", json={"expires_in": 600}).json()["token"]
    headers = {"Authorization": f"token {token}"}
    for body in ({"cmd": ["/bin/sh"]}, {"port": 9999, "exec_prefix": "x"}, {"port": "9999"}):
        r = requests.post(url, json=body, headers=headers)
        assert r.status_code == 400, (body, r.status_code, r.text)
    assert requests.post(url, json={"port": 9999}, headers=headers).status_code == 403
    # the server's own token, once it runs: nothing is waiting for a port
    token = asyncio.run(
        execute(hub.url, "bob", ADMIN_TOKEN, "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])")
    ).strip()
    r = requests.post(url, json={"port": 9999}, headers={"Authorization": f"token {token}"})
    assert r.status_code == 409, r.text
    hub.stop_server("bob")


def test_a_job_waiting_for_gpus_shows_its_queue_position_and_times_out_clearly(hub, cluster):
    # every A800 of the cluster taken by someone else's job
    blocker = cluster.run(
        "sbatch",
        "--parsable",
        "--partition=a800",
        "--gres=gpu:a800:8",
        "--mem=1G",
        "--output=/dev/null",
        "--wrap=sleep 300",
    ).stdout.strip()
    try:
        until(
            lambda: cluster.job(blocker)["JobState"] == "RUNNING",
            f"the blocker to run: {cluster.job(blocker).get('Reason')}",
        )
        hub.ensure_user("alice")
        balance = until(lambda: hub.ledger.balance("alice"), "alice's wallet")
        text = progress_of_a_spawn(hub, "alice", {"profile": "a800", "gpus": "1"})
        assert "pending (Resources), position 1 in the a800 queue" in text, text
        assert f"did not start within {START_TIMEOUT} s" in text, text
        assert "nothing was charged" in text, text
        until(lambda: not jobs_of(cluster, PREFIX + "alice"), "the stuck job to be cancelled")
        assert hub.ledger.open_sessions("alice") == []
        assert hub.ledger.balance("alice") == balance
    finally:
        cluster.run("scancel", blocker, check=False)


def test_render_slurm_gives_a_script_sbatch_accepts_for_every_profile(hub, cluster):
    config = str(hub.config_path)
    entry = cluster.account(PREFIX + "alice")
    choices = [("debug", None)] + [
        (t, n) for t in ("rtx4090", "a800", "h800") for n in (1, 2, 4, 8)
    ]
    for profile, gpus in choices:
        args = ["render-slurm", "--config", config, "--user", "alice", "--profile", profile]
        args += ["--credit", "10.00"] + (["--gpus", str(gpus)] if gpus else [])
        rendered = run_cli(args)
        assert rendered.returncode == 0, rendered.stderr
        script = Path(cluster.workdir / f"render-{profile}-{gpus}.sh")
        script.write_text(rendered.stdout)
        script.chmod(0o644)
        test = cluster.run(
            "setpriv",
            f"--reuid={entry.pw_uid}",
            f"--regid={entry.pw_gid}",
            "--init-groups",
            "sbatch",
            "--test-only",
            str(script),
            check=False,
        )
        assert test.returncode == 0 and "to start at" in test.stderr, (profile, gpus, test.stderr)
    bad = run_cli(
        ["render-slurm", "--config", config, "--user", "alice", "--profile", "a800", "--gpus", "3"]
    )
    assert bad.returncode == 2 and "'gpus' must be one of 1, 2, 4, 8" in bad.stderr, bad
