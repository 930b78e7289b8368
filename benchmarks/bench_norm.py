"""LayerNorm / RMSNorm vs F.layer_norm / F.rms_norm: see pytransformer/bench/norm.py (shared with the CLI)."""
from pytransformer.bench.norm import main

if __name__ == "__main__":
    main()
