"""The pgtrain trainer: one Horovod rank per process, data from the run's PostgreSQL manifest."""

import time

STARTED = time.perf_counter()  # when a rank's Python reached the trainer: its imports are counted from here
