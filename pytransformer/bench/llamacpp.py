"""llama.cpp as an engine of bench-generate: the saved Hugging Face folder converted to GGUF by llama.cpp's own
convert_hf_to_gguf.py, and greedy generation of a batch of parallel sequences through the low-level API of the
`llama_cpp` package (llama-cpp-python).

Neither the library nor its tests need llama.cpp. For the benchmark, build the package from source for this CPU and
add sentencepiece, which its converter imports (besides torch, numpy and transformers):

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
    pip install sentencepiece

The converter is not part of the installed package: it comes from the package's source distribution of the installed
version (pip download, kept in a cache folder) with the gguf-py it imports, or from LLAMA_CPP_CONVERTER, the path of
a convert_hf_to_gguf.py in a llama.cpp checkout.

The folder's tokenizer is the benchmark's word-level vocabulary "t0", "t1", ...; llama.cpp's converter reads a Llama
vocabulary from a SentencePiece tokenizer.model, so one with the same pieces at the same ids is written beside it.
"""
import ctypes
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

# GGUF types per dtype of ours: the first is the pair of that dtype; bfloat16 also runs f16, llama.cpp's usual
# 16-bit type. q8_0 is the converter's own (blocks of 32 int8 weights with one scale).
GGUF_TYPES = {"float32": ["f32"], "bfloat16": ["bf16", "f16"], "float16": ["f16"], "int8": ["q8_0"]}
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def write_sentencepiece_vocab(folder: Path, vocab: int) -> None:
    """folder/tokenizer.model: a SentencePiece model whose piece i is "t<i>" for every id below `vocab` (t0 is its
    unknown piece, the others user-defined symbols), trained here on a one-character text."""
    import sentencepiece
    model = io.BytesIO()
    names = [f"t{i}" for i in range(vocab)]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["t"]), model_writer=model, model_type="char", vocab_size=vocab, unk_id=0, bos_id=-1,
        eos_id=-1, pad_id=-1, unk_piece=names[0], user_defined_symbols=names[1:], hard_vocab_limit=False,
        normalization_rule_name="identity", add_dummy_prefix=False, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())


def converter() -> Path:
    """The path of llama.cpp's convert_hf_to_gguf.py: LLAMA_CPP_CONVERTER, or the one in the source distribution of
    the installed llama-cpp-python, extracted once (with the conversion/ and gguf-py/ folders it imports) into
    ~/.cache/pytransformer/llama.cpp-<version>."""
    if "LLAMA_CPP_CONVERTER" in os.environ:
        return Path(os.environ["LLAMA_CPP_CONVERTER"])
    version = importlib.metadata.version("llama-cpp-python")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pytransformer" / f"llama.cpp-{version}"
    script = cache / CONVERTER_FILES[0]
    if not script.exists():
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                 f"llama-cpp-python=={version}", "-d", str(cache)], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"pip could not download the source of llama-cpp-python=={version} for its converter "
                               "(or set LLAMA_CPP_CONVERTER to a convert_hf_to_gguf.py): "
                               + " | ".join(result.stderr.strip().splitlines()[-2:]))
        extract_converter(next(cache.glob("llama_cpp_python-*.tar.gz")), cache)
    return script


def extract_converter(sdist: Path, out: Path) -> None:
    """The converter's files of a llama-cpp-python sdist (under <top>/vendor/llama.cpp/) extracted into `out`."""
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            name = m.name.split("/vendor/llama.cpp/", 1)[-1]
            if "/vendor/llama.cpp/" in m.name and name.startswith(CONVERTER_FILES):
                m.name = name
                members.append(m)
        tar.extractall(out, members=members, filter="data")


def gguf_file(folder: Path, gguf_type: str) -> Path:
    """The GGUF conversion of the saved model in `gguf_type` (f32, bf16, f16, q8_0), made once by llama.cpp's converter
    in a process of its own."""
    out = folder / f"model-{gguf_type}.gguf"
    if not out.exists():
        if not (folder / "tokenizer.model").exists():
            write_sentencepiece_vocab(folder, json.loads((folder / "config.json").read_text())["vocab_size"])
        result = subprocess.run([sys.executable, str(converter()), str(folder), "--outtype", gguf_type, "--outfile",
                                 str(out)], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"llama.cpp's converter failed on {folder} ({gguf_type}): "
                               + " | ".join(result.stderr.strip().splitlines()[-3:]))
    return out


