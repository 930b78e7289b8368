"""Broken checkpoint folders fail loudly and exactly: every failure of from_pretrained is one ValueError
(FileNotFoundError for a missing path) whose message names the file and the field or tensor, raised from the config
and the safetensors headers before the model is allocated. Also the decisions on tied heads that differ, integer
weights and BertFor* task heads, and generate's checks of key_lengths, eos lists and learned positions."""
import json
import re

import pytest
import torch

from pytransformer.models import DecoderLM, EncoderModel

from tests.models.test_hf_checkpoints import DECODERS, V, _copy, _random_norms, transformers, safetensors_torch

LLAMA_Q = "model.layers.0.self_attn.q_proj.weight"  # [64, 64]; k_proj and v_proj [32, 64]; gate/up [128, 64]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> save_pretrained directory: llama (tied), llama3 (untied), gpt2 (sharded), bert, bert_cls."""
    out = {}
    for i, name in enumerate(("llama", "llama3", "gpt2")):
        torch.manual_seed(i)
        out[name] = tmp_path_factory.mktemp(name)
        _random_norms(DECODERS[name]()).save_pretrained(out[name], **({"max_shard_size": "100KB"} if name == "gpt2"
                                                                       else {}))
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)
    for name, build in (("bert", transformers.BertModel), ("bert_cls", transformers.BertForSequenceClassification)):
        out[name] = tmp_path_factory.mktemp(name)
        build(config).save_pretrained(out[name])
    return out


def _rewrite(path, change):
    """model.safetensors of `path` rewritten as change(tensors dict) leaves it."""
    tensors = safetensors_torch.load_file(path / "model.safetensors")
    change(tensors)
    safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _raises(path, match, cls=DecoderLM, error=ValueError):
    """from_pretrained raises `error` matching `match`, its message starting with a file of `path`."""
    with pytest.raises(error, match=match) as e:
        cls.from_pretrained(path)
    assert str(e.value).startswith(str(path)), str(e.value)
    return str(e.value)


def _resized(name, rows):
    def change(t):
        t[name] = torch.randn(rows, t[name].shape[1])
    return change


@pytest.mark.parametrize("changes, match", [
    ({LLAMA_Q: 72, LLAMA_Q.replace("q_proj", "k_proj"): 24}, r"q_proj.weight: shape \[72, 64\] does not fit "
                                                               r"decoder.layers.0.self_attn.qkv_proj.weight"),
    ({"model.layers.1.mlp.gate_proj.weight": 129, "model.layers.1.mlp.up_proj.weight": 127},
     r"layers.1.mlp.gate_proj.weight: shape \[129, 64\] .* needs \[128, 64\] \(intermediate_size = 128\)"),
])
def test_fused_parts_are_checked_one_by_one(folders, tmp_path, changes, match):
    """Item 3: q|k|v and gate|up of the right total rows but wrong parts are refused, naming the part."""
    path = _copy(folders["llama"], tmp_path / "parts")
    for name, rows in changes.items():
        _rewrite(path, _resized(name, rows))
    _raises(path, match)


@pytest.mark.parametrize("name, changes, match", [
    ("llama", {"vocab_size": 200}, r"model.safetensors: model.embed_tokens.weight: shape \[100, 64\] does not fit "
                                   r"embed.tok.weight of the config, which needs \[200, 64\] \(vocab_size = 200\)"),
    ("llama", {"vocab_size": 3e8}, r"config.json: vocab_size: 300000000 is larger than any tensor of the checkpoint "
                                   r"\(the largest, model\.\S+ in \S+model.safetensors, has \d+ elements\)"),
    ("llama", {"intermediate_size": 10 ** 9}, r"config.json: intermediate_size: 1000000000 is larger than any tensor"),
    ("gpt2", {"n_positions": 10 ** 10}, r"config.json: n_positions: 10000000000 is larger than any tensor of the "
                                        r"checkpoint \(the largest, transformer\.\S+ in \S+model-\d+-of-\d+\."),
    ("bert", {"hidden_size": 10 ** 10}, r"config.json: hidden_size: 10000000000 is larger than any tensor"),
    ("llama", {"num_hidden_layers": 10 ** 9}, r"config.json: num_hidden_layers: 1000000000 layers, but the checkpoint"
                                              r" holds only \d+ tensors"),
])
def test_absurd_sizes_fail_from_the_headers(folders, tmp_path, name, changes, match):
    """Item 4: a size that disagrees with the tensors fails naming the field and the tensor, from the headers before
    any allocation (a 77 GB embedding for vocab_size 3e8 otherwise); a size no tensor could hold fails before the
    model is even built on the meta device (hidden_size 1e10 overflows its sizes there)."""
    _raises(_copy(folders[name], tmp_path / "big", **changes), match, EncoderModel if name == "bert" else DecoderLM)


