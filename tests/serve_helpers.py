"""A real ``empatheia serve`` application on 127.0.0.1 for the tests, and a plain HTTP
client for it (the standard library's: multipart bodies written here)."""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="empatheia serve needs the serve extra (pip install 'empatheia[serve]')")
pytest.importorskip("fastapi", reason="empatheia serve needs the serve extra (pip install 'empatheia[serve]')")
pytest.importorskip("multipart", reason="empatheia serve needs the serve extra (pip install 'empatheia[serve]')")

from empatheia.serve.app import create_app  # noqa: E402

Files = Dict[str, Tuple[str, bytes]]


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict
    """Names in lower case."""

    def json(self):
        return json.loads(self.body)

    def lines(self):
        return [json.loads(line) for line in self.body.decode().splitlines() if line.strip()]


class Server:
    """``create_app(model, **options)`` served by uvicorn on a free loopback port, in a
    thread; ``stop()`` ends it (the application's shutdown closes its worker)."""

    def __init__(self, model, **options):
        self.app = create_app(model, **options)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def request(self, method: str, path: str, fields: Optional[dict] = None, files: Optional[Files] = None,
                timeout: float = 120) -> Reply:
        data, headers = None, {}
        if fields is not None or files is not None:
            data, content_type = multipart(fields or {}, files or {})
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return Reply(response.status, response.read(), _lower(response.headers))
        except urllib.error.HTTPError as error:
            return Reply(error.code, error.read(), _lower(error.headers))

    def post(self, path: str, fields: Optional[dict] = None, files: Optional[Files] = None, **kwargs) -> Reply:
        return self.request("POST", path, fields if fields is not None else {}, files, **kwargs)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def new_session(self) -> str:
        reply = self.post("/api/sessions")
        assert reply.status == 200, reply.body
        return reply.json()["session_id"]


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


def multipart(fields: dict, files: Files) -> Tuple[bytes, str]:
    """A multipart/form-data body: text ``fields`` and ``files`` as ``{field: (filename, bytes)}``."""
    boundary = secrets.token_hex(16)
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, content) in files.items():
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def mp4_bytes(tmp_path, frames: int = 12, size: int = 64) -> bytes:
    import numpy as np
    import torch

    from empatheia.media import write_mp4

    video = np.random.default_rng(0).integers(0, 255, (frames, size, size, 3), dtype=np.uint8)
    return write_mp4(tmp_path / "clip.mp4", torch.from_numpy(video), 25.0).read_bytes()
