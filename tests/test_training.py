"""pytransformer.training. mlm_mask: the 15% / 80-10-10 proportions within binomial bounds, special tokens and
padding never chosen, random tokens never special, labels, seeds, bad input. mlm_loss and next_token_loss: a
hand-written float64 reference (padding, ignore_index), dtypes, torch.compile, bad input. distillation_loss: the
reference, gradcheck, dtypes, torch.compile, bad input. One objective each trains a tiny model: EncoderModel with its
MLM head, DecoderLM on next tokens, a student DecoderLM toward its teacher."""
import math

import pytest
import torch
import torch.nn.functional as F

from pytransformer.models import DecoderLM, EncoderConfig, EncoderModel, gpt2_small
from pytransformer.training import distillation_loss, mlm_loss, mlm_mask, next_token_loss


def reference(student, teacher, temperature, alpha, labels=None, ignore_index=-100):
    """The loss written out position by position in float64."""
    s = student.double().reshape(-1, student.shape[-1]).tolist()
    t = teacher.double().reshape(-1, teacher.shape[-1]).tolist()
    flat_labels = None if labels is None else labels.reshape(-1).tolist()
    kd = ce = 0.0
    count = 0
    for i, (srow, trow) in enumerate(zip(s, t)):
        if flat_labels is not None and flat_labels[i] == ignore_index:
            continue
        zs = sum(math.exp(x / temperature) for x in srow)
        zt = sum(math.exp(x / temperature) for x in trow)
        for x, y in zip(srow, trow):
            p_t, p_s = math.exp(y / temperature) / zt, math.exp(x / temperature) / zs
            kd += p_t * (math.log(p_t) - math.log(p_s))
        if flat_labels is not None:
            ce -= srow[flat_labels[i]] - math.log(sum(math.exp(x) for x in srow))
        count += 1
    count = max(count, 1)
    if flat_labels is None:
        return temperature ** 2 * kd / count
    return alpha * temperature ** 2 * kd / count + (1 - alpha) * ce / count


@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), (2, 1, 3, 4)])
@pytest.mark.parametrize("temperature,alpha", [(1.0, 0.5), (2.0, 0.9), (4.0, 0.0), (0.5, 1.0)])
def test_matches_reference(shape, temperature, alpha):
    student, teacher = torch.randn(shape) * 3, torch.randn(shape) * 3
    labels = torch.randint(0, shape[-1], shape[:-1])
    if labels.numel() > 1:
        labels.view(-1)[::3] = -100  # padding
    got = distillation_loss(student, teacher, temperature, alpha, labels)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(reference(student, teacher, temperature, alpha, labels), rel=1e-5, abs=1e-6)
    got = distillation_loss(student.double(), teacher.double(), temperature, alpha)
    assert got.item() == pytest.approx(reference(student, teacher, temperature, alpha), rel=1e-12, abs=1e-12)


def test_special_cases():
    student, teacher = torch.randn(4, 9), torch.randn(4, 9)
    labels = torch.randint(0, 9, (4,))
    assert distillation_loss(student, student.clone(), 3.0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(distillation_loss(student, teacher, 3.0, 0.0, labels),
                               torch.nn.functional.cross_entropy(student, labels))
    torch.testing.assert_close(distillation_loss(student, teacher, 1.0, 1.0, labels),
                               torch.nn.functional.kl_div(student.log_softmax(-1), teacher.log_softmax(-1),
                                                          reduction="batchmean", log_target=True))
    # Every position ignored: a zero loss (not NaN) with zero gradients.
    s = student.clone().requires_grad_()
    loss = distillation_loss(s, teacher, 2.0, 0.5, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(s.grad) == 0
    # Another ignore_index.
    labels[1] = 7
    assert distillation_loss(student, teacher, 2.0, 0.5, labels, ignore_index=7).item() == pytest.approx(
        reference(student, teacher, 2.0, 0.5, labels, ignore_index=7), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype):
    student, teacher = torch.randn(6, 32), torch.randn(6, 32)
    labels = torch.randint(0, 32, (6,))
    got = distillation_loss(student.to(dtype), teacher.to(dtype), 2.0, 0.7, labels)
    want = reference(student.to(dtype), teacher.to(dtype), 2.0, 0.7, labels)
    assert got.dtype == torch.float32 and got.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("with_labels", [False, True])
def test_gradcheck(with_labels):
    student = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, -100, 4], [0, 2, -100]]) if with_labels else None
    assert torch.autograd.gradcheck(lambda s, t: distillation_loss(s, t, 1.7, 0.3, labels), (student, teacher))
    assert torch.autograd.gradgradcheck(lambda s, t: distillation_loss(s, t, 1.7, 0.3, labels), (student, teacher))


