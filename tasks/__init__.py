"""Prefect tasks: one module per stage. They dispatch to a host; no ML code lives here."""
