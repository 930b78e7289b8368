"""DecoderLM generate tokens/s (KV cache, no cache) vs Hugging Face GPT-2: see pytransformer/bench/generate.py."""
from pytransformer.bench.generate import main

if __name__ == "__main__":
    main()
