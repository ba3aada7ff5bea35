"""Layer 5, replication: mirror restore points to object storage and restore them elsewhere.
"""
