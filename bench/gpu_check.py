"""meterhub's GPU code paths on a real NVIDIA GPU, checked once in under five minutes.

What it runs, each part on its own (one failing does not lose the others' results):

1. `nvml`: `spawner.inventory.detect_inventory()` through the real `pynvml`, (a) with the
   built-in GPU types (rtx4090, a800, h800: an H100 or H200 matches none, so the answer is []
   and a warning) and (b) with site-style `gpu_types` `h100`/`h200` (`product_patterns`,
   through `catalog.merge_gpu_types`, as hub/config.py builds them); the Gpu objects,
   `device_nodes()` (and that the node exists), `visible_devices_env()`, and that CUDA in a
   fresh process sees exactly that GPU with `CUDA_VISIBLE_DEVICES=<uuid>` and none with "".
2. `sampling`: the server extension's `GpuMonitor` (`extensions/server.py`, the busy-GPU
   activity of idle detection), made by `gpu_monitor()` from a server's environment
   (`METERHUB_GPUS`, `CUDA_VISIBLE_DEVICES=<uuid>`), and the widgets' `gpus()` / `GpuInfo`
   (`extensions/widgets.py`): utilization at or under `idle.gpu_busy_percent` (5) when idle,
   above it while bf16 matmuls run (sample() True, the activity stamp set, the hub notified
   once), idle again after. The real modules are imported: jupyter_server, tornado, traitlets
   and ipywidgets come from the carried wheels (`.whl/`); a stand-in is put in place only for
   a module that still cannot be imported, and the report says so.
3. `lora`: the LoRA starter (`extensions/lora.py`) on a randomly initialised
   Llama-2-7B-shaped causal LM (hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000;
   6.74 B parameters), built on the GPU in bf16 and saved as safetensors into a pool made by
   `hub/demo_pool.py` (its byte-level tokenizer and dataset) with the model added to
   `catalog.yaml`; `plan()` must pick it with bf16 and gradient checkpointing. `train()` runs
   to step `--interrupt-at` of `--steps` (checkpoints every `--save-every`, an override of
   the plan's 50) and is interrupted there, as a stopped server would be; `train()` again
   resumes from the latest checkpoint and finishes, writing the last checkpoint and the
   adapter. Recorded: the plan, the time of each phase (create, save, load, steps), step
   times, tokens per second, losses, peak GPU memory, the files written, and whether the
   resumed steps repeat the interrupted run's losses.
4. While `lora` trains, a thread samples the GPU with the same `GpuMonitor` every second:
   busy during the steps, idle while the model loads.

The wheels (that machine has no network; `.whl/` is in `.git/info/exclude`), fetched here:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl comm==0.2.3 ipython==9.19.1 ipywidgets==8.1.9 jupyter_core==5.9.1 jupyter_server==2.21.1 platformdirs==4.14.9 pygments==2.21.0 tornado==6.6.1 traitlets==5.16.1

On the GPU machine, from the repository root (the wheels carried as `.whl`):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT

It writes `gpu_check.json` (everything) and `gpu_check.md` (the checks, one line each) into
`--out` after every part. `--dry-run` runs the same logic here without a GPU: a stand-in
`pynvml` (an H100 whose utilization follows the workload), a tiny Llama (hidden 64, 2
layers) on CPU, in under a minute.

Without an installed meterhub (the GPU machine), `meterhub` is this checkout through a
symlink in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = time.monotonic()

#: the Llama-2-7B shape; bos/eos/pad are the demo tokenizer's end-of-text (id 256)
LLAMA_7B = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
#: the same model, tiny (--dry-run)
LLAMA_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
MODEL_NAME = "llama-2-7b-shaped"
#: site-style GPU types for the cards the machine may have (hub/site-schema.yaml gpu_types)
SITE_GPU_TYPES = {
    "h100": {
        "display_name": "H100",
        "vram_gb": 80,
        "price_per_hour": "7.50",
        "cpu_per_gpu": 16,
        "memory_gib_per_gpu": 120,
        "product_patterns": ["h100"],
        "node_product": "NVIDIA-H100-80GB-HBM3",
    },
    "h200": {
        "display_name": "H200",
        "vram_gb": 141,
        "price_per_hour": "9.90",
        "cpu_per_gpu": 16,
        "memory_gib_per_gpu": 120,
        "product_patterns": ["h200"],
        "node_product": "NVIDIA-H200",
    },
}
BUSY_PERCENT = 5  # idle.gpu_busy_percent's default


def now() -> float:
    return round(time.monotonic() - T0, 3)


def say(message: str) -> None:
    print(f"[{now():7.1f}s] {message}", flush=True)


class Report:
    """Results by part, and checks; written to --out after every part."""

    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.data: dict = {"meta": meta, "parts": {}, "checks": []}

    def check(self, name: str, ok: bool | None, detail: object = "") -> None:
        """ok None: information, neither pass nor fail."""
        status = "INFO" if ok is None else "PASS" if ok else "FAIL"
        self.data["checks"].append({"check": name, "status": status, "detail": str(detail)})
        say(f"{status} {name}: {detail}")

    def part(self, name: str, function, *args) -> dict:
        say(f"== {name}")
        started = time.perf_counter()
        record: dict = {}
        self.data["parts"][name] = record
        try:
            function(record, *args)
            record["ok"] = True
        except Exception as e:
            record["ok"] = False
            record["error"] = traceback.format_exc()
            self.check(f"{name}.completed", False, f"{type(e).__name__}: {e}")
            print(record["error"], flush=True)
        except KeyboardInterrupt:  # the time limit (gpu_check.sh: timeout -s INT)
            record["ok"] = False
            record["error"] = traceback.format_exc()
            record["seconds"] = round(time.perf_counter() - started, 2)
            self.check(f"{name}.completed", False, "interrupted (time limit)")
            self.write()
            raise
        record["seconds"] = round(time.perf_counter() - started, 2)
        say(f"== {name} done in {record['seconds']} s (ok={record['ok']})")
        self.write()
        return record

    def write(self) -> None:
        self.data["meta"]["elapsed_seconds"] = now()
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.rename(self.out / "gpu_check.json")
        lines = [
            "# meterhub GPU check",
            "",
            f"{self.data['meta'].get('device', '?')}; {self.data['meta'].get('mode')};"
            f" {self.data['meta']['elapsed_seconds']:.0f} s",
            "",
            "| status | check | detail |",
            "| --- | --- | --- |",
        ]
        for c in self.data["checks"]:
            detail = c["detail"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {c['status']} | {c['check']} | {detail[:400]} |")
        for name, part in self.data["parts"].items():
            lines.append(f"\n{name}: ok={part.get('ok')} in {part.get('seconds')} s")
            if part.get("error"):
                lines.append("```\n" + part["error"][-3000:] + "\n```")
        (self.out / "gpu_check.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ imports and fakes


def import_meterhub() -> str:
    """`meterhub` installed (editable), else this checkout through a symlink named meterhub."""
    try:
        importlib.import_module("meterhub.spawner")
        return "installed"
    except ImportError:
        pass
    shim = Path(tempfile.gettempdir()) / "meterhub-shim"
    shim.mkdir(exist_ok=True)
    link = shim / "meterhub"
    if not link.is_symlink():
        link.symlink_to(ROOT, target_is_directory=True)
    sys.path.insert(0, str(shim))
    for name in [m for m in sys.modules if m == "meterhub" or m.startswith("meterhub.")]:
        del sys.modules[name]
    importlib.import_module("meterhub.spawner")
    return f"shim {link} -> {ROOT}"


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    module.__meterhub_stand_in__ = True
    return module


def _install_stand_ins(names: list[str]) -> list[str]:
    """Stand-ins for the server extension's imports that cannot be imported (see the doc)."""

    class HTTPError(Exception):
        def __init__(self, status_code=500, log_message=None, *args, **kwargs):
            super().__init__(status_code, log_message)

    class APIHandler:
        def update_api_activity(self):
            pass

    async def ensure_async(value):
        return await value if asyncio.iscoroutine(value) else value

    def url_path_join(*pieces):
        return "/".join(p.strip("/") for p in pieces if p)

    class _Any:
        def __init__(self, *args, **kwargs):
            pass

    made = {
        "tornado": lambda: _module("tornado"),
        "tornado.web": lambda: _module(
            "tornado.web", authenticated=lambda f: f, HTTPError=HTTPError
        ),
        "tornado.httpclient": lambda: _module(
            "tornado.httpclient",
            AsyncHTTPClient=_Any,
            HTTPClientError=type("HTTPClientError", (Exception,), {}),
            HTTPRequest=_Any,
        ),
        "jupyter_server": lambda: _module("jupyter_server"),
        "jupyter_server.base": lambda: _module("jupyter_server.base"),
        "jupyter_server.base.handlers": lambda: _module(
            "jupyter_server.base.handlers", APIHandler=APIHandler
        ),
        "jupyter_server.utils": lambda: _module(
            "jupyter_server.utils", ensure_async=ensure_async, url_path_join=url_path_join
        ),
    }
    stood_in = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            sys.modules[name] = made[name]()
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, sys.modules[name])
            stood_in.append(name)
    return stood_in


