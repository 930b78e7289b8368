"""masked_softmax vs masked_fill + torch.softmax: see pytransformer/bench/softmax.py (shared with the CLI)."""
from pytransformer.bench.softmax import main

if __name__ == "__main__":
    main()
