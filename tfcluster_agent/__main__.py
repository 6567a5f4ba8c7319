"""`python -B ROOT/tfcluster_agent COMMAND`: the agent's command line (commands.py), by hand and
from the playbooks. (The controller runs it the same way without runpy, whose imports cost every
start: tfcluster/hosts/links.py.)"""
import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import tfcluster_agent  # noqa: E402

tfcluster_agent.main(sys.argv[1:])