def import_server_extension(record: dict):
    try:
        return importlib.import_module("meterhub.extensions.server")
    except ImportError as e:
        record["server_import_error"] = repr(e)
    record["stand_ins"] = _install_stand_ins(
        [
            "tornado",
            "tornado.web",
            "tornado.httpclient",
            "jupyter_server",
            "jupyter_server.base",
            "jupyter_server.base.handlers",
            "jupyter_server.utils",
        ]
    )
    return importlib.import_module("meterhub.extensions.server")


def import_widgets(record: dict):
    try:
        return importlib.import_module("meterhub.extensions.widgets")
    except ImportError as e:
        record["widgets_import_error"] = repr(e)

    class Widget:
        def __init__(self, children=(), **kwargs):
            self.children, self.value = children, kwargs.get("value", "")

        def on_click(self, callback):
            pass

        def close(self):
            pass

    sys.modules["ipywidgets"] = _module(
        "ipywidgets", HBox=Widget, HTML=Widget, Button=Widget, Layout=lambda **k: k
    )
    record["stand_ins"] = record.get("stand_ins", []) + ["ipywidgets"]
    return importlib.import_module("meterhub.extensions.widgets")


class FakeNVML(types.ModuleType):
    """pynvml for --dry-run: one H100 whose utilization is 97 % while `busy` is set."""

    def __init__(self):
        super().__init__("pynvml")
        self.busy = threading.Event()
        self.uuid = "GPU-00000000-fake-4h10-0000-000000000000"
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.inits -= 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        if index != 0:
            raise ValueError(f"no GPU {index}")
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if (uuid.decode() if isinstance(uuid, bytes) else uuid) != self.uuid:
            raise ValueError(f"no GPU {uuid}")
        return 0

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle):
        return self.uuid

    def nvmlDeviceGetMinorNumber(self, handle):
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=97 if self.busy.is_set() else 0, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        total = 80 * 2**30
        return types.SimpleNamespace(total=total, used=2**30, free=total - 2**30)

    def nvmlSystemGetDriverVersion(self):
        return "fake"


