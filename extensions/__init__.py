"""What meterhub adds inside each single-user server.

- server.py: a Jupyter server extension, `GET /api/meterhub/status`, the user's credit
- labextension/ (built into lab/): credit in JupyterLab's status bar and warnings before a stop
- widgets.py: the `CreditMeter` and `GpuInfo` notebook widgets
- pool.py: the read-only `/public` pool through fsspec (`public://`)
- lora.py: the LoRA starter the starter notebook runs
"""
