"""pgtrain: scheduled distributed training from PostgreSQL (Airflow 3 + Horovod).

The core modules import neither Airflow nor torch; the Airflow glue lives in
``pgtrain.airflow`` and the torch side in the ``trainer`` package.
"""

__version__ = "0.1.0"
