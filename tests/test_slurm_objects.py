"""The Slurm backend's pure parts, no cluster: the batch script from the catalog, account
mapping, time limits from credit, queue parsing, and the site config's translation."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from meterhub.billing_hooks.postings import covered_until, session_runway
from meterhub.hub.config import ConfigError, apply_config, load_site_config
from meterhub.spawner.catalog import Catalog
from meterhub.spawner.slurm import (
    JobSpec,
    cluster_account,
    format_time,
    job_is_gone,
    job_script,
    parse_job_line,
    queue_position,
    sbatch_options,
    time_limit_minutes,
)


def spec(profile: str = "a800", gpus: int = 1, **kw) -> JobSpec:
    choice = Catalog().choice(profile, gpus)
    fields = dict(
        user="alice",
        choice=choice,
        partition="debug" if profile == "debug" else profile,
        disk="/shared/disks/alice",
        disk_mount="/home/jovyan",
        pool="/shared/public",
        pool_mount="/public",
        env_prefix="/opt/meterhub",
        export=("JUPYTERHUB_API_TOKEN", "PATH"),
        command=(
            "/opt/meterhub/bin/batchspawner-singleuser",
            "/opt/meterhub/bin/jupyterhub-singleuser",
        ),
        ro_paths=("/opt/meterhub",),
        hidden=("/shared/disks",),
    )
    fields.update(kw)
    return JobSpec(**fields)


def test_a_gpu_choice_asks_for_its_typed_gres_partition_cpus_and_memory():
    options = sbatch_options(spec("a800", 2, time_minutes=90, account="lab", qos="normal"))
    assert options == [
        "--job-name=meterhub-alice",
        "--partition=a800",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=32",
        "--mem=240G",
        "--gres=gpu:a800:2",
        "--time=01:30:00",
        "--account=lab",
        "--qos=normal",
        "--no-requeue",
        "--output=/dev/null",
        "--export=JUPYTERHUB_API_TOKEN,PATH",
    ]


def test_debug_mode_asks_for_no_gpu_and_hides_any_it_lands_on():
    script = job_script(spec("debug", 0))
    assert "--gres" not in script and "#SBATCH --partition=debug" in script
    assert 'export CUDA_VISIBLE_DEVICES=""' in script
    assert "export NVIDIA_VISIBLE_DEVICES=void" in script


def test_the_script_sandboxes_with_bwrap_where_it_can_and_says_so_where_not():
    script = job_script(spec())
    sandboxed, _, fallback = script.partition("\nfi\n")
    assert "if command -v bwrap" in sandboxed
    assert "--bind /shared/disks/alice /home/jovyan" in sandboxed
    assert "--ro-bind /shared/public /public" in sandboxed
    assert '"${devices[@]}"' in sandboxed  # the node's GPU nodes inside
    assert "no bubblewrap sandbox" in fallback and '--ServerApp.root_dir="$DISK"' in fallback
    required = job_script(spec(sandbox="bwrap"))
    assert required.rstrip().endswith("exit 1")
    off = job_script(spec(sandbox="off"))
    assert "bwrap" not in off.replace("no bubblewrap", "")


def test_values_are_shell_quoted():
    script = job_script(spec(disk="/shared/disks/a b;rm -rf ~", extra_env={"X": "$(id)"}))
    assert "DISK='/shared/disks/a b;rm -rf ~'" in script
    assert "export X='$(id)'" in script


@pytest.mark.parametrize(
    "user, user_map, account",
    [
        ("alice", "same", "alice"),
        ("alice", "prefix:hpc-", "hpc-alice"),
        ("alice", "run_as:jupyter", "jupyter"),
    ],
)
def test_hub_users_map_to_cluster_accounts(user, user_map, account):
    assert cluster_account(user, user_map) == account


@pytest.mark.parametrize("user", ["Alice", "a;b", "../x", "a" * 40, "-x"])
def test_a_name_that_cannot_be_an_account_is_refused(user):
    with pytest.raises(ValueError, match="cannot name a cluster account"):
        cluster_account(user, "same")


def test_the_time_limit_never_outlasts_the_credit():
    assert time_limit_minutes(None, None) is None
    assert time_limit_minutes(3599, None) == 59  # rounded down
    assert time_limit_minutes(30, None) == 1  # Slurm's least
    assert time_limit_minutes(7200, 60) == 60
    assert format_time(1333) == "22:13:00" and format_time(1500) == "1-01:00:00"
    # ¥10.00 at ¥4.50/h: 2 h 13 min 20 s
    assert session_runway(None, 0, 10_000_000, 4_500_000, None, None) == 8000
    # a pass until t=3600, then the credit; a cost cap; a time cap
    assert session_runway(3600, 0, 4_500_000, 4_500_000, None, None) == 7200
    assert session_runway(None, 0, 10_000_000, 4_500_000, 4_500_000, None) == 3600
    assert session_runway(None, 0, 10_000_000, 4_500_000, None, 600) == 600
    assert session_runway(None, 0, 0, 0, None, None) is None  # a free rate
    assert session_runway(None, 0, -5, 4_500_000, None, None) == 0  # overdrawn: nothing
    assert covered_until([(0, 50), (50, 90), (100, 200)], 10) == 90
    assert covered_until([(20, 50)], 10) is None


def test_squeue_lines_and_queue_positions():
    assert parse_job_line("PENDING n/a Resources") == ("PENDING", "n/a", "Resources")
    assert parse_job_line("RUNNING node7 None") == ("RUNNING", "node7", "None")
    assert parse_job_line("") == ("", "", "")
    lines = "12 100\n15 300\n14 100\nbad line\n"
    assert queue_position("15", lines) == 1
    assert queue_position("12", lines) == 2  # same priority: the older first
    assert queue_position("14", lines) == 3
    assert queue_position("99", lines) is None


def test_the_site_config_selects_and_configures_the_slurm_backend(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(
        "backend: slurm\n"
        "public_dir: /shared/public\n"
        "slurm:\n"
        "  home_root: /shared/disks\n"
        "  partitions: {a800: gpu-a800}\n"
        "  user_map: 'prefix:hpc-'\n"
        "  account: lab\n"
        "  hub_host: 10.0.0.5\n"
        "  pass_capacity: {a800: 4}\n"
    )
    c = apply_config(load_site_config(path, cwd=str(tmp_path)), Config())
    assert c.JupyterHub.spawner_class == "meterhub.spawner.slurm.SlurmGPUSpawner"
    s = c.SlurmGPUSpawner
    assert s.home_root == "/shared/disks" and s.partitions == {"a800": "gpu-a800"}
    assert s.user_map == "prefix:hpc-" and s.account == "lab" and s.debug_partition == "debug"
    assert s.queue_timeout_seconds == 300 and s.poll_interval == 30 and s.sandbox == "auto"
    assert s.pool_dir == "/shared/public"
    assert c.JupyterHub.hub_ip == "10.0.0.5"
    assert s.environment["METERHUB_BILLING_URL"].startswith("http://10.0.0.5:")
    assert c.BillingSettings.pass_capacity == {"a800": 4}


@pytest.mark.parametrize(
    "text, message",
    [
        ("backend: slurm\n", "slurm.home_root: required with backend: slurm"),
        ("slurm: {home_root: /x, user_map: 'sudo:root'}\n", "slurm.user_map"),
        ("slurm: {home_root: relative}\n", "slurm.home_root"),
        ("slurm: {home_root: /x, partitions: {a800: 'a b'}}\n", "slurm.partitions.a800"),
        ("slurm: {home_root: /x, srun: yes}\n", "slurm.srun: unknown key"),
        (
            "slurm: {home_root: /x, user_map: 'run_as:jupyter'}\n",
            "slurm.sandbox: with user_map run_as",
        ),
    ],
)
def test_bad_slurm_settings_name_their_key(tmp_path, text, message):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_site_config(path, cwd=str(tmp_path))


@pytest.mark.parametrize(
    "user, user_map", [("root", "same"), ("daemon", "same"), ("x", "run_as:root")]
)
def test_jobs_never_run_as_a_system_account(tmp_path, user, user_map):
    from meterhub.hub.render_slurm import offline_spawner

    site = load_site_config(None, cwd=str(tmp_path))
    site["slurm"].update(home_root="/shared/disks", user_map=user_map, sandbox="bwrap")
    spawner = offline_spawner(site, user)
    with pytest.raises(ValueError, match="system account"):
        spawner.account_entry()


@pytest.mark.parametrize(
    "output, gone",
    [
        ("", True),
        ("slurm_load_jobs error: Invalid job id specified", True),
        ("CANCELLED node1 None", True),
        ("TIMEOUT node1 TimeLimit", True),
        ("RUNNING node1 None", False),
        ("SUSPENDED node1 None", False),
        ("PENDING n/a Resources", False),
        ("slurm_load_jobs error: Unable to contact slurm controller", None),
        ("Killed", None),
        ("sudo: a password is required", None),
    ],
)
def test_a_job_is_gone_only_when_slurm_says_so(output, gone):
    assert job_is_gone(output) is gone