def test_duplicated_tensors(folders, tmp_path):
    """Item 5: one tensor under two names, in two shards, or in a shard its index does not list it in."""
    path = _rewrite(_copy(folders["llama"], tmp_path / "two_names"),
                    lambda t: t.update({"norm.weight": t["model.norm.weight"].clone()}))
    _raises(path, r"model.safetensors: tensors '(model\.)?norm.weight' and '(model\.)?norm.weight' are both "
                  r"'norm.weight' \(duplicated\)")
    shards = _copy(folders["gpt2"], tmp_path / "two_shards")
    index = json.loads((shards / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))[:2]
    moved = next(n for n, f in index["weight_map"].items() if f == first)
    tensors = safetensors_torch.load_file(shards / second)
    tensors[moved] = safetensors_torch.load_file(shards / first)[moved]
    safetensors_torch.save_file(tensors, shards / second, metadata={"format": "pt"})
    _raises(shards, rf"{second}: tensor '{re.escape(moved)}' is also in .*{first} \(duplicated\)")
    index["weight_map"][moved] = second  # now the first shard holds it where the index lists it in the second
    (shards / "model.safetensors.index.json").write_text(json.dumps(index))
    _raises(shards, rf"{first}: tensor '{re.escape(moved)}' is listed in model.safetensors.index.json under {second}")


def _edit_config(path, edit):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(edit(config))


@pytest.mark.parametrize("edit, match", [
    (lambda c: json.dumps([c]), r"config.json: expected a JSON object of config fields, got list"),
    (lambda c: json.dumps({k: v for k, v in c.items() if k != "hidden_size"}), r"config.json: hidden_size: missing"),
    (lambda c: json.dumps({**c, "num_attention_heads": 0}), r"config.json: num_attention_heads: expected an integer "
                                                            r">= 1, got 0"),
    (lambda c: json.dumps({**c, "vocab_size": -5}), r"config.json: vocab_size: expected an integer >= 1, got -5"),
    (lambda c: json.dumps({**c, "hidden_size": "64"}), r"config.json: hidden_size: expected an integer >= 1, got '64'"),
    (lambda c: json.dumps({**c, "rms_norm_eps": "small"}), r"config.json: rms_norm_eps: expected a number"),
    (lambda c: json.dumps({**c, "tie_word_embeddings": "yes"}), r"config.json: tie_word_embeddings: expected true or "
                                                                r"false"),
    (lambda c: json.dumps({**c, "num_key_value_heads": 3}), r"config.json: num_key_value_heads: 3 does not divide "
                                                            r"num_attention_heads 4"),
    (lambda c: json.dumps(c)[:-9], r"config.json: not valid JSON"),
])
def test_config_errors_are_value_errors_naming_file_and_field(folders, tmp_path, edit, match):
    """Item 6: a JSON list, a missing, zero, negative, string or indivisible size, invalid JSON."""
    path = _copy(folders["llama"], tmp_path / "config")
    _edit_config(path, edit)
    _raises(path, match)


@pytest.mark.parametrize("index, match", [({"metadata": {}}, r"index.json: weight_map: expected a JSON object"),
                                          ({"weight_map": {"a": "../model.safetensors"}}, r"weight_map: expected"),
                                          ({"weight_map": []}, r"weight_map: expected")])
def test_index_without_weight_map(folders, tmp_path, index, match):
    path = _copy(folders["gpt2"], tmp_path / "index")
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _raises(path, match)


@pytest.mark.parametrize("cut", [10, 0.5, -4])
def test_truncated_or_corrupt_safetensors(folders, tmp_path, cut):
    """Item 2: a safetensors file cut inside its header or its data, or a header overwritten, is a ValueError naming
    the file (SafetensorError otherwise)."""
    path = _copy(folders["llama"], tmp_path / "cut")
    data = (path / "model.safetensors").read_bytes()
    if cut == -4:
        data = data[:8] + b"\xff" * 16 + data[24:]  # the JSON header overwritten
    else:
        data = data[:cut if isinstance(cut, int) else int(len(data) * cut)]
    (path / "model.safetensors").write_bytes(data)
    _raises(path, r"model.safetensors: not a readable safetensors file")


def test_model_type_is_named_first(folders, tmp_path):
    """Item 7: a BERT folder (here with an activation we do not support) given to DecoderLM names model_type."""
    path = _copy(folders["bert"], tmp_path / "bert", hidden_act="quick_gelu")
    _raises(path, r"config.json: model_type: 'bert' is not a DecoderLM architecture \(those are \['gemma3_text', "
                  r"'gpt2', 'llama', 'mistral', 'phi3', 'qwen2', 'qwen3'\]\)")
    _raises(_copy(folders["llama"], tmp_path / "llama"), r"model_type: 'llama' is not a EncoderModel", EncoderModel)


