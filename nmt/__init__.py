"""nmt: sequence-to-sequence learning with sparse and structured probability mappings."""

__version__ = "0.1.0"
