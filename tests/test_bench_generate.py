"""bench-generate's parts: the prefill/decode split of generation time, the engine list and record, Marian
translation (our tokens against Hugging Face's and, when ctranslate2 is installed, CTranslate2's), the SentencePiece
vocabulary written for llama.cpp's converter (pieces "t<i>" at id i, beside the folder's word-level tokenizer, which
Hugging Face still reads), the q8_0 switch on AMX CPUs, and, when llama-cpp-python is installed, a tiny random Llama
converted by llama.cpp's converter and generated with batched sequences, against our float32 tokens."""
import copy
import importlib.util
import io
import math
import subprocess
import tarfile

import pytest
import torch

from pytransformer.bench import generate, llamacpp
from pytransformer.models import DecoderLM

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, initializer_range=0.3, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama (decisive logits: initializer_range 0.3) saved by save_folder."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    folder = tmp_path_factory.mktemp("tiny_llama")
    generate.save_folder(hf, folder)
    return hf, folder


TINY_MARIAN = dict(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                   pad_token_id=299, decoder_start_token_id=299, init_std=0.3)


def test_marian_engines():
    """Translation: ours eager (compile=True is DecoderLM's), Hugging Face, CTranslate2 when installed; no
    llama.cpp."""
    names = generate.engines("cpu", "float32", False, "marian")
    assert names[:2] == ["ours", "Hugging Face"] and names[2:] in ([], ["CTranslate2"])


@pytest.mark.parametrize("beams", [1, 4])
def test_marian_translations_agree(tmp_path, beams):
    """A tiny random Marian saved by save_folder: our float32 translation, greedy or by beam search (exactly n tokens
    after the pad id, never the pad id), equals Hugging Face's, from the folder as the timed engines load it, and
    CTranslate2's conversion of the folder (its vocabulary without the pad token, its decoder started from a zero
    embedding, as the pad id's row is) gives the same tokens."""
    hf = generate.hf_model("marian", "cpu", **TINY_MARIAN)
    generate.save_folder(hf, tmp_path)
    ids = generate.prompts(3, 9, 300, "cpu")
    with torch.no_grad():
        ours = generate.load_engine("ours", "float32", tmp_path, "cpu", 1, 3, 30, beams)(ids, 12)
    assert ours.shape == (3, 13) and ours[:, 0].eq(299).all() and not ours[:, 1:].eq(299).any()
    assert generate.same_tokens(hf, "cpu", [1, 3], 9, 12, {"Hugging Face": generate.hf_generate(hf, beams)},
                                beams) == {"Hugging Face": {1: None, 3: None}}
    pytest.importorskip("ctranslate2")
    theirs = generate.load_engine("CTranslate2", "float32", tmp_path, "cpu", 1, 3, 30, beams)(ids, 12)
    assert torch.equal(theirs, ours)


def test_beams_only_for_translation(capsys):
    with pytest.raises(SystemExit):
        generate.main(["--model", "llama", "--beams", "4"])
    assert "--beams: at least 1, and more only with --model marian" in capsys.readouterr().err


def test_split_times():
    """generate(ids, 1) is the prefill; the other n - 1 tokens of each row share the remaining time."""
    r = generate.split_times(8, 5, t_all=2.0, t_first=0.4)
    assert r == pytest.approx({"total": 8 * 5 / 2.0, "decode": 8 * 4 / 1.6, "prefill": 0.4})
    assert math.isnan(generate.split_times(1, 5, t_all=0.4, t_first=0.5)["decode"])
    with pytest.raises(ValueError, match="new_tokens"):
        generate.split_times(1, 1, 1.0, 1.0)


