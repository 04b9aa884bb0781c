"""Processes as /proc shows them: one reader for the spawner's recovery and `meterhub stop`.

No JupyterHub import here: the CLI uses it without loading the hub.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    #: one letter of /proc/PID/stat: R, S, D, T, Z ...
    state: str
    #: clock ticks after boot: with the pid, what tells this process from a later one
    started_ticks: int
    #: the command line, without empty arguments
    argv: tuple[bytes, ...]

    @property
    def started_at(self) -> float:
        """Epoch seconds."""
        return boot_time() + self.started_ticks / os.sysconf("SC_CLK_TCK")


@functools.cache
def boot_time() -> float:
    """When the kernel booted, epoch seconds (whole seconds: /proc/stat's btime)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def read_process(pid: int, proc: str = "/proc") -> Process | None:
    """The process `pid` now, or None when there is none (or it exited while read)."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            # the command name (field 2) is in parentheses and may hold anything: cut there
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            argv = tuple(a for a in f.read().split(b"\0") if a)
        return Process(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]), argv)
    except (OSError, IndexError, ValueError):
        return None


def scan(proc: str = "/proc") -> list[Process]:
    """Every process this user can see (blocking)."""
    found = []
    for entry in os.listdir(proc):
        if entry.isdigit():
            process = read_process(int(entry), proc)
            if process is not None:
                found.append(process)
    return found
