"""kv_cache_append vs a sliced copy_: see pytransformer/bench/kv_cache_append.py (shared with the CLI)."""
from pytransformer.bench.kv_cache_append import main

if __name__ == "__main__":
    main()
