"""Modules imported at their first use, for the command line: each command pays only for the
modules it runs (`tfcluster --help` imports neither Ansible nor the launcher)."""
import importlib.util
import sys


def lazy(name):
    """The module NAME, whose code runs when one of its attributes is first read."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
