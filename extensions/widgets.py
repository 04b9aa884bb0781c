"""Notebook widgets: `CreditMeter()` — balance, rate and time left — and `GpuInfo()` — the GPUs
this server holds, with memory and utilisation from NVML when present.

    from meterhub.extensions.widgets import CreditMeter, GpuInfo
    CreditMeter()
    GpuInfo()

CreditMeter reads this server's `/api/meterhub/status`, the same answer as the JupyterLab
status bar, and refreshes itself every `interval` seconds while the kernel is idle, for
`refresh_minutes` after it was shown or refreshed by hand (its ↻ button, or `refresh()`).
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import time
import urllib.request
from collections.abc import Callable

import ipywidgets as widgets

CURRENCY_SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€"}
#: JupyterLab's theme colours for each level (so the dark theme works), with a fallback for
#: front ends without them
LEVEL_COLOURS = {
    "ok": "inherit",
    "warning": "var(--jp-warn-color1, #e67700)",
    "critical": "var(--jp-error-color1, #c92a2a)",
}


def credit_status() -> dict:
    """This server's /api/meterhub/status — the same answer the status bar shows (blocking)."""
    server = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if not server:
        raise RuntimeError("not in a meterhub server: JUPYTERHUB_SERVICE_URL is not set")
    request = urllib.request.Request(
        server.rstrip("/") + "/api/meterhub/status",
        headers={"Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _left(minutes: int | None) -> str:
    if minutes is None:
        return "no server charging"
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60} min left"
    return f"{minutes} min left"


def level(minutes_left: int | None, warn_minutes: list[int]) -> str:
    """How near the stop is, by the site's `billing.warn_minutes` (as JupyterLab's status bar,
    extensions/labextension/src/status.ts): `warning` at or below the largest threshold,
    `critical` at or below the second largest (or the only one), else `ok`."""
    if minutes_left is None or not warn_minutes:
        return "ok"
    thresholds = sorted(warn_minutes, reverse=True)
    largest, second = thresholds[0], thresholds[1 if len(thresholds) > 1 else 0]
    if minutes_left <= second:
        return "critical"
    if minutes_left <= largest:
        return "warning"
    return "ok"


def credit_html(status: dict) -> str:
    symbol = CURRENCY_SYMBOLS.get(status["currency"], status["currency"] + " ")
    minutes = status.get("minutes_left")
    colour = LEVEL_COLOURS[level(minutes, status.get("warn_minutes") or [])]
    parts = [
        f'<span class="meterhub-credit" style="color:{colour}">'
        f"<b>{symbol}{html.escape(status['balance'])}</b>"
        f" · {symbol}{html.escape(status['rate_per_hour'])}/h · {_left(minutes)}</span>"
    ]
    for note in status.get("notifications", [])[-3:]:
        parts.append(f"<div><small>{html.escape(note['message'])}</small></div>")
    return "".join(parts)


#: what a meter that stopped refreshing itself adds to its last text
PAUSED_NOTE = " <small>· not updating; ↻ to refresh</small>"


class CreditMeter(widgets.HBox):
    """Live balance, rate and time left of this server's user, with a ↻ (refresh) button.

    It refreshes itself every `interval` seconds (0: never) for `refresh_minutes` after it was
    shown or last refreshed by hand, then stops and says so. Each change it shows reaches the
    browser through the kernel, which counts as the server's activity: a meter left open
    must not keep an idle server, and its GPUs, running (and charging) for ever. For the
    same reason it sends the browser nothing when the text is unchanged.
    """

    def __init__(
        self,
        interval: float = 30,
        fetch: Callable[[], dict] = credit_status,
        refresh_minutes: float = 10,
        clock: Callable[[], float] = time.monotonic,
        **kwargs,
    ):
        self.text = widgets.HTML()
        self.button = widgets.Button(
            icon="refresh", tooltip="Refresh now", layout=widgets.Layout(width="auto")
        )
        super().__init__(children=[self.text, self.button], **kwargs)
        self._fetch = fetch
        self._interval = interval
        self._refresh_seconds = refresh_minutes * 60
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._until = 0.0
        self.button.on_click(lambda _button: self.refresh())
        self.refresh()

    @property
    def value(self) -> str:
        """The HTML shown."""
        return self.text.value

    def refresh(self) -> None:
        """Update now, and refresh automatically for another `refresh_minutes`."""
        self._show(self._status_html())
        self._resume()

    def _status_html(self) -> str:
        try:
            return credit_html(self._fetch())
        except Exception as e:  # shown, not raised: a widget must not break the notebook
            return f"<span>Credit status unavailable: {html.escape(str(e))}</span>"

    def _show(self, value: str) -> None:
        if value != self.text.value:  # an unchanged text is not sent to the browser
            self.text.value = value

    def _resume(self) -> None:
        self._until = self._clock() + self._refresh_seconds
        if self._interval:
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no kernel loop (plain Python): refresh() by hand
        self._timer = loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._clock() >= self._until:
            if not self.text.value.endswith(PAUSED_NOTE):
                self._show(self.text.value + PAUSED_NOTE)
            return
        self._show(self._status_html())
        self._schedule()

    def _repr_mimebundle_(self, **kwargs):
        # shown (again): refresh for another `refresh_minutes`
        self._resume()
        return super()._repr_mimebundle_(**kwargs)

    def close(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.text.close()
        self.button.close()
        super().close()


def gpus() -> list[dict]:
    """The GPUs visible to this server: index, name, memory and utilisation (NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    found = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            use = pynvml.nvmlDeviceGetUtilizationRates(handle)
            found.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_used_mib": memory.used // 2**20,
                    "memory_total_mib": memory.total // 2**20,
                    "utilisation_percent": use.gpu,
                }
            )
    finally:
        pynvml.nvmlShutdown()
    return found


class GpuInfo(widgets.HTML):
    """The GPUs this server holds, with memory and utilisation."""

    def __init__(self, probe=gpus, **kwargs):
        super().__init__(**kwargs)
        held = probe()
        profile = os.environ.get("METERHUB_PROFILE", "")
        if not held:
            what = "debug mode: no GPU" if profile == "debug" else "no GPU visible"
            self.value = f"<span>{html.escape(what)}</span>"
            return
        rows = "".join(
            f"<tr><td>{g['index']}</td><td>{html.escape(g['name'])}</td>"
            f"<td>{g['memory_used_mib']} / {g['memory_total_mib']} MiB</td>"
            f"<td>{g['utilisation_percent']} %</td></tr>"
            for g in held
        )
        self.value = (
            "<table><thead><tr><th>GPU</th><th>name</th><th>memory</th><th>use</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>"
        )
