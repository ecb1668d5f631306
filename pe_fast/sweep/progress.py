"""The sweep's one progress line on stderr."""
from __future__ import annotations

import sys
import time


class Progress:
    """One line on stderr: packs and models done, model-steps per second, ETA, and the step of each pack training
    now. Redrawn at most once a second (every 30 s when stderr is not a terminal). The rate counts the steps trained
    by this process only (not the packs a resumed sweep found finished or checkpointed), so the ETA holds for
    resumes and for Ray."""

    def __init__(self, packs: list[list[dict]], steps: int, finished: set[int]):
        self.packs = packs
        self.num_packs, self.num_models, self.steps = len(packs), sum(len(p) for p in packs), steps
        self.total = self.num_models * steps
        self.packs_done = len(finished)
        self.models_done = sum(len(packs[i]) for i in finished)
        self.trained = 0  # model-steps trained by this process in finished packs
        # the packs training now: index -> [first step counted here (None until known), step reached]
        self.running: dict[int, list] = {}
        self.local_pack = None  # the pack this process trains itself (local executor)
        self.start = self.last_draw = time.perf_counter()  # no rate before a second of work
        self.tty = sys.stderr.isatty()

    def start_pack(self, index: int):
        self.local_pack = index
        self.running[index] = [None, 0]

    def update(self, step: int, force: bool = False):
        """The pack training here has done `step` steps (the first call after a resume tells where it started)."""
        running = self.running[self.local_pack]
        if running[0] is None:
            running[0] = step - 1
        running[1] = step
        self.draw(force)

    def observe(self, index: int, step: int):
        """A worker reports pack `index` at `step`. Its steps count towards the rate from the first report seen
        (a step below it: the worker restarted from an older checkpoint, so counting starts again there)."""
        running = self.running.setdefault(index, [step, step])
        running[0], running[1] = min(running[0], step), step

    def finish_pack(self, index: int, trained_steps: int):
        self.packs_done += 1
        self.models_done += len(self.packs[index])
        self.trained += len(self.packs[index]) * trained_steps
        self.running.pop(index, None)
        self.draw(force=True)

    def draw(self, force: bool = False):
        now = time.perf_counter()
        if not force and now - self.last_draw < (1.0 if self.tty else 30.0):
            return
        self.last_draw = now
        counted = sum(len(self.packs[i]) * (step - first) for i, (first, step) in self.running.items()
                      if first is not None)
        rate = (self.trained + counted) / max(now - self.start, 1e-9)
        done = self.models_done * self.steps + sum(len(self.packs[i]) * step for i, (_, step) in self.running.items())
        eta = f"{(self.total - done) / rate / 60:.1f} min" if rate > 0 else "?"
        line = (f"packs {self.packs_done}/{self.num_packs}  models {self.models_done}/{self.num_models}  "
                f"{rate:,.0f} model-steps/s  ETA {eta}")
        if self.running:
            line += "  (" + ", ".join(f"pack {i}: step {step}/{self.steps}"
                                      for i, (_, step) in sorted(self.running.items())) + ")"
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def close(self):
        if self.tty:
            print(file=sys.stderr)
