"""PyGPUkit: a small, fast GPU runtime for Python."""
__version__ = "0.1.0"
