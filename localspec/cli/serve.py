"""`localspec serve`: OpenAI's HTTP API over one loaded engine."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

from ..errors import LocalspecError
from .common import (
    add_model_args,
    add_overflow_arg,
    calibrate_first,
    engine_config,
    install_hint,
    raise_interrupt,
    say_mode_notes,
    target_arg,
)


def add_parser(sub: Any) -> None:
    srv = sub.add_parser(
        "serve",
        help="serve the model with OpenAI's HTTP API (chat, completions, models, health)",
        description="Loads the pair once and answers OpenAI-style requests, one generation at "
        "a time in FIFO order, with speculative statistics in each response's `timings`.",
    )
    add_model_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free)")
    srv.add_argument(
        "--api-key",
        default=os.environ.get("LOCALSPEC_API_KEY") or None,
        help="require Authorization: Bearer KEY on /v1 and /metrics (default: "
        "$LOCALSPEC_API_KEY, or none)",
    )
    srv.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait while one generates; more get 503 (default 16)",
    )
    add_overflow_arg(srv)
    srv.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at /metrics (off by default)",
    )
    srv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import contextlib
    import logging
    import signal

    try:
        from ..server import create_app
        from ..server.run import base_url, listen, make_server
    except ImportError as exc:
        raise LocalspecError(
            f"serve needs the serve extra ({exc.name} is missing): {install_hint('serve')}"
        ) from None
    if args.metrics:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise LocalspecError(
                f"--metrics needs prometheus-client: {install_hint('serve')}"
            ) from None

    if args.max_queue < 0:
        raise LocalspecError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.api_key is not None and not args.api_key.strip():
        raise LocalspecError("--api-key is empty")
    cfg = engine_config(args)
    sock = listen(args.host, args.port)  # a busy port fails before the model loads
    try:
        # after the port: a busy one fails before a download
        cfg = replace(cfg, target=target_arg(args)).checked()
    except BaseException:
        sock.close()
        raise
    tree, source = cfg.tree, cfg.draft_source
    with sock, cfg.load() as eng:
        app = create_app(
            eng,
            api_key=args.api_key,
            max_queue=args.max_queue,
            context_overflow=args.context_overflow,
            metrics=args.metrics,
        )
        server = make_server(app)
        print(
            f"localspec: {eng.drafter_note}; draft source {source}; "
            f"context overflow {args.context_overflow}",
            file=sys.stderr,
        )
        say_mode_notes(eng, args, tree, source)  # the default speculation, as in flags
        for note in eng.sampling_notes.values():  # what of the model's sampling is left out
            print(f"localspec: note: {note}", file=sys.stderr)
        calibrate_first(eng, n_draft="auto")  # requests may ask for auto whatever the default
        if not args.api_key and not sock.getsockname()[0].startswith(("127.", "::1")):
            print("localspec: warning: no --api-key on a non-loopback address", file=sys.stderr)
        print(f"serving {os.path.basename(eng.target_path)} at {base_url(sock)}/v1", flush=True)
        # uvicorn shuts down on SIGTERM, then re-raises it: end like Ctrl-C, engine closed
        signal.signal(signal.SIGTERM, raise_interrupt)
        # one line per request on stderr (uvicorn's own access log is off)
        log = logging.getLogger("localspec.server")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        try:
            with contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=[sock])
        finally:
            log.removeHandler(handler)
    print("localspec: server stopped", file=sys.stderr)
    return 0
