"""Training losses: knowledge distillation (Hinton et al. 2015)."""
import torch
import torch.nn.functional as F
from torch import Tensor


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
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
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
