"""How pe_fast's programs end (`python -m pe_fast.sweep`, `python -m pe_fast.report`, `pe-fast ...`).

A program that trained has imported torch.compile's stack (torch.optim loads it), and the interpreter's teardown of
those modules takes about a second of a 2-core machine after the work is done. exit_now ends the process as the
interpreter would, less that teardown: threading's exit hooks run and the other non-daemon threads joined, the
atexit handlers run (logging, Ray, multiprocessing, temporary files), the standard streams flushed; then it exits
with the program's code. Under a
profiler or a tracer (`python -m cProfile -m pe_fast.sweep`, a debugger, coverage) it exits the usual way, so that
they can write what they gathered after the program returns.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import unicodedata
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    # as the interpreter does first: threading's exit hooks (a ThreadPoolExecutor's tells its idle workers to stop:
    # inductor's compile pool's waited 95 s when they were joined without it), then the non-daemon threads joined
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)


def is_control(character: str) -> bool:
    """A character a terminal or a viewer acts on rather than shows: Unicode's control and format characters
    (category C: a line break, ESC and the 8-bit CSI \\x9b, a right-to-left override, a zero-width space) and
    the line and paragraph separators. Refused in names and settings, shown as its escape in messages. Not a
    lone surrogate (Cs): a file name's bytes that are not UTF-8, as os.fsdecode keeps them, named as such."""
    category = unicodedata.category(character)
    return (category[0] == "C" and category != "Cs") or category in ("Zl", "Zp")


def control_character(text: str) -> str | None:
    """The first control character (is_control) of text, or None."""
    return next((character for character in text if is_control(character)), None)


MAX_SHOWN = 60  # characters of a caller's value that a message quotes


def brief(value: object) -> str:
    """A caller's value as a one-line message quotes it: its repr on one line, cut to MAX_SHOWN characters (then
    named by its type too); an array or a tensor by its type and shape, never its numbers."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if getattr(value, "ndim", 0) and hasattr(value, "shape"):  # a numpy scalar has ndim 0: its repr is short
        return f"a {name} of shape {tuple(value.shape)}"
    try:
        text = repr(value)
    except Exception:  # a caller's object whose repr fails is still named
        return f"a {name}"
    if "\n" in text:
        text = " ".join(text.split())
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN - 1]}… (a {name})"


def escaped(text: str) -> str:
    """Outside text as a line quotes it: each control character (is_control) shown as its escape."""
    return "".join(ascii(character)[1:-1] if is_control(character) else character for character in text)


MAX_ERROR = 2_000  # characters of an error line: one that quotes a file's text whole (3 MB of a weights file's
#                    metadata) is cut, saying how much is left out


def print_error(message: object):
    """The program's error, one line on stderr: outside text it quotes (a lock's host name, $RAY_ADDRESS)
    escaped, and the line cut to MAX_ERROR characters."""
    text = escaped(str(message))
    if len(text) > MAX_ERROR:
        text = f"{text[:MAX_ERROR]}… ({len(text) - MAX_ERROR:,} characters more)"
    print(f"error: {text}", file=sys.stderr)
