"""hostlib: the test hosts' library (Python 3 standard library only).

scripts/testhosts (SSH hosts as network namespaces) and scripts/dockerhosts (SSH hosts as
Docker containers) are thin command lines over it; the tests import it as `hostlib` (tests/
conftest.py puts scripts/ on sys.path, as running a script there does).

    common       errors, commands, polling, locks, processes, mounts, SSH, state files
    netns        network namespaces, the bridge, veth links, the firewall rule
    sshd         one sshd per namespace host: its keys, config, start and login checks
    testhosts    the testhosts commands (up, down, status, link, sshd)
    labusers     ordinary users of the testhosts (no sudo, one shared home): testhosts user
    engine       a private Docker engine: start, stop, what a dead one leaves
    image        the containers' image: a debootstrap base, cached, and the Dockerfile's build
    dockerhosts  the dockerhosts commands (up, down, status)
"""
