"""The drafter's GPU paths, on a GPU (`pytest -m gpu tests/gpu`; on a GPU host: scripts/gpu_suite.sh).

What no CPU test can run: the fused flex-attention TTT unroll (`Eagle3Drafter.ttt_forward` takes it for CUDA
inputs: `attn.ttt_flex`, compiled, with the analytic block mask), the compiled norm, rope, silu and soft-CE
kernels, bf16 autocast, the CUDA-stream shard writer, and DDP over 2 GPUs. Each is checked against the CPU
path the rest of the suite pins down (test_model.py, test_mla.py, test_step.py, test_shards.py), within what
bf16 allows, and with a control that shows the tolerance would catch a real fault.
Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.drafter import H, V, make_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]
ROOT = Path(__file__).resolve().parents[2]

# Compiled flex attention needs heads of 16 dims or more (inductor: "embedding dimension of the query, key, and value
# must be at least 16"), so these tiny drafters have 16-wide heads where the CPU tests' have 8 (MLA: rotary 4 of 16
# query/key dims, values 16 wide). Real drafters' heads are 64-192.
MLA = dict(
    attention="mla",
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    kv_lora_rank=16,
    qk_nope_head_dim=12,
    qk_rope_head_dim=4,
    v_head_dim=16,
    norm_before_fc=False,
    fc_norm=True,
    rms_norm_eps=1e-6,
    q_lora_rank=10,
)
ARCHS = {"llama-gqa": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16), "mla": MLA}
BF16 = dict(atol=6e-2, rtol=6e-2)  # one layer in bf16 (8 bits of mantissa): outputs are O(1) normed states


def kv_cache_drafts(model, aux, ids, steps: int, p: int) -> list:
    """Step i's normed output at context end p, drafted the way an engine does: prefill to p, then one token
    at a time against the KV cache (attention without flex: the reference path)."""
    kv: list = []
    normed, pre = model.prefill(aux[:, : p + 1], ids[:, 1 : p + 2], kv)
    ref, hidden = [normed[0, -1]], pre[:, -1:]
    for i in range(1, steps):
        normed, hidden = model.decode_one_token(ids[:, p + 1 + i : p + 2 + i], hidden, p + i, kv)
        ref.append(normed[0, 0])
    return ref


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_the_fused_unroll_in_bf16_equals_kv_cache_drafting(arch):
    """The fused unroll (one flex-attention call a step, keys of every step concatenated, the block mask from
    block arithmetic) over a padded batch with a query window crossing 128-blocks, under bf16 autocast, equals
    KV-cache drafting of each sequence on the same GPU, and the CPU unroll in float32."""
    model = make_model(**ARCHS[arch]).cuda()
    t, steps, tq = 300, 3, 256  # 3 key blocks of step 0, a query window of 2 blocks
    g = torch.Generator().manual_seed(1)
    aux, ids = torch.randn(2, t, 3 * H, generator=g), torch.randint(0, V, (2, t), generator=g)
    start = torch.tensor([t - steps - tq, 7])
    with torch.no_grad():
        cpu, _ = model.cpu().ttt_forward(aux, ids, steps, query_start=start, query_len=tq)
        model.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fused, qpos = model.ttt_forward(aux.cuda(), ids.cuda(), steps, query_start=start.cuda(), query_len=tq)
            errs = []
            for row in range(2):
                for r in [0, 1, 63, 127, 128, 129, 200, tq - 1]:  # block edges and inside
                    p = int(qpos[row, r])
                    if p + steps >= t:
                        continue
                    ref = kv_cache_drafts(model, aux[row : row + 1].cuda(), ids[row : row + 1].cuda(), steps, p)
                    for i in range(steps):
                        got = fused[i][row, r].float()
                        torch.testing.assert_close(got, ref[i].float(), **BF16)
                        torch.testing.assert_close(got.cpu(), cpu[i][row, r], **BF16)
                        errs.append((got.cpu() - cpu[i][row, r]).abs().mean().item())
    assert fused[0].dtype == torch.bfloat16  # the norm returns the autocast dtype (no fp32 copies kept)
    mean_err = sum(errs) / len(errs)
    print(f"\n{arch}: fused bf16 vs CPU fp32, mean |error| {mean_err:.4f} over {len(errs)} outputs")
    assert mean_err < 1.5e-2  # bf16 rounding, not a wrong key or mask (those move outputs by O(1))
    # The control: the next context end's drafts are not within the tolerance (the check can fail).
    assert not torch.allclose(fused[1][0, 1].float().cpu(), cpu[1][0, 2], **BF16)


def tiny_objective(tmp_path: Path, device: str):
    from tests.helpers.drafter import tiny_trainer, write_synthetic

    root = tmp_path / "syn"
    if not root.exists():
        write_synthetic(root, n_train=40)
        cfg = json.loads((root / "target" / "config.json").read_text())
        (root / "target" / "config.json").write_text(json.dumps({**cfg, "head_dim": 16}))  # flex's 16 (above)
    dtype = "bfloat16" if device == "cuda" else "float32"
    return tiny_trainer(tmp_path / device, root, device=device, dtype=dtype, max_seq_len=32)


def test_a_training_step_on_the_gpu_is_the_cpu_step_within_bf16(tmp_path):
    """The same drafter, the same batch: loss and every gradient of the CUDA step (bf16 autocast, fused unroll,
    compiled kernels) against the CPU step (float32, the reference unroll)."""
    from eagleflow.drafter.data import collate
    from eagleflow.drafter.step import autocast_for

    cpu, gpu = tiny_objective(tmp_path, "cpu"), tiny_objective(tmp_path, "cuda")
    gpu.model.load_state_dict({k: v.cuda() for k, v in cpu.model.state_dict().items()})
    batch = collate(cpu.train_data, [3, 1, 4, 0])
    losses, grads = {}, {}
    for name, t, b in (("cpu", cpu, batch), ("cuda", gpu, batch.to(torch.device("cuda")))):
        t.optimizer.zero_grad(set_to_none=True)
        with autocast_for(b.aux.device, t.cfg):
            loss, stats = t.objective(b)
        loss.backward()
        losses[name] = float(loss.detach())
        grads[name] = {n: p.grad.float().cpu() for n, p in t.model.named_parameters() if p.grad is not None}
    print(f"\nloss cpu {losses['cpu']:.5f} cuda {losses['cuda']:.5f}")
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=2e-2)
    assert grads["cpu"].keys() == grads["cuda"].keys() and len(grads["cpu"]) > 5
    for n, gc in grads["cpu"].items():
        gg = grads["cuda"][n]
        cos = torch.nn.functional.cosine_similarity(gc.flatten(), gg.flatten(), dim=0).item()
        rel = ((gg.norm() - gc.norm()).abs() / gc.norm().clamp(min=1e-12)).item()
        assert cos > 0.98 and rel < 0.05, f"{n}: cosine {cos:.4f}, norm off by {rel:.1%}"
    # The control: another batch's gradients are far from these.
    other = collate(cpu.train_data, [5, 6, 7, 8])
    cpu.optimizer.zero_grad(set_to_none=True)
    cpu.objective(other)[0].backward()
    name = next(iter(grads["cpu"]))
    moved = dict(cpu.model.named_parameters())[name].grad.flatten()
    assert torch.nn.functional.cosine_similarity(moved, grads["cpu"][name].flatten(), dim=0).item() < 0.98


def test_a_muon_step_on_the_gpu_moves_the_weights_as_on_the_cpu(tmp_path):
    """train.optimizer 'muon' on CUDA: the same weights and gradients, one step of Muon beside AdamW on each
    device; every weight's update agrees with the CPU's (Newton-Schulz runs in bf16 on both), and the update of a
    matrix is Muon's (near-orthogonal), not Adam's. Control: a step on other gradients moves it elsewhere."""
    from tests.helpers.drafter import tiny_trainer, write_synthetic

    root = tmp_path / "syn"
    write_synthetic(root, n_train=40)
    cpu, gpu = (tiny_trainer(tmp_path / d, root, device=d, optimizer="muon", max_seq_len=32) for d in ("cpu", "cuda"))
    gpu.model.load_state_dict({k: v.cuda() for k, v in cpu.model.state_dict().items()})
    gen = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(p.shape, generator=gen) for n, p in cpu.model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in cpu.model.named_parameters()}
    for t in (cpu, gpu):
        for n, p in t.model.named_parameters():
            if n in grads:
                p.grad = grads[n].to(p.device)
        t.optimizer.step()
    for n in grads:
        dc = dict(cpu.model.named_parameters())[n].detach() - before[n]
        dg = dict(gpu.model.named_parameters())[n].detach().cpu() - before[n]
        cos = torch.nn.functional.cosine_similarity(dc.flatten(), dg.flatten(), dim=0).item()
        assert cos > 0.99, f"{n}: the GPU's update is off the CPU's (cosine {cos:.4f})"
    sv = torch.linalg.svdvals(
        (dict(gpu.model.named_parameters())["fc.weight"].detach().cpu() - before["fc.weight"]).double()
    )
    assert float(sv.max() / sv.min()) < 2.0  # orthogonalized
    other = torch.randn(grads["fc.weight"].shape, generator=gen)
    w = dict(cpu.model.named_parameters())["fc.weight"]
    start = w.detach().clone()
    w.grad = other
    cpu.optimizer.step()
    dc = (w.detach() - start).flatten()
    ref = (dict(gpu.model.named_parameters())["fc.weight"].detach().cpu() - before["fc.weight"]).flatten()
    assert torch.nn.functional.cosine_similarity(dc, ref, dim=0).item() < 0.99


@pytest.mark.parametrize("storage", ["bfloat16", "float8_e4m3fn"])
def test_the_cuda_stream_shard_writer_writes_the_cpu_writers_bytes(tmp_path, storage):
    """States on the GPU go through the copy stream into pinned chunks (and fp8 is quantized on the GPU): the
    file is byte for byte the one the CPU writer makes of the same states."""
    from eagleflow.drafter.shards import ShardPlan, ShardWriter

    g = torch.Generator().manual_seed(0)
    lens = [300, 17, 1024, 5]
    states = [torch.randn(n, 4, 64, generator=g) * (1 + i) for i, n in enumerate(lens)]
    files = {}
    for where in ("cpu", "cuda"):
        path = tmp_path / f"{where}.safetensors"
        # 64 KiB chunks: the big sequence spans several copies and chunks come back to the pool
        w = ShardWriter(
            path, ShardPlan(sum(lens), len(lens), 64, storage), {"split": "train"}, chunk_bytes=64 << 10, pool=3
        )
        for i, (n, s) in enumerate(zip(lens, states)):
            w.add(list(range(i, i + n)), [0] + [1] * (n - 1), s.to(where))
        w.close()
        files[where] = path.read_bytes()
    assert len(files["cpu"]) == len(files["cuda"]) > 300 * 4 * 64
    differ = sum(a != b for a, b in zip(files["cpu"], files["cuda"]))
    # fp8 was one ulp apart on some scales (CUDA divides by a scalar through its reciprocal), fixed in quantize_fp8
    assert differ == 0, f"{differ} of {len(files['cpu'])} bytes differ between the CPU and the CUDA writer"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP needs 2 GPUs on one host")
def test_ddp_over_two_gpus_trains_and_keeps_the_ranks_equal(tmp_path):
    """torchrun with 2 ranks on 2 GPUs: NCCL all-reduce keeps both ranks' weights identical after steps."""
    from tests.helpers.drafter import write_synthetic

    root = write_synthetic(tmp_path / "syn", n_train=40)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(root=str(root), out=str(tmp_path / "out"), repo=str(ROOT)))
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    sums = [line for line in p.stdout.splitlines() if line.startswith("RANK")]
    assert len(sums) == 2 and sums[0].split()[2] == sums[1].split()[2], sums


DDP_SCRIPT = """
import sys, torch
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.helpers.drafter import tiny_trainer
t = tiny_trainer(Path({out!r}), Path({root!r}), device="cuda", dtype="bfloat16", max_seq_len=32)
t.train()
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
total = sum(float(p.detach().double().sum()) for p in t.model.parameters())
print(f"RANK {{rank}} {{total:.10e}}", flush=True)
"""
