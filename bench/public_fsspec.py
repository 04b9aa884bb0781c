"""`/public` through fsspec: reads through `public://` (extensions/pool.py's PublicFileSystem)
vs the same reads with the builtin `open`, side by side, alternating.

1. Throughput: one 1 GiB file read whole, `f.read(8 MiB)` until the end, from
   `open(path, "rb")` and from `fs.open(path, "rb")` (the same loop), after a warm-up read
   of each so both come from the page cache. Goal: public:// ≥ 0.95× raw.
2. Per-open overhead: 10,000 small files (4 KiB each) opened and read whole, public://'s
   `fs.open(path).read()` vs `open(path, "rb").read()`; reported per file.

Everything lives in a temporary folder, deleted at the end.

    .venv/bin/python bench/public_fsspec.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from meterhub.extensions.pool import PublicFileSystem  # noqa: E402

CHUNK = 8 << 20


def write_big(path: Path, size: int) -> None:
    block = os.urandom(CHUNK)
    with open(path, "wb") as f:
        for _ in range(size // CHUNK):
            f.write(block)


def drain(f) -> int:
    total = 0
    while chunk := f.read(CHUNK):
        total += len(chunk)
    return total


def read_raw(path: Path) -> tuple[float, int]:
    start = time.perf_counter()
    with open(path, "rb") as f:
        total = drain(f)
    return time.perf_counter() - start, total


def read_public(fs: PublicFileSystem, name: str) -> tuple[float, int]:
    start = time.perf_counter()
    with fs.open(name, "rb") as f:
        total = drain(f)
    return time.perf_counter() - start, total


def small_raw(root: Path, names: list[str]) -> float:
    start = time.perf_counter()
    for name in names:
        with open(root / name, "rb") as f:
            f.read()
    return time.perf_counter() - start


def small_public(fs: PublicFileSystem, names: list[str]) -> float:
    start = time.perf_counter()
    for name in names:
        with fs.open(name, "rb") as f:
            f.read()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fs = PublicFileSystem(str(root))
        big = root / "big.bin"
        write_big(big, args.size_mib << 20)
        size = big.stat().st_size
        read_raw(big), read_public(fs, "big.bin")  # warm: both from the page cache
        raw, public = [], []
        for i in range(args.rounds):
            pair = [("raw", lambda: read_raw(big)), ("public", lambda: read_public(fs, "big.bin"))]
            for label, read in pair if i % 2 == 0 else pair[::-1]:
                seconds, total = read()
                assert total == size, f"{label} read {total} of {size} bytes"
                (raw if label == "raw" else public).append(seconds)
        a, b = statistics.median(raw), statistics.median(public)
        gib = size / (1 << 30)
        print(
            f"{args.size_mib} MiB read: raw {gib / a:.2f} GiB/s ({a * 1000:.0f} ms), public:// {gib / b:.2f}"
            f" GiB/s ({b * 1000:.0f} ms), public/raw throughput {a / b:.3f}"
            f" (medians of {args.rounds}; raw {[round(x * 1000) for x in raw]} ms,"
            f" public {[round(x * 1000) for x in public]} ms)"
        )
        big.unlink()

        small = root / "small"
        small.mkdir()
        payload = os.urandom(4096)
        names = [f"small/f{i:05d}.bin" for i in range(args.files)]
        for name in names:
            (root / name).write_bytes(payload)
        small_raw(root, names), small_public(fs, names)  # warm
        raw, public = [], []
        for i in range(args.rounds):
            if i % 2 == 0:
                raw.append(small_raw(root, names))
                public.append(small_public(fs, names))
            else:
                public.append(small_public(fs, names))
                raw.append(small_raw(root, names))
        a, b = statistics.median(raw), statistics.median(public)
        n = len(names)
        print(
            f"{n} small files (4 KiB): raw {a * 1e6 / n:.1f} µs/file ({a:.2f} s),"
            f" public:// {b * 1e6 / n:.1f} µs/file ({b:.2f} s), overhead"
            f" {(b - a) * 1e6 / n:.1f} µs per open+read, ratio {b / a:.2f}"
            f" (medians of {args.rounds})"
        )


if __name__ == "__main__":
    main()
