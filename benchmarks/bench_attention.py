"""Attention vs F.scaled_dot_product_attention (and peak memory): see pytransformer/bench/attention.py (shared with
the CLI)."""
from pytransformer.bench.attention import main

if __name__ == "__main__":
    main()
