"""Test doubles of what cannot run here: `pynvml.py` stands in for NVML (no GPU on CI)."""
