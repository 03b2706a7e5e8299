"""How a rank's process ends once ``main`` has returned: at once, without tearing down what torch loaded.

A Python process that imported torch spends about half a second in its finalization (the modules' teardown and
libtorch's static destructors), after the rank's work is written and its collectives are shut down: half a second
of every train task, longer on a busy machine (issue 32). By then nothing is left to tear down that matters: the
connections are closed, the staged rows committed. So the rank flushes its output, runs what ``atexit`` holds
(whoever registered a handler still gets it) and leaves with ``os._exit``. A rank that raised exits the usual way,
traceback and all.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, run the ``atexit`` handlers, end the process with ``code``; under a profiler or a
    tracer (``python -m cProfile``, a debugger), which write their results after the program returns, the usual
    way."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: the launcher is gone, nobody reads it
            pass
    os._exit(code)
