"""`python -B ROOT/tfcluster_agent serve`: the agent by hand. (The controller starts it the same
way without runpy, whose imports cost every start 4 ms: tfcluster/hosts/links.py.)"""
import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import tfcluster_agent  # noqa: E402

tfcluster_agent.main(sys.argv[1:])
