"""docs/sweep.md lists every flag of `python -m pe_fast.sweep`, each task's defaults and its presets, in a block
generated from the parser (pe_fast.sweep.settings.build_parser) and the tasks' KINDs. This test fails when the block
and the code disagree; `python tests/test_sweep_docs.py` rewrites the block."""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "sweep.md"
BEGIN = ("<!-- BEGIN generated: the flags, defaults and presets, from pe_fast.sweep.settings.build_parser() and "
         "the tasks; rewrite with `python tests/test_sweep_docs.py`, do not edit by hand -->")
END = "<!-- END generated -->"


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def takes(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "(a switch)"
    if action.choices:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    if action.metavar:
        return f"`{action.metavar}`"
    return {int: "integer", float: "number"}.get(action.type, "text")


def generated() -> str:
    from pe_fast.sweep.settings import build_parser
    from pe_fast.tasks import KINDS

    lines = ["| flag | takes | what it sets |", "|---|---|---|"]
    for action in build_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = ", ".join(f"`{o}`" for o in action.option_strings)
        repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
        lines.append(f"| {flag} | {takes(action)}{repeat} | {cell(action.help or '')} |")
    tasks = list(KINDS)
    lines += ["", "Each task's defaults (a flag or a preset overrides them):", "",
              "| setting | " + " | ".join(f"`--task {t}`" for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    keys = list(dict.fromkeys(k for kind in KINDS.values() for k in kind.defaults))
    for key in keys:
        values = [KINDS[t].defaults.get(key, "4 × width" if key == "mlp_width" else "—") for t in tasks]
        lines.append(f"| `--{key.replace('_', '-')}` | " + " | ".join(cell(v) for v in values) + " |")
    lines += ["", "The presets (`--preset NAME`; explicit flags override what a preset sets):", "",
              "| task | preset | sets |", "|---|---|---|"]
    for t in tasks:
        for name, values in KINDS[t].presets.items():
            sets = ", ".join(f"`--{k.replace('_', '-')} {v}`" for k, v in values.items())
            lines.append(f"| {t} | `{name}` | {sets} |")
    return "\n".join(lines)


def block(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def test_sweep_doc_matches_the_parser():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lacks its generated block"
    assert block(text) == generated(), (f"{DOC.relative_to(ROOT)} disagrees with the sweep's parser or the tasks' "
                                        f"defaults: run `python tests/test_sweep_docs.py` and commit the result")


def test_every_flag_is_in_the_doc():
    """Belt and braces for the block's generator: each option string appears in the doc."""
    from pe_fast.sweep.settings import build_parser

    text = DOC.read_text()
    missing = [o for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)
               for o in a.option_strings if f"`{o}`" not in text]
    assert not missing, f"flags missing from docs/sweep.md: {missing}"


def rewrite() -> None:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + generated() + "\n" + text[end:])
    print(f"rewrote the generated block of {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    rewrite()
