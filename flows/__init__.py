"""Prefect flows: the DAG and nothing else."""
