"""The Ansible content as the collection tfcluster.cluster: in the wheel, in the tarball, and
`tfcluster deploy` running it from wherever tfcluster is installed, outside any checkout."""
import fnmatch
import glob
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest
import yaml

from support.ansible_run import ansible_tool
from support import REPO
from support.installed_wheel import build_wheel, install_wheel, run_installed
from tfcluster.cli import main as cli
from tfcluster.cli.arguments import build_parser
from tfcluster.deploy import playbook as deploy
from tfcluster.deploy import wheelhouse

COLLECTION = "ansible_collections/tfcluster/cluster/"
# What `make collection` puts in the tarball: its README (COLLECTION.md), the Ansible content
# (its modules in plugins/), the host packages and the datasets role's manifest
# (tfcluster/data/datasets.json, its one file from tfcluster/).
TARBALL_TOP = {"COLLECTION.md", "meta", "playbooks", "plugins", "roles", "tfcluster",
               "tfcluster_agent", "trainers"}
HARMLESS_INVENTORY = """all:
  vars:
    ansible_connection: local
    # Nothing to provision: every playbook validates and leaves the slots alone.
    tfcluster_deploy: false
  children:
    worker:
      hosts:
        worker0: {ansible_host: localhost}
    ps:
      hosts:
        ps0: {ansible_host: localhost}
"""


# The collection's modules (plugins/modules/) by their collection names, one of them through a
# module_utils file that is a link in the checkout (plugins/module_utils/shares.py).
MODULES_PLAY = """- name: Run the collection's modules
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Ensure the folder has its marker
      tfcluster.cluster.folder_tokens:
        paths: ["{{ folder }}"]
      register: tokens
    - name: Check the administrator's half
      tfcluster.cluster.system_ready:
        packages: []
        python: "{{ ansible_playbook_python }}"
        python_range: ["3.0", "3.99"]
        root: "{{ folder }}"
      register: ready
    - name: Show what they found
      ansible.builtin.debug:
        msg: "token={{ tokens.tokens[folder] }} made={{ tokens.made }} changed={{ tokens.changed }}
          missing={{ ready.missing }}"
"""


def modules_play_ran(proc, folder):
    """True when ansible-playbook's PROC ran MODULES_PLAY on FOLDER: the marker made and read."""
    from tfcluster_agent import shares
    token = shares.folder_id(str(folder), create=False)
    return proc.returncode == 0 and token and (
        "token=%s made=['%s'] changed=True missing=[]" % (token, folder)) in proc.stdout


def git_files(*paths):
    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True,
                         check=True).stdout.decode()
    return [p for p in out.split("\0") if p]


