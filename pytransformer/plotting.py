"""matplotlib, an optional extra (`pip install 'pytransformer[plot]'`), for the demo's figures and `bench --plot`."""

INSTALL_HINT = "plots need matplotlib: pip install 'pytransformer[plot]' (or pip install matplotlib)"


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend; ImportError saying how to install it when it is missing."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
