"""The wheel's one build step beyond pyproject.toml: the Ansible content (galaxy.yml, meta/,
playbooks/, plugins/, roles/, ansible.cfg) goes into the wheel as ansible_collections/tfcluster/cluster/,
copied from this checkout at build time, so they stay the one source (a link in
plugins/module_utils/ becomes the file it names). ansible-playbook finds collections on
sys.path: with the wheel installed, `ansible-playbook tfcluster.cluster.deploy` works anywhere.
An editable install (`make setup`) runs the checkout's playbooks/ instead."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

COLLECTION = os.path.join("ansible_collections", "tfcluster", "cluster")
# COLLECTION.md: the collection's README (galaxy.yml's readme); ansible.cfg: the settings
# `tfcluster deploy` runs the playbooks with (ANSIBLE_CONFIG); inventory/sample: what
# `tfcluster init --sample` copies.
CONTENT = ("galaxy.yml", "COLLECTION.md", "ansible.cfg", "meta", "playbooks", "plugins", "roles",
           os.path.join("inventory", "sample"))
ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithCollection(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, COLLECTION)
        shutil.rmtree(target, ignore_errors=True)
        for name in CONTENT:
            source = os.path.join(ROOT, name)
            if os.path.isdir(source):
                shutil.copytree(source, os.path.join(target, name),
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
            else:
                os.makedirs(target, exist_ok=True)
                shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithCollection})