def test_pyproject_lists_every_python_package_of_the_checkout():
    """setuptools puts only the packages named in the wheel, subpackages too (trainers.common,
    trainers.cifar10): a package left out would be missing from an installed tfcluster."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib: Python 3.11+")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        listed = set(tomllib.load(handle)["tool"]["setuptools"]["packages"])
    found = {os.path.dirname(path).replace("/", ".")
             for path in git_files("tfcluster", "tfcluster_agent", "trainers")
             if path.endswith("/__init__.py")}
    assert found == listed


def test_collection_metadata_matches_the_package():
    galaxy = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml")))
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert (galaxy["namespace"], galaxy["name"], galaxy["version"]) == ("tfcluster", "cluster",
                                                                        version)
    runtime = yaml.safe_load(open(os.path.join(REPO, "meta", "runtime.yml")))
    pin = re.search(r'"ansible-core>=([0-9.]+),<([0-9.]+)"', pyproject).groups()
    assert runtime["requires_ansible"] == ">=%s.0,<%s.0" % pin


def test_the_collection_has_a_readme_of_its_own():
    """galaxy.yml's readme: a short one about the collection, not the project's front page."""
    galaxy = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml")))
    assert galaxy["readme"] == "COLLECTION.md"
    readme = open(os.path.join(REPO, galaxy["readme"])).read()
    assert readme.startswith("# tfcluster.cluster\n") and len(readme.splitlines()) <= 80
    for name in deploy.PLAYBOOKS:
        assert "tfcluster.cluster.%s " % name in readme, name


def test_playbook_names_are_collection_names():
    # tfcluster.cluster.NAME: no dashes (ansible-core's collection playbook names are \w+).
    names = [os.path.basename(p)[:-4] for p in glob.glob(os.path.join(REPO, "playbooks", "*.yml"))]
    assert sorted(names) == sorted(deploy.PLAYBOOKS)
    assert all(re.fullmatch(r"\w+", name) for name in names)


def test_tarball_leaves_everything_else_out():
    """galaxy.yml's build_ignore, applied to the checkout's files, leaves just TARBALL_TOP."""
    patterns = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml")))["build_ignore"]
    kept = [path for path in git_files()
            if not any(fnmatch.fnmatch(part, pattern)
                       for part in (path.split("/")[0], path) for pattern in patterns)]
    assert {path.split("/")[0] for path in kept} == TARBALL_TOP | {"galaxy.yml"}, kept
    assert [path for path in kept if path.startswith("tfcluster/")] == ["tfcluster/data/datasets.json"]


def test_the_collections_modules_run_from_the_checkout(tmp_path):
    """ansible.cfg finds plugins/modules/ by their collection names, wherever ansible-playbook
    starts (as `tfcluster deploy` runs it: ANSIBLE_CONFIG)."""
    (tmp_path / "modules.yml").write_text(MODULES_PLAY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    folder = tmp_path / "shared"
    proc = subprocess.run([ansible_tool("ansible-playbook"), "modules.yml",
                           "-e", "folder=%s" % folder], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert modules_play_ran(proc, folder), proc.stdout[-3000:] + proc.stderr[-2000:]


def test_find_content_prefers_the_installed_collection(tmp_path):
    root = tmp_path / COLLECTION
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "deploy.yml").write_text("---\n")
    assert deploy.find_content([str(tmp_path / "nothing"), str(tmp_path)]) == (str(tmp_path),
                                                                              str(root))
    # No collection on the path: the checkout this tfcluster runs from.
    assert deploy.find_content([str(tmp_path / "nothing")]) == (None, REPO)


def parse_deploy(*argv):
    argv = list(argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.trainer_args = rest
    return args


def test_deploy_passes_ansible_playbook_options_through():
    args = parse_deploy("deploy", "-i", "hosts.yml", "-e", "a=1", "-e", "@vars.yml", "--limit",
                        "gpu*", "--check", "--diff", "--tags", "x,y", "-vv", "--", "--forks", "3")
    cmd = deploy.playbook_command(args, "/site", "/site/" + COLLECTION)
    assert cmd[:5] == [sys.executable, "-m", "ansible", "playbook", "tfcluster.cluster.deploy"]
    assert cmd[5:] == ["-i", "hosts.yml", "-e", "a=1", "-e", "@vars.yml", "--limit", "gpu*",
                       "--tags", "x,y", "--check", "--diff", "-vv", "--forks", "3"]
    args = parse_deploy("deploy", "-i", "h.yml", "--playbook", "teardown")
    assert deploy.playbook_command(args, None, REPO)[4] == os.path.join(REPO, "playbooks",
                                                                        "teardown.yml")


def test_deploy_shows_no_extra_var_value():
    # -e values may be passwords; files (@FILE) are only names.
    assert deploy.shown(["tfcluster.cluster.deploy", "-i", "my hosts.yml", "-e",
                         "ansible_become_password=s3cret", "-e", "@vars.json", "--check"]) == (
        "tfcluster.cluster.deploy -i 'my hosts.yml' -e ... -e @vars.json --check")


def test_deploy_runs_with_the_settings_that_came_with_the_playbooks():
    env = deploy.playbook_env("/site", "/site/" + COLLECTION, {"HOME": "/h", "PWD": "/old"})
    assert env == {"HOME": "/h", "ANSIBLE_CONFIG": "/site/" + COLLECTION + "ansible.cfg",
                   "ANSIBLE_COLLECTIONS_PATH": "/site", "PWD": os.getcwd()}
    env = deploy.playbook_env(None, REPO, {})
    assert env == {"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "PWD": os.getcwd()}


@pytest.mark.parametrize("argv, message", [
    (["deploy"], "the following arguments are required: -i/--inventory"),
    (["deploy", "-i", "/nonexistent/hosts.yml"], "inventory /nonexistent/hosts.yml: no such file"),
    (["deploy", "-i", "h.yml", "--playbook", "site"], "invalid choice: 'site'"),
])
def test_deploy_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- built and installed

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(str(tmp_path_factory.mktemp("wheel")))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    python, site, work = install_wheel(wheel, tmp_path_factory.mktemp("installed"))
    with open(os.path.join(work, "hosts.yml"), "w") as handle:
        handle.write(HARMLESS_INVENTORY)
    return python, site, work


def in_installed(installed, *argv, timeout=300):
    python, _, work = installed
    return run_installed(python, work, *argv, timeout=timeout)


@pytest.mark.slow
def test_wheel_carries_the_checkouts_ansible_content(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for path in git_files("playbooks", "plugins", "roles", "meta", "galaxy.yml", "COLLECTION.md",
                              "ansible.cfg", "inventory/sample"):
            assert COLLECTION + path in names, path
            with open(os.path.join(REPO, path), "rb") as handle:
                assert archive.read(COLLECTION + path) == handle.read(), path
        # The host packages the trainers role pushes sit beside ansible_collections/.
        assert {"tfcluster_agent/agent.py", "tfcluster_agent/hostcode.json", "trainers/requirements.txt",
                "trainers/requirements-no-deps.txt", "tfcluster/data/datasets.json",
                "tfcluster/spec/catalog.yml", "trainers/common/loop.py",
                "trainers/cifar10/__main__.py"} <= names


@pytest.mark.slow
def test_installed_wheel_runs_the_playbooks_outside_the_checkout(installed):
    python, site, work = installed
    proc = in_installed(installed, "-c", "import tfcluster; print(tfcluster.__file__)")
    assert proc.stdout.startswith(site), proc.stdout + proc.stderr
    # One ansible-playbook start for every playbook (~1 CPU s each): it names each one it checked.
    proc = in_installed(installed, "-m", "ansible", "playbook", "-i", "hosts.yml", "--syntax-check",
                        *["tfcluster.cluster." + name for name in deploy.PLAYBOOKS])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in deploy.PLAYBOOKS:
        assert "playbook: %s\n" % os.path.join(site, COLLECTION, "playbooks", name + ".yml") \
            in proc.stdout, proc.stdout
    # Every slot has tfcluster_deploy: false: deploy refuses before Ansible starts; the
    # validate playbook runs from the installed collection.
    refused = in_installed(installed, "-m", "tfcluster", "deploy", "-i", "hosts.yml", "--check")
    assert refused.returncode == 2 and "nothing to deploy" in refused.stderr, refused.stderr
    proc = in_installed(installed, "-m", "tfcluster", "deploy", "-i", "hosts.yml", "--playbook",
                        "validate", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tfcluster: ansible-playbook tfcluster.cluster.validate -i hosts.yml --check" in proc.stdout
    assert re.search(r"worker0\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout)


@pytest.mark.slow
def test_installed_wheel_runs_the_collections_modules(installed):
    python, site, work = installed
    with open(os.path.join(work, "modules.yml"), "w") as handle:
        handle.write(MODULES_PLAY)
    folder = os.path.join(work, "shared")
    proc = in_installed(installed, "-m", "ansible", "playbook", "modules.yml",
                        "-e", "folder=%s" % folder)
    assert modules_play_ran(proc, folder), proc.stdout[-3000:] + proc.stderr[-2000:]
    # The link in the checkout is the file it names in the wheel.
    assert not os.path.islink(os.path.join(site, COLLECTION, "plugins", "module_utils", "shares.py"))


@pytest.mark.slow
def test_installed_wheel_inits_and_finds_its_wheelhouse_inputs(installed):
    """`tfcluster init --sample` copies the wheel's sample; `tfcluster wheelhouse` reads the
    wheel's constraints and fills the current folder, and will not rewrite the wheel's pins."""
    python, site, work = installed
    proc = in_installed(installed, "-m", "tfcluster", "init", "cluster", "--sample")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.isfile(os.path.join(work, "cluster", "group_vars", "all", "connection.yml"))
    program = ("import argparse; from tfcluster.deploy import wheelhouse as w; "
               "a = w.complete(w.add_arguments(argparse.ArgumentParser()).parse_args([]), "
               "w.Content()); print(a.dest, a.constraints, a.requirements, a.tf_version)")
    proc = in_installed(installed, "-c", program)
    collection = os.path.join(site, COLLECTION)
    assert proc.stdout.split() == [
        os.path.join(work, "wheelhouse"),
        os.path.join(collection, "roles", "tensorflow", "files", "constraints.txt"),
        os.path.join(site, "trainers", "requirements.txt"), wheelhouse.Content().tf_version()], \
        proc.stdout + proc.stderr
    proc = in_installed(installed, "-m", "tfcluster", "wheelhouse", "--lock")
    assert proc.returncode == 2 and "run it in a checkout" in proc.stderr, proc.stderr
    assert not os.path.exists(os.path.join(work, "wheelhouse"))


@pytest.mark.slow
def test_host_code_is_found_from_a_users_own_playbook(installed):
    """A playbook of the user's (here: the work folder) importing the collection's: the roles
    find the host packages where the wheel put them, site-packages."""
    python, site, work = installed
    with open(os.path.join(work, "site.yml"), "w") as handle:
        handle.write("""- name: Validate
  ansible.builtin.import_playbook: tfcluster.cluster.validate
