#!/usr/bin/python
"""The tensorflow role's install of scripts/wheelhouse's packed venv on a host."""

DOCUMENTATION = r"""
module: venv_unpack
short_description: Install a packed venv (tar.zst) as a host's venv, whole or not at all
description:
  - Unpacks the archive into a fresh folder beside the venv, rewrites the build folder's path in
    the venv's scripts and pyvenv.cfg, writes the install record, then swaps the folder in (an
    interrupted run leaves the old venv or none). The archive is removed as soon as it is open.
  - Inflates with the host's libzstd1 through ctypes (plugins/module_utils/venv_pack.py).
options:
  archive: {description: The packed venv on the host., type: path, required: true}
  venv: {description: Where the venv goes., type: path, required: true}
  prefix: {description: The folder the pack was built in., type: str, required: true}
  record: {description: What the venv's tfcluster-installed records., type: str, required: true}
author: [tfcluster developers]
"""

RETURN = r"""
venv: {description: The venv installed., type: str, returned: success}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.tfcluster.cluster.plugins.module_utils.venv_pack import UnpackError, main as install


def main():
    module = AnsibleModule(argument_spec={
        "archive": {"type": "path", "required": True},
        "venv": {"type": "path", "required": True},
        "prefix": {"type": "str", "required": True},
        "record": {"type": "str", "required": True},
    })
    params = module.params
    try:
        install(params["archive"], params["venv"], params["prefix"], params["record"])
    except (UnpackError, OSError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=True, venv=params["venv"])


if __name__ == "__main__":
    main()
