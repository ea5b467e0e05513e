"""The EAGLE-3 training objective (eagleflow.drafter.objective): labels are the target's distribution
at p+1+i for unroll step i, loss masking per unroll step (only assistant labels), the KL loss against
the soft cross-entropy, the LK hybrid, the per-step statistics and the engine walk that replays greedy
verification, and the per-step label counts that make micro-batch losses add up. Host environment (torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagleflow.drafter.data import Batch  # noqa: E402
from eagleflow.drafter.losses import LOSSES, _lk_eager, loss_named  # noqa: E402
from eagleflow.drafter.objective import (  # noqa: E402
    StepStats,
    engine_walk,
    label_counts,
    label_positions,
    ttt_loss,
)
from tests.helpers.drafter import H, Oracle, V, make_model, target_head  # noqa: E402


def test_labels_are_the_targets_distribution_at_p_plus_1_plus_i():
    target = target_head()
    b, t, k = 2, 20, 3
    final = torch.randn(b, t, H)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :4] = False  # prompt
    ids = torch.randint(0, V, (b, t))
    ids[:, 1:] = target.logits(final[:, :-1]).argmax(-1)  # the answers are the target's greedy output
    batch = Batch(ids, mask, torch.tensor([t, t - 5]), torch.randn(b, t, 3 * H), final)
    rows = torch.arange(V)
    _, good = ttt_loss(Oracle(target, final, 0), target, rows, batch, k, 0.8, walk=True)
    s = good.summary(0.8)
    assert s["acc"] == [1.0] * k and s["acceptance_length"] == pytest.approx(1 + k)
    assert s["acceptance_length_uniform"] == pytest.approx(1 + k)
    logp = torch.log_softmax(target.logits(final[label_positions(batch)]), -1)
    entropy = -(logp.exp() * logp).sum(-1).mean().item()
    assert s["loss_per_step"][0] == pytest.approx(entropy, rel=1e-3)  # soft CE of a perfect drafter
    _, off = ttt_loss(Oracle(target, final, -1), target, rows, batch, k, 0.8)  # one position early
    assert max(off.summary(0.8)["acc"]) < 0.5


def test_label_positions_and_acceptance_chain():
    ids = torch.zeros(1, 8, dtype=torch.int64)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    batch = Batch(ids, mask, torch.tensor([7]), torch.zeros(1, 8, 3 * H), torch.zeros(1, 8, H))
    # assistant input token (mask) and a next token inside the sequence (j <= len-2 = 5)
    assert label_positions(batch)[0].tolist() == [False, False, False, True, True, True, False, False]
    stats = StepStats(
        3,
        correct=torch.tensor([9.0, 6, 3]),
        count=torch.tensor([10.0, 10, 10]),
        chain_accepted=torch.tensor([9.0, 5, 2]),
        chain_count=10,
    )
    s = stats.summary(0.8)
    assert s["accept_pos_uniform"] == [0.9, 0.5, 0.2]
    assert s["acceptance_length_uniform"] == pytest.approx(2.6)
    assert s["acceptance_length_indep"] == pytest.approx(1 + 0.9 + 0.9 * 0.6 + 0.9 * 0.6 * 0.3)


def test_engine_walk_replays_greedy_verification():
    """Answer starts at index 3, so the first round drafts at p=2; accepting a drafts moves to p+a+1."""
    n, k = 12, 3
    correct = torch.ones(k, 1, n, dtype=torch.bool)
    correct[2, 0, 2] = False  # p=2: accepts 2 -> next p=5
    correct[0, 0, 5] = False  # p=5: accepts 0 -> next p=6; p=6 accepts 3 -> p=10, past the end
    correct[:, 0, [3, 4, 7]] = False  # never visited
    mask = torch.tensor([[0, 0, 0] + [1] * 9], dtype=torch.bool)
    drafts, accepted, judged = engine_walk(correct, mask, torch.tensor([n]))
    assert drafts == 3 and accepted.tolist() == [2, 2, 1]
    assert judged.tolist() == [3, 2, 2]  # greedy answers: every round judges draft 0, each accepted one the next
    stats = StepStats(3, walk_accepted=accepted, walk_seen=judged, walk_drafts=drafts)
    assert stats.summary(0.8)["acceptance_length"] == pytest.approx(1 + 5 / 3, abs=1e-4)
    # The same answer marked all on the argmax reads the same: the greedy walk is the special case.
    assert [
        x.tolist() for x in engine_walk(correct, mask, torch.tensor([n]), torch.ones(1, n, dtype=torch.bool))[1:]
    ] == [
        [2, 2, 1],
        [3, 2, 2],
    ]


def test_engine_walk_judges_a_draft_only_where_the_sampled_answer_follows_the_argmax():
    """A sampled answer: x[p+1] off the target's argmax leaves draft 1 of that round unjudged (greedy serving
    would have fed the drafter the argmax token, not the sampled one); the rate of draft 1 comes from the
    rounds that did follow the argmax, and the AL is the product of the rates."""
    n, k = 12, 3
    correct = torch.ones(k, 1, n, dtype=torch.bool)
    correct[2, 0, 7] = False  # p=7: drafts 0, 1 accepted, draft 2 judged and rejected -> next p=10, past the end
    mask = torch.tensor([[0, 0, 0] + [1] * 9], dtype=torch.bool)
    greedy = torch.ones(1, n, dtype=torch.bool)
    greedy[0, 2] = False  # x[3] was sampled off the argmax: round p=2 judges draft 0 only, accepts 1 -> p=4
    greedy[0, 5] = False  # x[6] off: round p=4 judges drafts 0 and 1 (x[6] would feed draft 2), accepts 2 -> p=7
    drafts, accepted, judged = engine_walk(correct, mask, torch.tensor([n]), greedy)
    assert drafts == 3
    assert judged.tolist() == [3, 2, 1] and accepted.tolist() == [3, 2, 0]
    stats = StepStats(3, walk_accepted=accepted, walk_seen=judged, walk_drafts=drafts)
    s = stats.summary(0.8)
    assert s["accept_pos"] == [1.0, 1.0, 0.0] and s["judged"] == [3, 2, 1]
    # Judged as the walk did before (every draft, whatever fed it): rounds at p=2 and p=6, all accepted.
    old = engine_walk(correct, mask, torch.tensor([n]))
    assert old[0] == 2 and old[1].tolist() == [2, 2, 2]


def test_step_stats_read_a_vector_written_before_walk_seen():
    old = torch.arange(5 * 3 + 3, dtype=torch.float64)
    s = StepStats.from_vector(3, old)
    assert s.walk_seen.tolist() == [0, 0, 0] and s.tokens == 17 and s.walk_accepted.tolist() == [12, 13, 14]
    assert StepStats.from_vector(3, s.to_vector()).to_vector().tolist() == s.to_vector().tolist()


def test_label_counts_per_unroll_step():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    # row 0: labels j in {2, 3, 4} (j <= len-2 = 4); row 1 (len 4): j in {1, 2}
    assert label_counts(mask, torch.tensor([6, 4]), 3).tolist() == [5.0, 4.0, 2.0]


def _window(jvalid, lengths, steps):
    first = torch.where(jvalid.any(1), jvalid.float().argmax(1), torch.zeros_like(lengths))
    start = (first - steps).clamp(min=0)
    return start, max(int((lengths - 2 - start).max()), 1)


@pytest.mark.parametrize("steps", [3, 7])
def test_loss_reads_only_assistant_labels_at_every_step(steps):
    """d loss / d output of step i at context end p is non-zero iff the label j = p+1+i is an
    assistant position (loss_mask[j], j <= len-2): the mask is shifted with the unroll."""
    torch.manual_seed(0)
    target = target_head()
    b, t = 2, 24
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[0, 5:12] = True  # two assistant turns with a user turn between them
    mask[0, 16:22] = True
    mask[1, 3:] = True
    lengths = torch.tensor([t, t - 4])
    batch = Batch(torch.randint(0, V, (b, t)), mask, lengths, torch.randn(b, t, 3 * H), torch.randn(b, t, H))

    class Leaf(Oracle):
        def ttt_forward(self, aux, input_ids, steps, query_start, query_len):
            outs, qpos = super().ttt_forward(aux, input_ids, steps, query_start, query_len)
            self.leaves = [o.clone().requires_grad_(True) for o in outs]
            return self.leaves, qpos

    # Offset 1: each step outputs the next position's state, never the label's own. An exact oracle's gradient is
    # the target's distribution minus itself, zero up to rounding: which rows it touched was then a coin's throw.
    drafter = Leaf(target, batch.final, 1)
    loss, _ = ttt_loss(drafter, target, torch.arange(V), batch, steps, 0.8)
    loss.backward()
    leaves = drafter.leaves
    jvalid = label_positions(batch)
    _, qpos = drafter.ttt_forward(None, None, steps, *_window(jvalid, lengths, steps))
    for i, leaf in enumerate(leaves):
        touched = leaf.grad.abs().sum(-1) > 0  # [B, Tq]
        j = qpos + 1 + i
        expect = torch.where(j < t, jvalid.gather(1, j.clamp(max=t - 1)), False)
        assert torch.equal(touched, expect), f"step {i}"


def test_kl_loss_is_soft_ce_minus_entropy_with_the_same_gradient():
    target = target_head()
    model = make_model(draft_vocab_size=V)
    model.train()
    b, t = 2, 16
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :3] = False
    batch = Batch(
        torch.randint(0, V, (b, t)), mask, torch.tensor([t, t - 3]), torch.randn(b, t, 3 * H), torch.randn(b, t, H)
    )
    grads = {}
    for kind in ("soft_ce", "kl"):
        model.zero_grad()
        loss, stats = ttt_loss(model, target, torch.arange(V), batch, 3, 0.8, loss_kind=kind)
        loss.backward()
        grads[kind] = (
            loss.item(),
            stats.summary(0.8)["loss_per_step"],
            [p.grad.clone() for p in model.parameters() if p.grad is not None],
        )
    jvalid = label_positions(batch)
    logp = torch.log_softmax(target.logits(batch.final[jvalid]), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    j = torch.arange(t)[None].expand(b, t)[jvalid]
    for i in range(3):
        h_i = entropy[j >= 1 + i].mean().item()
        assert grads["kl"][1][i] == pytest.approx(grads["soft_ce"][1][i] - h_i, abs=1e-4)
        assert grads["kl"][1][i] >= 0
    for g_ce, g_kl in zip(grads["soft_ce"][2], grads["kl"][2]):
        torch.testing.assert_close(g_ce, g_kl, atol=1e-6, rtol=1e-4)


def test_lk_hybrid_is_kl_far_off_and_the_acceptance_rate_close_by():
    """The LK hybrid per row, against the paper's definition computed here from p and q directly: eta 0 is
    KL; a large eta is 1 - alpha (the total variation); q = p reads 0; the weight carries no gradient."""
    torch.manual_seed(0)
    logits = torch.randn(5, 7, requires_grad=True)
    p = torch.softmax(torch.randn(5, 7) * 2, -1)
    entropy = -(p * p.log()).sum(-1)
    q = torch.softmax(logits, -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    alpha = torch.minimum(p, q).sum(-1)
    assert torch.allclose(_lk_eager(logits, p, entropy, 0.0), kl, atol=1e-6)
    assert torch.allclose(_lk_eager(logits, p, entropy, 1e4), 1 - alpha, atol=1e-6)
    w = torch.exp(-3.0 * alpha)
    assert torch.allclose(_lk_eager(logits, p, entropy, 3.0), w * kl + (1 - w) * (1 - alpha), atol=1e-6)
    (g,) = torch.autograd.grad(_lk_eager(logits, p, entropy, 3.0).sum(), logits)
    (g_kl,) = torch.autograd.grad((w.detach() * kl).sum(), logits, retain_graph=True)
    (g_tv,) = torch.autograd.grad(((1 - w.detach()) * (1 - alpha)).sum(), logits)
    torch.testing.assert_close(g, g_kl + g_tv)
    same = torch.log(p).detach()
    assert torch.allclose(_lk_eager(same, p, entropy, 3.0), torch.zeros(5), atol=1e-6)


def test_lk_loss_of_a_ttt_unroll_trains_and_reads_zero_for_a_perfect_drafter():
    target = target_head()
    b, t, k = 2, 20, 3
    final = torch.randn(b, t, H)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, :4] = False
    batch = Batch(torch.randint(0, V, (b, t)), mask, torch.tensor([t, t - 5]), torch.randn(b, t, 3 * H), final)
    _, good = ttt_loss(Oracle(target, final, 0), target, torch.arange(V), batch, k, 0.8, loss_kind="lk")
    assert good.summary(0.8)["loss_per_step"] == pytest.approx([0.0] * k, abs=1e-4)
    model = make_model(draft_vocab_size=V)
    loss, stats = ttt_loss(model, target, torch.arange(V), batch, k, 0.8, loss_kind="lk", lk_eta=3.0)
    loss.backward()
    assert 0 < loss.item() and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_loss_is_named_once_and_an_unknown_name_lists_the_choices():
    from eagleflow.config.train import TrainConfig

    assert set(LOSSES) == set(TrainConfig.model_fields["loss"].annotation.__args__)
    with pytest.raises(ValueError, match=r"unknown train.loss 'tv'; expected one of \['kl', 'lk', 'soft_ce'\]"):
        loss_named("tv")