- name: Show where the host code is
  hosts: localhost
  gather_facts: false
  roles: [tfcluster.cluster.tfcluster]
  tasks:
    - name: Show
      ansible.builtin.debug:
        msg: "src={{ tfcluster_src }} dir={{ tfcluster_controller_dir }}"
""")
    proc = in_installed(installed, "-m", "ansible", "playbook", "site.yml", "-i", "hosts.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"msg": "src=%s dir=%s"' % (site, work) in proc.stdout, proc.stdout


@pytest.mark.slow
def test_collection_tarball_installs_and_runs_from_files(tmp_path):
    """`make collection`'s tarball, installed with ansible-galaxy from the file."""
    galaxy = ansible_tool("ansible-galaxy")
    proc = subprocess.run([galaxy, "collection", "build", "--output-path", str(tmp_path), REPO],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = glob.glob(str(tmp_path / "tfcluster-cluster-*.tar.gz"))
    with tarfile.open(tarball) as archive:
        top = {name.split("/")[0] for name in archive.getnames()}
    assert top == TARBALL_TOP | {"MANIFEST.json", "FILES.json"}, top
    proc = subprocess.run([galaxy, "collection", "install", "-p", str(tmp_path / "collections"),
                           tarball], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "hosts.yml").write_text(HARMLESS_INVENTORY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"),
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    proc = subprocess.run([sys.executable, "-m", "ansible", "playbook", "tfcluster.cluster.deploy",
                           "-i", "hosts.yml", "--syntax-check"], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(tmp_path / "collections" / COLLECTION) in proc.stdout
    (tmp_path / "modules.yml").write_text(MODULES_PLAY)
    folder = tmp_path / "shared"
    proc = subprocess.run([sys.executable, "-m", "ansible", "playbook", "modules.yml",
                           "-e", "folder=%s" % folder], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert modules_play_ran(proc, folder), proc.stdout[-3000:] + proc.stderr[-2000:]
