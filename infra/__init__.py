"""Control-side operations on hosts that are not pipeline stages: bootstrapping the host environment.

Runs in the control environment (paramiko for SSH hosts); never imports Prefect, so `python -m
infra.bootstrap` works without a Prefect server. `tasks/bootstrap.py` wraps it as a Prefect task.
"""
