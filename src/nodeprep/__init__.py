"""nodeprep: prepare GPU nodes alike, prove they are alike, and launch training on them."""

__version__ = "0.1.0"
