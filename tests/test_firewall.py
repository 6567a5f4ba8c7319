"""The firewall role on the test hosts: TensorFlow's ports open to the cluster, closed to others.

th1 (ps), th2 and th3 (workers) are the cluster; a fourth machine on the same bridge (the
namespace HostSet.outsider() makes) is in no inventory. A listener on th1 stands in for a running
ps on the ports the role fences; a playbook running only the firewall role fences the hosts (they
need no TensorFlow for that), teardown.yml removes the fence. Training through the fence, the
second deploy's changed=0 and --check on a deployed host are test_dockerhosts.py's (deploy.yml runs the
role). Rules live in the hosts' network namespaces: the machine's own ruleset must not change.
"""
import json
import os
import re
import select
import shutil
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.geteuid() != 0:
    pytest.skip("test_firewall needs root: the test hosts are network namespaces",
                allow_module_level=True)

from support.ansible_run import RECAP, Ansible, ansible_tool, explain  # noqa: E402

pytestmark = pytest.mark.root  # the network-namespace test hosts; no TensorFlow is started


def run_own_playbook(ansible, playbook, label, *args):
    """Ansible.run for a playbook outside playbooks/ (Ansible.run prefixes that folder):
    same environment and SSH masters, output kept for explain(), recap parsed, time recorded."""
    argv = [ansible_tool("ansible-playbook"), "-i", ansible.inventory, playbook, *args]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_SSH_CONTROL_PATH_DIR=ansible.control_dir,
               ANSIBLE_RETRY_FILES_ENABLED="0")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    ansible.timings.append((label, time.monotonic() - started))
    proc.log = playbook + ".log"
    with open(proc.log, "w") as handle:
        handle.write(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    proc.recap = {m.group(1): {"changed": int(m.group(3)), "failed": int(m.group(5))}
                  for m in RECAP.finditer(proc.stdout)}
    return proc


BASE = 2222                      # tfcluster_port_base's default: the ps port of every launch
WIDTH = 100                      # roles/firewall/defaults/main.yml: firewall_port_width
FIXED = 4000                     # th3's tfcluster_port in this test's inventory
FENCED = [BASE, BASE + WIDTH - 1, FIXED]
OPEN = [BASE + WIDTH]            # just past the range: not TensorFlow's
RULES_FILE = "/etc/tfcluster-firewall.nft"  # the test hosts share this machine's /etc

LISTENER = r"""
import selectors, socket, sys
sel = selectors.DefaultSelector()
for port in sys.argv[1:]:
    server = socket.create_server(("0.0.0.0", int(port)), backlog=64)
    server.setblocking(False)
    sel.register(server, selectors.EVENT_READ)
print("listening", flush=True)
while True:
    for key, _ in sel.select():
        try:
            key.fileobj.accept()[0].close()
        except BlockingIOError:
            pass
"""

# Connects to every port at once; a dropped SYN shows as "timeout", a closed port as "refused".
PROBE = r"""
import concurrent.futures, json, socket, sys
def probe(port):
    try:
        socket.create_connection((sys.argv[1], port), timeout=float(sys.argv[2])).close()
        return "open"
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as err:
        return "error: %s" % err
ports = [int(p) for p in sys.argv[3:]]
with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
    print(json.dumps(dict(zip(ports, pool.map(probe, ports)))))
"""


def probe(prefix, address, ports, timeout=1.5):
    """{port: open|timeout|refused} as seen from the namespace of argv PREFIX ([] = this one)."""
    argv = prefix + ["python3", "-c", PROBE, address, str(timeout)] + [str(p) for p in ports]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {int(port): state for port, state in json.loads(out.stdout).items()}


def nft(prefix, *args):
    """nft ARGS in the namespace of argv PREFIX ([] = this machine's own)."""
    return subprocess.run(list(prefix) + ["nft", *args], capture_output=True, text=True, timeout=30)


def ruleset(prefix=()):
    out = nft(prefix, "list", "ruleset")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def cluster(testhosts, tmp_path_factory, request):
    """The test hosts with a listener on th1, a fourth machine, and an Ansible runner. The tests
    assert on the shared /etc: a ruleset file an earlier deploy left there is set aside for them
    and put back afterwards."""
    work = tmp_path_factory.mktemp("firewall")
    machine_rules = ruleset()
    # The session inventory plus th3's explicit tfcluster_port: an inventory folder of two files.
    inventory = work / "inventory"
    inventory.mkdir()
    (inventory / "testhosts.yml").symlink_to(testhosts.inventory)
    (inventory / "port.yml").write_text("worker:\n  hosts:\n    th3: {tfcluster_port: %d}\n"
                                        % FIXED)
    (work / "extra-vars.json").write_text("{}")
    # Only the firewall role, as deploy.yml runs it; one slot a machine here, so no validate.yml.
    playbook = work / "fence.yml"
    playbook.write_text(
        "- name: Fence only\n"
        "  hosts: ps:worker\n"
        "  gather_subset: [min]\n"
        "  roles: [tfcluster]\n"
        "  tasks:\n"
        "    - name: Fence\n"
        "      ansible.builtin.import_role:\n"
        "        name: firewall\n")
    ansible = Ansible(inventory, str(work / "extra-vars.json"), str(work))
    ansible.fence = str(playbook)
    ansible.torn_down = False
    listener = subprocess.Popen(testhosts.netns_argv("th1") + ["python3", "-c", LISTENER]
                                + [str(p) for p in FENCED + OPEN],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    left = work / "left-by-an-earlier-deploy.nft"
    if os.path.exists(RULES_FILE):
        shutil.move(RULES_FILE, left)
    try:
        ready, _, _ = select.select([listener.stdout], [], [], 20)
        assert ready and listener.stdout.readline().strip() == "listening", listener.stderr.read()
        with testhosts.outsider() as outsider:
            yield testhosts, ansible, outsider
    finally:
        listener.kill()
        listener.wait(10)
        if not ansible.torn_down:  # the teardown test did not run or failed: remove by hand
            for name, _ in testhosts.hosts:
                nft(testhosts.netns_argv(name), "delete", "table", "inet", "tfcluster")
            if os.path.exists(RULES_FILE):
                os.unlink(RULES_FILE)
        if left.exists():
            shutil.move(left, RULES_FILE)
        ansible.close()
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            request.config.pluginmanager.getplugin("terminalreporter").write_line(
                "\ntest_firewall timings (s): " + ", ".join(
                    "%s %.1f" % (label, seconds) for label, seconds in ansible.timings))
        assert ruleset() == machine_rules, "the machine's own (root namespace) ruleset changed"


def test_fence_drops_the_outsider_and_lets_the_cluster_in(cluster):
    hosts, ansible, outsider = cluster
    ps = hosts.addr("th1")
    # Unfenced, the outsider reaches the "ps": what follows is the role's doing.
    assert probe(outsider, ps, [BASE]) == {BASE: "open"}

    # A dry run on one fresh host reports what it would do and loads nothing.
    check = run_own_playbook(ansible, ansible.fence, "firewall role --check",
                             "--check", "--limit", "th1")
    assert check.returncode == 0 and check.recap["th1"]["changed"] > 0, explain(check)
    assert "tfcluster" not in ruleset(hosts.netns_argv("th1")) and not os.path.exists(RULES_FILE)

    fence = run_own_playbook(ansible, ansible.fence, "firewall role")
    assert fence.returncode == 0, explain(fence)
    for name, _ in hosts.hosts:
        assert fence.recap[name]["changed"] > 0, explain(fence)
        table = nft(hosts.netns_argv(name), "list", "table", "inet", "tfcluster")
        assert table.returncode == 0, "%s has no tfcluster table: %s" % (name, table.stderr)

    seen = probe(outsider, ps, FENCED + OPEN + [22])
    assert seen == {**{port: "timeout" for port in FENCED}, OPEN[0]: "open", 22: "open"}, seen
    for member in ("th2", "th3"):
        assert probe(hosts.netns_argv(member), ps, FENCED) == {p: "open" for p in FENCED}, member
    assert probe([], ps, FENCED) == {p: "open" for p in FENCED}, "the controller was fenced out"
    assert probe(hosts.netns_argv("th1"), "127.0.0.1", [BASE]) == {BASE: "open"}
    counters = nft(hosts.netns_argv("th1"), "list", "chain", "inet", "tfcluster", "input")
    assert re.search(r"counter packets [1-9]", counters.stdout), "no drop counted:\n" + counters.stdout


def test_teardown_removes_the_fence(cluster):
    hosts, ansible, outsider = cluster
    teardown = ansible.run("teardown.yml", label="teardown")
    assert teardown.returncode == 0, explain(teardown)
    ansible.torn_down = True
    for name, _ in hosts.hosts:
        assert "tfcluster" not in ruleset(hosts.netns_argv(name)), name
    assert not os.path.exists(RULES_FILE)
    assert probe(outsider, hosts.addr("th1"), [BASE]) == {BASE: "open"}