class Busy:
    """Marks the fake GPU busy while the block runs (nothing on a real GPU)."""

    def __init__(self, fake: FakeNVML | None):
        self.fake = fake

    def __enter__(self):
        if self.fake is not None:
            self.fake.busy.set()

    def __exit__(self, *exc):
        if self.fake is not None:
            self.fake.busy.clear()


def versions() -> dict:
    found = {}
    for name in (
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "safetensors",
        "tokenizers",
        "pynvml",
        "yaml",
        "fsspec",
        "traitlets",
        "tornado",
        "jupyter_server",
        "jupyter_core",
        "ipywidgets",
        "IPython",
        "comm",
    ):
        try:
            module = importlib.import_module(name)
        except Exception as e:
            found[name] = f"not importable: {type(e).__name__}: {e}"
            continue
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as dist_version

                version = dist_version({"pynvml": "nvidia-ml-py", "yaml": "PyYAML"}.get(name, name))
            except Exception:
                version = "?"
        found[name] = f"{version} ({getattr(module, '__file__', '?')})"
    return found


# ------------------------------------------------------------------ 1. NVML inventory


def part_nvml(record: dict, ctx: dict) -> None:
    import pynvml

    from meterhub.spawner import inventory
    from meterhub.spawner.catalog import GPU_TYPES, gpu_type_for_product, merge_gpu_types

    report: Report = ctx["report"]
    record["pynvml"] = getattr(pynvml, "__file__", repr(pynvml))
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        record["product_name"] = name.decode() if isinstance(name, bytes) else name
        record["device_count"] = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    ctx["product_name"] = record["product_name"]
    report.check("nvml.product", None, f"{record['device_count']} x {record['product_name']}")

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, log_record):
            warnings.append(log_record.getMessage())

    keep = Keep(level=logging.WARNING)
    inventory.log.addHandler(keep)
    try:
        builtin = inventory.detect_inventory()
    finally:
        inventory.log.removeHandler(keep)
    record["builtin"] = {
        "types": list(GPU_TYPES),
        "gpus": [vars(g) for g in builtin],
        "warnings": warnings,
        "type_for_product": getattr(gpu_type_for_product(record["product_name"]), "slug", None),
    }
    matched = gpu_type_for_product(record["product_name"])
    report.check(
        "nvml.builtin_types",
        (not builtin and bool(warnings)) if matched is None else bool(builtin),
        f"built-in types {list(GPU_TYPES)} -> {[vars(g) for g in builtin]};"
        f" warning: {warnings[:1]}",
    )

    types_ = merge_gpu_types(SITE_GPU_TYPES)
    gpus = inventory.detect_inventory(gpu_types=types_)
    nodes = inventory.device_nodes(gpus)
    env = inventory.visible_devices_env(gpus)
    record["site"] = {
        "gpu_types": SITE_GPU_TYPES,
        "gpus": [dict(vars(g), device_node=g.device_node) for g in gpus],
        "device_nodes": nodes,
        "device_nodes_without_exists_check": inventory.device_nodes(gpus, exists=lambda p: True),
        "visible_devices_env": env,
        "debug_env": inventory.visible_devices_env([]),
        "dev_listing": sorted(p.name for p in Path("/dev").glob("nvidia*")),
    }
    ok = (
        len(gpus) == record["device_count"]
        and all(g.type in ("h100", "h200") for g in gpus)
        and all(g.uuid.startswith("GPU-") for g in gpus)
    )
    report.check(
        "nvml.site_types",
        ok,
        "; ".join(f"#{g.index} {g.type} {g.uuid} {g.device_node}" for g in gpus) or "no GPU",
    )
    if gpus:
        exists = os.path.exists(gpus[0].device_node)
        report.check(
            "nvml.device_node",
            exists or ctx["dry_run"],
            f"{gpus[0].device_node} exists={exists}; device_nodes()={nodes};"
            f" /dev: {record['site']['dev_listing']}",
        )
        ctx["uuid"] = gpus[0].uuid
    report.check("nvml.visible_devices_env", bool(gpus and env["CUDA_VISIBLE_DEVICES"]), env)

    # CUDA in a fresh process, with the server's environment and with debug mode's
    probe = (
        "import torch; n = torch.cuda.device_count();"
        " print(n, torch.cuda.get_device_name(0) if n else '')"
    )
    seen = {}
    runs = {}
    for label, value in (("uuid", env.get("CUDA_VISIBLE_DEVICES", "")), ("debug", "")):
        child_env = dict(os.environ, CUDA_VISIBLE_DEVICES=value)
        runs[label] = subprocess.Popen(
            [sys.executable, "-c", probe],
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for label, process in runs.items():
        out, err = process.communicate(timeout=120)
        seen[label] = {"stdout": out.strip(), "stderr": err.strip()[-500:]}
    record["cuda_visible_devices_probe"] = seen
    count = int((seen["uuid"]["stdout"] or "-1").split()[0])
    report.check(
        "nvml.cuda_sees_uuid",
        count == 1 or (ctx["dry_run"] and count == 0),
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')}: {seen['uuid']['stdout']!r}",
    )
    report.check(
        "nvml.cuda_debug_mode_hidden",
        seen["debug"]["stdout"].split()[:1] == ["0"],
        f"CUDA_VISIBLE_DEVICES='': {seen['debug']['stdout']!r}",
    )


# ------------------------------------------------------------------ 2. sampling


def gpu_work(seconds: float, device: str, stop: threading.Event | None = None) -> int:
    """bf16 matmuls on `device` for `seconds`; the number of matmuls."""
    import torch

    size = 8192 if device == "cuda" else 256
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop and stop.is_set()):
        for _ in range(8):
            a @ b
        done += 8
        if device == "cuda":
            torch.cuda.synchronize()
    return done


