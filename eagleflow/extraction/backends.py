"""Extraction backends: what computes the target's states, what it takes of the host, and how it starts.

    hf          a transformers forward in the stage's own process (small targets, CPU, or the host's GPUs)
    vllm        the serving engine's own capture, at production's tensor parallel size and kernels
    sglang      the same on SGLang: an SGLang engine of ours running eagleflow's capture plugin
    production  production's own engine, while it serves (eagleflow's capture plugin): no window, no engine

Each backend says whether it loads the target in an engine of its own (then its load is part of the
stage and the engine takes the GPUs) and the rate a plan assumes where the host measured none (with its
source). The capacity plan, the production window and the extract stage ask this registry instead of
comparing names; the package's face (`eagleflow.extraction.open_capture`) opens the one a config names. A
new backend is an entry here, its opener there and its name in `ExtractConfig.backend`. Torch-free: the
control side reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagleflow.config import RunConfig


@dataclass(frozen=True)
class ExtractionBackend:
    name: str
    loads_engine: bool  # the target loaded in a serving engine of its own, for the stage's duration
    default_tok_s: float  # tokens a second a plan assumes where the host measured none
    default_source: str
    on_production: bool = False  # production computes the states while it serves: the stage holds no GPU

    def uses_gpus(self, cfg: RunConfig) -> bool:
        """Whether the stage takes the GPUs production holds ('auto' counts: on a GPU host it picks CUDA)."""
        if self.on_production:
            return False
        return self.loads_engine or cfg.extract.device != "cpu"


BACKENDS: dict[str, ExtractionBackend] = {
    "hf": ExtractionBackend(
        "hf",
        loads_engine=False,
        default_tok_s=14_600.0,
        default_source="default: the extract stage's transformers forward ran 14.6k tok/s on an H200, 8B Llama "
        "shape (docs/benchmarks.md)",
    ),
    "vllm": ExtractionBackend(
        "vllm",
        loads_engine=True,
        default_tok_s=3_165.0,
        default_source="default: the reference run extracted Kimi-K2.5's states at 3,165 tok/s (docs/reference-run.md)",
    ),
    "sglang": ExtractionBackend(
        "sglang",
        loads_engine=True,
        default_tok_s=3_165.0,
        default_source="default: as the vllm backend's, the reference run's 3,165 tok/s of Kimi-K2.5's prefill "
        "(docs/reference-run.md); SGLang's own capture rate not yet measured",
    ),
    "production": ExtractionBackend(
        "production",
        loads_engine=False,
        default_tok_s=3_165.0,
        default_source="default: as the vllm backend's, the reference run's 3,165 tok/s of Kimi-K2.5's prefill "
        "(docs/reference-run.md); production's own traffic shares the engine",
        on_production=True,
    ),
}


def backend_of(cfg: RunConfig) -> ExtractionBackend:
    """The backend `extract.backend` names; a ValueError naming the choices for any other."""
    name = cfg.extract.backend
    if name not in BACKENDS:
        raise ValueError(f"unknown extract.backend {name!r}; expected one of {sorted(BACKENDS)}")
    return BACKENDS[name]
