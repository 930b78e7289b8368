"""Training objectives: BERT's masked-language-model (mlm_mask, mlm_loss), GPT's next-token prediction
(next_token_loss) and knowledge distillation (distillation_loss, Hinton et al. 2015).

Conventions shared by the losses: a target equal to ignore_index (-100 by default, as F.cross_entropy) is not
counted; the loss is the mean over the counted positions, 0 (with zero gradients, never NaN) when none is counted;
fp16/bf16 logits are reduced in float32 and the loss returned in float32 (float64 for float64 logits).
"""
import operator
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor


def _loss_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _check_ids(name: str, ids: Tensor) -> None:
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name}: expected an integer tensor, got {ids.dtype}")


def _check_mask(attention_mask: Tensor | None, input_ids: Tensor) -> None:
    if attention_mask is not None and (attention_mask.shape != input_ids.shape or attention_mask.is_floating_point()
                                       or attention_mask.is_complex()):
        raise ValueError(f"attention_mask: expected bool or int {tuple(input_ids.shape)} (the shape of input_ids), "
                         f"got {attention_mask.dtype} {tuple(attention_mask.shape)}")


def _as_int(name: str, value) -> int:
    try:
        return operator.index(value)  # an int, a numpy integer or a 0-d integer tensor; not a float
    except TypeError:
        raise ValueError(f"{name}: expected an int, got {value!r}") from None


def _mean_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
    """Mean cross-entropy of logits [..., V] against targets [...] over the targets != ignore_index; 0 if none."""
    logits = logits.to(_loss_dtype(logits)).reshape(-1, logits.shape[-1])  # [N, V]
    targets = targets.reshape(-1).long()  # [N]
    count = (targets != ignore_index).sum().clamp(min=1)
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum") / count


