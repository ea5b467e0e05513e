"""The benchmark stage as a Prefect task (upstream: export, unless benchmark.drafter names the drafter).

Its table and verdict become a markdown artifact. When it fails, the engine and guardian logs are
attached as an artifact too, so the root cause is one click from the failed task, not an SSH away.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagleflow.config import RunConfig
from eagleflow.hosts import Host, StageFailed
from eagleflow.manifest import Manifest
from eagleflow.outputs import BenchmarkOutputs
from tasks.dispatch import STAGE_TASK, dispatch
from tasks.naming import artifact_key

# The files a failed benchmark leaves that explain it, in the order a reader wants them.
FAILURE_FILES = ("stage.log", "engine-baseline.log", "engine-current.log", "engine-drafter.log",
                 "engine-triage-verify.log", "plumbing-{key}/engine.log",  # the triage's probe engines
                 "preflight.json", "production.json", "production.restored.json", "production-guardian.log",
                 "production-commands.log")
MAX_ATTACHED = 200_000  # characters per file; the full file stays on the host, named in the artifact


def attach_failure_logs(config: RunConfig, host: Host, stage_dir: str, error: StageFailed) -> None:
    parts = [f"# Benchmark failed on {host.name}", "", "```", str(error)[-4000:], "```"]
    for name in FAILURE_FILES:
        name = name.format(key=stage_dir.rstrip("/").rsplit("/", 1)[-1])
        path = f"{stage_dir}/{name}"
        if not host.exists(path):
            continue
        text = host.read_text(path)
        cut = len(text) > MAX_ATTACHED
        parts += ["", f"## {name}", f"`{host.name}:{path}`" + (f" (last {MAX_ATTACHED} characters)" if cut else ""),
                  "", "```", text[-MAX_ATTACHED:], "```"]
    try:
        create_markdown_artifact("\n".join(parts), key=artifact_key("eagleflow", config.name, "benchmark-failure"),
                                 description=f"logs of the failed benchmark in {stage_dir}")
    except Exception as exc:  # noqa: BLE001 - attaching must never hide the failure itself
        get_run_logger().warning("could not attach the benchmark logs: %s", exc)


@task(name="benchmark", **STAGE_TASK, cache_policy=NO_CACHE, task_run_name="benchmark")
def benchmark(host: Host, config: RunConfig, upstream: dict[str, Manifest],
              env: dict[str, str] | None = None) -> Manifest:
    manifest = dispatch("benchmark", host, config, upstream, env=env,
                        on_failure=lambda d, exc: attach_failure_logs(config, host, d, exc))
    text = host.read_text(manifest.path(BenchmarkOutputs.of(manifest).report_md))
    create_markdown_artifact(text, key=artifact_key("eagleflow", config.name, "benchmark"),
                             description=f"benchmark table and verdict ({manifest.dir})")
    return manifest