def test_tied_head_that_differs_is_refused(folders, tmp_path):
    """Item 10: a tied config whose file holds a different lm_head.weight is refused (naming the field to change); an
    equal one is skipped; untied, it is used."""
    path = _rewrite(_copy(folders["llama"], tmp_path / "tied"),
                    lambda t: t.update({"lm_head.weight": torch.randn_like(t["model.embed_tokens.weight"])}))
    _raises(path, r"lm_head.weight: differs from the embedding model.embed_tokens.weight while tie_word_embeddings is "
                  r"true \(set it to false")
    _rewrite(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model = DecoderLM.from_pretrained(path)
    assert model.lm_head.weight is model.embed.tok.weight
    _edit_config(path, lambda c: json.dumps({**c, "tie_word_embeddings": False}))
    untied = DecoderLM.from_pretrained(path)
    assert untied.lm_head.weight is not untied.embed.tok.weight
    assert torch.equal(untied.lm_head.weight, untied.embed.tok.weight)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.int8])
def test_integer_weights_are_refused(folders, tmp_path, dtype):
    """Item 10: an integer or bool weight is refused, naming it and its dtype, never cast to float."""
    path = _rewrite(_copy(folders["llama3"], tmp_path / "int"),
                    lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=dtype)}))
    _raises(path, r"model.safetensors: model.norm.weight: dtype (I64|BOOL|I8) is not a floating-point type")


def test_bert_for_sequence_classification_is_read(folders):
    """Item 10: a BertFor* folder loads its encoder and pooler (classifier.* is a task head, skipped)."""
    hf = transformers.BertForSequenceClassification.from_pretrained(folders["bert_cls"]).eval()
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        expected = hf.bert(ids)
        ours = EncoderModel.from_pretrained(folders["bert_cls"])
        hidden = ours(ids)
        torch.testing.assert_close(hidden, expected.last_hidden_state, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.pool(hidden), expected.pooler_output, atol=1e-4, rtol=1e-4)


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        DecoderLM.from_pretrained(tmp_path / "nowhere")


# generate's arguments (item 8) and EOS lists (item 1)


@pytest.fixture(scope="module")
def gpt2(folders):
    return DecoderLM.from_pretrained(folders["gpt2"])


@pytest.mark.parametrize("lengths, match", [([6, 0], r"each in \[1, 6\]"), ([6, -2], r"each in \[1, 6\]"),
                                            ([6, 9], r"each in \[1, 6\]"), ([6, 5, 4], r"shape \[2\]"),
                                            ([[6, 5]], r"shape \[2\]"), ([6.0, 5.0], r"integer tensor")])
def test_generate_checks_key_lengths(gpt2, lengths, match):
    with pytest.raises(ValueError, match=r"key_lengths: expected .*" + match):
        gpt2.generate(torch.randint(0, V, (2, 6)), 3, key_lengths=torch.tensor(lengths))


def test_generate_stops_at_learned_positions(gpt2):
    """GPT-2's learned positions end at n_positions (256 here): more tokens are a ValueError, not an IndexError."""
    ids = torch.randint(0, V, (1, 250))
    assert gpt2.generate(ids, 6).shape == (1, 256)
    with pytest.raises(ValueError, match=r"max_new_tokens: 250 prompt tokens \+ 7 new ones exceed the model's 256 "
                                         r"learned positions"):
        gpt2.generate(ids, 7)


def test_generate_stops_at_any_eos_of_a_list(gpt2):
    """eos_id may be a list: any of its ids ends a row, which then continues with the first id; otherwise the tokens
    are those of eos_id=<that id>."""
    for _ in range(20):  # row 0 emits `stop` among its first 4 greedy tokens, row 1 never: row 0 ends first
        ids = torch.randint(0, V, (2, 5))
        greedy = gpt2.generate(ids, 12)[:, 5:]
        stops = [int(t) for t in greedy[0, :4] if t not in greedy[1]]
        if stops:
            break
    stop = stops[0]
    single = gpt2.generate(ids, 12, eos_id=stop)[:, 5:]
    unused = next(t for t in range(V) if t not in single)
    out = gpt2.generate(ids, 12, eos_id=[unused, stop])[:, 5:]
    ended = (single == stop).long().cumsum(1)
    after = torch.cat([torch.zeros_like(ended[:, :1]), ended[:, :-1]], 1) > 0  # after the first stop
    assert after[0].any() and torch.equal(out, single.masked_fill(after, unused))
    with pytest.raises(ValueError, match=r"eos_id: expected None, an int or a non-empty list of ints"):
        gpt2.generate(ids, 2, eos_id=[])


def test_beam_search_stops_at_any_eos_of_a_list(gpt2):
    """Beam search with an eos_id list: each row's best beam continues with the first id after any of them."""
    ids = torch.randint(0, V, (3, 5))
    greedy = gpt2.generate(ids, 6)[:, 5:]
    eos = greedy[:, :3].flatten().unique().tolist()  # each row's greedy path meets one in its first 3 tokens
    out = gpt2.generate(ids, 12, eos_id=eos, beam_size=3)[:, 5:]
    ended = [row for row in out if torch.isin(row, torch.tensor(eos)).any()]
    assert ended
    for row in ended:
        first = int(torch.isin(row, torch.tensor(eos)).nonzero()[0, 0])
        assert (row[first + 1:] == eos[0]).all(), (row, eos)