def part_sampling(record: dict, ctx: dict) -> None:
    report: Report = ctx["report"]
    fake: FakeNVML | None = ctx["fake"]
    server = import_server_extension(record)
    widgets = import_widgets(record)
    record["server_module"] = server.__file__
    record["jupyter_server"] = getattr(sys.modules.get("jupyter_server"), "__file__", None)
    record["ipywidgets"] = getattr(sys.modules.get("ipywidgets"), "__file__", None)
    uuid = ctx.get("uuid", "0")
    environ = {
        "METERHUB_GPUS": "1",
        "CUDA_VISIBLE_DEVICES": uuid,
        "JUPYTERHUB_ACTIVITY_INTERVAL": "1",
    }
    notified: list[float] = []

    async def notify():
        notified.append(now())

    settings: dict = {}
    monitor = server.gpu_monitor(settings, environ, notify=notify)
    record["monitor"] = {
        "devices": monitor.devices,
        "busy_percent": monitor.busy_percent,
        "interval_seconds": monitor.interval_seconds,
    }
    every_gpu = server.GpuMonitor({}, server.visible_devices(None), BUSY_PERCENT, 1)

    async def samples(n: int, pause: float) -> list[dict]:
        got = []
        for _ in range(n):
            percents = await asyncio.to_thread(monitor.utilization)
            busy = await monitor.sample()
            got.append({"t": now(), "percent": percents, "busy": busy})
            await asyncio.sleep(pause)
        return got

    async def run() -> None:
        record["idle"] = await samples(4, 0.5)
        record["idle_every_gpu"] = await asyncio.to_thread(every_gpu.utilization)
        record["widgets_idle"] = widgets.gpus()
        stop = threading.Event()
        device = "cuda" if ctx["cuda"] else "cpu"
        with Busy(fake):
            worker = asyncio.ensure_future(asyncio.to_thread(gpu_work, 8.0, device, stop))
            await asyncio.sleep(1.5)
            record["busy"] = await samples(8, 0.5)
            record["widgets_busy"] = widgets.gpus()
            info = widgets.GpuInfo()
            record["gpuinfo_html_busy"] = info.value
            stop.set()
            record["matmuls"] = await worker
        record["activity_stamp"] = str(settings.get(server.GPU_ACTIVITY_KEY))
        await asyncio.sleep(2.0)
        record["idle_after"] = await samples(4, 0.5)

    asyncio.run(run())
    every_gpu._close()
    monitor._close()
    record["notified"] = notified

    def show(rows):
        return [f"{r['percent']}:{r['busy']}" for r in rows]

    idle_ok = all(r["busy"] is False for r in record["idle"])
    report.check("sampling.idle", idle_ok, f"percent:busy {show(record['idle'])}")
    busy_rows = record["busy"]
    busy_ok = sum(r["busy"] is True for r in busy_rows) >= len(busy_rows) - 1
    report.check(
        "sampling.busy",
        busy_ok and all(r["busy"] is not None for r in busy_rows),
        f"percent:busy {show(busy_rows)} ({record['matmuls']} matmuls)",
    )
    report.check(
        "sampling.activity_stamp_and_notify",
        record["activity_stamp"] != "None" and len(notified) == 1,
        f"{server.GPU_ACTIVITY_KEY}={record['activity_stamp']}; hub notified {len(notified)}x",
    )
    report.check(
        "sampling.idle_after",
        record["idle_after"][-1]["busy"] is False,
        f"percent:busy {show(record['idle_after'])}",
    )
    report.check("sampling.every_gpu_handles", None, f"devices=None -> {record['idle_every_gpu']}")
    wb = record["widgets_busy"]
    report.check(
        "widgets.gpus",
        len(wb) == 1 and wb[0]["memory_total_mib"] > 0 and wb[0]["utilisation_percent"] > 5,
        f"idle {record['widgets_idle']}; busy {wb}",
    )
    name = ctx.get("product_name") or (wb[0]["name"] if wb else "?")
    report.check(
        "widgets.GpuInfo",
        name in record["gpuinfo_html_busy"],
        record["gpuinfo_html_busy"],
    )
    ctx["server"] = server


