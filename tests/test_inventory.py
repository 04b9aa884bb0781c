"""GPU inventory: declared in config or detected with NVML (a fake NVML module here)."""

import pytest

from meterhub.spawner.inventory import (
    Gpu,
    declared_inventory,
    detect_inventory,
    device_nodes,
    visible_devices_env,
)


class FakeNVML:
    """Behaves like pynvml for a machine with the given product names."""

    def __init__(self, names, fail_init=False):
        self.names = names
        self.fail_init = fail_init
        self.shutdown_called = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return self.names[handle].encode()

    def nvmlDeviceGetMinorNumber(self, handle):
        return 10 + handle

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle:04d}"


def test_declared_inventory_numbers_in_order():
    gpus = declared_inventory([{"type": "rtx4090", "count": 2}, {"type": "a800", "count": 1}])
    assert gpus == [Gpu(0, "rtx4090", 0), Gpu(1, "rtx4090", 1), Gpu(2, "a800", 2)]
    assert gpus[2].device_node == "/dev/nvidia2"
    with pytest.raises(ValueError, match="unknown GPU type 'v100'"):
        declared_inventory([{"type": "v100", "count": 1}])


def test_nvml_detection_maps_products_and_skips_unknown():
    nvml = FakeNVML(["NVIDIA A800-SXM4-80GB", "Tesla V100", "NVIDIA H800"])
    gpus = detect_inventory(nvml)
    assert gpus == [Gpu(0, "a800", 10, "GPU-0000"), Gpu(2, "h800", 12, "GPU-0002")]
    assert nvml.shutdown_called


def test_no_nvml_means_no_gpus():
    assert detect_inventory(FakeNVML([], fail_init=True)) == []
    assert detect_inventory(FakeNVML([])) == []


def test_device_nodes_only_for_the_servers_gpus():
    present = {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    gpus = [Gpu(1, "a800", 1), Gpu(2, "a800", 2)]
    assert device_nodes(gpus, exists=present.__contains__) == [
        "/dev/nvidia1",
        "/dev/nvidia2",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    # debug mode, or a declared inventory on a machine without the nodes: nothing is bound
    assert device_nodes([], exists=present.__contains__) == []
    assert device_nodes([Gpu(5, "a800", 5)], exists=present.__contains__) == []


def test_visible_devices_env_hides_everything_in_debug():
    assert visible_devices_env([]) == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    env = visible_devices_env([Gpu(0, "h800", 0, "GPU-aaaa"), Gpu(3, "h800", 3, "GPU-bbbb")])
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
    }
    assert visible_devices_env([Gpu(2, "a800", 2)])["CUDA_VISIBLE_DEVICES"] == "2"
