"""Tramontane: offline multimodal chat for Mistral 3-family GGUF models.

The source folders app/, engine/, kernels/ and resources/ are installed as
tramontane.app, tramontane.engine, tramontane.kernels and tramontane.resources.
"""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("tramontane")
except PackageNotFoundError:  # running from a bundle without metadata
    __version__ = "0+unknown"
