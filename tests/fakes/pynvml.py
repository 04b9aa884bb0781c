"""A stand-in for `pynvml` (nvidia-ml-py) for machines without NVIDIA GPUs: the GPUs and
their utilization come from a JSON file the test writes, read again at every call, so a test
can turn a GPU busy or idle while a server runs.

    FAKE_NVML_STATE=/path/state.json
    {"gpus": [{"uuid": "GPU-0a1b...", "name": "NVIDIA A800-SXM4-80GB", "utilization": 80}]}

Put its folder first on PYTHONPATH (a server) or in `sys.modules["pynvml"]` (in-process). No
`FAKE_NVML_STATE`, or a missing file: nvmlInit fails as without a driver. `calls` records the
device lookups, for tests that check which GPUs were asked for.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12

#: ("index", 0) or ("uuid", "GPU-...") for each handle asked for
calls: list[tuple[str, object]] = []


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


def _gpus() -> list[dict]:
    path = os.environ.get("FAKE_NVML_STATE", "")
    try:
        with open(path) as f:
            return json.load(f)["gpus"]
    except (OSError, ValueError, KeyError):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None


def nvmlInit() -> None:
    _gpus()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    calls.append(("index", index))
    if not 0 <= index < len(_gpus()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> int:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    calls.append(("uuid", uuid))
    for index, gpu in enumerate(_gpus()):
        if gpu.get("uuid") == uuid:
            return index
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def _gpu(handle: int) -> dict:
    gpus = _gpus()
    if not 0 <= handle < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpus[handle]


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=int(_gpu(handle).get("utilization", 0)), memory=0)


def nvmlDeviceGetName(handle: int) -> str:
    return _gpu(handle).get("name", "NVIDIA A800-SXM4-80GB")


def nvmlDeviceGetUUID(handle: int) -> str:
    return _gpu(handle).get("uuid", f"GPU-fake-{handle}")


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    total = 80 * 2**30
    return SimpleNamespace(total=total, used=0, free=total)
