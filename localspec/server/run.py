"""Running the app with uvicorn: a listening socket first (a busy port fails before the model
loads), then the server until Ctrl-C or SIGTERM."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette

from ..errors import LocalspecError

LISTEN_BACKLOG = 2048  # uvicorn's own default backlog


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free port) and listening: a client that
    connects once the address is printed waits in the kernel's queue until uvicorn accepts,
    instead of being refused while the model loads and calibrates."""
    if not 0 <= port <= 65535:
        raise LocalspecError(f"--port must be in 0..65535, got {port}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise LocalspecError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise LocalspecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, which at shutdown first ends the open requests (``on_shutdown``:
    waiting ones get 503, a running generation stops between steps), so that connections
    close by themselves instead of being cancelled."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def make_server(app: Starlette, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for an app made by create_app (a second Ctrl-C stops at once)."""
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=5
    )
    return _Server(config, app.state.server.worker.close)
