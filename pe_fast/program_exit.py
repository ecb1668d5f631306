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
import re
import sys
import threading
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


# a line break or a terminal escape: refused in names and settings, shown as its escape in messages
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


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
    """Outside text as a line quotes it: a line break or a terminal escape shown as its escape."""
    return CONTROL_CHARACTER.sub(lambda match: ascii(match.group())[1:-1], text)


def print_error(message: object):
    """The program's error, one line on stderr: outside text it quotes (a lock's host name, $RAY_ADDRESS)
    escaped."""
    print(f"error: {escaped(str(message))}", file=sys.stderr)
