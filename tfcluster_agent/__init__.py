"""The host agent: one per machine per run; standard library only (see agent.py)."""


def main(argv):
    """The agent's command line (commands.py) with its compiled code in the user's cache, never
    next to the deployed code, whose hash is checked: how the controller starts it
    (tfcluster/hosts.py) and what `python -B ROOT/tfcluster_agent serve` runs (__main__.py)."""
    import os
    import sys
    sys.pycache_prefix = sys.pycache_prefix or os.path.join(
        os.path.expanduser("~"), ".cache", "tfcluster", "pycache")
    sys.dont_write_bytecode = False
    from tfcluster_agent.commands import main as run
    sys.exit(run(argv))
