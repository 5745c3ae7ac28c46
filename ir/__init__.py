"""The graph IR of PyGPUkit."""
