"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded Engine.

Needs the ``serve`` extra (starlette, uvicorn, pydantic): ``pip install ".[serve]"`` in the
localspec checkout, as the README installs it.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
