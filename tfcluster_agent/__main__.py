"""`python -B ROOT/tfcluster_agent serve`: the agent as the controller starts it on every host.

Run as a script, agent.py would be compiled at every start; imported from here, it and the
modules it needs are compiled once, into the user's cache (never next to the deployed code,
whose hash is checked)."""
import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.pycache_prefix = sys.pycache_prefix or os.path.join(
    os.path.expanduser("~"), ".cache", "tfcluster", "pycache")
sys.dont_write_bytecode = False

from tfcluster_agent.commands import main  # noqa: E402

main()
