"""eagleflow: train EAGLE-3 drafters for a served model and prove them on the real engine.

The library never imports Prefect: `flows/` wire, `tasks/` dispatch, this package does the work.
Modules that need torch (stages, drafter) import it themselves, so the control environment can
import `eagleflow.config`, `eagleflow.contracts.manifest` and `eagleflow.hosts` without it.
"""

__version__ = "0.2.0"


class EagleflowError(Exception):
    """The root of every error eagleflow raises on purpose: a caller that catches it catches them all.

    Each subclass's message is what a person reads (eagleflow.contracts.failure: what failed, the cause, the fix);
    those raised where a value is wrong are also `ValueError`s, so validation and argument parsing treat them so.
    Its repr is that message under its type's name, not Python's quoted `Type('line\\nline')`: Prefect logs a failed
    run's exception by its repr ("Encountered exception during execution: ..."), and an operator reads those lines
    in the UI's log as lines.
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}: {self}"