def has_amx() -> bool:
    """Whether the CPU has AMX (Linux: an amx_* flag in /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag.startswith("amx") for line in f if line.startswith("flags") for flag in line.split())
    except OSError:
        return False


def extra_buffers(gguf_type: str) -> bool:
    """Whether llama.cpp may use its extra buffer types (weight repacking, AMX) for `gguf_type`: not for q8_0 on an
    AMX CPU, whose q8_0 prompt processing in the AMX buffer type can crash (a llama.cpp bug)."""
    return not (gguf_type == "q8_0" and has_amx())


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _log_errors(level, text, _):
    """llama.cpp's log callback: its errors (GGML_LOG_LEVEL_ERROR, 4) go to stderr, its information does not."""
    if level == 4:
        sys.stderr.write(text.decode(errors="replace"))


class Generator:
    """Greedy generation with llama.cpp from a GGUF file: a context of `threads` threads with room for `max_batch`
    parallel sequences of `max_len` tokens each, its KV cache in float32 when f32_cache (else llama.cpp's default,
    float16). generate(ids, n) (call the object) returns ids followed by exactly n new tokens per row (end-of-sequence
    tokens do not stop it), like DecoderLM.generate."""

    def __init__(self, path: Path, threads: int, max_batch: int, max_len: int, extra_bufts: bool, f32_cache: bool):
        import llama_cpp as lc
        self.lc = lc
        lc.llama_log_set(_log_errors, ctypes.c_void_p())
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.use_extra_bufts = extra_bufts
        self.model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = lc.llama_context_default_params()
        cparams.n_seq_max, cparams.n_ctx = max_batch, max_batch * max_len
        cparams.n_batch = cparams.n_ctx
        cparams.n_threads = cparams.n_threads_batch = threads
        if f32_cache:
            cparams.type_k = cparams.type_v = lc.GGML_TYPE_F32
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {max_batch} x {max_len} tokens")
        self.sampler = lc.llama_sampler_init_greedy()
        self.max_batch, self.max_len = max_batch, max_len

    def __call__(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        batch, length = ids.shape
        if batch > self.max_batch or length + n > self.max_len:
            raise ValueError(f"ids: {batch} rows of {length} + {n} tokens exceed the context's {self.max_batch} "
                             f"sequences of {self.max_len}")
        lc = self.lc
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        rows = ids.tolist()
        # the prompts: every position of every row, logits at each row's last
        last = self._decode([(s, p, t, p == length - 1) for s, row in enumerate(rows) for p, t in enumerate(row)])
        new = []  # per step, the batch's tokens
        for step in range(n):
            new.append([lc.llama_sampler_sample(self.sampler, self.ctx, i) for i in last])
            if step + 1 < n:
                last = self._decode([(s, length + step, t, True) for s, t in enumerate(new[-1])])
        return torch.cat([ids.cpu(), torch.tensor(new, dtype=ids.dtype).T], 1)

    def _decode(self, tokens) -> list[int]:
        """llama_decode of (sequence, position, token, logits wanted) tuples in one batch; returns the batch indices
        whose logits were asked for."""
        lc = self.lc
        b = lc.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, (seq, pos, token, logits) in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
                b.seq_id[i][0] = seq
            b.n_tokens = len(tokens)
            if lc.llama_decode(self.ctx, b):
                raise RuntimeError("llama_decode failed")
        finally:
            lc.llama_batch_free(b)
        return [i for i, t in enumerate(tokens) if t[3]]

    def close(self) -> None:
        """Frees the sampler, context and model."""
        self.lc.llama_sampler_free(self.sampler)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def load(folder: Path, gguf_type: str, threads: int, max_batch: int, max_len: int) -> Generator:
    """The llama.cpp Generator of the saved folder converted to `gguf_type`; f32 keeps its KV cache in float32, as
    ours does in float32."""
    return Generator(gguf_file(folder, gguf_type), threads, max_batch, max_len, extra_buffers(gguf_type),
                     gguf_type == "f32")
