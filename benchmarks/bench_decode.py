"""decode_attention / kv_cache_append vs PyTorch: see pytransformer/bench/decode.py (shared with the CLI)."""
from pytransformer.bench.decode import main

if __name__ == "__main__":
    main()
