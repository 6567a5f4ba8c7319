"""Putting code on hosts: the deploy playbooks' runner, `tfcluster sync`, and the offline wheelhouse with its packed venv."""
