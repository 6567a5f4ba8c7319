"""dist_test's cluster-spec string, `job|host:port;host:port,job|...`, parsed once for the
controller (`tfcluster spec`) and the trainers (--cluster_spec). Standard library only.

Grammar (tensorflow/tools/dist_test, grpc_tensorflow_server.py): SPEC = JOB(,JOB)*,
JOB = NAME|HOST:PORT(;HOST:PORT)*, NAME = [a-z][0-9a-z]*.
"""
import re

JOB_NAME = re.compile(r"^[a-z][0-9a-z]*$")
HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
EXAMPLE = " (expected e.g. 'worker|localhost:2222;localhost:2223,ps|localhost:2224')"


class ClusterSpecError(ValueError):
    """A cluster spec that does not parse; the message names the problem and the fix."""


def normal_host(host):
    """HOST as TensorFlow's host:port needs it (IPv6 bracketed), or None when it is not a host
    name or IP address."""
    host = str(host)
    if ":" in host:  # only an IPv6 address holds one: ipaddress is imported for it alone
        import ipaddress
        try:
            ipaddress.IPv6Address(host.strip("[]"))
            return "[%s]" % host.strip("[]")
        except ValueError:
            return None
    return host if HOST_NAME.match(host) else None


def host_problem(what, host, fix):
    return ("%s %r is not a host name or IP address (letters, digits, '.', '-', '_'; IPv6 in "
            "brackets): %s" % (what, host, fix))


def format_cluster_spec(jobs):
    return ",".join("%s|%s" % (job, ";".join(addresses)) for job, addresses in jobs.items())


def parse_cluster_spec(text):
    """{job: [host:port, ...]} from dist_test's string; ClusterSpecError says what is wrong."""
    if not text or not text.strip():
        raise ClusterSpecError("empty cluster spec" + EXAMPLE)
    jobs, seen = {}, {}
    for part in text.strip().split(","):
        if part.count("|") != 1:
            raise ClusterSpecError("job %r in the cluster spec needs exactly one '|'" % part
                                   + EXAMPLE)
        name, task_text = part.split("|")
        if not name:
            raise ClusterSpecError("a job in the cluster spec has an empty name" + EXAMPLE)
        if not JOB_NAME.match(name):
            raise ClusterSpecError("job name %r must match [a-z][0-9a-z]*" % name + EXAMPLE)
        if name in jobs:
            raise ClusterSpecError("job %r appears twice in the cluster spec" % name + EXAMPLE)
        if not task_text:
            raise ClusterSpecError("job %r has no tasks in the cluster spec" % name + EXAMPLE)
        addresses = [_check_address(address, name) for address in task_text.split(";")]
        for address in addresses:
            if address in seen:
                raise ClusterSpecError("%s is in the cluster spec twice (%s and %s): give every "
                                       "task its own host:port" % (address, seen[address], name))
            seen[address] = name
        jobs[name] = addresses
    return jobs


def _check_address(address, job):
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ClusterSpecError("task %r of job %r is not host:port with a port from 1 to 65535"
                               % (address, job) + EXAMPLE)
    normal = normal_host(host)
    if normal is None:
        raise ClusterSpecError(host_problem("task %r of job %r:" % (address, job), host,
                                            "fix the cluster spec"))
    return "%s:%d" % (normal, int(port))
