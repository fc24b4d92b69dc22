"""``python -m mcruntime``: the same command line as the ``mcruntime`` console script."""

from mcruntime._cli.main import entry_point

if __name__ == "__main__":
    entry_point()
