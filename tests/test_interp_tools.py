"""The interpretability tools researchers use, on a trained model of a results folder (the .[interp] extra):
nnsight traces run.model(i) and saves the values the model's own cache holds; bertviz's head_view draws one LST
puzzle's attention, and a headless Chromium shows that view (where Chromium and npm, for the page's scripts, are
there)."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import textwrap

import numpy as np
import pytest
import torch

import pe_fast
import pe_fast.sweep


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("interp") / "lst"
    pe_fast.sweep.run(task="lst", preset="cpu", pe=["learned"], sigmas=[0.2], seeds=1, steps=4, eval_every=2,
                      threads=1, no_report=True, out=str(out))
    return pe_fast.load_run(out)


def test_nnsight_traces_a_trained_model(run, tmp_path):
    pytest.importorskip("nnsight", reason="nnsight is not installed (pip install -e '.[interp]')")
    # nnsight reads a trace's `with` block from its source file: the trace runs as a script of its own
    script = tmp_path / "trace.py"
    script.write_text(textwrap.dedent(f"""
        import torch, pe_fast
        from nnsight import NNsight
        run = pe_fast.load_run({str(run.path)!r})
        model = run.model(0)
        x = run.task_inputs("test")[:8]
        traced = NNsight(model)
        with traced.trace(x):
            pattern = traced.blocks[0].attn.hook_pattern.output.save()  # in the order the forward reaches them
            block = traced.blocks[1].output.save()
            out = traced.output.save()
        torch.save({{"block": block.detach(), "pattern": pattern.detach(), "out": out.detach()}},
                   {str(tmp_path / "saved.pt")!r})
    """))
    done = subprocess.run(["python", str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = torch.load(tmp_path / "saved.pt")
    x = run.task_inputs("test")[:8]
    out, cache = run.model(0).run_with_cache(x)
    np.testing.assert_allclose(saved["block"], cache["blocks.1.hook_resid_post"], atol=1e-6)
    np.testing.assert_allclose(saved["pattern"], cache["blocks.0.attn.hook_pattern"], atol=1e-6)
    np.testing.assert_allclose(saved["out"], out, atol=1e-6)


def puzzle_labels(item: torch.Tensor) -> list[str]:
    """One LST puzzle's tokens as labels: the cell (row, column) and its shape 1-4, ? for the query, _ blank."""
    def cell(token):
        return str(int(token[:4].argmax()) + 1) if token[:4].any() else "?" if token[4] else "_"
    return [f"r{index // 4}c{index % 4}:{cell(token)}" for index, token in enumerate(item)]


def head_view_html(run) -> tuple[str, torch.Tensor]:
    from bertviz import head_view
    puzzle = run.task_inputs("ood")[:1]
    attention = run.attention(0, puzzle)  # [L, 1, H, N, N]
    html = head_view(list(attention), puzzle_labels(puzzle[0]), html_action="return")
    return html.data, attention


def test_bertviz_head_view_holds_the_models_attention(run):
    pytest.importorskip("bertviz", reason="bertviz is not installed (pip install -e '.[interp]')")
    page, attention = head_view_html(run)
    start = page.index("const params = ") + len("const params = ")
    params = json.JSONDecoder().raw_decode(page[start:])[0]
    drawn = np.array(params["attention"][0]["attn"])  # [L, H, N, N]: the one puzzle
    np.testing.assert_allclose(drawn, attention[:, 0].numpy(), atol=1e-7)
    assert params["attention"][0]["left_text"][0].startswith("r0c0:")


# The page's scripts: the CDN path it names -> the npm package and its file (require.js by a script tag, with its
# .js; d3 and jQuery through require.js's paths, without)
SCRIPTS = {"require.js/2.3.6/require.min.js": ("requirejs@2.3.6", "require.js"),
           "d3/5.7.0/d3.min": ("d3@5.7.0", "dist/d3.min"), "jquery/2.0.0/jquery.min": ("jquery@2.2.4",
                                                                                     "dist/jquery.min")}


def local_scripts(folder) -> dict[str, str]:
    """The page's scripts from npm (the CDN it names is out of reach here): CDN path -> local file URL."""
    urls = {}
    for cdn, (package, inside) in SCRIPTS.items():
        done = subprocess.run(["npm", "pack", package, "--silent"], cwd=folder, capture_output=True, text=True,
                              timeout=120)
        if done.returncode:
            pytest.skip(f"npm cannot fetch {package} ({done.stderr.strip()[:100]})")
        with tarfile.open(folder / done.stdout.strip().splitlines()[-1]) as archive:
            archive.extractall(folder / package.replace("@", "-"), filter="data")
        urls[cdn] = (folder / package.replace("@", "-") / "package").as_uri() + "/" + inside
    return urls


def test_chromium_shows_the_head_view(run, tmp_path):
    """The page rendered headless: the view's SVG is drawn (one rectangle per token on each side, and the
    attention lines), not left empty. The screenshot is kept beside it."""
    pytest.importorskip("bertviz", reason="bertviz is not installed (pip install -e '.[interp]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or shutil.which("npm") is None:
        pytest.skip("needs Chromium and npm (apt-get install chromium; npm fetches the page's scripts)")
    page, _ = head_view_html(run)
    for cdn, local in local_scripts(tmp_path).items():
        page = page.replace(f"https://cdnjs.cloudflare.com/ajax/libs/{cdn}", local)
    (tmp_path / "head_view.html").write_text(f"<html><body>{page}</body></html>")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", (tmp_path / "head_view.html").as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-1000:]
    # one line per (query, key) pair of the head shown, a box per token on each side
    assert dom.stdout.count("<line") >= 16 * 16 and dom.stdout.count("<rect") >= 32, dom.stdout[-1500:]
    shot = subprocess.run([*flags, f"--screenshot={tmp_path / 'head_view.png'}", "--window-size=600,700",
                           (tmp_path / "head_view.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and (tmp_path / "head_view.png").stat().st_size > 5000
