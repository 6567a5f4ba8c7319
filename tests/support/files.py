"""Files and folders a command meets read-only."""
import os
import subprocess

from support import REPO


def read_only(path, argv):
    """ARGV run while PATH (a file or folder) cannot be written: for root, whom file modes do
    not stop, a read-only bind mount in a mount namespace of its own; else its modes."""
    if os.geteuid() == 0:
        argv = ["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
                str(path)] + argv
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    mode = os.stat(folder).st_mode
    os.chmod(folder, mode & ~0o222)
    try:
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(folder, mode)
