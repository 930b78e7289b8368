"""decode_attention vs SDPA: see pytransformer/bench/decode_attention.py (shared with the CLI)."""
from pytransformer.bench.decode_attention import main

if __name__ == "__main__":
    main()
