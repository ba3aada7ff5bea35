"""Layer 5, maintenance: verify (never writes) and prune (retention and artifact collection).
"""
