"""Layer 3, the store: CheckpointStore (commit, load, compaction, retention, sharing), artifacts by
content, and leases for several workers.
"""
