"""Layer 4, the agent runtime: CheckpointedAgent, IdempotentToolRunner, Worker, policies, resume.
"""
