"""Unit tests of the EAGLE-3 drafter package (eagleflow.drafter), one module per library module: the
model's shapes and TTT attention layout against engine-style drafting (test_model), the draft
vocabulary (test_vocab), label alignment, loss masking per unroll step and the KL loss
(test_objective), the data (test_data), checkpoints and the vLLM export's names as vLLM loads them
(test_checkpoint, test_vllm_export), the target head (test_target), warm starts from public drafters in
the vLLM, EAGLE and speculators layouts (test_warm_start), one optimizer step (test_step), gradient
accumulation, resume state and the step bounds (test_trainer), the training settings (test_config).
All on a tiny synthetic target (tests/helpers/drafter.py); host environment (torch). The train and
export stages end to end are tests/unit/stages/test_train.py; killing and resuming a real stage
process, and torchrun, are tests/integration/stages/test_train.py."""
