"""What a host can tell about itself before a run: interpreter, TensorFlow, ports, GPUs, code.

Standard library only; used by the agent's preflight.
"""
import fcntl
import os
import sys
import time

from tfcluster_agent import datafiles
from tfcluster_agent import jsonc as json
from tfcluster_agent.hostcode import code_files, code_hash, sha256
from tfcluster_agent.supervisor import boot_id, write_atomic


def port_is_free(port):
    """True when nothing listens on PORT on any address (TF servers bind the wildcard address)."""
    # The C module: the socket module's enums cost each agent's start.
    import _socket
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        # Like gRPC, ignore TIME_WAIT leftovers of closed connections: only a listener counts.
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
    except OSError:
        return False
    finally:
        sock.close()
    return True


# Where a run's ports are claimed: a lock on a file, whose holder is the agent from preflight to
# start, then the task's supervisor until the task has exited, so a claim never outlives its
# holder and two launches cannot both find a port free before either task binds it. The files
# lie beside the GPU claims, in the folder every user's runs share (gpuclaims.py): another
# user's launch on the same ports is refused as well.
CLAIMS_SUBDIR = "ports"


def claim_port(port):
    """(descriptor holding PORT's claim, None); (None, what the holder wrote) when another
    process holds it; (None, None) where no lock can be taken (no shared claims folder, a file
    system without locks): the bind check is all there is then.

    Ports are per machine and network namespace, so claims are too: the file's name holds the
    boot id and the namespace."""
    from tfcluster_agent.gpuclaims import open_shared, shared_dir
    try:
        namespace = os.stat("/proc/self/ns/net").st_ino
        name = "%s-%s-%d" % (boot_id() or os.uname().nodename, namespace, port)
        fd = open_shared(os.path.join(shared_dir(CLAIMS_SUBDIR), name))
    except OSError:
        return None, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
        os.close(fd)
        return None, holder
    except OSError:
        os.close(fd)
        return None, None
    return fd, None


def label_claim(fd, holder):
    """Write who holds the claim of FD, and as which user, for a launch that finds the port
    claimed (written before the old label is cut, so a reader never sees an empty one)."""
    from tfcluster_agent.gpuclaims import user_name
    data = ("%s (user %s)" % (holder, user_name())).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


class PortClaims:
    """The claims an agent holds, {port: descriptor}, until a task's supervisor takes one."""

    def __init__(self):
        self.held = {}

    def claim(self, ports, holder):
        """Claim PORTS, labelled HOLDER; {port: its holder} for those another process holds."""
        taken = {}
        for port in ports:
            if port not in self.held:
                fd, other = claim_port(port)
                if other is not None:
                    taken[str(port)] = other or "another tfcluster launch"
                if fd is None:
                    continue
                self.held[port] = fd
            label_claim(self.held[port], holder)
        return taken

    def take(self, port):
        """PORT's claim, now the caller's descriptor to close; None when none is held."""
        return self.held.pop(int(port), None) if port else None

    def release(self, keep=()):
        """Close every claim but those of the ports in KEEP."""
        for port in set(self.held) - set(keep):
            os.close(self.held.pop(port))


def port_is_listening(port, host="127.0.0.1"):
    import socket
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# Run by path with another interpreter: what it says about its TensorFlow.
TF_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfprobe.py")


