"""A rank's process ends at once when its work is done: output flushed, atexit handlers run, no finalization."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TRAINER_IMAGE = Path(__file__).resolve().parents[2] / "trainer_image"

CHILD = textwrap.dedent("""\
    import atexit, sys

    class TornDown:
        def __del__(self):
            print("torn down", flush=True)

    kept = TornDown()  # a module global: finalization deletes it, os._exit does not
    atexit.register(lambda: print("atexit ran"))
    sys.stdout.write("work done\\n")  # block-buffered into a pipe: only a flush gets it out
    sys.stderr.write("said on stderr")

    from trainer.finish import exit_now

    exit_now(3)
    """)


def test_exit_now_flushes_runs_atexit_and_skips_the_teardown():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINER_IMAGE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["work done", "atexit ran"]
    assert done.stderr == "said on stderr"
    assert "torn down" not in done.stdout



def test_under_a_profiler_the_rank_exits_the_usual_way(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINER_IMAGE), os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "rank.py"
    script.write_text(CHILD)
    stats = tmp_path / "rank.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), str(script)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert "work done" in done.stdout, done.stderr  # cProfile ends the run itself (its exit status is its own)
    assert stats.stat().st_size > 0  # it wrote its figures: the process was not cut short
