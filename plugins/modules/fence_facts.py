#!/usr/bin/python
"""What the firewall role needs to know about a host before it fences TensorFlow's ports, in one
run where five were."""

DOCUMENTATION = r"""
module: fence_facts
short_description: Read a host's nftables, systemd, SSH connection and name resolution
description:
  - Whether nft and systemd are there, the tables nft has loaded (when it is there), the address
    the controller connects from (C(SSH_CONNECTION)), and the addresses each name resolves to as
    the host resolves it. Reads only.
options:
  nft: {description: The nft program., type: str, required: true}
  names: {description: Host names to resolve., type: list, elements: str, default: []}
author: [tfcluster developers]
"""

RETURN = r"""
nft: {description: Whether the nft program is there., type: bool, returned: always}
systemd: {description: Whether systemd runs the host., type: bool, returned: always}
ssh: {description: SSH_CONNECTION of this session ("" without one)., type: str, returned: always}
tables: {description: "`nft list tables`: rc, stdout, stderr, stdout_lines; null without nft.", type: dict, returned: always}
resolved: {description: "Each name's addresses, [] where it does not resolve.", type: dict, returned: always}
"""

import os
import socket
import subprocess

from ansible.module_utils.basic import AnsibleModule


def fence_facts(nft, names):
    found = {"nft": os.path.exists(nft), "systemd": os.path.exists("/run/systemd/system"),
             "ssh": os.environ.get("SSH_CONNECTION", ""), "tables": None, "resolved": {}}
    if found["nft"]:
        run = subprocess.run([nft, "list", "tables"], capture_output=True, text=True)
        found["tables"] = {"rc": run.returncode, "stdout": run.stdout, "stderr": run.stderr,
                           "stdout_lines": run.stdout.splitlines()}
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            infos = []
        found["resolved"][name] = sorted({info[4][0].split("%")[0] for info in infos})
    return found


def main():
    module = AnsibleModule(argument_spec={
        "nft": {"type": "str", "required": True},
        "names": {"type": "list", "elements": "str", "default": []},
    }, supports_check_mode=True)
    module.exit_json(changed=False, **fence_facts(module.params["nft"], module.params["names"]))


if __name__ == "__main__":
    main()