def test_markdown_has_both_ratios_and_total_memory():
    def rates(total, decode, prefill, spread, middle_half):
        return {"total": total, "decode": decode, "prefill": prefill, "spread": spread, "middle_half": middle_half}
    rows = [(2, 8, "ours", "float32", 4, rates(20.0, 30.0, 0.05, 0.1, 0.04)),
            (2, 8, "llama.cpp f32", "float32", 4, rates(10.0, 60.0, 0.1, 0.02, 0.01)),
            (1, 16, "ours", "float32", 4, rates(10.0, 30.0, 0.1, 0.5, 0.2)),
            (1, 16, "llama.cpp f32", "float32", 4, rates(10.0, 60.0, 0.2, 0, 0))]
    text = generate.markdown(rows, [("llama.cpp f32", "float32", 8, 2**20, 2 * 2**20, 500 * 2**20)], "cpu", "cmd",
                             "tiny", 3, {"llama.cpp f32": {1: None, 8: 3}})
    # the range in ms: 2% of the median call, 2 rows x 4 tokens at 10 tokens/s
    assert "| 2 | 8 | llama.cpp f32 | float32 | 4 | 10.0 | 2.00x | 60.0 | 0.50x | 100.0 | 2% (1%), 16 ms |" in text
    # its own ours:
    assert "| 1 | 16 | llama.cpp f32 | float32 | 4 | 10.0 | 1.00x | 60.0 | 0.50x | 200.0 | 0% (0%), 0 ms |" in text
    assert "| llama.cpp f32 | float32 | 8 | 1 | 2 | 500 |" in text
    assert "against llama.cpp f32's: batch 1: identical; batch 8: first difference at new token 3" in text
    assert "convert_hf_to_gguf.py" in text


def test_llamacpp_engines_only_for_llama_on_cpu(monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "llama_cpp" else found(name))
    assert generate.engines("cpu", "bfloat16", False, "llama")[-2:] == ["llama.cpp bf16", "llama.cpp f16"]
    assert generate.engines("cpu", "int8", False, "llama")[-1] == "llama.cpp q8_0"
    assert generate.engines("cpu", "float32", False, "llama-1b")[-1] == "llama.cpp f32"
    assert generate.engines("cpu", "float32", False, "qwen3-0.6b")[-1] == "llama.cpp f32"
    assert generate.engines("cpu", "float32", False, "gemma3-270m")[-1] == "llama.cpp f32"
    assert not any(e.startswith("llama.cpp") for e in generate.engines("cpu", "float32", False, "gpt2"))


