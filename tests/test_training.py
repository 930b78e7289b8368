"""distillation_loss: float64 hand-written reference (with and without labels, ignore_index), gradcheck, dtypes,
torch.compile, bad input, and a student DecoderLM moving toward its teacher."""
import math

import pytest
import torch

from pytransformer.losses import distillation_loss
from pytransformer.models import DecoderLM, gpt2_small


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
