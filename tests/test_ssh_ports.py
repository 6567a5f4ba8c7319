"""Two machines behind one address, told apart by their SSH ports (Vagrant boxes on 127.0.0.1,
NAT'd hosts): status, logs and stop must each reach the right one. Two test hosts are reached
through a TCP forwarder on 127.0.0.1, one port each."""
import contextlib
import select
import socket
import sys
import threading

import pytest

from support import REPO
from support.cli import assert_run_clean, run_record, tfcluster
from support.procs import wait_for
from tfcluster_agent.supervisor import has_live_member

pytestmark = [pytest.mark.slow, pytest.mark.root]


@contextlib.contextmanager
def forwarder(targets):
    """A listener on 127.0.0.1 (a free port) per (host, port) of TARGETS, each forwarding every
    connection there; yields the local ports. Everything is closed on exit."""
    stop = threading.Event()
    listeners, threads, open_sockets = [], [], []

    def pipe(a, b):
        try:
            while not stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    (b if source is a else a).sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def accept(listener, target):
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            server = socket.create_connection(target, timeout=10)
            open_sockets.extend((client, server))
            worker = threading.Thread(target=pipe, args=(client, server), daemon=True)
            worker.start()
            threads.append(worker)

    try:
        for target in targets:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(16)
            listener.settimeout(0.2)
            listeners.append(listener)
            thread = threading.Thread(target=accept, args=(listener, target), daemon=True)
            thread.start()
            threads.append(thread)
        yield [listener.getsockname()[1] for listener in listeners]
    finally:
        stop.set()
        for sock in listeners + open_sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in threads:
            thread.join(timeout=5)


def test_two_hosts_behind_one_address_on_two_ssh_ports(testhosts, tmp_path):
    (name1, addr1), (name2, addr2) = testhosts.hosts[:2]
    with forwarder([(addr1, 22), (addr2, 22)]) as (port1, port2):
        # The hosts' keys, as known for 127.0.0.1 on each port.
        keys = {line.split()[0]: line.split(None, 1)[1]
                for line in testhosts.known_hosts.read_text().splitlines() if line.strip()}
        known = tmp_path / "known_hosts"
        known.write_text("[127.0.0.1]:%d %s\n[127.0.0.1]:%d %s\n"
                         % (port1, keys[addr1], port2, keys[addr2]))
        inventory = tmp_path / "ports.yml"
        inventory.write_text("""all:
  vars:
    ansible_user: root
    ansible_host: 127.0.0.1
    ansible_ssh_private_key_file: {key}
    tfcluster_known_hosts: {known}
    tfcluster_root: {repo}
    tfcluster_python: {python}
    tfcluster_workdir: /opt/tfc-ports/{tmp}/work
    tfcluster_port_base: 24100
  children:
    worker:
      hosts:
        {name1}: {{ansible_port: {port1}, tfcluster_address: {addr1}}}
        {name2}: {{ansible_port: {port2}, tfcluster_address: {addr2}}}
""".format(key=testhosts.key, known=known, repo=REPO, python=sys.executable, tmp=tmp_path.name,
           name1=name1, name2=name2, port1=port1, port2=port2, addr1=addr1, addr2=addr2))
        # tfcluster_address: the tasks reach each other on the hosts' own addresses (127.0.0.1
        # is each host itself; the preflight's reachability check refuses it).
        runs_dir = str(tmp_path / "runs")
        # Each task prints the addresses of the host it runs on, then sleeps.
        command = "hostname -I; sleep 300"
        try:
            tfcluster("launch", "--cmd", command, "-i", str(inventory), "--workers", "2",
                      "--ps", "0", "--chief", "0", "--detach", "--run-id", "ports",
                      runs_dir=runs_dir, check=0)
            record = run_record(runs_dir, "ports")
            assert [t["machine"][2] for t in record["tasks"].values()] == [port1, port2]

            status = tfcluster("status", "ports", runs_dir=runs_dir, check=0)
            rows = [line.split() for line in status.stdout.splitlines()
                    if line.startswith("worker:")]
            assert [(r[0], r[1], r[3]) for r in rows] == [
                ("worker:0", "127.0.0.1:%d" % port1, "running"),
                ("worker:1", "127.0.0.1:%d" % port2, "running")], status.stdout

            for label, address in (("worker:0", addr1), ("worker:1", addr2)):
                logs = tfcluster("logs", "ports", "--task", label, runs_dir=runs_dir, check=0)
                assert logs.stdout.split() == [address], logs.stdout

            stop = tfcluster("stop", "ports", runs_dir=runs_dir, check=0)
            assert "no task left running, ports free" in stop.stdout
        finally:
            # Whatever happened, nothing of this run stays on either host.
            tfcluster("stop", "ports", runs_dir=runs_dir)
        record = run_record(runs_dir, "ports")
        assert record["state"] == "stopped"
        assert {t["state"] for t in record["tasks"].values()} == {"stopped"}
        assert_run_clean(record)
        # The hosts share this machine's processes: no process of either task's group is left
        # (a zombie its supervisor has not reaped yet is no process left running).
        for label, task in record["tasks"].items():
            assert task["pid"], label
            wait_for(lambda: not has_live_member(task["pid"]), 30, "%s's group to be gone" % label)