def test_compile():
    student, teacher = torch.randn(2, 4, 10, requires_grad=True), torch.randn(2, 4, 10)
    labels = torch.randint(0, 10, (2, 4))
    fn = torch.compile(distillation_loss, fullgraph=True, backend="aot_eager")
    got = fn(student, teacher, 2.0, 0.5, labels)
    got.backward()
    grad = student.grad.clone()
    student.grad = None
    want = distillation_loss(student, teacher, 2.0, 0.5, labels)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, student.grad)


def test_bad_input():
    s, t = torch.randn(3, 5), torch.randn(3, 5)
    with pytest.raises(ValueError, match="teacher_logits"):
        distillation_loss(s, torch.randn(3, 6), 2.0, 0.5)
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(s, t, 0.0, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        distillation_loss(s, t, 2.0, 1.5)
    with pytest.raises(ValueError, match="labels"):
        distillation_loss(s, t, 2.0, 0.5, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        distillation_loss(s, t, 2.0, 0.5, torch.zeros(3))


def test_student_moves_toward_teacher():
    """A 1-layer student trained on a 2-layer teacher's soft targets: its KL to the teacher falls clearly."""
    def model(n_layers, d_model):
        return DecoderLM(gpt2_small(vocab_size=32, d_model=d_model, n_heads=2, n_layers=n_layers, d_ff=2 * d_model,
                                    max_len=16, dropout=0.0))
    torch.manual_seed(0)
    teacher, student = model(2, 32).eval(), model(1, 16)
    with torch.no_grad():  # larger weights: a peaked teacher, so that there is something to learn
        for p in teacher.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    held_out = torch.randint(0, 32, (8, 12))
    with torch.no_grad():
        target = teacher(held_out)

    def kl_to_teacher():
        with torch.no_grad():
            return distillation_loss(student(held_out), target, 1.0, 1.0).item()

    before = kl_to_teacher()
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    for _ in range(30):
        ids = torch.randint(0, 32, (8, 8))
        with torch.no_grad():
            teacher_logits = teacher(ids)
        loss = distillation_loss(student(ids), teacher_logits, 2.0, 0.9, ids.roll(-1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = kl_to_teacher()
    assert after < 0.6 * before, (before, after)


# ---------------------------------------------------------------------------------------------------- mlm_mask
PAD, CLS, SEP, MASK, VOCAB = 0, 1, 2, 3, 50
SPECIAL = (CLS, SEP)
DRAWABLE = set(range(4, VOCAB))  # the ids a random replacement may take


def mlm_batch(batch=512, length=256, seed=0):
    """Ids in [4, VOCAB) with [CLS] first and [SEP] at the end of each row's real tokens, rows right-padded to random
    lengths: even rows with PAD, odd rows with ordinary ids that only attention_mask marks as padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (batch, length), generator=g)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = torch.arange(length) < lengths[:, None]  # [B, L]
    ids[:, 0] = CLS
    ids[torch.arange(batch), lengths - 1] = SEP
    ids[0::2][~mask[0::2]] = PAD
    return ids, mask


def mask_args(**overrides):
    return {"mask_token_id": MASK, "vocab_size": VOCAB, "special_token_ids": SPECIAL, "pad_token_id": PAD, **overrides}


def assert_binomial(count, n, p, sigmas=5.0):
    """count ~ Binomial(n, p) within `sigmas` standard deviations."""
    assert abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)), (count, n, p, n * p)


def test_mlm_mask_proportions():
    ids, mask = mlm_batch()
    out, labels = mlm_mask(ids, **mask_args(attention_mask=mask), generator=torch.Generator().manual_seed(1))
    eligible = mask & ~torch.isin(ids, torch.tensor([PAD, CLS, SEP, MASK]))
    chosen = labels != -100
    n_chosen = int(chosen.sum())
    assert_binomial(n_chosen, int(eligible.sum()), 0.15)
    # Of the chosen: 80% [MASK]; 10% a random drawable id, which equals the original with probability 1 / 46; 10% kept.
    masked = int((chosen & (out == MASK)).sum())
    kept = int((chosen & (out == ids)).sum())
    changed = int((chosen & (out != ids) & (out != MASK)).sum())
    assert masked + kept + changed == n_chosen
    assert_binomial(masked, n_chosen, 0.8)
    assert_binomial(changed, n_chosen, 0.1 * (1 - 1 / len(DRAWABLE)))
    assert_binomial(kept, n_chosen, 0.1 + 0.1 / len(DRAWABLE))
    # Random tokens come from the whole vocabulary less the special ids: every drawable id, nothing else.
    assert set(out[chosen & (out != ids) & (out != MASK)].tolist()) == DRAWABLE


@pytest.mark.parametrize("padding", ["pad_token_id", "attention_mask", "both"])
def test_mlm_mask_never_chooses_special_tokens_or_padding(padding):
    ids, mask = mlm_batch(batch=64, length=64, seed=2)
    ids[:, 5] = MASK  # an input that already holds [MASK] is not chosen either
    args = mask_args(pad_token_id=None if padding == "attention_mask" else PAD,
                     attention_mask=None if padding == "pad_token_id" else mask)
    out, labels = mlm_mask(ids, **args, probability=1.0, generator=torch.Generator().manual_seed(3))
    padded = {"pad_token_id": ids == PAD, "attention_mask": ~mask, "both": ~mask}[padding]
    never = padded | torch.isin(ids, torch.tensor([CLS, SEP, MASK]))
    assert never.any() and (~never).any()
    chosen = labels != -100
    assert not (chosen & never).any()
    assert chosen[~never].all()  # probability 1 chooses every other token: odd rows' tails when only PAD marks padding
    assert torch.equal(out[never], ids[never])


def test_mlm_mask_labels_and_input():
    ids, mask = mlm_batch(batch=32, length=64, seed=4)
    before = ids.clone()
    out, labels = mlm_mask(ids, **mask_args(attention_mask=mask), generator=torch.Generator().manual_seed(5))
    assert torch.equal(ids, before)  # not modified
    assert out.dtype == ids.dtype and labels.dtype == torch.int64 and out.shape == labels.shape == ids.shape
    chosen = labels != -100
    assert chosen.any() and (~chosen).any()
    assert torch.equal(labels[chosen], ids[chosen])  # the original id, also where [MASK] or a random id went in
    assert torch.equal(out[~chosen], ids[~chosen])  # nothing changes off the chosen positions
    # Labels for cross_entropy(ignore_index=-100): the loss over the chosen positions only.
    logits = torch.randn(*ids.shape, VOCAB)
    torch.testing.assert_close(F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)),
                               F.cross_entropy(logits[chosen], ids[chosen]))


def test_mlm_mask_seeds(device):
    ids, mask = mlm_batch(batch=16, length=64, seed=6)
    ids, mask = ids.to(device), mask.to(device)

    def run(seed):
        return mlm_mask(ids, **mask_args(attention_mask=mask), generator=torch.Generator(device).manual_seed(seed))

    first, again, other = run(7), run(7), run(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1]) and not torch.equal(first[0], other[0])
    assert first[0].device == first[1].device == ids.device
    torch.manual_seed(9)  # without a generator: torch's global one
    unseeded = mlm_mask(ids, **mask_args(attention_mask=mask))
    torch.manual_seed(9)
    assert torch.equal(unseeded[1], mlm_mask(ids, **mask_args(attention_mask=mask))[1])


def test_mlm_mask_settings():
    ids, mask = mlm_batch(batch=16, length=32, seed=10)
    eligible = mask & ~torch.isin(ids, torch.tensor([PAD, CLS, SEP]))
    out, labels = mlm_mask(ids, **mask_args(attention_mask=mask), probability=0.0)
    assert torch.equal(out, ids) and (labels == -100).all()
    out, labels = mlm_mask(ids, **mask_args(attention_mask=mask), probability=1.0, mask_fraction=1.0,
                           random_fraction=0.0)
    assert torch.equal(labels != -100, eligible) and (out[eligible] == MASK).all()
    out, labels = mlm_mask(ids, **mask_args(attention_mask=mask), probability=1.0, mask_fraction=0.0,
                           random_fraction=0.0, ignore_index=-1)
    assert torch.equal(out, ids) and torch.equal(labels, torch.where(eligible, ids, -1))
    # Other integer dtypes, any shape; no special ids at all.
    out, labels = mlm_mask(ids.int()[0], mask_token_id=MASK, vocab_size=VOCAB, probability=1.0, mask_fraction=0.0,
                           random_fraction=1.0, generator=torch.Generator().manual_seed(11))
    assert out.dtype == torch.int32 and labels.dtype == torch.int64 and out.shape == (32,)
    assert torch.equal(labels, torch.where(ids[0] == MASK, -100, ids[0]))
    assert MASK not in out[labels != -100].tolist()


def test_mlm_mask_bad_input():
    ids, mask = mlm_batch(batch=2, length=8)
    for name, args in [("probability", {"probability": 1.5}), ("probability", {"probability": -0.1}),
                       ("probability", {"probability": float("nan")}), ("mask_fraction", {"mask_fraction": 1.1}),
                       ("random_fraction", {"random_fraction": -0.5}),
                       ("random_fraction", {"mask_fraction": 0.8, "random_fraction": 0.3}),
                       ("mask_token_id", {"mask_token_id": VOCAB}), ("mask_token_id", {"mask_token_id": 3.0}),
                       ("special_token_ids", {"special_token_ids": (1, -1)}), ("pad_token_id", {"pad_token_id": 99}),
                       ("vocab_size", {"vocab_size": 0}), ("attention_mask", {"attention_mask": mask[:, :4]}),
                       ("attention_mask", {"attention_mask": mask.float()}),
                       ("special_token_ids", {"vocab_size": 4, "mask_token_id": 3, "special_token_ids": (1, 2)})]:
        with pytest.raises(ValueError, match=name):
            mlm_mask(ids, **mask_args(**args))
    with pytest.raises(ValueError, match="input_ids"):
        mlm_mask(ids.float(), **mask_args())


# ---------------------------------------------------------------------------------------------------- mlm_loss
def test_mlm_loss():
    logits, labels = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    labels[:, ::2] = -100
    want = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1))
    torch.testing.assert_close(mlm_loss(logits, labels), want)
    torch.testing.assert_close(mlm_loss(logits.bfloat16(), labels), F.cross_entropy(
        logits.bfloat16().float().reshape(-1, 11), labels.reshape(-1)))
    assert mlm_loss(logits.half(), labels).dtype == torch.float32
    assert mlm_loss(logits.double(), labels).dtype == torch.float64
    # No position chosen: 0 with zero gradients, not NaN.
    x = logits.clone().requires_grad_()
    loss = mlm_loss(x, torch.full((3, 7), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(x.grad) == 0
    with pytest.raises(ValueError, match="labels"):
        mlm_loss(logits, labels[:, 1:])
    with pytest.raises(ValueError, match="labels"):
        mlm_loss(logits, labels.float())
    with pytest.raises(ValueError, match="logits"):
        mlm_loss(labels, labels[..., 0])


# ---------------------------------------------------------------------------------------------------- next_token_loss
def next_token_reference(logits, ids, mask=None, ignore_index=-100):
    """Position by position in float64: logits[b, t] predicts ids[b, t + 1] where both are real tokens."""
    total, count = 0.0, 0
    B, L, _ = logits.shape
    for b in range(B):
        for t in range(L - 1):
            if mask is not None and not (mask[b, t] and mask[b, t + 1]):
                continue
            target = int(ids[b, t + 1])
            if target == ignore_index:
                continue
            total -= torch.log_softmax(logits[b, t].double(), -1)[target].item()
            count += 1
    return total / max(count, 1)


@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_next_token_loss_matches_reference(padding):
    B, L, V = 4, 9, 13
    logits, ids = torch.randn(B, L, V) * 2, torch.randint(1, V, (B, L))
    mask = None
    if padding:
        lengths = torch.tensor([9, 5, 2, 1])
        pos = torch.arange(L) if padding == "right" else torch.arange(L).flip(0)
        mask = pos < lengths[:, None]
        ids = ids.masked_fill(~mask, 0)
    got = next_token_loss(logits, ids, attention_mask=mask)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(next_token_reference(logits, ids, mask), rel=1e-5)
    # Labels with ignore_index (say, on a prompt) in place of input_ids; another ignore_index; an int mask.
    labels = ids.clone()
    labels[:, :3] = -100
    got = next_token_loss(logits, labels, attention_mask=None if mask is None else mask.long())
    assert got.item() == pytest.approx(next_token_reference(logits, labels, mask), rel=1e-5)
    got = next_token_loss(logits.double(), ids, attention_mask=mask, ignore_index=5)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(next_token_reference(logits, ids, mask, 5), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_next_token_loss_half_precision_logits(dtype):
    logits, ids = torch.randn(2, 6, 40).to(dtype), torch.randint(0, 40, (2, 6))
    got = next_token_loss(logits, ids)
    assert got.dtype == torch.float32 and got.item() == pytest.approx(next_token_reference(logits, ids), rel=1e-5)


def test_next_token_loss_nothing_to_predict():
    for logits, ids, mask in [(torch.randn(3, 1, 8), torch.randint(0, 8, (3, 1)), None),  # L = 1
                              (torch.randn(2, 4, 8), torch.randint(0, 8, (2, 4)), torch.zeros(2, 4, dtype=torch.bool))]:
        x = logits.requires_grad_()
        loss = next_token_loss(x, ids, attention_mask=mask)
        loss.backward()
        assert loss.item() == 0.0 and torch.count_nonzero(x.grad) == 0


def test_next_token_loss_gradcheck_and_compile():
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    ids, mask = torch.randint(0, 7, (2, 5)), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda x: next_token_loss(x, ids, attention_mask=mask), (logits,))
    x = logits.detach().float().requires_grad_()
    fn = torch.compile(next_token_loss, fullgraph=True, backend="aot_eager")
    got = fn(x, ids, attention_mask=mask)
    got.backward()
    grad, x.grad = x.grad, None
    want = next_token_loss(x, ids, attention_mask=mask)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, x.grad)


def test_next_token_loss_bad_input():
    logits, ids = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    with pytest.raises(ValueError, match="logits"):
        next_token_loss(logits[0], ids)
    with pytest.raises(ValueError, match="logits"):
        next_token_loss(ids[..., None].expand(2, 5, 7), ids)
    with pytest.raises(ValueError, match="input_ids"):
        next_token_loss(logits, ids[:, 1:])
    with pytest.raises(ValueError, match="input_ids"):
        next_token_loss(logits, ids.float())
    with pytest.raises(ValueError, match="attention_mask"):
        next_token_loss(logits, ids, attention_mask=torch.ones(2, 4, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------------- training steps
def train(model, step_loss, steps=15, lr=1e-2):
    """Adam steps on step_loss(model); the losses before and after, and whether every parameter got a gradient."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        loss = step_loss(model)
        opt.zero_grad()
        loss.backward()
        if i == 0:
            with_grad = all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    return losses[0], losses[-1], with_grad


def test_mlm_trains_an_encoder():
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=32, dropout=0.0,
                           activation="gelu", positional="learned", pooler=False)
    model = EncoderModel(config, mlm_head=True)
    ids, mask = mlm_batch(batch=8, length=32, seed=12)
    masked, labels = mlm_mask(ids, **mask_args(attention_mask=mask), generator=torch.Generator().manual_seed(13))

    def step_loss(m):
        return mlm_loss(m.mlm_logits(m(masked, attention_mask=mask)), labels)

    before, after, with_grad = train(model, step_loss)
    assert with_grad and math.isfinite(before) and after < 0.7 * before, (before, after)


def test_next_token_trains_a_decoder():
    torch.manual_seed(0)
    model = DecoderLM(gpt2_small(vocab_size=32, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=16, dropout=0.0))
    ids = (torch.randint(0, 32, (8, 1)) + torch.arange(12)) % 32  # each token the previous one + 1
    mask = torch.arange(12) < torch.randint(6, 13, (8, 1))  # right padding
    ids = ids.masked_fill(~mask, 0)

    def step_loss(m):
        return next_token_loss(m(ids), ids, attention_mask=mask)

    before, after, with_grad = train(model, step_loss)
    assert with_grad and math.isfinite(before) and after < 0.7 * before, (before, after)
