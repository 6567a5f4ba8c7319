"""The alternative test hosts, checked without running them (no VirtualBox or Docker here):
the Vagrantfile is compiled and evaluated by Ruby, the compose file validated against the
Compose specification's JSON schema, and both agree with their Ansible inventories."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402
import yaml  # noqa: E402  (PyYAML comes with ansible-core)

REPO = Path(__file__).resolve().parent.parent
VAGRANTFILE = REPO / "Vagrantfile"
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yml"
INV_VAGRANT = REPO / "inventory" / "vagrant.yml"
INV_COMPOSE = REPO / "inventory" / "compose.yml"
# From the docker-compose 1.29.2 wheel (compose/config/compose_spec.json): see tests/data/README.md.
COMPOSE_SCHEMA = REPO / "tests" / "data" / "compose_spec.json"

# Runs the Vagrantfile with Vagrant's configuration objects replaced by recorders, and prints
# every call made on them (path, arguments, keyword options) as JSON.
VAGRANT_STUB = r"""
require "json"
class Recorder
  def initialize(path, calls)
    @path, @calls = path, calls
  end

  def method_missing(name, *args, **opts, &block)
    path = @path + [name.to_s]
    @calls << { "path" => path.join("."), "args" => args, "opts" => opts }
    inner = Recorder.new(name == :define ? ["machine", args[0].to_s] : path, @calls)
    block.call(inner) if block
    inner
  end

  def respond_to_missing?(*)
    true
  end
end

module Vagrant
  CALLS = []
  def self.configure(version, &block)
    CALLS << { "path" => "configure", "args" => [version], "opts" => {} }
    block.call(Recorder.new([], CALLS))
  end
end

load ARGV[0]
puts JSON.generate(Vagrant::CALLS)
"""


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


# ---------------------------------------------------------------- Vagrant

def ruby():
    found = shutil.which("ruby")
    if not found:
        pytest.skip("ruby is not installed (make setup installs Debian's ruby as root)")
    return found


def test_vagrantfile_compiles():
    proc = subprocess.run([ruby(), "-c", str(VAGRANTFILE)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "Syntax OK" in proc.stdout, proc.stderr


def vagrant_machines():
    """{machine name: {"hostname":, "ips": [private network addresses]}} as the Vagrantfile
    defines them when Ruby runs it."""
    proc = subprocess.run([ruby(), "-e", VAGRANT_STUB, str(VAGRANTFILE)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    machines = {}
    for call in json.loads(proc.stdout):
        parts = call["path"].split(".")
        if parts[0] != "machine":
            continue
        machine = machines.setdefault(parts[1], {"hostname": None, "ips": []})
        if parts[2:] == ["vm", "hostname="]:
            machine["hostname"] = call["args"][0]
        if parts[2:] == ["vm", "network"] and call["args"][0] == "private_network":
            machine["ips"].append(call["opts"]["ip"])
    return machines


def test_vagrantfile_machines_match_inventory():
    machines = vagrant_machines()
    im = load_inventory(INV_VAGRANT)
    assert sorted(machines) == sorted(h.name for h in im.get_hosts())
    addresses = set()
    for name, machine in machines.items():
        v = host_vars(im, name)
        assert machine["hostname"] == name
        assert machine["ips"] == [v["ansible_host"]], (name, machine)
        assert v["ansible_ssh_private_key_file"] == \
            ".vagrant/machines/%s/virtualbox/private_key" % name
        addresses.add(v["ansible_host"])
    assert len(addresses) == len(machines)


# ---------------------------------------------------------------- Docker Compose

def compose_validator():
    from jsonschema import Draft201909Validator
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    Draft201909Validator.check_schema(schema)
    return Draft201909Validator(schema)


def test_compose_file_follows_the_compose_specification():
    validator = compose_validator()
    doc = yaml.safe_load(COMPOSE.read_text())
    errors = ["%s: %s" % ("/".join(map(str, e.absolute_path)), e.message)
              for e in validator.iter_errors(doc)]
    assert not errors, errors
    # The same validator rejects what Compose would: a misspelled key, a wrong type.
    name = sorted(doc["services"])[0]
    bad = dict(doc, services=dict(doc["services"]))
    bad["services"][name] = dict(doc["services"][name], hostnme="x", init="yes")
    assert len(list(validator.iter_errors(bad))) == 2


def test_compose_services_match_inventory():
    """Every inventory host is a service, reached at a port the service publishes on the
    loopback, or at the service's own address on its network."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    im = load_inventory(INV_COMPOSE)
    assert sorted(services) == sorted(h.name for h in im.get_hosts())
    for name, service in services.items():
        v = host_vars(im, name)
        if v["ansible_host"] in ("127.0.0.1", "localhost"):
            published = ["127.0.0.1:%s:22" % v["ansible_port"]]
            assert set(published) <= set(map(str, service.get("ports", []))), (name, service)
        else:
            addresses = [n.get("ipv4_address") for n in (service.get("networks") or {}).values()
                         if isinstance(n, dict)]
            assert v["ansible_host"] in addresses, (name, v["ansible_host"], addresses)
