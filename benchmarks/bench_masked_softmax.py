"""masked_softmax vs masked_fill + torch.softmax: see pytransformer/bench/masked_softmax.py (shared with the CLI)."""
from pytransformer.bench.masked_softmax import main

if __name__ == "__main__":
    main()
