"""Spawn overhead: a meterhub debug spawn vs stock JupyterHub's SimpleLocalProcessSpawner.

Both hubs run side by side on this machine with the same single-user environment; spawns
alternate (meterhub, stock, meterhub, ...) so drift and noise hit both alike. Each sample
is the time from the spawn request to the server answering through the proxy.

    .venv/bin/python bench/spawn_overhead.py --pairs 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.hubprocess import ADMIN_TOKEN, HubProcess, until  # noqa: E402

STOCK_CONFIG = """
c.JupyterHub.spawner_class = "simple"
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{workdir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{workdir}/cookie_secret"
c.JupyterHub.authenticator_class = "null"
c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["bench"]}}]
c.SimpleLocalProcessSpawner.home_dir_template = "{workdir}/home/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root"]  # stock spawns run as the hub's user
"""


class StockHub(HubProcess):
    """Stock JupyterHub with SimpleLocalProcessSpawner, driven like a meterhub HubProcess."""

    def command(self) -> list[str]:
        from meterhub.hub.app import find_proxy

        hub = self.site["hub"]
        config = self.workdir / "jupyterhub_config.py"
        config.write_text(
            STOCK_CONFIG.format(
                port=self.port,
                proxy=find_proxy(),
                token=ADMIN_TOKEN,
                workdir=self.workdir,
                singleuser=str(Path(sys.prefix) / "bin" / "jupyterhub-singleuser"),
                **hub,
            )
        )
        (self.workdir / "home").mkdir(exist_ok=True)
        jupyterhub = str(Path(sys.executable).parent / "jupyterhub")
        return [jupyterhub, "-f", str(config)]


def timed_spawn(hub: HubProcess, user: str, options: dict | None) -> float:
    hub.ensure_user(user)
    start = time.perf_counter()
    r = hub.api("POST", f"/users/{user}/server", json=options or {})
    assert r.status_code in (201, 202), r.text
    until(
        lambda: requests.get(f"{hub.url}/user/{user}/api", timeout=10).status_code == 200,
        f"{user}'s server through the proxy",
        interval=0.05,
    )
    elapsed = time.perf_counter() - start
    hub.stop_server(user)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        ours = HubProcess(Path(tmp) / "meterhub", {"gpus": []})
        stock = StockHub(Path(tmp) / "stock", {})
        try:
            ours.start()
            stock.start()
            timed_spawn(ours, "warmup", {"profile": "debug"})  # demo pool, caches
            timed_spawn(stock, "warmup", None)
            rows = []
            for i in range(args.pairs):
                a = timed_spawn(ours, f"u{i}", {"profile": "debug"})
                b = timed_spawn(stock, f"u{i}", None)
                rows.append((a, b, a / b))
                print(f"pair {i + 1}: meterhub {a:.3f}s  stock {b:.3f}s  ratio {a / b:.3f}")
        except Exception:
            print(stock.log_tail(120), file=sys.stderr)
            raise
        finally:
            ours.teardown()
            stock.teardown()
    med_a = statistics.median(r[0] for r in rows)
    med_b = statistics.median(r[1] for r in rows)
    med_ratio = statistics.median(r[2] for r in rows)
    print(
        f"median: meterhub {med_a:.3f}s  stock {med_b:.3f}s  "
        f"median ratio {med_ratio:.3f} over {len(rows)} pairs"
    )


if __name__ == "__main__":
    main()
