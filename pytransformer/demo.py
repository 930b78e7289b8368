"""`python -m pytransformer demo`: train a small Seq2SeqTransformer to reverse digit strings, then decode a held-out
set greedily and with beam search, with and without the KV cache, and plot the loss and a cross-attention map.

Reversal needs attention: output token t is source token L-1-t, a position that moves with the source length L, so
the decoder must look it up in the encoder output. Sources have varied lengths and are right-padded (key_lengths).
"""
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .models import Seq2SeqTransformer, count_parameters, transformer_base
from .plotting import pyplot

PAD, BOS, EOS, DIGIT0 = 0, 1, 2, 3  # token ids; digit d is DIGIT0 + d
VOCAB = DIGIT0 + 10


@dataclass
class DemoConfig:
    """What the demo trains and how it is evaluated."""
    steps: int = 1200
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 100
    min_len: int = 3
    max_len: int = 12
    held_out: int = 1000
    beam_size: int = 4
    seed: int = 0
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_layers: int = 2


def keys(src: Tensor, lengths: Tensor) -> Tensor:
    """One int64 per sequence (base 11, 0 = padding) identifying src [N, L] with lengths [N]: the held-out set's ids."""
    digits = torch.where(torch.arange(src.shape[1], device=src.device) < lengths[:, None], src - DIGIT0 + 1, 0)
    return (digits * 11 ** torch.arange(src.shape[1], device=src.device)).sum(1)


def sample(n: int, cfg: DemoConfig, generator: torch.Generator, exclude: Tensor | None = None
           ) -> tuple[Tensor, Tensor, Tensor]:
    """n random digit strings: src [n, max_len] right-padded, lengths [n], targets [n, max_len + 2] =
    BOS, the reversed digits, EOS, padding. Strings whose keys are in `exclude` are replaced by fresh ones."""
    src, lengths = torch.empty(0, cfg.max_len, dtype=torch.long), torch.empty(0, dtype=torch.long)
    while src.shape[0] < n:
        lens = torch.randint(cfg.min_len, cfg.max_len + 1, (n,), generator=generator)  # [n]
        digits = torch.randint(0, 10, (n, cfg.max_len), generator=generator) + DIGIT0  # [n, max_len]
        digits = digits.masked_fill(torch.arange(cfg.max_len) >= lens[:, None], PAD)
        if exclude is not None:
            fresh = ~torch.isin(keys(digits, lens), exclude)
            digits, lens = digits[fresh], lens[fresh]
        src, lengths = torch.cat([src, digits])[:n], torch.cat([lengths, lens])[:n]
    pos = torch.arange(cfg.max_len + 2)  # [max_len + 2]
    source_index = (lengths[:, None] - pos).clamp(0, cfg.max_len - 1)  # target position t + 1 <- source L - 1 - t
    tgt = torch.where(pos <= lengths[:, None], src.gather(1, source_index), PAD)
    tgt[:, 0] = BOS
    tgt[torch.arange(n), lengths + 1] = EOS
    return src, lengths, tgt


def build_model(cfg: DemoConfig) -> Seq2SeqTransformer:
    """The demo's small encoder-decoder (Vaswani architecture, post-LN, tied embeddings, no dropout)."""
    return Seq2SeqTransformer(transformer_base(vocab_size=VOCAB, d_model=cfg.d_model, n_heads=cfg.n_heads,
                                               d_ff=cfg.d_ff, n_encoder_layers=cfg.n_layers,
                                               n_decoder_layers=cfg.n_layers, dropout=0.0, max_len=cfg.max_len + 2))


