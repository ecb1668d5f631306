"""Issue 13's test that another precision (tf32, bf16, fp16) keeps the science: LST sweeps of the same grid in
several precisions, each against float32.

    python bench/science/precision_check.py FOLDER [--reference fp32]
    python bench/science/precision_check.py FOLDER --by folder --reference triton

bench/gpu/gpu_check.sh's science step trains them on a GPU (SCIENCE_PRECISIONS="fp32 fp16" for fp16); on the CPU:

    for p in fp32 fp16; do
      python -m pe_fast.sweep --task lst --preset cpu --pe learned --sigmas 0.2,2.0 --seeds 5 --precision $p \
          --out runs/precision-cpu/$p-learned --no-report
      python -m pe_fast.sweep --task lst --preset cpu --pe sin2d --pe-dropout 0 --seeds 5 --precision $p \
          --out runs/precision-cpu/$p-sin2d --no-report
    done
    python bench/science/precision_check.py runs/precision-cpu

FOLDER holds results.parquet files (any depth, any name ending in results.parquet: the sweeps' folders, or the
flat copies bench/gpu/gpu_check.sh's science step brings back). Their `precision` column says which run is which;
with --by folder, the first folder under FOLDER does (compute paths, say: FOLDER/triton/, FOLDER/fused/, as
gpu_check.sh's science_paths step lays them out), and every run must then be of one precision.
Per (PE, σ) and precision it prints training accuracy, in-distribution held-out accuracy and generalisation
accuracy (mean ± sd over seeds, in points, sd with ddof 0 as everywhere in pe_fast), the generalisation
difference from the reference paired by seed (95 % t interval), and one verdict per precision. A precision
passes when, against the reference:
  * the settings rank the same by mean generalisation accuracy;
  * every setting's mean training accuracy is within 1 point;
  * every setting's mean generalisation accuracy is within one seed-sd (the larger of the two precisions' sds).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pe_fast.report.numbers import paired_difference

FIT, HELD_OUT, SCORE = "train_acc", "test_acc", "ood_acc"
FIT_TOLERANCE = 1.0  # points of training accuracy


class InputError(Exception):
    """Results that cannot be checked; the message is the one line the user sees."""


BY = ("precision", "folder")  # what tells the compared runs apart


def load(folder: Path, by: str = "precision") -> pd.DataFrame:
    """Every results.parquet under folder, with the run it belongs to in the column `precision` (by precision) or
    the name of its first folder under `folder` (by folder)."""
    files = sorted(folder.rglob("*results.parquet")) if folder.is_dir() else []
    if not files:
        raise InputError(f"no results.parquet under {folder}")
    frames = []
    for file in files:
        try:
            frame = pd.read_parquet(file)
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise InputError(f"{file}: not a readable parquet file ({type(error).__name__})") from None
        if by == "folder":
            parts = file.relative_to(folder).parts
            if len(parts) < 2:
                raise InputError(f"{file}: --by folder reads each run's variant from its folder under {folder}; "
                                 "this file lies directly in it")
            if "precision" in frame and frame["precision"].nunique() > 1:
                raise InputError(f"{file}: runs of several precisions ({sorted(set(frame['precision']))}) in one "
                                 "--by folder comparison")
            frame = frame.assign(run_precision=frame.get("precision"), precision=parts[0])
        frames.append(frame)
    results = pd.concat(frames, ignore_index=True)
    if by == "folder" and results["run_precision"].nunique() > 1:
        raise InputError(f"{folder}: the folders' runs are of different precisions "
                         f"({', '.join(sorted(set(results['run_precision'])))}): compare one at a time")
    missing = [c for c in ("task", "precision", "seed", "pe", "sigma", FIT, HELD_OUT, SCORE) if c not in results]
    if missing:
        raise InputError(f"{folder}: the results lack the columns {', '.join(missing)} (LST sweeps have them)")
    if set(results["task"]) != {"lst"}:
        raise InputError(f"{folder}: the check is defined on LST runs, found tasks {sorted(set(results['task']))}")
    results["setting"] = [setting_label(pe, sigma) for pe, sigma in zip(results["pe"], results["sigma"])]
    twice = results[results.duplicated(["precision", "setting", "seed"])]
    if len(twice):
        first = twice.iloc[0]
        raise InputError(f"{folder}: two results for {first['precision']} {first['setting']} seed {first['seed']} "
                         "(one run per precision and setting)")
    for column in (FIT, HELD_OUT, SCORE):
        results[column] = 100 * results[column]
    return results


def setting_label(pe: str, sigma: float) -> str:
    return pe if pd.isna(sigma) else f"{pe} σ = {sigma:g}"


@dataclass
class Verdict:
    precision: str
    reasons: list[str]  # empty: faithful

    def line(self, reference: str) -> str:
        if not self.reasons:
            return (f"{self.precision}: faithful to {reference} (same ranking, training fit within "
                    f"{FIT_TOLERANCE:g} point, generalisation within one seed-sd)")
        return f"{self.precision}: NOT faithful to {reference}: " + "; ".join(self.reasons)


def per_setting(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd (ddof 0) over seeds per (precision, setting)."""
    grouped = results.groupby(["precision", "setting"])[[FIT, HELD_OUT, SCORE]]
    sd = grouped.std(ddof=0).add_suffix("_sd")
    return pd.concat([grouped.mean(), sd, grouped.size().rename("seeds")], axis=1)


