"""SSH to a machine: Fabric (paramiko) with host key checking on, the known hosts read once."""
import os
import threading

_KNOWN_HOSTS_LOCK = threading.Lock()
_known_hosts_files = {}  # (path, mtime, size, inode) -> paramiko.HostKeys


def ssh_connection(machine):
    """A Fabric connection to MACHINE, not yet open, that trusts only the host keys known for it."""
    import fabric
    import paramiko
    connect_kwargs = {"banner_timeout": machine.connect_timeout,
                      "auth_timeout": machine.connect_timeout}
    if machine.key_file:
        connect_kwargs["key_filename"] = os.path.expanduser(machine.key_file)
    connection = fabric.Connection(machine.address, user=machine.user, port=machine.ssh_port,
                                   connect_timeout=machine.connect_timeout,
                                   connect_kwargs=connect_kwargs)
    # Host key checking stays on: Fabric's default policy would add unknown keys silently.
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    # The keys known for this machine alone: each connection loading whole files cost 128 hosts
    # 128 parses of a 128-line file (and a search through all of it per host).
    # Named as paramiko looks it up: the host and port Fabric resolved (ssh_config's HostName).
    name = connection.host if connection.port == 22 else "[%s]:%d" % (connection.host,
                                                                       connection.port)
    own = connection.client.get_host_keys()
    user_file = os.path.expanduser("~/.ssh/known_hosts")
    for path in ([user_file] if os.path.exists(user_file) else []) + (
            [os.path.expanduser(machine.known_hosts)] if machine.known_hosts else []):
        for keytype, key in (known_hosts(path).lookup(name) or {}).items():
            own.add(name, keytype, key)
    return connection


def known_hosts(path):
    """PATH parsed (paramiko.HostKeys), once per process while the file stays as it is."""
    import paramiko
    stat = os.stat(path)  # a missing file: OSError, as paramiko's own load gave
    key = (path, stat.st_mtime_ns, stat.st_size, stat.st_ino)
    with _KNOWN_HOSTS_LOCK:
        if key not in _known_hosts_files:
            _known_hosts_files[key] = paramiko.HostKeys(path)
        return _known_hosts_files[key]
