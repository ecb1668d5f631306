"""The sweep's one progress line on stderr."""
from __future__ import annotations

import sys
import time


class Progress:
    """One line on stderr: packs and models done, model-steps per second, ETA. Redrawn at most once a second
    (every 30 s when stderr is not a terminal). The rate counts the steps trained by this process only (not the
    packs a resumed sweep found finished or checkpointed), so the ETA holds for resumes and for Ray."""

    def __init__(self, packs: list[list[dict]], steps: int, finished: set[int]):
        self.num_packs, self.num_models, self.steps = len(packs), sum(len(p) for p in packs), steps
        self.total = self.num_models * steps
        self.packs_done = len(finished)
        self.models_done = sum(len(packs[i]) for i in finished)
        self.trained = 0  # model-steps trained by this process in finished packs
        self.pack, self.size, self.first_step, self.step = None, 0, None, 0  # the pack training here, if any
        self.start = self.last_draw = time.perf_counter()  # no rate before a second of work
        self.tty = sys.stderr.isatty()

    def start_pack(self, index: int, size: int):
        self.pack, self.size, self.first_step, self.step = index, size, None, 0

    def update(self, step: int, force: bool = False):
        """The running pack has done `step` steps (the first call after a resume tells where it started)."""
        if self.first_step is None:
            self.first_step = step - 1
        self.step = step
        self.draw(force)

    def finish_pack(self, size: int, trained_steps: int):
        self.packs_done += 1
        self.models_done += size
        self.trained += size * trained_steps
        self.pack = None
        self.draw(force=True)

    def draw(self, force: bool = False):
        now = time.perf_counter()
        if not force and now - self.last_draw < (1.0 if self.tty else 30.0):
            return
        self.last_draw = now
        running = self.size * (self.step - self.first_step) if self.pack is not None and self.first_step is not None \
            else 0
        rate = (self.trained + running) / max(now - self.start, 1e-9)
        done = self.models_done * self.steps + (self.size * self.step if self.pack is not None else 0)
        eta = f"{(self.total - done) / rate / 60:.1f} min" if rate > 0 else "?"
        line = (f"packs {self.packs_done}/{self.num_packs}  models {self.models_done}/{self.num_models}  "
                f"{rate:,.0f} model-steps/s  ETA {eta}")
        if self.pack is not None:
            line += f"  (pack {self.pack}: step {self.step}/{self.steps})"
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def close(self):
        if self.tty:
            print(file=sys.stderr)
