"""The sweep's progress line: the steps of several packs training at once (Ray, SLURM workers) counted into the
rate and the ETA, checked against the arithmetic done by hand; and the workers' step reports, which reach the
driver through the results folder and leave it with their finished pack."""
import pandas as pd
import pytest

from pe_fast.results import run_folder
from pe_fast.sweep import executors, progress
from pe_fast.sweep.progress import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", fake)
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    return fake


def test_line_counts_every_running_pack(clock, capsys):
    # 3 packs of 2, 1 and 1 models, 100 steps each; pack 2 finished before this process started
    line = Progress([[{}, {}], [{}], [{}]], steps=100, finished={2})
    line.observe(0, 40)  # pack 0 first seen at step 40: its steps count from there
    clock.now = 10.0
    line.observe(0, 60)
    line.observe(1, 30)  # pack 1 first seen now: none of its steps counted yet
    line.draw(force=True)
    # rate: 2 models × (60 − 40) steps / 10 s = 4; done: 1 × 100 + 2 × 60 + 1 × 30 = 250 of 400; ETA 150 / 4 s
    assert capsys.readouterr().err.strip() == ("packs 1/3  models 1/4  4 model-steps/s  ETA 0.6 min  "
                                               "(pack 0: step 60/100, pack 1: step 30/100)")


def test_finished_pack_counts_its_trained_steps_and_leaves_the_line(clock, capsys):
    line = Progress([[{}, {}], [{}]], steps=100, finished=set())
    line.observe(0, 10)
    line.observe(1, 50)
    clock.now = 20.0
    line.observe(1, 90)
    line.finish_pack(0, trained_steps=100)  # its worker trained all 100 steps
    # rate: (2 × 100 + 1 × (90 − 50)) / 20 s = 12; done 2 × 100 + 90 = 290 of 300
    assert capsys.readouterr().err.strip() == ("packs 1/2  models 2/3  12 model-steps/s  ETA 0.0 min  "
                                               "(pack 1: step 90/100)")


def test_a_worker_restarted_from_an_older_checkpoint_counts_from_there(clock, capsys):
    line = Progress([[{}]], steps=100, finished=set())
    line.observe(0, 70)  # a stale report from before a preemption
    line.observe(0, 50)  # the requeued job resumes from its checkpoint at step 50
    clock.now = 5.0
    line.observe(0, 60)
    line.draw(force=True)
    # rate: 1 model × (60 − 50) steps / 5 s = 2; ETA 40 / 2 s
    assert capsys.readouterr().err.strip() == ("packs 0/1  models 0/1  2 model-steps/s  ETA 0.3 min  "
                                               "(pack 0: step 60/100)")


def test_local_pack_line_unchanged(clock, capsys):
    line = Progress([[{}, {}]], steps=100, finished=set())
    line.start_pack(0)
    line.update(1)  # the first step of a fresh pack
    clock.now = 2.0
    line.update(5, force=True)
    # rate: 2 models × (5 − 0) steps / 2 s = 5; done 2 × 5 = 10 of 200; ETA 190 / 5 s
    assert capsys.readouterr().err.strip() == ("packs 0/1  models 0/2  5 model-steps/s  ETA 0.6 min  "
                                               "(pack 0: step 5/100)")


def test_worker_reports_its_step_at_most_every_few_seconds(tmp_path, monkeypatch):
    now = Clock()
    monkeypatch.setattr(executors.time, "monotonic", now)
    report = executors.StepReporter(tmp_path, 3)
    assert run_folder.read_step(tmp_path, 3) is None
    report(1)
    assert run_folder.read_step(tmp_path, 3) == 1  # the first step at once: the driver knows where it starts
    now.now = executors.STEP_REPORT_S / 2
    report(2)
    assert run_folder.read_step(tmp_path, 3) == 1
    now.now = executors.STEP_REPORT_S
    report(9)
    assert run_folder.read_step(tmp_path, 3) == 9


def test_step_report_leaves_with_the_finished_pack_and_garbage_reads_as_none(tmp_path):
    run_folder.write_step(tmp_path, 0, 42)
    frame = pd.DataFrame({"model_id": [0]})
    run_folder.write_pack(tmp_path, 0, frame, frame, {}, {})
    assert not run_folder.step_path(tmp_path, 0).exists()
    assert run_folder.read_step(tmp_path, 0) is None
    run_folder.step_path(tmp_path, 1).write_text("not a step")
    assert run_folder.read_step(tmp_path, 1) is None
