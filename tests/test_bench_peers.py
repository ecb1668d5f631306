"""bench/training/bench_peers.py runs as a user runs it and reports pe_fast's pack and both peers (a tiny shape, one
round, eager only: what is checked is that every way runs and reports a rate, not the speeds)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_peers_benchmark_reports_the_pack_and_its_peers_at_a_tiny_shape(tmp_path):
    out = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, "bench/training/bench_peers.py", "--shapes", "lst", "--sweep-flags",
                           "--width 8 --depth 1 --mlp-width 16 --batch-size 4 --seeds 1", "--steps", "2",
                           "--warmup", "1", "--repeats", "1", "--ensemble-compile", "off", "--pack-compile", "off", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())["records"][0]
    assert record["models"] == 2 and record["width"] == 8
    assert record["params_per_model"]["pack"] == record["params_per_model"]["peers"]  # the same models
    assert set(record["ways"]) == {"pack", "ensemble_eager", "loop"}
    assert all(row["model_steps_per_s"] > 0 for row in record["ways"].values())
    assert record["ways"]["loop"]["pack_over_peer"] > 0
