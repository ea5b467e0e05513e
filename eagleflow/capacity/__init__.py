"""The capacity plan: what a run and a night cost on a host, before any work starts.

`rates` (what a plan assumes where the host measured nothing, each with its source), `costs` (bytes, FLOPs and
memory of one token, step and checkpoint), `planner` (a full run, stage by stage, and the disk refusal),
`nightly` (one night after the first), `render` (the tables a person reads), `facts` (what the plan needs to
know of a host, read there: `python -m eagleflow.capacity.facts`). The schema is `eagleflow.contracts.plan`.
"""
