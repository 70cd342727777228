"""A uvicorn server on a free port of 127.0.0.1 in a background thread, for the tests that
count its connections and tasks (``server.server_state``) or shut it down while clients are
still connected; both services' thread helpers build on it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn


class UvicornThread:
    def __init__(self, app: Any, **options: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{type(self).__name__}: the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
