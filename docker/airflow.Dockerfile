# Airflow 3 with pgtrain and the local (CPU) launcher: torch, Horovod (built by the same script as .venv).
# The official image already holds Airflow installed with Airflow's constraints; on top of it go the runtime
# requirements only (requirements.txt: no test tools), with apache-airflow pinned to the image's version so
# that pip can never move it (what Airflow's constraints files ask of later pip commands).
ARG AIRFLOW_VERSION=3.3.2
FROM apache/airflow:${AIRFLOW_VERSION}-python3.11
ARG AIRFLOW_VERSION
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
USER airflow
COPY requirements.txt trainer_image/requirements.txt trainer_image/build_horovod.sh /opt/pgtrain/
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/pgtrain/requirements.txt \
    && pip install --no-cache-dir cloudpickle psutil pyyaml packaging cffi \
    && bash /opt/pgtrain/build_horovod.sh python /tmp/wheels \
    && pip install --no-cache-dir --no-deps /tmp/wheels/*/horovod-*.whl \
    && rm -rf /tmp/wheels
ENV PYTHONPATH=/opt/airflow/plugins:/opt/pgtrain/trainer_image \
    PGTRAIN_SQL_DIR=/opt/airflow/sql
