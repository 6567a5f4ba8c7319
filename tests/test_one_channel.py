"""One channel to the hosts: every piece of Python that runs on a host is a module, of the agent
(tfcluster_agent/, reached through its commands) or of the collection (plugins/modules/), never
a program inside a string or inside YAML; trainers.sha256 has one writer, which the deploy and
`tfcluster sync` share."""
import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import yaml

from support import REPO
from support.cli import run_cli
from tfcluster.hosts import links as hosts
from tfcluster.deploy import sync
from tfcluster_agent import hostcode

PYTHON_FOLDERS = ("tfcluster", "tfcluster_agent", "plugins")
YAML_FOLDERS = ("playbooks", "roles")
# An interpreter's own -c in a task: -c after an interpreter's name on its line, with no other
# word between them than quoting and options (`{{ python | quote }} -B -c`, `[python, '-c', ...`).
YAML_INTERPRETER_C = re.compile(r"(python|interpreter|executable)[\w.]*([\s'\",|~(){}\[\]]|quote|"
                                r"-[A-Za-z]\b)*?-c\b", re.I)
# A Python file read on the controller to be run elsewhere.
YAML_FILE_LOOKUP = re.compile(r"lookup\(\s*['\"](ansible\.builtin\.)?file['\"][^)\n]*\.py\b")
# A line of Python (a statement, not prose) in a YAML value.
YAML_PYTHON_LINE = re.compile(r"^\s+(import [\w.]+|from [\w.]+ import |def \w+\(|print\()", re.M)


def files(folders, pattern):
    return sorted(path for folder in folders
                  for path in glob.glob(os.path.join(REPO, folder, "**", pattern), recursive=True))


def test_no_python_in_yaml_and_no_file_fed_to_an_interpreter():
    """No task runs `python -c` with a program, a file read by lookup('file') or a program
    written in a variable: what a playbook runs on a host is a module or an agent command."""
    found = []
    for path in files(YAML_FOLDERS, "*.yml"):
        text = open(path).read()
        rel = os.path.relpath(path, REPO)
        found += ["%s: %s" % (rel, m.group(0)) for m in YAML_INTERPRETER_C.finditer(text)]
        found += ["%s: %s" % (rel, m.group(0)) for m in YAML_FILE_LOOKUP.finditer(text)]
        found += ["%s: Python in YAML: %s" % (rel, m.group(0).strip())
                  for m in YAML_PYTHON_LINE.finditer(text)]
    assert not found, "\n".join(found)


def test_the_scans_see_what_they_look_for():
    """The YAML scans catch the forms that ran Python from YAML before."""
    for text in ("{{ ansible_facts.python.executable | quote }} -c {{ lookup('ansible.builtin.file', 'x.py') }}",
                 "argv: [\"{{ trainers_python }}\", -c, \"{{ _writer }}\"]",
                 "argv: \"{{ [ansible_facts.python.executable, '-c', _probe] }}\"",
                 "{{ tfcluster_python | quote }} -c {{ _tfcluster_probe | quote }}",
                 "lookup('ansible.builtin.pipe', (ansible_playbook_python | quote) ~ ' -c ' ~ x)"):
        assert YAML_INTERPRETER_C.search(text), text
    assert YAML_PYTHON_LINE.search("x: |-\n  import json, os, sys\n  print(json.dumps(1))\n")
    assert YAML_FILE_LOOKUP.search("-c {{ lookup('ansible.builtin.file', 'files/system_ready.py') }}")
    assert not YAML_FILE_LOOKUP.search("{{ lookup('ansible.builtin.file', hostcode ~ '.json') }}")
    assert not YAML_INTERPRETER_C.search("{{ '-c ' ~ (_tensorflow_constraints_dest | quote) }}")
    assert not YAML_INTERPRETER_C.search("{{ tensorflow_venv }}/bin/python -m pip install -c x")
    assert python_c_uses(ast.parse("run([python, '-B', '-c', 'import os', 'x'])")) == ["'import os'"]
    assert python_c_uses(ast.parse("run(['/bin/sh', '-c', cmd])")) == []
    assert python_c_uses(ast.parse("run([sys.executable, '-m', 'pip', 'download', '-c', c])")) == []
    assert program_strings(ast.parse("S = '''\nimport os\nprint(os.getpid())\n'''")) == ["S"]


