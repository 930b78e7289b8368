"""`python -m pytransformer generate` end to end on a tiny random Llama saved with save_pretrained and a byte-level BPE
tokenizer trained here (no download): the streamed text is the prompt plus the decoded greedy tokens, sampling is
reproducible with --seed, int8/bf16 and --compile run, generation stops at any id of an eos_token_id list, bad
arguments print usage and exit 2, and a broken directory prints one line naming the file and exits 2."""
import json
import shutil
import re
import subprocess
import sys

import pytest
import torch

from pytransformer.__main__ import main
from pytransformer.models import DecoderLM

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = ["hello world", "the quick brown fox jumps over the lazy dog", "h\u00e9llo w\u00f6rld \u2713 \u00fcn\u00efc\u00f6de"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(TEXT * 4, tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def run(model_dir, *args):
    return main(["generate", "--model", str(model_dir), "--threads", "1", *args])


def test_greedy_text_is_streamed(model_dir, capsys):
    prompt = "hello w\u00f6rld"
    assert run(model_dir, "--prompt", prompt, "--max-new-tokens", "12") == 0
    out, err = capsys.readouterr()
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = torch.tensor([tok.encode(prompt).ids])
    new = DecoderLM.from_pretrained(model_dir).generate(ids, 12)[0, ids.shape[1]:]
    assert out == prompt + tok.decode(new.tolist()) + "\n"
    assert "prefill: " in err and "decode: 11 tokens" in err and "tokens/s" in err


def test_bf16_cache_decodes_through_a_bfloat16_cache(model_dir, capsys, monkeypatch):
    """--int8 --bf16-cache: a bfloat16 cache, and the tokens of generate(cache_dtype=torch.bfloat16) of the int8
    model."""
    prompt, dtypes, new_cache = "hello", [], DecoderLM.new_cache
    monkeypatch.setattr(DecoderLM, "new_cache", lambda *a, **k: dtypes.append(k.get("dtype")) or new_cache(*a, **k))
    assert run(model_dir, "--prompt", prompt, "--max-new-tokens", "10", "--int8", "--bf16-cache") == 0
    assert dtypes == [torch.bfloat16]
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = torch.tensor([tok.encode(prompt).ids])
    model = DecoderLM.from_pretrained(model_dir, quantize=True)
    new = model.generate(ids, 10, cache_dtype=torch.bfloat16)[0, ids.shape[1]:]
    assert capsys.readouterr().out == prompt + tok.decode(new.tolist()) + "\n"


def test_compile_streams_the_eager_tokens(model_dir, capsys, monkeypatch):
    """--compile: the greedy text of eager decoding, through the compiled step (built by a one-token warm-up, then
    taken again by the generation itself)."""
    from pytransformer.models import decoder
    built, compiled_step = [], decoder.compiled_step
    monkeypatch.setattr(decoder, "compiled_step", lambda *a: built.append(a[1].capacity) or compiled_step(*a))
    prompt = "the quick"
    assert run(model_dir, "--prompt", prompt, "--max-new-tokens", "12", "--compile") == 0
    out, err = capsys.readouterr()
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = torch.tensor([tok.encode(prompt).ids])
    new = DecoderLM.from_pretrained(model_dir).generate(ids, 12)[0, ids.shape[1]:]
    assert out == prompt + tok.decode(new.tolist()) + "\n" and "decode: 11 tokens" in err
    assert built == [2, ids.shape[1] + 12]


def test_sampling_is_reproducible_and_int8_bf16_run(model_dir, capsys):
    sample = ["--prompt", "the quick", "--max-new-tokens", "8", "--temperature", "1.5", "--top-p", "0.9",
              "--top-k", "20"]
    outs = []
    for extra in (["--seed", "3"], ["--seed", "3"], ["--seed", "3", "--int8", "--bf16"]):
        assert run(model_dir, *sample, *extra) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[2].startswith("the quick")


@pytest.mark.parametrize("args", [[], ["--model", "DIR"], ["--prompt", "hi"], ["--model", "/nowhere", "--prompt", "hi"],
                                  ["--model", "DIR", "--prompt", "hi", "--top-p", "1.5"],
                                  ["--model", "DIR", "--prompt", "hi", "--temperature", "-1"],
                                  ["--model", "DIR", "--prompt", "hi", "--max-new-tokens", "0"],
                                  ["--model", "DIR", "--prompt", "hi", "--top-k", "-2"],
                                  ["--model", "DIR", "--prompt", "hi", "--device", "tpu"]])
def test_bad_arguments_print_usage_and_exit_2(model_dir, args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate"] + [str(model_dir) if a == "DIR" else a for a in args])
    assert exc.value.code == 2 and "usage: python -m pytransformer generate" in capsys.readouterr().err


def _broken_copy(model_dir, tmp_path, name, damage):
    """A copy of model_dir whose file `name` is rewritten as damage(its bytes) returns."""
    path = tmp_path / "broken"
    shutil.copytree(model_dir, path)
    (path / name).write_bytes(damage((path / name).read_bytes()))
    return path


def _without(field):
    return lambda data: json.dumps({k: v for k, v in json.loads(data).items() if k != field}).encode()


@pytest.mark.parametrize("name, damage, match", [
    ("tokenizer.json", None, r"tokenizer.json: no tokenizer.json in the model directory"),
    ("tokenizer.json", lambda data: data[:len(data) // 2], r"tokenizer.json: not a readable tokenizer.json"),
    ("model.safetensors", lambda data: data[:-100], r"model.safetensors: not a readable safetensors file"),
    ("config.json", _without("hidden_size"), r"config.json: hidden_size: missing"),
    ("config.json", lambda data: data.replace(b'"hidden_size": 64', b'"hidden_size": "64"'),
     r"config.json: hidden_size: expected an integer >= 1, got '64'"),
    ("config.json", lambda data: data[:-3], r"config.json: not valid JSON"),
    ("generation_config.json", lambda data: b'{"eos_token_id": "</s>"}', r"generation_config.json: eos_token_id: "),
])
def test_broken_directory_prints_one_line_and_exits_2(model_dir, tmp_path, capsys, name, damage, match):
    path = _broken_copy(model_dir, tmp_path, name, damage or (lambda data: data))
    if damage is None:
        (path / name).unlink()
    assert run(path, "--prompt", "hi") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("python -m pytransformer generate: error: "), err
    assert re.search(f"{re.escape(str(path))}/{match}", err), err


def test_eos_token_id_list_stops_at_any(model_dir, tmp_path, capsys):
    """eos_token_id [unused, t] in generation_config.json stops at t, as transformers does."""
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = torch.tensor([tok.encode("hello").ids])
    new = DecoderLM.from_pretrained(model_dir).generate(ids, 12)[0, ids.shape[1]:].tolist()
    unused = next(t for t in range(tok.get_vocab_size()) if t not in new)
    path = _broken_copy(model_dir, tmp_path, "generation_config.json",
                        lambda data: json.dumps({"eos_token_id": [unused, new[2]]}).encode())
    assert run(path, "--prompt", "hello", "--max-new-tokens", "12") == 0
    out, err = capsys.readouterr()
    stop = new.index(new[2]) + 1
    assert out == "hello" + tok.decode(new[:stop]) + "\n" and f"decode: {stop - 1} tokens" in err


def test_gpt2_past_its_positions_exits_2(model_dir, tmp_path, capsys):
    """GPT-2's learned positions end at n_positions: more tokens than that is one line and status 2."""
    path = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2,
                                                         n_positions=16)).save_pretrained(path)
    shutil.copy(model_dir / "tokenizer.json", path)
    assert run(path, "--prompt", "hello", "--max-new-tokens", "8") == 0
    capsys.readouterr()
    assert run(path, "--prompt", "hello", "--max-new-tokens", "40") == 2
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(r"python -m pytransformer generate: error: max_new_tokens: \d+ prompt tokens \+ "
                                      r"40 new ones exceed the model's 16 learned positions \(max_len\)\n", err), err


def test_module_entry_point(model_dir):
    out = subprocess.run([sys.executable, "-m", "pytransformer", "generate", "--model", str(model_dir), "--prompt",
                          "hello", "--max-new-tokens", "4", "--threads", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello") and "tokens/s" in out.stderr


def test_module_entry_point_broken_directory(model_dir, tmp_path):
    """The process itself: one line on stderr, no traceback, status 2."""
    path = _broken_copy(model_dir, tmp_path, "config.json", _without("hidden_size"))
    out = subprocess.run([sys.executable, "-m", "pytransformer", "generate", "--model", str(path), "--prompt", "hi"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert "config.json: hidden_size: missing" in out.stderr
