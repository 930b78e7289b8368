"""linear (and int8_linear) vs F.linear: see pytransformer/bench/linear.py (shared with the CLI)."""
from pytransformer.bench.linear import main

if __name__ == "__main__":
    main()