# ------------------------------------------------------------------ 3. LoRA


class Sampler(threading.Thread):
    """GpuMonitor.sample() every `interval` s in its own event loop, until stopped."""

    def __init__(self, monitor, interval: float = 1.0):
        super().__init__(daemon=True)
        self.monitor = monitor
        self.interval = interval
        self.stop = threading.Event()
        self.samples: list[dict] = []

    def run(self) -> None:
        async def loop():
            while not self.stop.is_set():
                try:
                    percents = await asyncio.to_thread(self.monitor.utilization)
                except Exception as e:
                    percents = repr(e)
                busy = await self.monitor.sample()
                self.samples.append({"t": now(), "percent": percents, "busy": busy})
                await asyncio.sleep(self.interval)

        asyncio.run(loop())


class Interrupted(Exception):
    """Stands for the stop of a server in the middle of training."""


def _dir_files(path: Path) -> dict[str, int]:
    return {
        str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()
    }


def pool_parent(want_bytes: int, choice: str | None) -> Path:
    """Where to build the pool: --pool-dir, else /dev/shm when it has room, else /tmp."""
    if choice:
        return Path(choice)
    try:
        shm = os.statvfs("/dev/shm")
        if shm.f_bavail * shm.f_frsize > 2 * want_bytes + 8 * 2**30:
            return Path("/dev/shm/meterhub-gpu-check")
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "meterhub-gpu-check"


