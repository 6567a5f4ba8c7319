"""SSH to a machine: Fabric (paramiko) with host key checking on; the known hosts and the key
file read once per process, not once per machine."""
import os
import threading

_FILES_LOCK = threading.Lock()
_files = {}  # (reader, path, mtime, size, inode) -> what it read


def ssh_connection(machine):
    """A Fabric connection to MACHINE, not yet open, that trusts only the host keys known for it."""
    # Fabric and paramiko here and below: commands that reach no host never pay for them.
    import fabric
    import paramiko
    connect_kwargs = {"banner_timeout": machine.connect_timeout,
                      "auth_timeout": machine.connect_timeout}
    if machine.key_file:
        path = os.path.expanduser(machine.key_file)
        key = private_key(path)
        # The key read once per process; one it cannot read alone (a passphrase) paramiko reads.
        connect_kwargs["pkey" if key else "key_filename"] = key or path
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


def private_key(path):
    """The private key in PATH (paramiko.PKey, with its -cert.pub as paramiko would load it);
    None where it cannot be read without more (a passphrase, a missing file)."""
    try:
        return read_once(path, _read_private_key)
    except OSError:
        return None


def _read_private_key(path):
    import paramiko
    try:
        key = paramiko.PKey.from_path(path)
    except (paramiko.SSHException, OSError, ValueError, TypeError):  # TypeError: a passphrase
        return None
    if os.path.isfile(path + "-cert.pub"):
        key.load_certificate(path + "-cert.pub")
    return key


def known_hosts(path):
    """PATH parsed (paramiko.HostKeys); a missing file: OSError, as paramiko's own load gave."""
    import paramiko
    return read_once(path, paramiko.HostKeys)


def read_once(path, read):
    """READ(PATH), once per process while the file stays as it is (the calls to every machine
    share it)."""
    stat = os.stat(path)
    key = (read, path, stat.st_mtime_ns, stat.st_size, stat.st_ino)
    with _FILES_LOCK:
        if key not in _files:
            _files[key] = read(path)
        return _files[key]
