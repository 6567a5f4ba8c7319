"""tfcluster agent's command line: `serve` (every launch, on every host), `stop --dir FOLDER`
(playbooks/stop.yml) and `hash` (the deploy's code hash). Standard library only."""
import os
import sys

from tfcluster_agent import jsonc as json
from tfcluster_agent import supervisor as S
from tfcluster_agent.agent import Agent, is_task_name
from tfcluster_agent.hostcode import code_hash


def cmd_serve(args):
    Agent().serve()
    # Its work is done and written (files closed, answers flushed; the supervisors are processes
    # of their own): an interpreter's shutdown would only add 5 ms to every host's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_stop(args):
    """Stop every task of a run folder (playbooks/stop.yml); verified identities only."""
    names = [n for n in S.task_names(args.dir) if is_task_name(n)]
    result = {name: S.stop_task(args.dir, name, args.grace) for name in names}
    print(json.dumps({"tasks": result,
                      "remaining": [n for n in names if S.task_state(args.dir, n)["alive"]]}))


def cmd_hash(args):
    print(code_hash(args.dir))


def build_parser():
    import argparse
    parser = argparse.ArgumentParser(prog="agent.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    code_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sub.add_parser("serve", help="talk to the controller on stdin/stdout").set_defaults(
        func=cmd_serve)
    p = sub.add_parser("stop", help="stop every task of a run folder (TERM, then KILL)")
    p.add_argument("--dir", required=True)
    p.add_argument("--grace", type=float, default=10)
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("hash", help="print the host code's content hash (agent and trainers)")
    p.add_argument("--dir", default=code_root, help="the code root holding both packages")
    p.set_defaults(func=cmd_hash)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["serve"]:  # every launch on every host: no argparse for it
        return cmd_serve(None)
    args = build_parser().parse_args(argv)
    args.func(args)
