"""Run code in a kernel of a user's single-user server, through the proxy, as a client would."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect


class KernelError(AssertionError):
    pass


async def execute(base_url: str, user: str, token: str, code: str, timeout: float = 90) -> str:
    """Execute `code` in a fresh kernel on `user`'s server; return its stdout; raise on error."""
    headers = {"Authorization": f"token {token}"}
    api = f"{base_url}/user/{user}/api/kernels"
    r = requests.post(api, headers=headers, json={}, timeout=timeout)
    assert r.status_code == 201, f"{r.status_code} {r.text}"
    kernel_id = r.json()["id"]
    ws_url = api.replace("http", "ws", 1) + f"/{kernel_id}/channels"
    try:
        ws = await websocket_connect(HTTPRequest(ws_url, headers=headers, request_timeout=timeout))
        msg_id = uuid.uuid4().hex
        ws.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": user,
                        "session": uuid.uuid4().hex,
                        "msg_type": "execute_request",
                        "version": "5.3",
                        "date": datetime.now(UTC).isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                }
            )
        )
        out: list[str] = []
        error = None
        while True:
            raw = await ws.read_message()
            if raw is None:
                raise KernelError("kernel websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                error = f"{msg['content']['ename']}: {msg['content']['evalue']}"
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        ws.close()
        if error:
            raise KernelError(error + "\n" + "".join(out))
        return "".join(out)
    finally:
        requests.delete(f"{api}/{kernel_id}", headers=headers, timeout=timeout)
