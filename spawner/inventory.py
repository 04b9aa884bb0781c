"""The GPUs of this machine: declared in site config, or detected with NVML.

Each GPU has a stable index (NVML order), a type from the catalog, the minor number of its
`/dev/nvidiaN` node and, when NVML knows it, a UUID for `CUDA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .catalog import GPU_TYPES, GpuType, gpu_type_for_product

log = logging.getLogger(__name__)

#: device nodes every CUDA process needs besides its own /dev/nvidiaN
CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


@dataclass(frozen=True)
class Gpu:
    index: int
    type: str
    minor: int
    uuid: str = ""

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.minor}"


def declared_inventory(
    entries: list[dict], gpu_types: Mapping[str, GpuType] | None = None
) -> list[Gpu]:
    """GPUs from site config `gpus: [{type, count}]`, numbered in the order declared.

    `gpu_types`: the configured catalog's (`Catalog.types()`); default the built-in ones.
    """
    known = GPU_TYPES if gpu_types is None else gpu_types
    gpus: list[Gpu] = []
    for entry in entries:
        if entry["type"] not in known:
            raise ValueError(f"gpus: unknown GPU type {entry['type']!r}; known: {', '.join(known)}")
        for _ in range(int(entry["count"])):
            index = len(gpus)
            gpus.append(Gpu(index=index, type=entry["type"], minor=index))
    return gpus


def detect_inventory(nvml=None, gpu_types: Mapping[str, GpuType] | None = None) -> list[Gpu]:
    """GPUs found by NVML, mapped to catalog types by product name; [] without NVML.

    `gpu_types`: the configured catalog's (`Catalog.types()`); default the built-in ones.
    A GPU whose product is not in the catalog is left out with a warning: it cannot be
    priced, so it is never offered.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception as e:  # no driver, no library, no device: all mean "no GPUs"
        log.info("No NVIDIA GPUs detected (%s)", e)
        return []
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            gpu_type = gpu_type_for_product(name, gpu_types)
            if gpu_type is None:
                log.warning("GPU %d (%s) is not in the catalog; not offering it", index, name)
                continue
            try:
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            except Exception:
                minor = index
            gpus.append(
                Gpu(
                    index=index,
                    type=gpu_type.slug,
                    minor=minor,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def device_nodes(gpus: list[Gpu], exists=os.path.exists) -> list[str]:
    """Device nodes a server with `gpus` needs: its own /dev/nvidiaN and the control devices."""
    nodes = [gpu.device_node for gpu in gpus if exists(gpu.device_node)]
    if not nodes:
        return []
    return nodes + [path for path in CONTROL_DEVICES if exists(path)]


def visible_devices_env(gpus: list[Gpu]) -> dict[str, str]:
    """What CUDA and the NVIDIA runtime see: exactly `gpus`, or none at all (debug mode)."""
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    visible = ",".join(gpu.uuid or str(gpu.index) for gpu in gpus)
    return {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
