#!/usr/bin/python
"""The tokens of folders several machines may share (a home on NFS): deploy.yml runs this module
to find the machines that write a shared tfcluster_root or data folder once."""

DOCUMENTATION = r"""
module: folder_tokens
short_description: Name each folder by the token in its marker, made where it has none
description:
  - Each folder is named by the marker file tfcluster_agent/shares.py makes in it
    (C(.tfcluster-folder-id)), holding a random token; machines that read the same token see the
    same folder, whatever its path or file system.
  - A folder without a marker gets one (made atomically, so two machines making it at once read
    one token back); in check mode nothing is made and such a folder counts as nobody else's.
  - A folder that cannot hold a marker (not writable) has no token.
options:
  paths: {description: The folders., type: list, elements: str, required: true}
author: [tfcluster developers]
"""

RETURN = r"""
tokens: {description: Each folder's token, null where it has none., type: dict, returned: always}
made: {description: The folders whose marker this run made (would make, in check mode)., type: list, elements: str, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.tfcluster.cluster.plugins.module_utils.shares import folder_id


def main():
    module = AnsibleModule(argument_spec={
        "paths": {"type": "list", "elements": "str", "required": True},
    }, supports_check_mode=True)
    tokens, made = {}, []
    for path in module.params["paths"]:
        tokens[path] = folder_id(path, create=False)
        if tokens[path] is None:
            if not module.check_mode:
                tokens[path] = folder_id(path)
            if tokens[path] or module.check_mode:
                made.append(path)
    module.exit_json(changed=bool(made), tokens=tokens, made=made)


if __name__ == "__main__":
    main()