def site_packages():
    """The folders `site` would add to sys.path for this interpreter, found without running it:
    the agent starts with -S, since a host's .pth files (an editable install's finder, a
    distribution's hooks) cost every start and the agent, standard library only, needs
    none of them."""
    import site
    bin_dir = os.path.dirname(sys.executable)
    for folder in (bin_dir, os.path.dirname(bin_dir)):  # a venv's pyvenv.cfg, as site finds it
        try:
            with open(os.path.join(folder, "pyvenv.cfg")) as handle:
                settings = dict(line.partition("=")[::2] for line in handle)
        except OSError:
            continue
        system = {k.strip().lower(): v.strip().lower() for k, v in settings.items()}.get(
            "include-system-site-packages") == "true"
        found = site.getsitepackages([folder] + ([sys.base_prefix] if system else []))
        # Debian's site gives a venv its own site-packages only once site.venv() has made
        # sys.prefix the venv, which -S skips.
        own = os.path.join(folder, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
        return found if own in found else [own] + found
    user = [] if sys.flags.no_user_site else [site.getusersitepackages()]
    return user + site.getsitepackages()


def locate_tensorflow():
    """`tfprobe.py locate`'s answer for this very interpreter, looked up in-process; "" when not
    found on the paths a plain start would have (a .pth could add others: the caller asks a
    fresh interpreter then)."""
    from importlib.machinery import PathFinder
    paths = sys.path + (site_packages() if sys.flags.no_site else [])
    spec = PathFinder.find_spec("tensorflow", paths)
    if not spec or not spec.origin:
        return ""
    return repr((os.path.realpath(spec.origin), os.path.getmtime(spec.origin)))


def python_report(python, cache_dir=None, import_seconds=120):
    """Version of TensorFlow importable by PYTHON, or the reason it is not (also when its import
    takes over IMPORT_SECONDS; None: no limit).

    A successful import is remembered in CACHE_DIR, keyed by the interpreter and the installed
    TensorFlow package's path and modification time: a reinstall or upgrade invalidates it.
    """
    # The agent's own interpreter: look in-process rather than start another one.
    found = locate_tensorflow() if os.path.abspath(python) == os.path.abspath(sys.executable) \
        else ""
    if not found:
        import subprocess
        try:
            out = subprocess.run([python, TF_PROBE, "locate"], capture_output=True, text=True,
                                 timeout=60)
        except FileNotFoundError:
            return {"python_ok": False, "error": "no interpreter at %s (tfcluster_python): run "
                    "ansible-playbook playbooks/deploy.yml or set tfcluster_python" % python}
        except (OSError, subprocess.TimeoutExpired) as err:
            return {"python_ok": False, "error": "cannot run %s: %s" % (python, err)}
        found = out.stdout.strip() if out.returncode == 0 else ""
    if not found:
        return {"python_ok": False, "error": "%s cannot import tensorflow: it is not installed"
                % python}
    key = sha256((os.path.realpath(python) + found + "\n").encode()).hexdigest()[:16]
    cache_dir = os.path.expanduser(cache_dir) if cache_dir else None
    cache = os.path.join(cache_dir, ".preflight-%s.json" % key) if cache_dir else None
    if cache and os.path.exists(cache):
        try:
            with open(cache) as handle:
                return dict(json.load(handle), cached=True)
        except (OSError, ValueError):
            pass  # a damaged cache entry is checked again
    import subprocess
    # As the trainers import it (bootstrap.import_tensorflow).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    from tfcluster_agent.cachedir import keep_keras_home
    keep_keras_home(cache_dir, env)
    try:
        out = subprocess.run([python, TF_PROBE, "import"], capture_output=True, text=True,
                             timeout=import_seconds, env=env)
    except subprocess.TimeoutExpired:
        return {"python_ok": False, "error": "importing tensorflow with %s took over %g s"
                % (python, import_seconds)}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
        return {"python_ok": False, "error": "%s cannot import tensorflow: %s" % (python, last)}
    lines = out.stdout.strip().splitlines()
    report = {"python_ok": True, "tf_version": lines[-2], "python_version": lines[-1]}
    if cache:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            write_atomic(cache, json.dumps(report))
        except OSError:
            pass  # no writable home: the next preflight imports TensorFlow again
    return report


def cached_code_hash(code_root, cache_dir, settle_ns=2 * 10**9):
    """code_hash(CODE_ROOT), remembered in CACHE_DIR against each file's inode, size and change
    times, so a preflight reads the files only after one changed. While no folder of the code
    changed (same inode and change times), the files are those listed last time: no walk, and
    no regular expression for the skip pattern (re and enum: a cost of an agent's start). A file
    or folder changed in the last SETTLE_NS keeps it from being remembered: a change within
    the clock's tick could leave the times as they were."""
    # Per machine (a home may be shared): inodes are the machine's own.
    cache = os.path.join(os.path.expanduser(cache_dir), "code-%s" % sha256(
        ("%s %s" % (boot_id(), os.path.realpath(code_root))).encode()).hexdigest()[:16])
    try:
        with open(cache) as handle:
            saved = json.load(handle)
        if saved["dirs"] != [[path, *_times(path)] for path, *_ in saved["dirs"]]:
            saved["files"] = None  # a file came or went: list them again
    except (OSError, ValueError, KeyError, TypeError):
        saved = {"files": None}  # none yet, or damaged (or the older format): computed again
    dirs = []
    files = [tuple(f) for f in saved["files"]] if saved["files"] else code_files(code_root, dirs)
    stats = [os.stat(path) for _, path in files]
    key = sha256(repr([(rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                       for (rel, _), st in zip(files, stats)]).encode()).hexdigest()
    if saved.get("key") == key:
        if not dirs:
            return saved["digest"]
        # Files as they were, in folders that changed (a __pycache__ made, a file come and
        # gone): the folders' new times are saved, or every later preflight lists them again.
        digest = saved["digest"]
    else:
        digest = code_hash(code_root, files)
    if not dirs:
        code_files(code_root, dirs)
    listed = [[path, *_times(path)] for path in dirs]
    settled = time.time_ns() - settle_ns
    if all(st.st_ctime_ns < settled and st.st_mtime_ns < settled for st in stats) and \
            all(entry[1] is None or max(entry[2:]) < settled for entry in listed):
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            write_atomic(cache, json.dumps({"key": key, "digest": digest, "dirs": listed,
                                            "files": [list(f) for f in files]}))
        except OSError:
            pass  # no writable home: hashed again next time
    return digest


def _times(path):
    """A folder's identity and change times: [inode, mtime_ns, ctime_ns] (None: gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return [None, None, None]
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def program_found(program):
    """True when PROGRAM (a path, or a name looked up on PATH) is an executable file."""
    if os.sep in program:
        return os.access(program, os.X_OK)
    return any(os.access(os.path.join(folder, program), os.X_OK)
               for folder in os.environ.get("PATH", os.defpath).split(os.pathsep))


def preflight_report(python, ports, code_dir, cache_dir=None, datasets=(), nvidia_smi="",
                     own_gpu_claims=lambda: ()):
    """The machine's answer to a preflight; OWN_GPU_CLAIMS() names the GPUs this agent holds."""
    report = {"hostname": os.uname().nodename, "cpus": os.cpu_count() or 1,
              "agent_python": sys.executable}
    nvidia_smi = nvidia_smi or "nvidia-smi"
    gpu_query = None
    if program_found(nvidia_smi):
        # The GPU query (nvidia-smi can take seconds) runs while the interpreter is checked.
        import threading
        from tfcluster_agent import gpuinfo

        def query_gpus():
            try:
                report["gpu_facts"] = gpuinfo.host_gpus(nvidia_smi, own_gpu_claims())
            except Exception as err:  # a preflight answers whatever the GPUs say
                report["gpu_facts"] = {"driver": None, "gpus": [], "warning": None,
                                       "absent": None, "error": "GPU query failed: %r" % err}

        gpu_query = threading.Thread(target=query_gpus)
        gpu_query.start()
    else:  # no driver tools (most hosts): nothing to start or import for them
        report["gpu_facts"] = {"driver": None, "gpus": [], "error": None, "warning": None,
                               "absent": "%s: not found" % nvidia_smi}
    report.update(python_report(python, cache_dir))
    report["ports"] = {str(p): port_is_free(int(p)) for p in ports}
    report["code_hash"] = (cached_code_hash(code_dir, cache_dir) if cache_dir else code_hash(code_dir)) \
        if os.path.isdir(code_dir) else None
    from tfcluster_agent import provenance
    report.update(provenance.package_facts(python, site_packages))
    report["gpus"] = []
    if gpu_query is not None:
        gpu_query.join()
        report["gpus"] = gpuinfo.smi_lines(report["gpu_facts"])
    if report["gpu_facts"].get("driver"):
        report["versions"]["driver"] = report["gpu_facts"]["driver"]
    missing = {folder: datafiles.missing_files(name, folder) for name, folder in datasets}
    report["missing_data"] = {folder: names for folder, names in missing.items() if names}
    report["data_hashes"] = provenance.data_hashes(
        [path for name, folder in datasets for path in datafiles.paths(name, folder)], cache_dir)
    report["proxy_env"] = proxy_facts(os.environ)
    return report


# Variables that send connections through a proxy (gRPC reads the lowercase http_proxy,
# https_proxy and grpc_proxy; other tools any case), and the lists that exempt hosts from it.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy")
NO_PROXY_VARIABLES = ("no_grpc_proxy", "no_proxy")


def proxy_facts(environ):
    """The proxy variables' names in ENVIRON (their values may hold passwords: never sent) and
    the exemption lists' values: {"proxies": [...], "no_grpc_proxy": ..., "no_proxy": ...}."""
    facts = {"proxies": sorted(n for n in environ if n.lower() in PROXY_VARIABLES)}
    facts.update((name, environ[name]) for name in NO_PROXY_VARIABLES if name in environ)
    return facts


def deploy_report(code_root):
    """deploy.yml's last check, with the interpreter the tasks run (`verify`): TensorFlow's
    version (imported once per install, no time limit: a deploy waits however busy the host
    is; the import is remembered where the agent's preflight finds it), the hash of the host
    code below CODE_ROOT and the one trainers.sha256 records (None: no file)."""
    from tfcluster_agent.hostcode import HASH_FILE
    found = python_report(sys.executable, "~/.cache/tfcluster", import_seconds=None)
    found["code_hash"] = code_hash(code_root)
    try:
        with open(os.path.join(code_root, HASH_FILE)) as handle:
            found["recorded_hash"] = handle.read().strip()
    except FileNotFoundError:
        found["recorded_hash"] = None
    return found