def verdict(stats: pd.DataFrame, precision: str, reference: str) -> Verdict:
    mine, ref = stats.loc[precision], stats.loc[reference]
    common = mine.index.intersection(ref.index)
    reasons = []
    if len(common) < len(ref.index) or len(common) < len(mine.index):
        reasons.append("not the same settings as the reference")
    mine, ref = mine.loc[common], ref.loc[common]
    rank_mine = list(mine[SCORE].sort_values(ascending=False).index)
    rank_ref = list(ref[SCORE].sort_values(ascending=False).index)
    if rank_mine != rank_ref:
        reasons.append(f"ranking {' > '.join(rank_mine)} against {' > '.join(rank_ref)}")
    for label in common:
        fit_gap = mine.loc[label, FIT] - ref.loc[label, FIT]
        if abs(fit_gap) > FIT_TOLERANCE:
            reasons.append(f"{label} training accuracy {fit_gap:+.2f} points")
        score_gap = mine.loc[label, SCORE] - ref.loc[label, SCORE]
        seed_sd = max(mine.loc[label, SCORE + "_sd"], ref.loc[label, SCORE + "_sd"])
        if abs(score_gap) > seed_sd:
            reasons.append(f"{label} generalisation {score_gap:+.2f} points (seed-sd {seed_sd:.2f})")
    return Verdict(precision, reasons)


def verdicts(results: pd.DataFrame, reference: str) -> dict:
    """{precision: "pass" or "fail"}: what a speed record of that precision quotes (bench_sweep_gpu.py)."""
    stats = per_setting(results)
    found = {p: "fail" if verdict(stats, p, reference).reasons else "pass"
             for p in sorted(set(results["precision"])) if p != reference}
    return {"reference": reference, "verdicts": {reference: "pass", **found}}


def cell(stats: pd.DataFrame, precision: str, setting: str, column: str) -> str:
    if (precision, setting) not in stats.index:
        return "–"
    row = stats.loc[(precision, setting)]
    return f"{row[column]:.1f} ± {row[column + '_sd']:.1f}"


def report(results: pd.DataFrame, reference: str) -> str:
    precisions = sorted(set(results["precision"]))
    if reference not in precisions:
        raise InputError(f"no {reference} runs to compare with (found precisions {', '.join(precisions)})")
    others = [p for p in precisions if p != reference]
    if not others:
        raise InputError(f"only {reference} runs: nothing to compare")
    order = [reference, *others]
    stats = per_setting(results)
    by_seed = results.set_index(["precision", "setting", "seed"])[SCORE]
    names = " / ".join(order)
    lines = [f"| setting | seeds | train acc {names} | held-out {names} | **generalisation {names}** | "
             + " | ".join(f"{p} − {reference}, paired by seed" for p in others) + " |",
             "|---" * (5 + len(others)) + "|"]
    for setting in stats.loc[reference].index:
        seeds = int(stats.loc[(reference, setting), "seeds"])
        paired = []
        for p in others:
            if (p, setting) not in stats.index:
                paired.append("–")
                continue
            diff = paired_difference(by_seed.loc[(p, setting)], by_seed.loc[(reference, setting)])
            paired.append("–" if diff is None else f"{diff[0]:+.1f} ({diff[1]:+.1f} to {diff[2]:+.1f})")
        lines.append(f"| {setting} | {seeds} | "
                     + " / ".join(cell(stats, p, setting, FIT) for p in order) + " | "
                     + " / ".join(cell(stats, p, setting, HELD_OUT) for p in order) + " | **"
                     + " / ".join(cell(stats, p, setting, SCORE) for p in order) + "** | " + " | ".join(paired) + " |")
    lines.append("")
    lines += [verdict(stats, p, reference).line(reference) for p in others]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder holding the runs' results.parquet files")
    parser.add_argument("--by", choices=BY, default="precision",
                        help="what tells the runs apart: their precision column (default), or the first folder "
                             "under FOLDER (one precision throughout)")
    parser.add_argument("--reference", default="fp32",
                        help="the precision (or, --by folder, the folder) the others are checked against (fp32)")
    parser.add_argument("--verdicts", type=Path,
                        help="also write {precision: pass or fail} as JSON here (the reference passes by definition), "
                             "for bench/training/bench_sweep_gpu.py --science-check")
    args = parser.parse_args(argv)
    try:
        results = load(args.folder, args.by)
        print(report(results, args.reference))
        if args.verdicts is not None:
            args.verdicts.write_text(json.dumps(verdicts(results, args.reference), indent=1) + "\n")
    except InputError as error:
        print(f"precision_check: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
