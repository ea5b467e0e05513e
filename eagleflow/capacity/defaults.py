"""What a plan assumes where the host has measured nothing, chosen for the host at hand: the closest host whose
rates were measured, and saying which.

A GPU host: the reference run's figures and this project's on an H200 (eagleflow.capacity.rates). A host without
GPUs: what `make demo` measured on a 2-core CPU machine (`CPU_REFERENCE`), scaled by the target's weights against
the demo target's (a token's compute grows with them) and by the host's cores against 2; never a GPU host's rates,
which on a CPU host are off by orders of magnitude. A rate the host measured itself beats both (the planner's
`measured_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagleflow.capacity.costs import default_train_rate
from eagleflow.capacity.rates import (
    CPU_REFERENCE,
    CPU_SOURCE,
    DEFAULT_CHECK_S,
    DEFAULT_DECODE_TOK_S,
    DEFAULT_EXPORT_S,
    DEFAULT_GENERATE_TOK_S,
    ENGINE_BASE_START_S,
    HF_MEASURED_WEIGHTS_BYTES,
    LOAD_S_PER_GB,
    SGLANG_ENGINE_NOTE,
    SOURCES,
)
from eagleflow.config import RunConfig
from eagleflow.contracts.plan import HostFacts, TargetFacts
from eagleflow.extraction.backends import ExtractionBackend


@dataclass(frozen=True)
class HostDefaults:
    """Each default rate a plan uses on this host, with where it comes from."""

    cpu: bool  # no GPUs: the demo's measured CPU rates, scaled
    scale: float  # the CPU rates' factor for this target and these cores (1.0 on a GPU host)
    scale_note: str
    generate_tok_s: float
    generate_src: str
    decode_tok_s: float
    decode_src: str
    export_s: float
    export_src: str
    check_s: float
    check_src: str
    engine_src: str

    def engine_start_s(self, weights_bytes: int | None, cache: str = "cold") -> float:
        """An engine's start: its fixed part (imports, init) and its weights read at the measured disk rate."""
        base = CPU_REFERENCE["engine_start_s"] if self.cpu else ENGINE_BASE_START_S
        return base + (weights_bytes or 0) / 1e9 * LOAD_S_PER_GB[cache]

    def extract(self, backend: ExtractionBackend, weights_bytes: int | None = None) -> tuple[float, str]:
        if self.cpu:
            rate = CPU_REFERENCE["extract_tok_s"] * self.scale
            return rate, f"{CPU_SOURCE}: extract ({backend.name}){self.scale_note}"
        src = backend.default_source
        if backend.name == "hf" and (weights_bytes or 0) > HF_MEASURED_WEIGHTS_BYTES * 4:
            src += (
                f"; not this target's: {weights_bytes / 1e9:,.0f} GB of weights against the 8B target's "
                f"{HF_MEASURED_WEIGHTS_BYTES / 1e9:.0f} GB (a transformers forward of a large MoE runs its experts "
                "one after another: read this time as a floor)"
            )
        return backend.default_tok_s, src

    def train(self, t: TargetFacts, cfg: RunConfig, facts: HostFacts) -> tuple[float, str]:
        if self.cpu:
            return CPU_REFERENCE["train_tok_s"] * self.scale, f"{CPU_SOURCE}: train{self.scale_note}"
        return default_train_rate(t, cfg, facts.gpus)


def defaults_for(facts: HostFacts, engine_kind: str = "vllm") -> HostDefaults:
    """The defaults for the host `facts` describe (see the module doc), for the engine that serves there."""
    if facts.gpus:
        engine_src = SOURCES["engine"] + (SGLANG_ENGINE_NOTE if engine_kind == "sglang" else "")
        return HostDefaults(
            cpu=False,
            scale=1.0,
            scale_note="",
            generate_tok_s=DEFAULT_GENERATE_TOK_S,
            generate_src=SOURCES["generate"],
            decode_tok_s=DEFAULT_DECODE_TOK_S,
            decode_src=SOURCES["benchmark"],
            export_s=DEFAULT_EXPORT_S,
            export_src=SOURCES["export"],
            check_s=DEFAULT_CHECK_S,
            check_src=SOURCES["check"],
            engine_src=engine_src,
        )
    ref = CPU_REFERENCE
    weights = facts.target.weights_bytes if facts.target and facts.target.weights_bytes else ref["weights_bytes"]
    cores = facts.cpus or ref["cores"]
    scale = ref["weights_bytes"] / weights * cores / ref["cores"]
    note = (
        ""
        if abs(scale - 1.0) < 0.005
        else f", x {scale:.3g} (the demo target's {ref['weights_bytes'] / 1e6:,.1f} MB of weights over this one's "
        f"{weights / 1e6:,.1f} MB, {cores} cores over {ref['cores']})"
    )
    return HostDefaults(
        cpu=True,
        scale=scale,
        scale_note=note,
        generate_tok_s=ref["generate_tok_s"] * scale,
        generate_src=f"{CPU_SOURCE}: generate{note}",
        decode_tok_s=ref["decode_tok_s"] * scale,
        decode_src=f"{CPU_SOURCE}: a request without speculation{note}, a window at that rate x its concurrency",
        export_s=ref["export_s"],
        export_src=f"{CPU_SOURCE}: export",
        check_s=ref["check_s"],
        check_src=f"{CPU_SOURCE}: check",
        engine_src=f"{CPU_SOURCE}: the engine's start, and its weights read at an H200 host's disk rate",
    )
