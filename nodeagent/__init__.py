"""tether node agent: enrolls once, then pulls its plan and reports over one gRPC stream.

This package also holds the vocabulary every tether component speaks (``model``,
``secrets``, ``logs``), because it is the part that ships to nodes on its own.
"""

__version__ = "0.1.0"
