"""Layer 1, the on-disk format: models, codec, record bodies, key names, and the one reader.

Pure: no I/O beyond what a caller hands in, nothing above imported.
"""
