"""The host agent: one per machine per run; standard library only (see agent.py)."""


def main(argv):
    """The agent's command line (commands.py) with its compiled code in the user's cache, never
    next to the deployed code, whose hash is checked: how the controller starts it
    (tfcluster/hosts/links.py) and what `python -B ROOT/tfcluster_agent serve` runs (__main__.py)."""
    import os
    import sys
    if not sys.pycache_prefix:
        from tfcluster_agent.cachedir import home_cache
        folder = home_cache()  # None without a usable home: nothing compiled is kept
        sys.pycache_prefix = folder and os.path.join(folder, "pycache")
    sys.dont_write_bytecode = not sys.pycache_prefix
    from tfcluster_agent.commands import main as run
    sys.exit(run(argv))
