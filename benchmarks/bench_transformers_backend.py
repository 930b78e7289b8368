"""transformers generate with the "sdpa" and "pytransformer" attention backends, our linears patched in (float32,
bfloat16, int8) and our DecoderLM, on one model and prompt: see pytransformer/bench/transformers_backend.py."""
from pytransformer.bench.transformers_backend import main

if __name__ == "__main__":
    main()
