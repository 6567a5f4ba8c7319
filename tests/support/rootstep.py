"""What a root deploy on the test hosts leaves in this machine's /etc, which the hosts share
(the fence, the GPU fact, the service group and user), and its removal, where a test made it."""
import grp
import os
import pwd
import subprocess

FENCE_FILE = "/etc/tfcluster-firewall.nft"
GPU_FACT = "/etc/ansible/facts.d/gpus.fact"


def netns_nft(testhosts, host, *args):
    return subprocess.run(testhosts.netns_argv(host) + ["nft", *args], capture_output=True,
                          text=True, timeout=30)


def root_step_state():
    """(what a root deploy may make in the shared /etc, whether each exists now), for
    remove_root_step."""
    made = [FENCE_FILE, GPU_FACT, os.path.dirname(GPU_FACT), os.path.dirname(os.path.dirname(GPU_FACT))]
    before = {path: os.path.exists(path) for path in made}
    for name, lookup in (("group", grp.getgrnam), ("user", pwd.getpwnam)):
        try:
            before[name] = lookup("tfcluster") is not None
        except KeyError:
            before[name] = False
    return made, before


def remove_root_step(testhosts, made, before):
    """The fence (each host's namespace and the shared /etc), the GPU fact and the service
    group and user, where the deploy made them (BEFORE: what existed before it)."""
    if testhosts.is_up:
        for name, _ in testhosts.hosts[:3]:  # the fence lives in each host's namespace
            netns_nft(testhosts, name, "delete", "table", "inet", "tfcluster")
    for path in made:  # files first, then the folders the GPU fact needed
        if not before[path] and os.path.isfile(path):
            os.unlink(path)
        elif not before[path] and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
    if not before["user"]:
        subprocess.run(["userdel", "tfcluster"], capture_output=True)
    if not before["group"]:
        subprocess.run(["groupdel", "tfcluster"], capture_output=True)
