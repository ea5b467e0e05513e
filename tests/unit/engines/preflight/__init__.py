"""The preflight's pure rules (eagleflow.engines.preflight): the old vLLM eagle3 whitelist read from
source text, the layer-id conventions, the shape checks and the proposer's image-token field. No
engine is imported. The preflight against the real vLLM is tests/integration/engines/test_preflight.py."""
