"""What a test runs as another Unix user, staged where that user can read it.

The checkout may live where only root can enter (root's home and `mktemp -d` folders are 0700):
another user cannot run anything from it. The fixture `readable_copy` copies the parts of the
checkout such a test needs into a fresh folder every user can read, and removes it afterwards:


    def test_x(readable_copy):
        folder = readable_copy("tfcluster_agent", "tests/programs/nvidia-smi")
        ... ["runuser", "-u", user, "--", "/usr/bin/python3", folder + "/tfcluster_agent/agent.py"]
"""
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from support import REPO


def closed_folder(path):
    """The first folder from / down to PATH that other users cannot enter, or None."""
    path = Path(path).resolve()
    for folder in reversed([path, *path.parents]):
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def open_to_all(folder):
    """Folders 0755, files 0644 (0755 where the owner may run them)."""
    for top, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(top, name), 0o755)
        for name in files:
            path = os.path.join(top, name)
            os.chmod(path, 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644)


def copy_readable(folder, paths):
    """Copies of PATHS (relative to the checkout) below FOLDER, readable by every user."""
    os.chmod(folder, 0o755)
    blocked = closed_folder(folder)
    if blocked:
        mode = stat.S_IMODE(os.stat(blocked).st_mode)
        pytest.fail("cannot stage files for another Unix user in %s: other users cannot enter %s "
                    "(mode %04o); set TMPDIR to a folder they can enter, such as /tmp"
                    % (folder, blocked, mode), pytrace=False)
    for rel in paths:
        source, target = os.path.join(REPO, rel), os.path.join(folder, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(source):
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    open_to_all(folder)
    return folder


@pytest.fixture
def readable_copy():
    """A function: copies of checkout paths in a folder every user can read; its path. Every
    folder it made is removed at the test's end."""
    made = []

    def copy(*paths):
        made.append(tempfile.mkdtemp(prefix="tfc-for-others-"))
        return copy_readable(made[-1], paths)

    yield copy
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)