def mlm_mask(input_ids: Tensor, *, mask_token_id: int, vocab_size: int, special_token_ids: Iterable[int] = (),
             pad_token_id: int | None = None, attention_mask: Tensor | None = None, probability: float = 0.15,
             mask_fraction: float = 0.8, random_fraction: float = 0.1, ignore_index: int = -100,
             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's masking (Devlin et al. 2018), as Hugging Face's DataCollatorForLanguageModeling does it.

    input_ids [B, L] (any shape works) of ids in [0, vocab_size) -> (masked_ids, labels), both of that shape.
    Each eligible token is chosen independently with `probability`; a token is not eligible when it is padding
    (attention_mask 0/False, or equal to pad_token_id), equals mask_token_id or is one of special_token_ids
    ([CLS], [SEP], ...). Of the chosen tokens a fraction `mask_fraction` (0.8) becomes mask_token_id, `random_fraction`
    (0.1) a random token and the rest (0.1) keeps its id. masked_ids has the dtype of input_ids; labels is int64 with
    the original id at the chosen positions and ignore_index (-100) elsewhere, ready for
    `mlm_loss(logits, labels)` or `F.cross_entropy(..., ignore_index=-100)`. input_ids is not modified.

    Random tokens are drawn uniformly from the vocabulary less mask_token_id, pad_token_id and special_token_ids
    (Hugging Face draws from the whole vocabulary): a random replacement never looks like structure ([SEP], padding)
    to the model. A random token may equal the original one (probability 1 / the number of drawable ids), as in BERT.
    The draws come from `generator` (on the device of input_ids) when given, else from torch's global generator; the
    same seed gives the same result.
    """
    _check_ids("input_ids", input_ids)
    _check_mask(attention_mask, input_ids)
    vocab_size = _as_int("vocab_size", vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size: expected an int >= 1, got {vocab_size!r}")
    special = [_as_int("special_token_ids", i) for i in special_token_ids]
    pads = [] if pad_token_id is None else [_as_int("pad_token_id", pad_token_id)]
    never = [_as_int("mask_token_id", mask_token_id), *special, *pads]  # never chosen, never drawn
    for name, ids in (("mask_token_id", never[:1]), ("special_token_ids", special), ("pad_token_id", pads)):
        if not all(0 <= i < vocab_size for i in ids):
            raise ValueError(f"{name}: expected ids in [0, vocab_size={vocab_size}), got {ids}")
    for name, p in (("probability", probability), ("mask_fraction", mask_fraction),
                    ("random_fraction", random_fraction)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name}: expected a probability in [0, 1], got {p}")
    if mask_fraction + random_fraction > 1.0 + 1e-9:
        raise ValueError(f"random_fraction: mask_fraction + random_fraction must be <= 1, got {mask_fraction} + "
                         f"{random_fraction}")
    device = input_ids.device
    never_t = torch.tensor(never, dtype=torch.long, device=device)
    drawable = torch.ones(vocab_size, dtype=torch.bool, device=device)
    drawable[never_t] = False
    drawable = drawable.nonzero().squeeze(1)  # [V'] the ids a random replacement may take
    if random_fraction > 0 and drawable.numel() == 0:
        raise ValueError("special_token_ids: every id of the vocabulary is special; no random token can be drawn")

    eligible = ~torch.isin(input_ids, never_t)
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    chosen = eligible & (torch.rand(input_ids.shape, generator=generator, device=device) < probability)
    kind = torch.rand(input_ids.shape, generator=generator, device=device)  # < mask_fraction: [MASK]; then random
    pick = torch.randint(max(drawable.numel(), 1), input_ids.shape, generator=generator, device=device)
    random_ids = drawable[pick] if drawable.numel() else torch.zeros_like(pick)
    to_mask = chosen & (kind < mask_fraction)
    to_random = chosen & (kind >= mask_fraction) & (kind < mask_fraction + random_fraction)
    masked_ids = torch.where(to_mask, torch.tensor(never[0], dtype=input_ids.dtype, device=device), input_ids)
    masked_ids = torch.where(to_random, random_ids.to(input_ids.dtype), masked_ids)
    labels = torch.where(chosen, input_ids.long(), torch.tensor(ignore_index, dtype=torch.long, device=device))
    return masked_ids, labels


def mlm_loss(logits: Tensor, labels: Tensor, *, ignore_index: int = -100) -> Tensor:
    """Masked-LM loss: mean cross-entropy of logits [..., V] (e.g. EncoderModel.mlm_logits, [B, L, V]) against labels
    [...] (int, from mlm_mask) over the positions whose label is not ignore_index; 0 when there is none (a batch in
    which no token was chosen). fp16/bf16 logits are reduced in float32; returned in float32 (float64 for float64)."""
    if logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError(f"logits: expected floating [..., V], got {logits.dtype} {tuple(logits.shape)}")
    _check_ids("labels", labels)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels: expected {tuple(logits.shape[:-1])} (logits [..., V] less V), got "
                         f"{tuple(labels.shape)}")
    return _mean_cross_entropy(logits, labels, ignore_index)


def next_token_loss(logits: Tensor, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                    ignore_index: int = -100) -> Tensor:
    """Causal-LM loss: logits [B, L, V] at position t predict input_ids[:, t + 1] (input_ids [B, L], int): the mean
    cross-entropy of logits[:, :-1] against input_ids[:, 1:], over the counted pairs, 0 when there is none (L = 1).

    A pair (t, t + 1) is not counted when either position is padding (attention_mask [B, L], 1/True for real tokens;
    for right padding to key_lengths [B], `torch.arange(L) < key_lengths[:, None]`), nor when input_ids[:, t + 1] ==
    ignore_index: pass labels with -100 at, say, the prompt tokens instead of input_ids to train on the answers only
    (as Hugging Face's `labels`). fp16/bf16 logits are reduced in float32; returned in float32 (float64 for float64).
    """
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"logits: expected floating [B, L, V], got {logits.dtype} {tuple(logits.shape)}")
    _check_ids("input_ids", input_ids)
    if input_ids.shape != logits.shape[:2]:
        raise ValueError(f"input_ids: expected [B, L] = {tuple(logits.shape[:2])} (logits [B, L, V]), got "
                         f"{tuple(input_ids.shape)}")
    _check_mask(attention_mask, input_ids)
    targets = input_ids[:, 1:]  # [B, L - 1]
    if attention_mask is not None:
        real = attention_mask.bool()
        targets = targets.masked_fill(~(real[:, :-1] & real[:, 1:]), ignore_index)
    return _mean_cross_entropy(logits[:, :-1], targets, ignore_index)


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 2.0, alpha: float = 0.5,
                      labels: Tensor | None = None, *, ignore_index: int = -100) -> Tensor:
    """alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * cross_entropy(student, labels).

    Logits are [..., V] and labels [...] (int). Both terms are means over positions; with labels, positions whose
    label is ignore_index count in neither term (padding), and the loss is 0 when every position is ignored. Without
    labels the loss is the distillation term T^2 * KL alone (alpha is not used). Gradients flow into both logits:
    pass a detached teacher (or compute it under torch.no_grad()) to train the student only. fp16/bf16 logits are
    reduced in float32 and the loss returned in float32.
    """
    if student_logits.dim() < 1 or student_logits.shape != teacher_logits.shape:
        raise ValueError(f"teacher_logits: expected the shape of student_logits {tuple(student_logits.shape)} "
                         f"[..., V], got {tuple(teacher_logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: expected a weight in [0, 1], got {alpha}")
    if labels is not None and (labels.shape != student_logits.shape[:-1] or labels.is_floating_point()):
        raise ValueError(f"labels: expected int [...] = {tuple(student_logits.shape[:-1])}, got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    dtype = _loss_dtype(student_logits)
    student = student_logits.to(dtype).reshape(-1, student_logits.shape[-1])  # [N, V]
    teacher = teacher_logits.to(dtype).reshape(-1, teacher_logits.shape[-1])  # [N, V]
    log_p_student = F.log_softmax(student / temperature, -1)
    log_p_teacher = F.log_softmax(teacher / temperature, -1)
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="none", log_target=True).sum(-1)  # [N]
    if labels is None:
        return temperature ** 2 * kl.mean()
    labels = labels.reshape(-1)  # [N]
    keep = labels != ignore_index
    count = keep.sum().clamp(min=1)
    kd = (kl * keep).sum() / count
    ce = F.cross_entropy(student, labels, ignore_index=ignore_index, reduction="sum") / count
    return alpha * temperature ** 2 * kd + (1.0 - alpha) * ce
