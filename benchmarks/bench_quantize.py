"""Weight-only int8 DecoderLM: size, logits error and generate tokens/s vs float: see pytransformer/bench/quantize.py."""
from pytransformer.bench.quantize import main

if __name__ == "__main__":
    main()
