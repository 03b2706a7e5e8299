"""Airflow glue: the only part of pgtrain that imports Airflow. Heavy imports stay inside task bodies."""
