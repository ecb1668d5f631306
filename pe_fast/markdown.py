"""Text from a results folder (its config.json, the names of files and folders in it) as it may stand in a markdown
file pe_fast writes (report.md, compare_lst_logs.md): a folder may come from anyone."""
from __future__ import annotations

import re

from pe_fast.program_exit import escaped

# backslash-escaped, each shows as itself; an underscore inside a word (ground_truth) marks nothing
MARKDOWN_MARKS = re.compile(r"[\\`*\[\]$~]|(?<![^\W_])_|_(?![^\W_])")


def inert(text: object, cell: bool = True) -> str:
    """Text from a folder (its config.json, file names in it) as it may stand in report.md: on one line (no heading
    or block of its own), HTML shown rather than run, markdown's emphasis, code, link and math marks shown as
    typed, control and format characters (a terminal's escapes, a right-to-left override) shown as escapes, and
    in a table `cell` no column break."""
    text = MARKDOWN_MARKS.sub(r"\\\g<0>", " ".join(str(text).split()))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = escaped(text)
    return text.replace("|", "\\|") if cell else text
