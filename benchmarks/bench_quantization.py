"""Weight-only int8 DecoderLM: size, logits error and generate tokens/s vs float: see
pytransformer/bench/quantization.py."""
from pytransformer.bench.quantization import main

if __name__ == "__main__":
    main()
