"""tfcluster agent's command line, standard library only: every piece of Python the controller
or a playbook runs on a host, as `python -B ROOT/tfcluster_agent COMMAND ...` (the controller
starts the same without runpy: tfcluster/hosts/links.py).

  serve                                   every launch, on every host: the agent (agent.py)
  stop --dir FOLDER [--grace S]           stop a run folder's tasks (playbooks/stop.yml)
  hash [--dir ROOT]                       the host code's hash (deploy.yml, on the controller)
  root                                    the folder holding this package and trainers/
                                          (deploy.yml's tfcluster_src, on the controller)
  write-hash ROOT [FILE] [--check]        trainers.sha256 (the trainers role)
  sync-list ROOT SKIP AREA...             the files tfcluster sync compares (codesync.py)
  sync-apply ROOT                         tfcluster sync's files from a tar on stdin
  shares ensure [--read-only] PATH...     the tokens of folders machines share (shares.py)
  stamp check|write|forget|inputs ...     deploy.yml's deploy stamp (deploystamp.py)
  verify ROOT                             deploy.yml's last check: TensorFlow and the code hash

Each command's module is imported when it runs: a launch's `serve` pays for none of the others,
and `sync-apply` hashes the code with the hostcode.py it has just written."""
import os
import sys


def cmd_serve(argv):
    from tfcluster_agent.agent import Agent
    Agent().serve()
    # Its work is done and written (files closed, answers flushed; the supervisors are processes
    # of their own): an interpreter's shutdown would only add time to every host's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_stop(argv):
    """Stop every task of a run folder (playbooks/stop.yml); verified identities only."""
    import argparse
    from tfcluster_agent import jsonc as json
    from tfcluster_agent import supervisor as S
    from tfcluster_agent.supervisor import is_task_name
    parser = argparse.ArgumentParser(prog="tfcluster_agent stop",
                                     description="stop every task of a run folder (TERM, then KILL)")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--grace", type=float, default=10)
    args = parser.parse_args(argv)
    names = [n for n in S.task_names(args.dir) if is_task_name(n)]
    result = {name: S.stop_task(args.dir, name, args.grace) for name in names}
    print(json.dumps({"tasks": result,
                      "remaining": [n for n in names if S.task_state(args.dir, n)["alive"]]}))
    return 0


def code_root():
    """The folder holding this package (and trainers/ beside it)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cmd_hash(argv):
    import argparse
    from tfcluster_agent.hostcode import code_hash
    parser = argparse.ArgumentParser(
        prog="tfcluster_agent hash",
        description="print the host code's content hash (agent and trainers)")
    parser.add_argument("--dir", default=code_root(), help="the code root holding both packages")
    print(code_hash(parser.parse_args(argv).dir))
    return 0


def cmd_root(argv):
    print(code_root())
    return 0


def cmd_write_hash(argv):
    """`write-hash ROOT [FILE] [--check]`: {"hash", "changed"}; --check (a dry run) writes
    nothing."""
    from tfcluster_agent import jsonc as json
    from tfcluster_agent.hostcode import write_hash
    paths = [a for a in argv if a != "--check"]
    if len(paths) not in (1, 2):
        return usage("write-hash ROOT [FILE] [--check]")
    print(json.dumps(write_hash(*paths, dry_run="--check" in argv)))
    return 0


def cmd_sync_list(argv):
    from tfcluster_agent import codesync
    return codesync.list_command(argv) if len(argv) >= 2 else usage("sync-list ROOT SKIP AREA...")


def cmd_sync_apply(argv):
    from tfcluster_agent import codesync
    return codesync.apply_command(argv[0]) if len(argv) == 1 else usage("sync-apply ROOT")


def cmd_shares(argv):
    from tfcluster_agent import shares
    return shares.main(argv)


def cmd_stamp(argv):
    from tfcluster_agent import deploystamp
    return deploystamp.main(argv)


def cmd_verify(argv):
    from tfcluster_agent.hostinfo import deploy_report
    from tfcluster_agent import jsonc as json
    if len(argv) != 1:
        return usage("verify ROOT")
    print(json.dumps(deploy_report(argv[0])))
    return 0


COMMANDS = {"serve": cmd_serve, "stop": cmd_stop, "hash": cmd_hash, "root": cmd_root,
            "write-hash": cmd_write_hash, "sync-list": cmd_sync_list,
            "sync-apply": cmd_sync_apply, "shares": cmd_shares, "stamp": cmd_stamp,
            "verify": cmd_verify}


def usage(line=None):
    sys.stderr.write("usage: tfcluster_agent %s\n" % line if line else __doc__)
    return 2


def main(argv=None):
    """Run the command ARGV names; its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    command = COMMANDS.get(argv[0]) if argv else None
    if command is None:
        return usage()
    return command(argv[1:])
