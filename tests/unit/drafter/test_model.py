"""The EAGLE-3 drafter module (eagleflow.drafter.model): shapes, and the training-time-test (TTT)
attention layout against engine-style drafting with a KV cache (one sequence at a time, as vLLM's
proposer drafts), causality, batch independence and query windows. Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.drafter import H, V, assert_unroll_matches_kv_cache, make_model  # noqa: E402


def test_shapes():
    model = make_model(draft_vocab_size=24)
    aux, ids = torch.randn(3, 11, 3 * H), torch.randint(0, V, (3, 11))
    outs, qpos = model.ttt_forward(aux, ids, steps=4)
    assert len(outs) == 4 and qpos.shape == (3, 11)
    assert all(o.shape == (3, 11, H) for o in outs)
    assert model.logits(outs[0]).shape == (3, 11, 24)
    assert model.combine_hidden_states(aux).shape == (3, 11, H)


@pytest.mark.parametrize("norm_before_residual,norm_output", [(True, False), (False, False), (True, True)])
def test_ttt_unroll_equals_engine_style_drafting(norm_before_residual, norm_output):
    """Step i of the unroll at index p == the i-th draft made with a KV cache the way vLLM's
    proposer drafts after the target has verified up to position p: a first pass over positions
    0..p (token x[s+1], target state s), then tokens x[p+1+i] at positions p+i fed the previous
    pre-norm output (the normed one with norm_output, EAGLE 3.1), each attending to everything cached.
    This pins the TTT mask, the rotary positions and the hidden-state feedback."""
    model = make_model(norm_before_residual=norm_before_residual, norm_output=norm_output)
    t, k = 14, 3
    aux, ids = torch.randn(1, t, 3 * H), torch.randint(0, V, (1, t))
    with torch.no_grad():
        outs, _ = model.ttt_forward(aux, ids, k)
        for p in range(t - k):
            kv: list = []
            normed, pre = model.prefill(aux[:, : p + 1], ids[:, 1 : p + 2], kv)
            ref = [normed[0, -1]]
            hidden = pre[:, -1:]
            for i in range(1, k):
                normed, hidden = model.decode_one_token(ids[:, p + 1 + i : p + 2 + i], hidden, p + i, kv)
                ref.append(normed[0, 0])
            for i in range(k):
                torch.testing.assert_close(outs[i][0, p], ref[i], atol=1e-4, rtol=1e-4)
    if norm_output:  # the feedback is the option's whole effect: without it, steps 1.. differ
        plain = make_model(norm_before_residual=norm_before_residual)
        with torch.no_grad():
            other, _ = plain.ttt_forward(aux, ids, k)
        torch.testing.assert_close(other[0], outs[0])
        assert not torch.allclose(other[1], outs[1], atol=1e-3)


def test_ttt_is_causal_and_batch_independent():
    model = make_model()
    t, k, p = 12, 3, 5
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    with torch.no_grad():
        base, _ = model.ttt_forward(aux, ids, k)
        aux2, ids2 = aux.clone(), ids.clone()
        aux2[:, p + 1 :] += 3.0  # target states after p
        ids2[0, p + 1 + k :] = (ids2[0, p + 1 + k :] + 1) % V  # tokens no step at p reads
        aux2[1] = torch.randn(t, 3 * H)  # another sequence in the batch
        moved, _ = model.ttt_forward(aux2, ids2, k)
    for i in range(k):
        torch.testing.assert_close(base[i][0, : p + 1], moved[i][0, : p + 1])
        assert not torch.allclose(base[i][1, : p + 1], moved[i][1, : p + 1])


def test_ttt_query_window_equals_full_unroll():
    """Computing outputs only for a window of context ends (per-row start) changes nothing inside it."""
    model = make_model()
    t, k = 16, 3
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    start = torch.tensor([5, 2])
    with torch.no_grad():
        full, _ = model.ttt_forward(aux, ids, k)
        win, qpos = model.ttt_forward(aux, ids, k, query_start=start, query_len=7)
    assert qpos.tolist() == [list(range(5, 12)), list(range(2, 9))]
    for i in range(k):
        for row in range(2):
            torch.testing.assert_close(win[i][row], full[i][row, qpos[row]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [3, 7])
def test_ttt_unroll_equals_kv_cache_drafting_batched(steps):
    """The parallel unroll over a padded batch (GQA, a query window) equals one-sequence KV-cache
    drafting at every context end: each step sees step-0 keys at positions <= p and its own
    earlier drafts at p, never later positions."""
    model = make_model(num_attention_heads=4, num_key_value_heads=1)
    t = 18
    aux, ids = torch.randn(2, t, 3 * H), torch.randint(0, V, (2, t))
    lengths = [t, 13]
    with torch.no_grad():
        outs, qpos = model.ttt_forward(aux, ids, steps, query_start=torch.tensor([0, 0]), query_len=t - steps)
        assert_unroll_matches_kv_cache(model, aux, ids, steps, outs, lengths)


@pytest.mark.parametrize("t,tq,batch,shift", [(256, 256, 1, 0), (256, 254, 1, 0), (300, 130, 2, 3), (257, 256, 3, 1)])
def test_the_ttt_block_mask_from_block_arithmetic_is_create_block_masks(t, tq, batch, shift):
    """The fused (CUDA) unroll's block mask, built from block arithmetic, equals flex attention's own
    create_block_mask of the same mask at every unroll step: the same partial and full blocks, and the same
    attention output (flex attention's eager reference, on CPU). Ragged edges included: T and Tq off the
    128 grid, rows whose context end is clamped, rows of a batch at other offsets."""
    import itertools

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from eagleflow.drafter.attention import ttt_block_mask

    def dense(num, idx, cols):  # ordered (counts, indices) -> [B, 1, nq, cols] bool
        out = torch.zeros(*num.shape, cols, dtype=torch.bool)
        for b, h, m in itertools.product(*map(range, num.shape)):
            out[b, h, m, idx[b, h, m, : num[b, h, m]].long()] = True
        return out

    start = torch.tensor([max(t - 2 - tq, 0) - k * shift for k in range(batch)]).clamp(min=0)
    qpos = (start[:, None] + torch.arange(tq)[None]).clamp(max=t - 1)  # shape: [B, Tq]

    def mask_mod(b, _h, q, kv):
        return torch.where(kv < t, kv <= qpos[b, q], (kv - t) % tq == q)

    for steps_done in range(3):
        kv_len = t + steps_done * tq
        ref = create_block_mask(mask_mod, B=batch, H=None, Q_LEN=tq, KV_LEN=kv_len, device="cpu")
        got = ttt_block_mask(qpos, t, steps_done, mask_mod)
        cols = -(-kv_len // 128)
        assert got.seq_lengths == ref.seq_lengths
        assert torch.equal(
            dense(got.kv_num_blocks, got.kv_indices, cols), dense(ref.kv_num_blocks, ref.kv_indices, cols)
        )
        assert torch.equal(
            dense(got.full_kv_num_blocks, got.full_kv_indices, cols),
            dense(ref.full_kv_num_blocks, ref.full_kv_indices, cols),
        )
        q, k, v = torch.randn(batch, 2, tq, 16), torch.randn(batch, 2, kv_len, 16), torch.randn(batch, 2, kv_len, 16)
        assert torch.equal(flex_attention(q, k, v, block_mask=got), flex_attention(q, k, v, block_mask=ref))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("arch", ["gqa", "mla"])
def test_the_fused_unrolls_attention_is_the_reference_forward(monkeypatch, arch):
    """`ttt_flex` (the CUDA path: one flex-attention call a step over the concatenated keys, the block mask from
    block arithmetic, GQA in the kernel) against `ttt` (the CPU path), forward, on CPU: flex attention runs its
    eager reference here. Compiling it is torch's business, the keys, mask and layout are ours. Rows cross
    128-blocks, a query window starts mid-sequence. The GPU suite runs the compiled kernel (tests/gpu)."""
    from torch.nn.attention.flex_attention import flex_attention

    import eagleflow.drafter.attention as attention_mod

    monkeypatch.setattr(attention_mod, "_compiled_flex", flex_attention)
    kw = (
        dict(num_attention_heads=4, num_key_value_heads=2)
        if arch == "gqa"
        else dict(
            attention="mla",
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=12,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            norm_before_fc=False,
            fc_norm=True,
            q_lora_rank=10,
        )
    )
    model = make_model(**kw)
    attn = model.layers[0].self_attn
    t, tq, steps = 200, 150, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, t, 2 * H, generator=g)
    from eagleflow.drafter.kernels import rope_tables

    cos, sin = rope_tables(torch.arange(t + steps), model.arch.rope_dim, model.arch.rope_theta, arch == "mla")
    rows = (torch.tensor([[40], [3]]) + torch.arange(tq)[None]).clamp(max=t - 1)  # shape: [2, Tq]
    with torch.no_grad():
        k0e, v0e = attn.kv(x, cos[:t], sin[:t], expand=True)
        k0, v0 = attn.kv(x, cos[:t], sin[:t], expand=False)
        diag_e, diag = [], []
        for i in range(steps):
            xi = torch.randn(2, tq, 2 * H, generator=g)
            c, s = cos[rows + i].unsqueeze(1), sin[rows + i].unsqueeze(1)
            q = attn.q(xi, c, s)
            if i > 0:
                diag_e.append(attn.kv(xi, c, s, expand=True))
                diag.append(attn.kv(xi, c, s, expand=False))
            ref = attn.ttt(q, rows, k0e, v0e, diag_e)
            got = attn.ttt_flex(q, rows, k0, v0, diag)
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(got[:, 1:], ref[:, :-1], atol=1e-3)  # the rows are not interchangeable
