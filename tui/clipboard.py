"""Copying text where the user can paste it: the system clipboard when a tool for it is
reachable, else the terminal's clipboard sequence (OSC 52, which many terminals ignore) plus a
file, so the text is never lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable

from .store import data_dir

TIMEOUT_S = 2.0


def clipboard_commands() -> list[list[str]]:
    """Clipboard writers for this platform and session, most specific first."""
    if sys.platform == "darwin":
        return [["pbcopy"]]
    if sys.platform == "win32":
        return [["clip"]]
    cmds: list[list[str]] = []
    if os.environ.get("WAYLAND_DISPLAY"):
        cmds.append(["wl-copy"])
    if os.environ.get("DISPLAY"):
        cmds += [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    if shutil.which("clip.exe"):  # WSL
        cmds.append(["clip.exe"])
    return cmds


def system_copy(text: str) -> bool:
    """True when a clipboard tool took the text."""
    for cmd in clipboard_commands():
        if shutil.which(cmd[0]) is None:
            continue
        try:
            # no pipes on its output: xclip and wl-copy leave a child holding them open, and
            # reading them would wait for that child (the whole timeout) after a good copy
            done = subprocess.run(
                cmd,
                input=text.encode(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return True
    return False


def fallback_path() -> str:
    """In the user's own data folder (the chat history's), not a shared temp folder."""
    return os.path.join(data_dir(), "localspec-clipboard.txt")


def copy_text(text: str, terminal_copy: Callable[[str], None], what: str) -> str:
    """Copy text and return one line saying where it went. terminal_copy sends OSC 52."""
    if system_copy(text):
        return f"{what} copied to the clipboard"
    terminal_copy(text)  # reaches the clipboard over SSH in terminals that allow it
    path = fallback_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        return f"{what} sent to the terminal's clipboard; no file copy ({exc.strerror})"
    return f"no clipboard tool found: {what} sent to the terminal's clipboard and saved to {path}"
