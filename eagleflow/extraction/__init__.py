"""The target's hidden states for the drafter to learn from: shard plans, the transformers forward
(`hf`), the serving engine's own capture (`vllm`). The extract stage wires them to the shard writer
(`eagleflow.drafter.shards`)."""
