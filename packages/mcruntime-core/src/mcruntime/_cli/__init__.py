"""The ``mcruntime`` command line: ``mcruntime run pkg.module:factory`` and friends (the top layer)."""
