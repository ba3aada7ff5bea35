"""Bridges from agent frameworks to ckptfs storage; each needs its optional extra.

`ckptfs.integrations.langgraph.saver.CkptfsSaver` needs `pip install 'ckptfs[langgraph]'`. Nothing is
imported here, so `import ckptfs` never pulls in a framework.
"""
