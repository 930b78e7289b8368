"""int8_linear vs F.linear: see pytransformer/bench/int8_linear.py (shared with the CLI)."""
from pytransformer.bench.int8_linear import main

if __name__ == "__main__":
    main()
