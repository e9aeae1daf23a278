"""The package's version, a leaf every layer may read (the manifest's toolchain, the server's ``/v2``)."""

__version__ = "0.1.0"