def build_pool(record: dict, ctx: dict) -> tuple[Path, Path]:
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, LlamaConfig

    from meterhub.hub import demo_pool

    shape = LLAMA_TINY if ctx["dry_run"] else LLAMA_7B
    work = pool_parent(14 * 2**30 if shape is LLAMA_7B else 2**20, ctx["args"].pool_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = work / "public"
    demo_pool.generate_demo_pool(str(root))
    record["pool_root"] = str(root)
    model_dir = root / "models" / MODEL_NAME

    config = LlamaConfig(
        **shape,
        rms_norm_eps=1e-5,
        bos_token_id=256,
        eos_token_id=256,
        pad_token_id=256,
        tie_word_embeddings=False,
    )
    device = "cuda" if ctx["cuda"] else "cpu"
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
    first = next(model.parameters())
    record["create"] = {
        "seconds": round(time.perf_counter() - started, 2),
        "parameters": sum(t.numel() for t in model.parameters()),
        "device": str(first.device),
        "dtype": str(first.dtype),
        "gpu_memory_gib": round(torch.cuda.memory_allocated() / 2**30, 2) if ctx["cuda"] else 0,
    }
    say(f"created {record['create']}")
    started = time.perf_counter()
    model.save_pretrained(model_dir, max_shard_size="5GB")
    record["save"] = {"seconds": round(time.perf_counter() - started, 2), "where": str(work)}
    say(f"saved in {record['save']['seconds']} s to {model_dir}")
    del model, first
    gc.collect()
    if ctx["cuda"]:
        torch.cuda.empty_cache()

    tiny = root / "models" / demo_pool.MODEL_NAME
    shutil.copy(tiny / "tokenizer.json", model_dir / "tokenizer.json")
    tokenizer_config = json.loads((tiny / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = shape["max_position_embeddings"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))

    catalog_path = root / "catalog.yaml"
    catalog = yaml.safe_load(catalog_path.read_text())
    size = sum(_dir_files(model_dir).values())
    catalog["models"].append(
        {
            "name": MODEL_NAME,
            "path": f"models/{MODEL_NAME}",
            "format": "huggingface",
            "size_bytes": size,
            "licence": "CC0-1.0",
            "description": "Randomly initialised Llama-2-7B-shaped causal LM (bf16), for checks.",
        }
    )
    catalog_path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    record["catalog"] = catalog
    record["model_files"] = _dir_files(model_dir)
    return root, model_dir


def part_lora(record: dict, ctx: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    report: Report = ctx["report"]
    args = ctx["args"]
    fake: FakeNVML | None = ctx["fake"]
    lora = importlib.import_module("meterhub.extensions.lora")
    pool = importlib.import_module("meterhub.extensions.pool")

    root, model_dir = build_pool(record, ctx)
    report.write()
    os.environ["METERHUB_PUBLIC_DIR"] = str(root)
    record["pool_catalog_read"] = pool.catalog()
    record["params_by_catalog"] = {
        m["name"]: lora._params(m) for m in record["pool_catalog_read"]["models"]
    }
    report.check(
        "lora.pool_catalog",
        record["params_by_catalog"].get(MODEL_NAME, 0) >= lora.SEVEN_B or ctx["dry_run"],
        f"{record['params_by_catalog']} (parameters from size_bytes // 2; SEVEN_B ="
        f" {lora.SEVEN_B:,}); model create {record['create']['seconds']} s,"
        f" save {record['save']['seconds']} s, {record['create']['parameters']:,} parameters",
    )

    chosen = lora.plan(max_steps=args.steps)
    record["plan"] = vars(chosen)
    if ctx["cuda"]:
        ok = (
            chosen.model_path == str(model_dir)
            and chosen.dtype == "bfloat16"
            and chosen.gradient_checkpointing
            and not chosen.quantize_4bit
            and chosen.device == "cuda"
        )
    else:  # debug mode picks the smallest model (the demo's tiny-llama) on CPU
        ok = chosen.model_path.endswith("tiny-llama") and chosen.device == "cpu"
    report.check("lora.plan", ok, record["plan"])

    # train: the plan's save_every (50 on a GPU) is not an argument of train(): overridden
    original_plan = lora.plan

    def plan_with_save_every(*a, **k):
        p = original_plan(*a, **k)
        p.save_every = args.save_every
        return p

    loads: list[dict] = []
    original_from_pretrained = AutoModelForCausalLM.from_pretrained

    def timed_from_pretrained(*a, **k):
        started = time.perf_counter()
        model = original_from_pretrained(*a, **k)
        loads.append(
            {
                "t": now(),
                "seconds": round(time.perf_counter() - started, 2),
                "kwargs": {key: str(v) for key, v in k.items()},
            }
        )
        return model

    output_dir = root.parent / "lora-runs" / MODEL_NAME
    model_arg = None if ctx["cuda"] else str(model_dir)  # on CPU: ours, not tiny-llama

    def one_run(name: str, interrupt_at: int | None) -> dict:
        run: dict = {"log": [], "steps": [], "called": now()}
        record[name] = run

        def log(message: str) -> None:
            t = now()
            run["log"].append([t, message])
            m = re.match(r"step (\d+) loss (\S+)", message)
            if m:
                run["steps"].append({"step": int(m[1]), "loss": float(m[2]), "t": t})
                if int(m[1]) % 5 == 0 or int(m[1]) == 1:
                    say(f"  {message}")
                if int(m[1]) == interrupt_at:
                    raise Interrupted(f"interrupted after step {m[1]}")
            else:
                say(f"  {message}")

        if ctx["cuda"]:
            torch.cuda.reset_peak_memory_stats()
        lora.plan = plan_with_save_every
        AutoModelForCausalLM.from_pretrained = timed_from_pretrained
        started = time.perf_counter()
        try:
            with Busy(fake):
                result = lora.train(
                    model=model_arg, output_dir=str(output_dir), max_steps=args.steps, log=log
                )
            run["result"] = {k: v for k, v in result.items() if k != "losses"}
        except Interrupted as e:
            run["interrupted"] = str(e)
        finally:
            lora.plan = original_plan
            AutoModelForCausalLM.from_pretrained = original_from_pretrained
        run["seconds"] = round(time.perf_counter() - started, 2)
        run["load"] = loads[-1] if loads else None
        if ctx["cuda"]:
            run["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            run["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        gc.collect()
        if ctx["cuda"]:
            torch.cuda.empty_cache()
            run["gpu_gib_after"] = round(torch.cuda.memory_allocated() / 2**30, 2)
        steps = run["steps"]
        deltas = [b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False)]
        saves = {s["step"] for s in steps if s["step"] % args.save_every == 0}
        plain = [
            d
            for d, s in zip(deltas, steps[1:], strict=False)
            if s["step"] - 1 not in saves  # a step after a save carries the save's time
        ]
        median = statistics.median(plain) if plain else None
        tokens = chosen.batch_size * chosen.block_size
        started_steps = next((t for t, m in run["log"] if m.startswith("training ")), None)
        run["timing"] = {
            "call_to_first_step_s": round(steps[0]["t"] - run["called"], 2) if steps else None,
            "from_pretrained_s": run["load"]["seconds"] if run["load"] else None,
            "to_device_and_peft_s": (
                round(started_steps - run["load"]["t"], 2)
                if started_steps and run["load"]
                else None
            ),
            "first_step_s": round(steps[0]["t"] - started_steps, 2)
            if steps and started_steps
            else None,
            "median_step_s": round(median, 3) if median else None,
            "step_s": [round(d, 3) for d in deltas],
            "tokens_per_step": tokens,
            "tokens_per_s_median": round(tokens / median, 1) if median else None,
        }
        say(f"{name}: {run['timing']} peak {run.get('peak_gpu_gib')} GiB")
        return run

    shutil.rmtree(output_dir, ignore_errors=True)
    monitor = ctx["server"].gpu_monitor(
        {}, {"METERHUB_GPUS": "1", "CUDA_VISIBLE_DEVICES": ctx.get("uuid", "0")}
    )
    sampler = Sampler(monitor, 1.0)
    sampler.start()
    try:
        first = one_run("run1", args.interrupt_at or None)
        checkpoints = sorted(p.name for p in output_dir.glob("checkpoint-*"))
        record["after_run1"] = {"checkpoints": checkpoints, "files": _dir_files(output_dir)}
        want = [
            f"checkpoint-{s}"
            for s in range(args.save_every, (args.interrupt_at or args.steps) + 1, args.save_every)
        ]
        report.check(
            "lora.run1",
            [s["step"] for s in first["steps"]] == list(range(1, len(first["steps"]) + 1))
            and sorted(checkpoints, key=lambda c: int(c.split("-")[1])) == want,
            f"steps 1..{len(first['steps'])}, {first.get('interrupted') or 'completed'};"
            f" checkpoints {checkpoints}; load {first['timing']['from_pretrained_s']} s,"
            f" to device+peft {first['timing']['to_device_and_peft_s']} s,"
            f" median step {first['timing']['median_step_s']} s"
            f" ({first['timing']['tokens_per_s_median']} tokens/s);"
            f" peak {first.get('peak_gpu_gib')} GiB",
        )
        report.write()
        resume_steps = args.steps if args.interrupt_at else args.steps + args.save_every
        start = (first["steps"][-1]["step"] // args.save_every) * args.save_every
        timing = first["timing"]
        need = (
            (timing["call_to_first_step_s"] or 60)
            + (resume_steps - start) * (timing["median_step_s"] or 2)
            + 15
        )
        left = args.budget - now()
        if left < need:
            report.check("lora.run2", False, f"skipped: {left:.0f} s left, {need:.0f} s needed")
            return
        args_steps, args.steps = args.steps, resume_steps
        try:
            second = one_run("run2", None)
        finally:
            args.steps = args_steps
        result = second.get("result", {})
        ckpt_name = f"checkpoint-{start}"
        record["after_run2"] = {"files": _dir_files(output_dir)}
        report.check(
            "lora.resume",
            (result.get("resumed_from") or "").endswith(ckpt_name)
            and bool(second["steps"])
            and second["steps"][0]["step"] == start + 1
            and result.get("steps") == resume_steps,
            f"resumed_from {result.get('resumed_from')}; steps"
            f" {second['steps'][0]['step'] if second['steps'] else None}..{result.get('steps')};"
            f" log: {[m for _, m in second['log'] if m.startswith('resumed')]}",
        )
        files = _dir_files(output_dir)
        wanted = [f"checkpoint-{resume_steps}/{f}" for f in ("trainer_state.json", "optimizer.pt")]
        wanted += ["adapter/adapter_model.safetensors", "adapter/adapter_config.json"]
        report.check(
            "lora.files",
            all(f in files for f in wanted),
            {f: files.get(f) for f in wanted},
        )
        again = {s["step"]: s["loss"] for s in second["steps"]}
        pairs = [
            (s["step"], s["loss"], again[s["step"]]) for s in first["steps"] if s["step"] in again
        ]
        record["repeated_steps"] = pairs
        # the same batches (Python's RNG restored) through the same weights: the same losses,
        # up to bf16 arithmetic on the GPU
        same = all(abs(a - b) <= 0.02 * max(1.0, abs(a)) for _, a, b in pairs)
        report.check(
            "lora.resume_repeats_losses",
            same if pairs else None,
            f"(step, interrupted run, resumed run): {pairs}",
        )
        losses = [s["loss"] for s in first["steps"]] + [s["loss"] for s in second["steps"]]
        report.check(
            "lora.loss_falls",
            losses[-1] < losses[0],
            f"{losses[0]:.4f} -> {losses[-1]:.4f} (all: {[round(x, 3) for x in losses]})",
        )
        report.check(
            "lora.timing",
            None,
            f"create {record['create']['seconds']} s, save {record['save']['seconds']} s,"
            f" run1 {first['seconds']} s (load {first['timing']['from_pretrained_s']} s),"
            f" run2 {second['seconds']} s (load {second['timing']['from_pretrained_s']} s);"
            f" median step {second['timing']['median_step_s']} s,"
            f" {second['timing']['tokens_per_s_median']} tokens/s,"
            f" train() said {result.get('tokens_per_second', 0):.0f} tokens/s;"
            f" peak {second.get('peak_gpu_gib')} GiB allocated,"
            f" {second.get('peak_reserved_gib')} GiB reserved",
        )
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)
        monitor._close()
        record["sampler"] = sampler.samples
        stepping = []
        for run in (record.get("run1"), record.get("run2")):
            if run and len(run["steps"]) > 1:
                lo, hi = run["steps"][0]["t"], run["steps"][-1]["t"]
                stepping += [s for s in sampler.samples if lo <= s["t"] <= hi]
        busy = sum(s["busy"] is True for s in stepping)
        report.check(
            "sampling.during_training",
            bool(stepping) and busy >= 0.8 * len(stepping),
            f"{busy}/{len(stepping)} samples busy between first and last step;"
            f" percents {[s['percent'] for s in stepping][:30]}",
        )
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--dry-run", action="store_true", help="fake NVML, tiny model on CPU")
    parser.add_argument("--steps", type=int, default=30, help="train(max_steps=)")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument(
        "--interrupt-at", type=int, default=25, help="stop the first run after this step (0: no)"
    )
    parser.add_argument(
        "--budget", type=float, default=330, help="seconds; run2 is skipped past it"
    )
    parser.add_argument("--pool-dir", help="where to build the pool (default /dev/shm or /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the pool and the runs")
    parser.add_argument("--only", help="comma-separated parts: nvml,sampling,lora")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    fake = None
    if args.dry_run:
        fake = FakeNVML()
        sys.modules["pynvml"] = fake
    meta: dict = {"mode": "dry-run" if args.dry_run else "gpu", "argv": sys.argv}
    meta["meterhub"] = import_meterhub()
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    meta["python"] = sys.version
    meta["versions"] = versions()
    meta["cuda"] = {
        "available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if cuda
        else None,
    }
    meta["device"] = meta["cuda"]["device"] or "no GPU (dry run)"
    try:
        meta["nvidia_smi"] = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,uuid,driver_version,memory.total,pci.bus_id",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except Exception as e:
        meta["nvidia_smi"] = repr(e)
    meta["cpus"] = os.cpu_count()
    report = Report(Path(args.out), meta)
    report.write()
    say(f"meterhub: {meta['meterhub']}; device: {meta['device']}; torch {torch.__version__}")
    for name, version in meta["versions"].items():
        say(f"  {name}: {version}")
    ctx = {"report": report, "args": args, "fake": fake, "cuda": cuda, "dry_run": args.dry_run}
    parts = {"nvml": part_nvml, "sampling": part_sampling, "lora": part_lora}
    only = args.only.split(",") if args.only else list(parts)
    try:
        for name in only:
            if name == "lora" and "server" not in ctx:
                ctx["server"] = import_server_extension(report.data["meta"])
            report.part(name, parts[name], ctx)
    except KeyboardInterrupt:
        say("interrupted: the results so far are in --out")
    failed = [c["check"] for c in report.data["checks"] if c["status"] == "FAIL"]
    report.data["meta"]["failed"] = failed
    report.write()
    say(f"done: {len(failed)} failed {failed}; wrote {args.out}/gpu_check.json and .md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
