"""An inventory of the test hosts (support.testhosts) as a user writes one for SSH."""
import sys

from support import REPO


def hosts_inventory(testhosts, path, groups, workdir, port_base=24000, known_hosts=None,
                    connect_timeout=5):
    """An inventory written to PATH (returned as a string) of the test hosts that GROUPS names
    ({group: [host number, from 1]}), as root over SSH, with WORKDIR as every host's run folder."""
    lines = ["all:", "  vars:", "    ansible_user: root",
             "    ansible_ssh_private_key_file: %s" % testhosts.key,
             "    tfcluster_known_hosts: %s" % (known_hosts or testhosts.known_hosts),
             "    tfcluster_root: %s" % REPO, "    tfcluster_python: %s" % sys.executable,
             "    tfcluster_workdir: %s" % workdir,
             "    tfcluster_connect_timeout: %s" % connect_timeout,
             "    tfcluster_port_base: %d" % port_base, "  children:"]
    for group, numbers in groups.items():
        lines += ["    %s:" % group, "      hosts:"]
        lines += ["        %s: {ansible_host: %s}" % testhosts.hosts[i - 1] for i in numbers]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def ssh_inventory(testhosts, tmp_path, known_hosts=None, connect_timeout=5):
    """ps:0 on the first test host, a worker on each of the next two."""
    # Each host's own /opt: hosts share every other folder, and a run folder is one machine's
    # alone (an agent never adopts a folder another agent created).
    return hosts_inventory(testhosts, tmp_path / "ssh.yml", {"ps": [1], "worker": [2, 3]},
                           "/opt/tfc-ssh/%s/work" % tmp_path.name, known_hosts=known_hosts,
                           connect_timeout=connect_timeout)
