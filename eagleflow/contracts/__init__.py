"""What the control side and the host-side stages agree on, and nothing that computes.

`request` (what a stage is asked to do) and `manifest` (what it made, keyed), `stage_records` and
`benchmark_records` (each stage's typed outputs and metrics), `plan` (the capacity plan's schema), `prompts`
(prompt sets and the held-out split), `failure` (the three lines a failure is read as) and `progress` (the
progress line protocol). Both environments import these: torch-free, Prefect-free.
"""
