"""Prepaid billing for meterhub: the ledger, the hub's spawn hooks, the meter and its service.

Money is exact (integer micros, see money.py); the ledger (ledger.py) is the one place that
moves it. The hub runs hooks.py around each server; the billing service (service.py) runs the
meter (meter.py) and serves the REST API (api.py, contract in openapi.yaml).
"""
