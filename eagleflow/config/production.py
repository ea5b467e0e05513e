"""The production service on the host: stopped or paused for the GPU stages, restored after them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from eagleflow.config.base import _Strict

# The probe after a wake passes a drafter at half the accepted drafts per step it should serve. Below the
# benchmark's benchmark.suspect_ratio (0.6 of the offline estimate: "the engine integration is suspect") because
# the probe reads fewer answers than the canary and the benchmark (it stops once its interval decides), and
# because a refusal costs a whole engine load where a pass only leaves the drafter to the canary and the
# benchmark, which judge it on more. Served over offline accepted drafts per step, greedy, on the held-out
# prompts: 0.98 (the demo's drafter on CPU, AL 3.39 against 3.45), 1.02 twice on an H200 (2.35 against 2.32,
# 2.69 against 2.66: docs/benchmarks.md); a drafter whose weights are not in use: 0 (AL 1.00).
PROBE_SHARE = 0.5
# Its caps: enough that a drafter well clear of the bar is decided in a few requests and one near it gets dozens
# (the interval's half-width falls as 1 / sqrt(requests)). Requests are as long as the canary's (its max_tokens): 32
# of 160 tokens (the demo's) take 10 s on an H200; at Kimi-K2.5's 82.5 tok/s a request without speculation
# (docs/reference-run.md) 90 s hold some 7,400 tokens, 46 such requests, less the users' requests queued
# during the sleep: the seconds cap then comes first.
PROBE_MAX_REQUESTS = 32
PROBE_MAX_S = 90.0


class TrafficCell(_Strict):
    """One part of what production serves: its sampling, how many requests are in flight, and its share."""

    temperature: float = Field(ge=0, le=2, description="Sampling temperature production's users get (0: greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling's top_p (1: off).")
    concurrency: int = Field(ge=1, description="Requests in flight on production at once in this part.")
    share: float = Field(
        gt=0, le=1, description="Share of production's output tokens served this way (the shares sum to 1)."
    )
    name: str | None = Field(None, description="What it is, for a person (e.g. 'thinking', 'instant').")


class ProductionConfig(_Strict):
    """The production service on the host: stopped for the stages that need the GPUs, restored after them
    whatever happens; and, with generate.server 'production', the server the data is generated from.

    'systemd' runs `systemctl stop|start <unit>`; 'command' runs the operator's own stop and start
    commands (argv lists, run on the host; start must return once the service is launched). eagleflow
    never signals the production processes itself. Health is `health_url` answering 200.
    """

    kind: Literal["none", "systemd", "command"] = Field(
        "none", description="'none': nothing to stop (a dedicated benchmark host); 'systemd' or 'command'."
    )
    unit: str | None = Field(None, description="systemd: the unit of the production server, e.g. vllm-kimi-k25-int4.")
    user_unit: bool = Field(False, description="systemd: a user unit (systemctl --user).")
    start_command: list[str] = Field(default_factory=list, description="command: argv that starts the service.")
    stop_command: list[str] = Field(default_factory=list, description="command: argv that stops the service.")
    status_command: list[str] = Field(
        default_factory=list,
        description="command: argv whose exit status says whether production's process is up (0: running or still "
        "loading) or gone (non-zero). Asked while production comes back: one that exits while loading (a drafter it "
        "cannot load) is known then, not after production.restore_timeout_s. systemd needs none: the unit's "
        "ActiveState and restart count say it. Empty: health alone decides.",
    )
    health_url: str | None = Field(
        None, description="URL that answers 200 when production is healthy, e.g. http://127.0.0.1:8000/health."
    )
    url: str | None = Field(
        None,
        description="Base URL of production's OpenAI-compatible API, e.g. http://127.0.0.1:8000 "
        "(generate.server 'production' sends its prompts there).",
    )
    replicas: list[str] = Field(
        default_factory=list,
        description="Base URLs of production's replicas (each an OpenAI-compatible server answering /health), e.g. "
        "the servers behind its load balancer. generate.server 'production' then sends to them directly, at most "
        "generate.concurrency requests in flight on each, spread by load (a free slot takes the next prompt, so a "
        "busy replica takes fewer); one that goes down is left and its requests sent to the others, and it is "
        "taken back once its /health answers. Empty: production.url alone.",
    )
    traffic: list[TrafficCell] = Field(
        default_factory=list,
        description="What production serves, by share of its output tokens: sampling (temperature, top_p) and "
        "requests in flight. The benchmark measures these cells (benchmark.temperatures, concurrencies and top_p "
        "follow them) and the verdict and the nightly's gate judge the throughput over the mix (docs/production.md, "
        "Production's traffic). Empty: the benchmark's first setting decides, as before.",
    )
    traffic_floor_share: float = Field(
        0.1,
        gt=0,
        le=1,
        description="A cell of production.traffic with at least this share that serves slower than no speculation "
        "beyond noise keeps a drafter out, whatever the mix's figure.",
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding production's API key, in the environment of the "
        "flow run (the Prefect worker). The key is handed to the generate stage in memory: never written to a "
        "request, manifest, log, report or artifact.",
    )
    api_key_secret: str | None = Field(
        None,
        description="Name of a Prefect Secret block holding production's API key (read by the flow run; "
        "wins over api_key_env).",
    )
    window: Literal["pipeline", "stage"] = Field(
        "pipeline",
        description="'pipeline': production is stopped once, before the first stage that needs the GPUs (extract "
        "through the engine or on GPU, train on GPU, benchmark), and restored after the last; 'stage': stopped and "
        "restored around each of them.",
    )
    stop_timeout_s: float = Field(120, gt=0, description="Wait this long for production to be down after stopping it.")
    restore_timeout_s: float = Field(
        1800, gt=0, description="Wait this long for production to answer healthy after starting it again."
    )
    orphan_grace_s: float = Field(
        20,
        gt=0,
        description="Safety net on the host: when the pipeline that stopped production is gone this long (its host "
        "lease is free), the net ends the benchmark and restores production.",
    )

    pause: Literal["stop", "sleep"] = Field(
        "stop",
        description="How production leaves the GPUs. 'stop': stopped and started again (a whole engine load). "
        "'sleep': vLLM's sleep mode (production launched with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, its "
        "port reachable from the host only): asleep in a second, woken in seconds, its drafter's acceptance probed "
        "after every wake; a preflight that fails, or a wake or probe that does, falls back to stop and start "
        "(docs/production.md).",
    )
    sleep_level: Literal[1, 2] | None = Field(
        None,
        description="sleep: 1 moves production's weights to host RAM, 2 drops them (read again at the wake). "
        "Unset: level 1 when the host's free RAM holds what production has on its GPUs, else 2.",
    )
    swap_drafter: bool = Field(
        False,
        description="sleep + promote 'serve': a new drafter of the served one's architecture is swapped into the "
        "woken engine over CUDA IPC (seconds) instead of a restart. Production must be launched with "
        '--weight-transfer-config \'{"backend": "ipc"}\' and VLLM_ALLOW_INSECURE_SERIALIZATION=1, which lets '
        "whoever reaches its port run code in it: only where the port is the host's alone.",
    )
    probe_share: float = Field(
        PROBE_SHARE,
        gt=0,
        le=1,
        description="sleep: after the wake the drafter production serves passes only when its probe reaches this "
        "share of what it should serve, in accepted drafts per step (AL - 1): its canary on production when it was "
        "confirmed good, else its offline estimate (the simulated AL its export wrote into its config.json). The "
        "probe sends requests until the 95% interval of its AL lies wholly above or below that bar "
        "(probe_max_requests, probe_max_s); below it, production is stopped and started. A drafter with neither "
        "figure passes when it accepts anything, and the window's record says it had none.",
    )
    probe_max_requests: int = Field(
        PROBE_MAX_REQUESTS,
        ge=4,
        description="sleep: the most requests the probe after the wake sends before the point estimate decides "
        "(the run's held-out prompts, one at a time, greedy, as long as the canary's).",
    )
    probe_max_s: float = Field(
        PROBE_MAX_S,
        gt=0,
        description="sleep: the most seconds the probe after the wake measures before the point estimate decides "
        "(production serves meanwhile; the window is not closed until the probe is done).",
    )

    promote: Literal["record", "serve"] = Field(
        "record",
        description="What the nightly's promotion does. 'record': write the promoted record only (production's launch "
        "is the operator's to change). 'serve' (named 'deploy' before 0.2, still read): production's launch reads its "
        "drafter from the link "
        "<work_root>/production/<name>/drafter; promoting switches the link inside the production window, so "
        "production comes back with the new drafter, then the canary measures production through its endpoint and "
        "rolls back to the last good drafter when it serves below the bar.",
    )
    canary_prompts: int = Field(
        16, ge=1, description="serve: held-out prompts the canary sends to production (one at a time, greedy)."
    )
    canary_max_tokens: int | None = Field(
        None, ge=1, description="serve: tokens per canary request (default: benchmark.max_tokens)."
    )
    canary_tolerance: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="serve: a new drafter whose acceptance length or output tok/s on production is more than this "
        "fraction below the last good drafter's canary is rolled back (as is one below the promotion gate's AL).",
    )

    @field_validator("promote", mode="before")
    @classmethod
    def _earlier_name(cls, v: object) -> object:
        return "serve" if v == "deploy" else v  # 'deploy' was this value's name until 0.2: "deploy" is Prefect's word

    @model_validator(mode="after")
    def _kind(self) -> ProductionConfig:
        if self.promote == "serve" and self.kind == "none":
            raise ValueError(
                "production.promote 'serve' needs a production service to restart (production.kind "
                "'systemd' or 'command')"
            )
        if self.promote == "serve" and not self.url:
            raise ValueError("production.promote 'serve' needs production.url: the canary measures production there")
        for i, u in enumerate(self.replicas):
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"production.replicas[{i}] is {u!r}: a base URL, e.g. http://10.0.0.2:8000")
        if len({u.rstrip("/") for u in self.replicas}) != len(self.replicas):
            raise ValueError("production.replicas names a URL twice: each replica once")
        if self.kind == "systemd" and not self.unit:
            raise ValueError("production.unit is required when production.kind is 'systemd'")
        if self.kind == "command" and not (self.start_command and self.stop_command):
            raise ValueError(
                "production.start_command and production.stop_command are required when production.kind is 'command'"
            )
        if self.status_command and self.kind != "command":
            raise ValueError(
                "production.status_command is for production.kind 'command' (systemd's unit state says it)"
            )
        if self.kind != "none" and not self.health_url:
            raise ValueError(
                f"production.health_url is required when production.kind is {self.kind!r}: "
                "it is how eagleflow knows production answers again"
            )
        if self.traffic:
            total = sum(c.share for c in self.traffic)
            if abs(total - 1.0) > 0.01:
                raise ValueError(f"production.traffic's shares sum to {total:.3f}: they are shares of one whole (1)")
            cells = [(c.temperature, c.concurrency) for c in self.traffic]
            if len(set(cells)) != len(cells):
                raise ValueError("production.traffic names one temperature and concurrency twice: merge their shares")
            sampled = {c.top_p for c in self.traffic if c.temperature > 0}
            if len(sampled) > 1 or any(c.top_p != 1.0 for c in self.traffic if c.temperature == 0):
                raise ValueError(
                    f"production.traffic: its sampled cells name top_p {sorted(sampled)}; eagleflow measures one top_p "
                    "for every sampled cell (and none at temperature 0): give them one"
                )
        if self.swap_drafter and self.pause != "sleep":
            raise ValueError("production.swap_drafter swaps into a woken engine: it needs production.pause 'sleep'")
        return self


LEVEL1_RAM_HEADROOM = 1.1  # host RAM free for production's GPU memory x this, or level 2


def choose_sleep_level(configured: int | None, gpu_mib: int | None, host_mib: int | None) -> tuple[int, str]:
    """The sleep level production is paused at, and why: level 1 when the host's free RAM holds what production has
    on its GPUs (an upper bound of its weights, which level 1 pins in host RAM) with LEVEL1_RAM_HEADROOM to spare,
    else level 2; a configured level (production.sleep_level) wins. One rule for the runtime (eagleflow.production.
    pause: nvidia-smi's and /proc/meminfo's figures) and the plan (eagleflow.capacity.nightly: the host's facts), so
    the plan never promises a level the night will not take."""
    if configured:
        return configured, f"level {configured} (production.sleep_level)"
    if gpu_mib is None or host_mib is None:
        return 2, "level 2: production's GPU memory or the host's free RAM is unknown, so level 1 is not risked"
    if host_mib >= LEVEL1_RAM_HEADROOM * gpu_mib:
        return 1, f"level 1: {host_mib:,} MiB of host RAM free for production's {gpu_mib:,} MiB on the GPUs"
    return 2, (
        f"level 2: {host_mib:,} MiB of host RAM free cannot hold production's {gpu_mib:,} MiB on the GPUs "
        f"(x{LEVEL1_RAM_HEADROOM})"
    )