def python_c_uses(tree):
    """The source of what follows an interpreter's own -c in each argv list of TREE: the -c in
    the run of options right after an element that names a Python."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple)) or not node.elts:
            continue
        head = ast.unparse(node.elts[0])
        if not re.search(r"python|executable", head, re.I):
            continue
        for index, element in enumerate(node.elts[1:], 1):
            if not (isinstance(element, ast.Constant) and isinstance(element.value, str)
                    and element.value.startswith("-")):
                break
            if element.value == "-c" and index + 1 < len(node.elts):
                found.append(ast.unparse(node.elts[index + 1]))
    return found


def docstrings(tree):
    """The ids of TREE's docstring nodes."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr)}


def program_strings(tree):
    """Names of the string constants TREE assigns that are Python programs of more than one
    statement with an import or a definition: a program to send somewhere."""
    return [ast.unparse(node.targets[0]) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str) and is_program(node.value.value)]


def is_program(text):
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError):
        return False
    return len(body) > 1 and any(isinstance(s, (ast.Import, ast.ImportFrom, ast.FunctionDef))
                                 for s in body)


def test_no_python_program_in_a_string():
    """Python the controller or the agent runs elsewhere is a module run by path or through the
    agent's commands. The one `-c` left is the agent's boot line: it imports the package and
    calls its command line, nothing else."""
    found = []
    for path in files(PYTHON_FOLDERS, "*.py"):
        tree = ast.parse(open(path).read())
        rel = os.path.relpath(path, REPO)
        found += ["%s: python -c %s" % (rel, use) for use in python_c_uses(tree)
                  if use != "AGENT_BOOT"]
        found += ["%s: a program in the string %s" % (rel, name) for name in program_strings(tree)
                  if name != "AGENT_BOOT"]
    assert not found, "\n".join(found)
    assert "\n" not in hosts.AGENT_BOOT
    assert hosts.AGENT_BOOT.endswith(";import tfcluster_agent;tfcluster_agent.main(sys.argv[2:])")


# ---------------------------------------------------------------- trainers.sha256: one writer


def trainers_hash_argv(root):
    """The trainers role's task that records the hash, its argv as the role renders it."""
    tasks = yaml.safe_load(open(os.path.join(REPO, "roles", "trainers", "tasks", "main.yml")))
    (task,) = [t for t in tasks if "trainers.sha256" in t["name"]]
    template = task["ansible.builtin.command"]["argv"]
    values = {"trainers_python": sys.executable, "trainers_dest": str(root),
              "trainers_hash_file": str(root / hostcode.HASH_FILE), "ansible_check_mode": False}
    import jinja2
    return ast.literal_eval(jinja2.Environment().from_string(template).render(values))


def test_the_deploy_and_sync_write_trainers_sha256_with_one_writer(tmp_path, capsys, monkeypatch):
    """The same host code written by the trainers role (its files, then its `write-hash` task)
    and by `tfcluster sync`: byte-for-byte the same trainers.sha256, from the one writer both
    reach through the agent's command line (hostcode.write_hash)."""
    deployed, synced = tmp_path / "deployed", tmp_path / "synced"
    for root in (deployed, synced):
        root.mkdir()
    for package in hostcode.packages():
        shutil.copytree(os.path.join(REPO, package), deployed / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    argv = trainers_hash_argv(deployed)
    assert argv[1:4] == ["-B", str(deployed / "tfcluster_agent"), "write-hash"], argv
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert '"changed": true' in out
    again = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert '"changed": false' in again  # a second deploy changes nothing

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars:\n    ansible_connection: local\n    tfcluster_root: %s\n"
                         "    tfcluster_python: %s\nworker:\n  hosts:\n    w0: {}\n"
                         "ps:\n  hosts:\n    p0: {}\n" % (synced, sys.executable))
    monkeypatch.setattr(sync, "code_root", lambda: str(deployed))
    code, _, err = run_cli(capsys, "sync", "-i", str(inventory))
    assert code == 0, err
    recorded = [(root / hostcode.HASH_FILE).read_bytes() for root in (deployed, synced)]
    assert recorded[0] == recorded[1] == (hostcode.code_hash(str(deployed)) + "\n").encode()
    assert {os.stat(root / hostcode.HASH_FILE).st_mode & 0o777 for root in (deployed, synced)} \
        == {0o644}
    # Both reach the one writer: no other code names the file (outside its documentation).
    naming = []
    for path in files(PYTHON_FOLDERS, "*.py"):
        tree = ast.parse(open(path).read())
        documentation = docstrings(tree)
        if any(isinstance(node, ast.Constant) and "trainers.sha256" in str(node.value)
               and id(node) not in documentation for node in ast.walk(tree)):
            naming.append(os.path.relpath(path, REPO))
    assert naming == ["tfcluster_agent/hostcode.py"], naming
