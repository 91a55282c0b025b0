"""The real server (uvicorn on a free 127.0.0.1 port) in a background thread, for tests that
talk to `localspec serve` over HTTP."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from localspec.server import create_app
from localspec.server.run import base_url, listen, make_server


@contextlib.contextmanager
def running(engine: Any, **kw: Any) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port in a background thread."""
    with running_server(engine, **kw) as (url, _):
        yield url


@contextlib.contextmanager
def running_server(engine: Any, **kw: Any) -> Iterator[tuple[str, Any]]:
    sock = listen("127.0.0.1", 0)
    server = make_server(create_app(engine, **kw))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    try:
        yield base_url(sock), server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
