"""An inventory of the test hosts (support.testhosts) as a user writes one for SSH."""
import sys

from support import REPO


def ssh_inventory(testhosts, tmp_path, known_hosts=None, connect_timeout=5):
    (ps_name, ps_addr), (w1, a1), (w2, a2) = testhosts.hosts[:3]
    text = """all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: {key}
    tfcluster_known_hosts: {known}
    tfcluster_root: {repo}
    tfcluster_python: {python}
    tfcluster_workdir: {work}
    tfcluster_connect_timeout: {timeout}
    tfcluster_port_base: 24000
  children:
    ps:
      hosts:
        {ps_name}: {{ansible_host: {ps_addr}}}
    worker:
      hosts:
        {w1}: {{ansible_host: {a1}}}
        {w2}: {{ansible_host: {a2}}}
""".format(key=testhosts.key, known=known_hosts or testhosts.known_hosts, repo=REPO,
           python=sys.executable, timeout=connect_timeout,
           # Each host's own /opt: hosts share every other folder, and a run folder is one
           # machine's alone (an agent never adopts a folder another agent created).
           work="/opt/tfc-ssh/%s/work" % tmp_path.name,
           ps_name=ps_name, ps_addr=ps_addr, w1=w1, a1=a1, w2=w2, a2=a2)
    path = tmp_path / "ssh.yml"
    path.write_text(text)
    return str(path)
