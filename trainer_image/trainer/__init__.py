"""The pgtrain trainer: one Horovod rank per process, data from the run's PostgreSQL manifest."""