def train(model: Seq2SeqTransformer, cfg: DemoConfig, held_out_keys: Tensor, device, progress: bool = True
          ) -> list[float]:
    """Adam with linear warm-up and cosine decay on fresh batches (never a held-out string); the loss of every step."""
    from tqdm import tqdm

    generator = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / cfg.warmup, 0.5 * (
        1 + math.cos(math.pi * min(s / cfg.steps, 1.0)))))
    losses, smooth = [], None
    model.train()
    bar = tqdm(range(cfg.steps), desc="training", unit="step", disable=not progress, dynamic_ncols=True)
    for step in bar:
        src, lengths, tgt = (t.to(device) for t in sample(cfg.batch_size, cfg, generator, held_out_keys))
        logits = model(src, tgt[:, :-1], src_key_lengths=lengths)  # [B, max_len + 1, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        smooth = losses[-1] if smooth is None else 0.95 * smooth + 0.05 * losses[-1]
        if step % 10 == 0 or step == cfg.steps - 1:
            bar.set_postfix(loss=f"{smooth:.4f}", lr=f"{sched.get_last_lr()[0]:.1e}")
    model.eval()
    return losses


def exact_match(out: Tensor, tgt: Tensor) -> Tensor:
    """Per-row bool [N]: the generated tokens out [N, 1 + n] (BOS first) equal tgt [N, max_len + 2] up to its EOS."""
    n = min(out.shape[1], tgt.shape[1])
    relevant = torch.cumsum((tgt == EOS).long(), 1) - (tgt == EOS).long() == 0  # [N, max_len + 2]: up to EOS
    same = (out[:, :n] == tgt[:, :n]) | ~relevant[:, :n]
    return same.all(1) & ~relevant[:, n:].any(1)


def timed_generate(model, src, lengths, cfg: DemoConfig, beam_size: int, use_cache: bool, device
                   ) -> tuple[Tensor, float]:
    """(generated tokens [N, 1 + n], seconds)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(src, lengths, max_new_tokens=cfg.max_len + 1, bos_id=BOS, eos_id=EOS, beam_size=beam_size,
                         use_cache=use_cache)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def evaluate(model, src, lengths, tgt, cfg: DemoConfig, device, repeats: int = 2) -> list[dict]:
    """Greedy and beam decoding of the held-out set, with and without the KV cache: accuracy, best-of-`repeats`
    time, and whether the cached and uncached outputs are identical."""
    results = []
    for beam in (1, cfg.beam_size):
        outs, times = {}, {True: [], False: []}
        for _ in range(repeats):  # alternate, so that changes in machine load hit both alike
            for use_cache in (True, False):
                outs[use_cache], t = timed_generate(model, src, lengths, cfg, beam, use_cache, device)
                times[use_cache].append(t)
        results.append({"decoding": "greedy" if beam == 1 else f"beam {beam}",
                        "accuracy": exact_match(outs[True].cpu(), tgt).float().mean().item(),
                        "cached_s": min(times[True]), "uncached_s": min(times[False]),
                        "identical": torch.equal(outs[True], outs[False]), "output": outs[True].cpu()})
    return results


def cross_attention(model: Seq2SeqTransformer, src: Tensor, length: int, out: Tensor) -> list[Tensor]:
    """Per decoder layer, the head-averaged cross-attention [n_out, length] of one example src [1, Ls] while the
    decoder reads its own output out [1, n_out] (BOS first), recomputed from the layers' inputs."""
    inputs = []
    hooks = [layer.cross_attn.register_forward_pre_hook(lambda m, args: inputs.append(args))
             for layer in model.decoder.layers]
    lengths = torch.tensor([length], device=src.device)
    try:
        with torch.no_grad():
            model(src, out, src_key_lengths=lengths)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        return [layer.cross_attn.attention_weights(x, memory, key_lengths=lengths)[0].mean(0)[:, :length].cpu()
                for layer, (x, memory) in zip(model.decoder.layers, inputs)]


def token_text(ids) -> list[str]:
    return [{PAD: "", BOS: "<s>", EOS: "</s>"}.get(int(i), str(int(i) - DIGIT0)) for i in ids]


