"""tfcluster's cache folder on a machine (standard library only): the controller's read
inventories, a host's preflight answers (its TensorFlow import) and the agent's compiled code.

$XDG_CACHE_HOME/tfcluster, else ~/.cache/tfcluster. A home that is missing is never created (as
root, a makedirs would) and one that cannot be written is not used: the caller keeps its cache
in a private folder of its own instead (the controller: under the runs folder; a host: under
its work folder), with a warning, since without a cache every launch imports TensorFlow again.
"""
import os

NAME = "tfcluster"


def home():
    """The home folder when it exists and can be written, else None."""
    path = os.path.expanduser("~")
    if os.path.isabs(path) and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
        return path
    return None


def private_folder(path):
    """PATH, made (0700) if needed, when files can be written there; else None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK | os.X_OK) else None


def home_cache():
    """The cache folder the user's settings name, when it can hold files; else None."""
    bases = []
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        bases.append(xdg)
    if home():
        bases.append(os.path.join(home(), ".cache"))
    for base in bases:
        folder = private_folder(os.path.join(base, NAME))
        if folder:
            return folder
    return None


def keep_keras_home(folder, environ=os.environ):
    """Keras (imported with TensorFlow) makes ~/.keras, and as root the missing home with it:
    without a usable home it gets FOLDER/keras in ENVIRON (nothing without a FOLDER)."""
    if folder and home() is None:
        environ.setdefault("KERAS_HOME", os.path.join(folder, "keras"))


def cache_folder(fallback):
    """(folder, warning): home_cache() and no warning, else FALLBACK/tfcluster (FALLBACK: a base
    folder as XDG_CACHE_HOME is, or None) and the warning line that says why; (None, warning)
    when no folder can hold the cache."""
    folder = home_cache()
    if folder:
        return folder, None
    path = os.path.expanduser("~")
    why = "HOME %s %s" % (path, "cannot be written" if os.path.isdir(path) else "does not exist")
    folder = private_folder(os.path.join(fallback, NAME)) if fallback else None
    if folder:
        return folder, "%s: tfcluster caches in %s (set XDG_CACHE_HOME for another place)" % (
            why, folder)
    return None, ("%s and no other folder can hold tfcluster's cache: each launch imports "
                  "TensorFlow again (set XDG_CACHE_HOME)" % why)
