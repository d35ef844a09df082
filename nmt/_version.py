"""The package version, in a module of its own so that any part (the checkpoint file format in
``nmt.utils`` included) can read it without importing the package's face (``nmt/__init__``)."""

__version__ = "0.1.0"
