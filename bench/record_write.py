"""A server's runtime record written (`spawner.local.write_record`, twice a local start) vs
the raw operation: the same bytes through os.open, os.write, os.fsync and os.replace with
nothing around them. CPU of this thread (`time.thread_time`): the disk's flushes do not
count, the system calls do.

    .venv/bin/python bench/record_write.py [--records 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from meterhub.spawner.local import ServerRecord, record_path, write_record  # noqa: E402


def raw_write(path: str, data: bytes) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(dir="/var/tmp")  # a disk, not tmpfs
    try:
        records = [
            ServerRecord(f"u{i}/", "/srv/disks/u", 1_800_000_000, (0,), ("/sys/fs/cgroup/x",))
            for i in range(args.records)
        ]
        write_record(folder, records[0])  # the records folder exists, as in a running hub
        raw = [(record_path(folder, r.owner) + ".raw", r.to_json().encode()) for r in records]
        for round_no in range(args.rounds):
            began = time.thread_time()
            for record in records:
                write_record(folder, record)
            ours = (time.thread_time() - began) / len(records) * 1e6
            began = time.thread_time()
            for path, data in raw:
                raw_write(path, data)
            bare = (time.thread_time() - began) / len(records) * 1e6
            print(
                f"round {round_no + 1}: write_record {ours:.0f} µs, raw {bare:.0f} µs,"
                f" ratio {ours / bare:.2f} (CPU a record)"
            )
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
