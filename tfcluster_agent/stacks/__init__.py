"""The folder tfcluster puts first on every task's PYTHONPATH for its sitecustomize.py; a
package only so that the wheel carries it (pyproject.toml lists every package)."""
