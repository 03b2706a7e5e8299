"""pgtrain: scheduled distributed training from PostgreSQL (Airflow 3 + Horovod).

The core modules import neither Airflow nor torch; the Airflow glue lives in
``pgtrain.airflow`` and the torch side in the ``trainer`` package.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # load_model, load_predictor and predict need torch: import it only when they are used, not with pgtrain.
    if name in {"load_model", "load_predictor", "predict"}:
        from pgtrain.store import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'pgtrain' has no attribute {name!r}")
