"""Static checks for the alternative test hosts (they cannot run here):
Vagrantfile + inventory/vagrant.yml, deploy/compose + inventory/compose.yml."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402
import yaml  # noqa: E402  (PyYAML comes with ansible-core)

REPO = Path(__file__).resolve().parent.parent
VAGRANTFILE = REPO / "Vagrantfile"
COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
INV_VAGRANT = REPO / "inventory" / "vagrant.yml"
INV_COMPOSE = REPO / "inventory" / "compose.yml"


def load_inventory(path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    return InventoryManager(loader=DataLoader(), sources=[str(path)])


def host_vars(im, name):
    """A host's variables including those inherited from its groups (all, ps, ...)."""
    from ansible.vars.manager import VariableManager
    vm = VariableManager(loader=im._loader, inventory=im)
    return vm.get_vars(host=im.get_host(name), include_hostvars=False)


def group_hosts(im, group):
    return [h.name for h in im.groups[group].get_hosts()]


@pytest.mark.parametrize("path", [INV_VAGRANT, INV_COMPOSE], ids=["vagrant", "compose"])
def test_inventory_parses_with_ps_and_worker(path):
    im = load_inventory(path)
    assert {"ps", "worker"} <= set(im.groups)
    assert len(group_hosts(im, "ps")) == 1
    assert len(group_hosts(im, "worker")) >= 1
    for h in im.get_hosts():
        v = host_vars(im, h.name)
        assert v.get("ansible_host"), h.name
        assert v.get("ansible_user"), h.name
        assert v.get("ansible_ssh_private_key_file"), h.name


def vagrant_hosts():
    """name -> ip as defined in the Vagrantfile's HOSTS table."""
    text = VAGRANTFILE.read_text()
    return dict(re.findall(r'\{\s*name:\s*"([\w-]+)",\s*ip:\s*"([\d.]+)"\s*\}', text))


def test_vagrantfile_syntax():
    text = VAGRANTFILE.read_text()
    ruby = shutil.which("ruby")
    if ruby:
        r = subprocess.run([ruby, "-c", str(VAGRANTFILE)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    # structural checks (always; the only check when ruby is absent)
    assert 'Vagrant.configure("2") do |config|' in text
    code = re.sub(r"<<-SHELL.*?^\s*SHELL$", "", text, flags=re.S | re.M)  # drop heredoc
    code = "\n".join(ln.split("#", 1)[0] for ln in code.splitlines())
    opens = len(re.findall(r"\bdo\b(\s*\|[^|]*\|)?\s*$", code, flags=re.M))
    ends = len(re.findall(r"^\s*end\s*$", code, flags=re.M))
    assert opens == ends, f"{opens} do-blocks vs {ends} ends"
    for a, b in ("()", "[]", "{}"):
        assert code.count(a) == code.count(b), f"unbalanced {a}{b}"
    assert 'config.vm.box = "debian/bookworm64"' in text
    assert "private_network" in text


def test_vagrantfile_matches_inventory():
    hosts = vagrant_hosts()
    assert hosts == {"ps1": "192.168.56.11", "worker1": "192.168.56.12",
                     "worker2": "192.168.56.13"}
    im = load_inventory(INV_VAGRANT)
    assert group_hosts(im, "ps") == ["ps1"]
    assert group_hosts(im, "worker") == ["worker1", "worker2"]
    for name, addr in hosts.items():
        v = host_vars(im, name)
        assert v["ansible_host"] == addr
        assert v["ansible_user"] == "vagrant"
        assert v["ansible_ssh_private_key_file"] == \
            f".vagrant/machines/{name}/virtualbox/private_key"


def compose_services():
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc["services"]


def test_compose_services_run_sshd():
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:12\b", dockerfile, flags=re.M)
    for pkg in ("openssh-server", "python3"):
        assert pkg in dockerfile
    assert "PermitRootLogin prohibit-password" in dockerfile
    assert "PasswordAuthentication no" in dockerfile
    assert "sshd -D" in dockerfile
    services = compose_services()
    assert set(services) == {"ps1", "worker1", "worker2"}
    for name, svc in services.items():
        # sshd comes from the Dockerfile's CMD unless a service overrides it
        assert svc.get("build") in (".", {"context": "."}), name
        assert "sshd" in str(svc.get("command", "sshd")), name
        assert any(str(v).startswith("./keys:") for v in svc.get("volumes", [])), name
        for port in svc["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes beyond localhost"


def test_compose_matches_inventory():
    ports = {}
    for name, svc in compose_services().items():
        ssh = [p for p in svc["ports"] if str(p).endswith(":22")]
        assert len(ssh) == 1, name
        ports[name] = int(str(ssh[0]).split(":")[1])
    assert sorted(ports.values()) == [2201, 2202, 2203]
    im = load_inventory(INV_COMPOSE)
    assert group_hosts(im, "ps") == ["ps1"]
    assert sorted(group_hosts(im, "worker")) == ["worker1", "worker2"]
    for name, port in ports.items():
        v = host_vars(im, name)
        assert v["ansible_host"] == "127.0.0.1"
        assert int(v["ansible_port"]) == port
        assert v["ansible_user"] == "root"
        assert v["ansible_ssh_private_key_file"] == "deploy/compose/keys/id_ed25519"
