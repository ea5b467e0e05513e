"""eagleflow: train EAGLE-3 drafters for a served model and prove them on the real engine.

The library never imports Prefect: `flows/` wire, `tasks/` dispatch, this package does the work.
Modules that need torch (stages, drafter) import it themselves, so the control environment can
import `eagleflow.config`, `eagleflow.manifest` and `eagleflow.hosts` without it.
"""

__version__ = "0.1.0"
