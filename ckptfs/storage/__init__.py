"""Layer 2, storage: one small API over an fsspec URL, one backend per module, a scheme registry,
and the wrappers (retry, record log) that add behaviour around a backend.
"""
