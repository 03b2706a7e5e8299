"""Reports the bad entries of the models file (dags/models.yaml) as this file's import error, naming the file,
each entry and its field. It defines no DAG: the good entries' DAGs come from pgtrain_models.py, and stay loaded
(Airflow marks every DAG of a file with an import error stale, so the error must not be in that file).
"""

from pathlib import Path

from pgtrain.config.model_entries import MODELS_FILE_NAME, errors_report, load_entries
from pgtrain.config.settings import SETTINGS_FILE_NAME, load_settings
from pgtrain.core.errors import ConfigError

try:
    settings = load_settings(default=Path(__file__).parent / SETTINGS_FILE_NAME)
    _, errors = load_entries(default=Path(__file__).parent / MODELS_FILE_NAME, search_limits=settings.search_limits)
except ConfigError:
    errors = []  # a file itself is unreadable: pgtrain_models.py reports that, with no DAG to keep
if errors:
    raise ConfigError(errors_report(errors))
