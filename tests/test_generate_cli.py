"""`python -m pytransformer generate` end to end on a tiny random Llama saved with save_pretrained and a byte-level BPE
tokenizer trained here (no download): the streamed text is the prompt plus the decoded greedy tokens, sampling is
reproducible with --seed, int8/bf16 run, bad arguments print usage and exit 2."""
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


def test_missing_tokenizer(model_dir, tmp_path, capsys):
    for f in ("config.json", "model.safetensors"):
        (tmp_path / f).write_bytes((model_dir / f).read_bytes())
    with pytest.raises(SystemExit) as exc:
        run(tmp_path, "--prompt", "hi")
    assert exc.value.code == 2 and "no tokenizer.json" in capsys.readouterr().err


def test_module_entry_point(model_dir):
    out = subprocess.run([sys.executable, "-m", "pytransformer", "generate", "--model", str(model_dir), "--prompt",
                          "hello", "--max-new-tokens", "4", "--threads", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello") and "tokens/s" in out.stderr