def test_float16_pairs_llamacpp_f16_and_leaves_out_ctranslate2(monkeypatch):
    """float16 runs llama.cpp's f16 and not CTranslate2, which has no float16 compute on the CPU."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    names = generate.engines("cpu", "float16", False, "llama")
    assert names[-1] == "llama.cpp f16" and "CTranslate2" not in names and "Hugging Face" in names
    assert "CTranslate2" in generate.engines("cpu", "bfloat16", False, "llama")


def test_cuda_engines_leave_out_the_cpu_only_ones():
    """On CUDA: no llama.cpp or CTranslate2, and no Hugging Face int8 (torch's dynamic quantization runs on the CPU
    only); Hugging Face in float32 and bfloat16."""
    assert generate.engines("cuda", "int8", False, "llama") == ["ours", "ours, compiled", "ours, x 8 bits"]
    for dtype in ("float32", "bfloat16"):
        assert generate.engines("cuda", dtype, False, "llama") == ["ours", "ours, compiled", "Hugging Face"]
    assert "Hugging Face" in generate.engines("cpu", "int8", False, "llama")


def test_llama_1b_is_tinyllamas_shape():
    with torch.device("meta"):
        hf = generate.hf_model("llama-1b", "meta", num_hidden_layers=2)
    c = hf.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads) == (2048, 5632, 32, 4)
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632 + 2 * 2048
    assert sum(p.numel() for p in hf.parameters()) == 2 * per_layer + 2 * 32000 * 2048 + 2048


def test_qwen3_is_qwen3_0_6bs_shape():
    with torch.device("meta"):
        hf = generate.hf_model("qwen3-0.6b", "meta")
    c = hf.config
    assert type(hf).__name__ == "Qwen3ForCausalLM" and c.tie_word_embeddings
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        1024, 3072, 16, 8, 128)
    per_layer = 2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128
    assert sum(p.numel() for p in hf.parameters()) == 28 * per_layer + 151936 * 1024 + 1024  # 596M


def test_gemma3_is_gemma_3_270ms_shape():
    with torch.device("meta"):
        hf = generate.hf_model("gemma3-270m", "meta")
    c = hf.config
    assert type(hf).__name__ == "Gemma3ForCausalLM" and c.tie_word_embeddings and c.sliding_window == 512
    assert c.layer_types.count("full_attention") == 3 and c.layer_types[5] == "full_attention"
    per_layer = 640 * 1024 + 2 * 640 * 256 + 1024 * 640 + 3 * 640 * 2048 + 4 * 640 + 2 * 256
    assert sum(p.numel() for p in hf.parameters()) == 18 * per_layer + 262144 * 640 + 640  # 268M


def test_q8_0_leaves_extra_buffer_types_off_on_amx(monkeypatch):
    monkeypatch.setattr(llamacpp, "has_amx", lambda: True)
    assert not llamacpp.extra_buffers("q8_0") and llamacpp.extra_buffers("f32")
    monkeypatch.setattr(llamacpp, "has_amx", lambda: False)
    assert llamacpp.extra_buffers("q8_0")


def test_converter_files_come_out_of_the_sdist(tmp_path):
    """Only the converter, conversion/ and gguf-py/ of vendor/llama.cpp/, at their paths below it."""
    sdist = tmp_path / "llama_cpp_python-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name in ("convert_hf_to_gguf.py", "conversion/base.py", "gguf-py/gguf/__init__.py", "README.md"):
            data = name.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-1.0/vendor/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    llamacpp.extract_converter(sdist, tmp_path / "out")
    found = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert found == ["conversion/base.py", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py"]


def test_converter_download_failure_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAMA_CPP_CONVERTER", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(llamacpp.importlib.metadata, "version", lambda name: "9.9.9")
    monkeypatch.setattr(llamacpp.subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(
        args, 1, "", "ERROR: No matching distribution found"))
    with pytest.raises(RuntimeError, match=r"==9\.9\.9 .*LLAMA_CPP_CONVERTER.*No matching distribution"):
        llamacpp.converter()
    monkeypatch.setenv("LLAMA_CPP_CONVERTER", "/a/convert_hf_to_gguf.py")
    assert str(llamacpp.converter()) == "/a/convert_hf_to_gguf.py"


def test_sentencepiece_vocab_beside_the_word_level_tokenizer(tiny):
    """Piece i of tokenizer.model is "t<i>" for every id; Hugging Face still loads the folder's tokenizer.json and
    maps "t<i>" to i and back."""
    sentencepiece = pytest.importorskip("sentencepiece")
    _, folder = tiny
    llamacpp.write_sentencepiece_vocab(folder, TINY["vocab_size"])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert sp.vocab_size() == TINY["vocab_size"]
    assert [sp.id_to_piece(i) for i in range(sp.vocab_size())] == [f"t{i}" for i in range(TINY["vocab_size"])]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = [0, 5, 299, 17, 2]
    assert tok(" ".join(f"t{i}" for i in ids), add_special_tokens=False)["input_ids"] == ids
    assert tok.convert_ids_to_tokens(ids) == [f"t{i}" for i in ids] and tok.decode(ids) == "t0 t5 t299 t17 t2"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_llamacpp_generates_our_float32_tokens(tiny):
    """llama.cpp's f32 conversion of the folder: its vocabulary keeps "t<i>" at id i, its greedy tokens for a
    batch of 3 parallel sequences (exactly n, past any end-of-sequence token) are the argmax of the model's float64
    logits at every step (within llama.cpp's rounding), and ours in float32 equal them up to a step whose two best
    logits are that close (a near-tie, which either engine's rounding may break either way)."""
    import llama_cpp
    hf, folder = tiny
    ids = torch.randint(0, TINY["vocab_size"], (3, 9))
    engine = llamacpp.load(folder, "f32", 2, max_batch=3, max_len=9 + 12)
    try:
        vocab = llama_cpp.llama_model_get_vocab(engine.model)
        assert [llama_cpp.llama_vocab_get_text(vocab, i) for i in (5, 299)] == [b"t5", b"t299"]
        theirs = engine(ids, 12)
        assert torch.equal(engine(ids[1:2], 12), theirs[1:2])  # the other sequences leave a row alone
        with pytest.raises(ValueError, match="ids"):
            engine(ids, 13)
    finally:
        engine.close()
    with torch.no_grad():  # the float64 logits of every new token, given the tokens before it (theirs)
        logits = copy.deepcopy(hf).double()(theirs).logits[:, ids.shape[1] - 1:-1]  # [3, 12, V]
    best = logits.topk(2, -1).values  # [3, 12, 2]
    picked = logits.gather(-1, theirs[:, ids.shape[1]:, None]).squeeze(-1)
    assert (best[..., 0] - picked).max() < 1e-2  # llama.cpp's f32 differs from float64 by about 1e-3 here
    ours = DecoderLM.from_hf(hf).generate(ids, 12)
    for row, margins in enumerate(best[..., 0] - best[..., 1]):
        decisive = ids.shape[1] + int((margins < 1e-2).cumsum(0).eq(0).sum())  # tokens before the first near-tie
        assert torch.equal(ours[row, :decisive], theirs[row, :decisive]), row


def test_engines_subset_and_bfloat16_folder(monkeypatch, tmp_path, capsys):
    """--engines times ours plus the engines named; bfloat16 engines load a bfloat16 save of the same weights,
    float32 and int8 ones the float32 save. The record's table, prefill and decode included, goes to stdout too."""
    from safetensors import safe_open
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    calls = []

    def fake_measure(engine_calls, dtype, folder, *args):
        with safe_open(folder / "model.safetensors", "pt") as f:
            dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
        calls.extend((engine, dtype, dtypes) for engine in engine_calls)
        rates = {"total": 1.0, "decode": 1.0, "prefill": 1.0, "spread": 0.0, "middle_half": 0.0}
        return {engine: ({1: rates}, 0, 0, 0) for engine in engine_calls}
    monkeypatch.setattr(generate, "hf_model", lambda *a: hf)
    monkeypatch.setattr(generate, "measure", fake_measure)
    monkeypatch.setattr(generate, "check_tokens", lambda *a: {})
    generate.main(["--model", "llama", "--device", "cpu", "--dtypes", "float32", "bfloat16", "int8", "--batch-sizes",
                   "1", "--engines", "ours, compiled", "--prompt-len", "8", "--record", str(tmp_path / "r.md")])
    assert calls == [(e, d, {"BF16" if d == "bfloat16" else "F32"})
                     for d in ("float32", "bfloat16", "int8") for e in ("ours", "ours, compiled")]
    assert all(p.dtype == torch.float32 for p in hf.parameters())  # the bfloat16 save left the model as it was
    record = (tmp_path / "r.md").read_text()
    assert record.count("| 1.00x | 1000.0 | 0% (0%)") == 6 and record.split("\n\n", 1)[1] in capsys.readouterr().out


def test_engines_take_turns_each_in_a_process_of_its_own(tiny, monkeypatch):
    """measure loads each engine in a process of its own, runs a first call of each (n new tokens, its memory
    sampled), then times them in turns, round after round (n new tokens, then the prefill alone), unsampled, each call
    after a pause; an engine that cannot load is reported with its error while the others run."""
    hf, folder = tiny
    order, time_call = [], generate.Engine.time

    def logged(self, batch, n, sample=False):
        order.append((self.name, batch, n, sample))
        return time_call(self, batch, n, sample)
    monkeypatch.setattr(generate.Engine, "time", logged)
    monkeypatch.setattr(generate, "pause", lambda: order.append("pause"))
    results = generate.measure({"ours": (3, 2), "nonesuch": (3, 2), "Hugging Face": (3, 2)}, "float32", folder,
                               "cpu", [1, 2], 5, TINY["vocab_size"])
    assert list(results) == ["ours", "nonesuch", "Hugging Face"]
    assert "no engine is named 'nonesuch'" in results["nonesuch"]
    both = ("ours", "Hugging Face")
    assert order == [call for b in (1, 2) for first in (True, False) for _ in range(1 if first else 2) for e in both
                     for n in ((3,) if first else (3, 1)) for call in ("pause", (e, b, n, first))]
    for engine in both:
        rates, after_load, peak, peak_total = results[engine]
        assert set(rates) == {1, 2}
        assert all(r["total"] > 0 and r["prefill"] > 0 and r["spread"] >= r["middle_half"] >= 0
                   for r in rates.values())
        assert peak >= after_load > 0 and peak_total > 0


def test_records_give_the_command_as_typed():
    """The command as typed, with the thread-count variables that were set (environ) in front."""
    from pytransformer.bench import command_line
    assert command_line(["/x/pytransformer/__main__.py", "bench-generate", "--engines", "ours, compiled",
                         "llama.cpp f32"], {}
                        ) == "python -m pytransformer bench-generate --engines 'ours, compiled' 'llama.cpp f32'"
    assert command_line(["benchmarks/bench_linear.py", "--record", "a.md"], {}) == (
        "python benchmarks/bench_linear.py --record a.md")
    assert command_line(["/x/pytransformer/__main__.py", "bench-generate"], {"OMP_NUM_THREADS": "1", "HOME": "/h"}
                        ) == "OMP_NUM_THREADS=1 python -m pytransformer bench-generate"