def plot_loss(losses: list[float], path: str) -> None:
    """Training loss per step (and a moving average), log scale, to a PNG."""
    plt = pyplot()

    window = max(1, len(losses) // 50)
    kernel = torch.ones(1, 1, window) / window
    smooth = F.conv1d(torch.tensor(losses)[None, None], kernel)[0, 0]  # [steps - window + 1]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(losses) + 1), losses, color="tab:blue", alpha=0.3, lw=0.8, label="loss per step")
    ax.plot(range(window, len(losses) + 1), smooth.tolist(), color="tab:blue", lw=2, label=f"mean of {window} steps")
    ax.set(yscale="log", xlabel="step", ylabel="cross-entropy (nats / token)",
           title="Seq2SeqTransformer learning to reverse digit strings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(maps: list[Tensor], src_tokens: list[str], out_tokens: list[str], path: str) -> None:
    """One heat map per decoder layer: rows = the decoder's input tokens, columns = source tokens."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(maps), figsize=(3.6 * len(maps) + 2, 4.6), sharey=True, squeeze=False,
                             constrained_layout=True)
    for i, (ax, m) in enumerate(zip(axes[0], maps)):
        im = ax.imshow(m.numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(src_tokens)), src_tokens)
        ax.set_yticks(range(len(out_tokens)), out_tokens)
        ax.set(xlabel="source token", title=f"decoder layer {i + 1} (mean of heads)")
    axes[0, 0].set_ylabel("decoder input (row t predicts output token t + 1)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention probability")
    fig.suptitle(f"Cross-attention: {''.join(src_tokens)} -> {''.join(out_tokens[1:])}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: DemoConfig, device, out_dir: str, progress: bool = True) -> dict:
    """Train, evaluate, plot and print the summary; returns the numbers."""
    torch.manual_seed(cfg.seed)
    os.makedirs(out_dir, exist_ok=True)
    src, lengths, tgt = sample(cfg.held_out, cfg, torch.Generator().manual_seed(cfg.seed + 10_000))
    model = build_model(cfg).to(device)
    print(f"task: reverse digit strings of {cfg.min_len}-{cfg.max_len} digits (right-padded), e.g. "
          f"{''.join(token_text(src[0, :lengths[0]]))} -> {''.join(token_text(tgt[0, 1:lengths[0] + 1]))}")
    print(f"model: Seq2SeqTransformer, {cfg.n_layers}+{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} "
          f"heads, {count_parameters(model):,} parameters; device {device}, {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    losses = train(model, cfg, keys(src, lengths), device, progress)
    train_s = time.perf_counter() - t0
    print(f"trained {cfg.steps} steps of {cfg.batch_size} in {train_s:.1f} s; final loss {losses[-1]:.4f}")

    results = evaluate(model, src.to(device), lengths.to(device), tgt, cfg, device)
    print(f"\nheld-out set: {cfg.held_out} strings never seen in training; exact match of the whole output")
    print("| decoding | exact match | KV cache (s) | no cache (s) | cache speed-up | same output |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['decoding']} | {r['accuracy']:.1%} | {r['cached_s']:.3f} | {r['uncached_s']:.3f} | "
              f"{r['uncached_s'] / r['cached_s']:.1f}x | {'yes' if r['identical'] else 'NO'} |")

    summary = {"train_s": train_s, "final_loss": losses[-1], "results": results, "pngs": None}
    try:
        pyplot()
    except ImportError as e:
        print(f"\nfigures skipped: {e}")
        return summary
    loss_png, attn_png = os.path.join(out_dir, "demo_loss.png"), os.path.join(out_dir, "demo_attention.png")
    plot_loss(losses, loss_png)
    example = int(torch.argmax(lengths))  # the longest held-out string
    out = results[0]["output"][example]  # [1 + n]: BOS, the greedy output
    n_out = int(lengths[example]) + 1  # BOS + the digits: each predicts the next token (the last one EOS)
    maps = cross_attention(model, src[example:example + 1].to(device), int(lengths[example]),
                           out[None, :n_out].to(device))
    plot_attention(maps, token_text(src[example, :lengths[example]]), token_text(out[:n_out]), attn_png)
    print(f"\nwrote {loss_png} and {attn_png}")
    return {**summary, "pngs": (loss_png, attn_png)}
