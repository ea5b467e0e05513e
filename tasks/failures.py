"""A failed stage's logs as a Prefect artifact: the root cause one click from the failed task, not an
SSH session away. Every stage attaches its stage.log and the log of any engine it started; the
benchmark names more (each variant's engine, the triage's, the preflight, production's records).
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from eagleflow.config import RunConfig
from eagleflow.contracts.progress import parse_line
from eagleflow.hosts import Host, StageFailed
from tasks.naming import artifact_key

# What a failed stage leaves that explains it, in the order a reader wants them.
STAGE_FILES = ("stage.log", "engine.log")  # engine.log: generate's own engine, extract's capturing one
MAX_ATTACHED = 200_000  # characters per file; the full file stays on the host, named in the artifact


def attach_failure_logs(
    config: RunConfig, host: Host, stage: str, stage_dir: str, error: StageFailed, files: tuple[str, ...] = STAGE_FILES
) -> None:
    """Artifact `eagleflow-<run>-<stage>-failure`: the error's three lines as its heading, then each of `files`
    found in the stage dir (`{key}` in a name is the stage key), progress lines as a person reads them. The
    error's message then names the artifact among its logs. Attaching never hides the failure itself."""
    key = stage_dir.rstrip("/").rsplit("/", 1)[-1]
    artifact = artifact_key("eagleflow", config.name, stage, "failure")
    what, *rest = str(error).splitlines()
    parts = [f"# {what[0].upper()}{what[1:]}", "", *[f"{line}  " for line in rest]]  # a line each
    try:
        for name in files:
            name = name.format(key=key)
            path = f"{stage_dir}/{name}"
            if not host.exists(path):
                continue
            text = "\n".join(parse_line(line)[0] for line in host.read_text(path).splitlines())
            cut = len(text) > MAX_ATTACHED
            parts += [
                "",
                f"## {name}",
                f"`{host.name}:{path}`" + (f" (last {MAX_ATTACHED} characters)" if cut else ""),
                "",
                "```",
                text[-MAX_ATTACHED:],
                "```",
            ]
        create_markdown_artifact(
            "\n".join(parts), key=artifact, description=f"logs of the failed {stage} stage in {stage_dir}"
        )
        error.logs.insert(0, f"artifact {artifact}")
    except Exception as exc:  # noqa: BLE001 - attaching must never hide the failure itself
        get_run_logger().warning("could not attach the %s logs: %s", stage, exc)
