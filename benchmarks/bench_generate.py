"""DecoderLM generate tokens/s against Hugging Face and CTranslate2 (GPT-2 or Llama shape): see
pytransformer/bench/generate.py."""
from pytransformer.bench.generate import main

if __name__ == "__main__":
    main()
