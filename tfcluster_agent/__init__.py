"""The host agent: one per machine per run; standard library only (see agent.py)."""
