"""Plumbing every layer uses: atomic files, flock liveness, process groups, one HTTP client, sizes and durations.

Standard library only (and httpx for `http`): a host-side job supervisor imports it before anything else is loaded.
"""
