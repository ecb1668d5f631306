"""pe_fast.program_exit.exit_now ends a program as the interpreter would, less the teardown of its modules: the
exit code, output written without a newline, a thread still running and the atexit handlers all come through."""
import subprocess
import sys

PROGRAM = """
import atexit, threading, time
from pe_fast.program_exit import exit_now
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
print("no newline", end="")
print("to stderr", file=sys.stderr, end="")
exit_now(3)
print("never")
"""


def test_exit_now_keeps_the_code_output_threads_and_atexit_handlers():
    done = subprocess.run([sys.executable, "-c", "import sys\n" + PROGRAM], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3
    assert done.stdout == "no newlinethread done\natexit ran\n"
    assert done.stderr == "to stderr"


def test_a_program_that_returns_none_exits_0():
    done = subprocess.run([sys.executable, "-c", "from pe_fast.program_exit import exit_now; exit_now(None)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""


def test_under_a_profiler_the_program_exits_the_usual_way_and_the_profile_is_written(tmp_path):
    script, profile = tmp_path / "program.py", tmp_path / "program.prof"
    script.write_text("from pe_fast.program_exit import exit_now\nexit_now(0)\n")
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), str(script)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert profile.stat().st_size > 0


def test_idle_thread_pool_workers_do_not_hold_the_exit():
    """A ThreadPoolExecutor left open (torch inductor's compile pool, after --compile on the CPU) keeps idle
    non-daemon workers: joined without threading's exit hook that tells them to stop, the sweep lingered 95 s after
    "results written" (or for ever)."""
    program = ("from concurrent.futures import ThreadPoolExecutor\n"
               "pool = ThreadPoolExecutor(2)\n"
               "print(pool.submit(lambda: 6 * 7).result(), flush=True)\n"
               "from pe_fast.program_exit import exit_now\n"
               "exit_now(3)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "42\n", done.stderr
