"""The `pe-fast` command: one entry point for the package's programs, beside their `python -m` forms.

    pe-fast sweep --task fmri          = python -m pe_fast.sweep --task fmri
    pe-fast report DIR                 = python -m pe_fast.report DIR
    pe-fast compare-lst-logs DIR       = python -m pe_fast.compare_lst_logs DIR
    pe-fast --version
"""
from __future__ import annotations

import importlib
import sys

import pe_fast
from pe_fast.program_exit import exit_now, print_error

# subcommand -> the module whose main(argv) runs it
PROGRAMS = {"sweep": "pe_fast.sweep.program", "report": "pe_fast.report.cli",
            "compare-lst-logs": "pe_fast.compare_lst_logs"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-V"]):
        print(f"pe-fast {pe_fast.__version__}")
        return 0
    if not argv:
        print_error(f"pe-fast: name a program: {', '.join(PROGRAMS)} (see pe-fast --help)")
        return 2
    if argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] not in PROGRAMS:
        print_error(f"pe-fast {argv[0]}: not a program; choose from {', '.join(PROGRAMS)} (see pe-fast --help)")
        return 2
    program = importlib.import_module(PROGRAMS[argv[0]])
    try:
        return program.main(argv[1:])
    except SystemExit as exit_:  # argparse's --help and errors
        return exit_.code if isinstance(exit_.code, int) else 1


def run():
    """The `pe-fast` command's entry point: main, then the process ends (pe_fast.program_exit)."""
    exit_now(main())
