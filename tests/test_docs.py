"""Every documented snippet runs. README.md and docs/*.md: each ```python block runs in a namespace of its own holding
the names that its `<!-- names: a, b -->` comment (the line before the block) lists, built by NAMES below; a block
after `<!-- signatures -->` lists signatures, not code, and is not run. Each `python -m pytransformer ...` line of the
```bash, ```sh and ```console blocks (a usage synopsis too: `[--opt X]`) parses: its command's --help lists every
option the line uses, and so does each `bash SCRIPT ...` line's script of the repository. Each `pt.` or
`pytransformer.` name in inline code resolves."""
import contextlib
import importlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

import pytransformer
from pytransformer.__main__ import main

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
MARKER = re.compile(r"<!--\s*(names:(?P<names>[^>]*)|signatures)\s*-->\s*$")
SHELL = {"bash", "sh", "console"}

TINY_LLAMA = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": None, "eos_token_id": None}
TINY_GPT2 = {"vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "bos_token_id": None,
             "eos_token_id": None}
TINY_MARIAN = {"vocab_size": 100, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
               "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
               "decoder_ffn_dim": 128, "max_position_embeddings": 64, "pad_token_id": 99, "decoder_start_token_id": 99,
               "eos_token_id": 0, "scale_embedding": True}
TINY_BERT = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "max_position_embeddings": 64}


def _saved(tmp_path_factory, name, model):
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    return str(path)


# The names a snippet may assume: tiny objects (no download), built on first use.
NAMES = {
    "llama_dir": lambda tmp: _saved(tmp, "llama", transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**TINY_LLAMA))),
    "bert_dir": lambda tmp: _saved(tmp, "bert", transformers.BertModel(transformers.BertConfig(**TINY_BERT))),
    "hf_gpt2": lambda tmp: transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY_GPT2)).eval(),
    "marian_dir": lambda tmp: _saved(tmp, "marian", transformers.MarianMTModel(
        transformers.MarianConfig(**TINY_MARIAN))),
}


def fenced_blocks(languages):
    """(file:line, marker line, code) of every fenced block in DOCS whose language is in `languages`."""
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) in languages:
                start = text.count("\n", 0, m.start())
                before = text.splitlines()[start - 1] if start else ""
                yield f"{path.relative_to(ROOT)}:{start + 1}", before, m.group(2)


PYTHON_BLOCKS = [pytest.param(before, code, id=where) for where, before, code in fenced_blocks({"python"})]


def shell_lines():
    """(file:line, words) of every command line of the shell blocks (lines continued with a backslash or by
    indentation joined; comments, a `$ ` prompt and leading VAR=value assignments dropped)."""
    for where, _, code in fenced_blocks(SHELL):
        for line in re.sub(r"\n[ \t]+", " ", code.replace("\\\n", " ")).splitlines():
            words = shlex.split(line.removeprefix("$ "), comments=True)
            while words and re.match(r"\w+=", words[0]):
                words = words[1:]
            yield where, words


def cli_lines():
    """(argv after `python -m pytransformer`) of every such line of the shell blocks."""
    for where, words in shell_lines():
        if words[:3] == ["python", "-m", "pytransformer"]:
            yield pytest.param(words[3:], id=f"{where} {' '.join(words[3:5])}")


def script_lines():
    """(script, its arguments) of every `bash SCRIPT ...` line of the shell blocks whose script is in the
    repository."""
    for where, words in shell_lines():
        if words[:1] == ["bash"] and len(words) > 1 and (ROOT / words[1]).is_file():
            yield pytest.param(words[1], words[2:], id=f"{where} {words[1]}")


@pytest.fixture(scope="module")
def names(tmp_path_factory):
    """name -> its object, each built once."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = NAMES[name](tmp_path_factory)
        return built[name]
    return get


@pytest.mark.parametrize("before,code", PYTHON_BLOCKS)
def test_python_block_runs(before, code, names):
    marker = MARKER.search(before)
    if marker and not marker.group("names"):
        pytest.skip("a list of signatures")
    assumed = [n.strip() for n in marker.group("names").split(",")] if marker else []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        exec(compile(code, "<doc block>", "exec"), {n: names(n) for n in assumed})


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0, f"python -m pytransformer {command} --help failed"
    return out.getvalue()


@pytest.mark.parametrize("argv", list(cli_lines()))
def test_cli_line_parses(argv):
    unknown = _unknown_options(argv[1:], _help(argv[0]))
    assert unknown == [], f"options not in `python -m pytransformer {argv[0]} --help`: {unknown}"


def _unknown_options(args: list[str], usage: str) -> list[str]:
    """The options of args (`--opt`, `--opt=X`, `[--opt X]`) that `usage` does not name."""
    options = [w.lstrip("[").split("=")[0].rstrip("]") for w in args]
    return [o for o in options if o.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", usage)]


@pytest.mark.parametrize("script, args", list(script_lines()))
def test_script_line_parses(script, args):
    """A repository script's documented line uses only options its --help lists."""
    usage = subprocess.run(["bash", str(ROOT / script), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, f"bash {script} --help failed: {usage.stderr}"
    assert _unknown_options(args, usage.stdout) == [], f"options not in `bash {script} --help`"


def _resolves(dotted: str) -> bool:
    """Whether pytransformer.a.b... names a module or an attribute."""
    parts = dotted.split(".")
    obj = pytransformer
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            try:
                importlib.import_module(".".join(["pytransformer", *parts[1:i + 1]]))
            except ImportError:
                return False
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


def inline_names(text: str) -> list[str]:
    """The dotted names after `pt.` or `pytransformer.` in the inline code spans of text, as pytransformer.x.y."""
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    name = re.compile(r"(?<![\w.])(?:pt|pytransformer)\.([\w.]*\w)")
    return [f"pytransformer.{m}" for span in spans for m in name.findall(span)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_inline_names_resolve(path):
    assert [n for n in inline_names(path.read_text()) if not _resolves(n)] == []
