"""The house's shape: the controller's rooms import only downwards, no module imports another in
a circle, and no private name is used outside its module. The contracts are .importlinter's."""
import ast
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tfcluster", "tfcluster_agent", "trainers")
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def lint_imports(root):
    env = dict(os.environ, PYTHONPATH=root)
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_import_contracts_hold():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_a_planted_import_cycle_breaks_the_contracts(tmp_path):
    """Two modules of the agent that import each other: the same contracts fail on them."""
    for package in PACKAGES:
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, ".importlinter"), tmp_path)
    (tmp_path / "tfcluster_agent" / "planted_a.py").write_text("from tfcluster_agent import planted_b\n")
    (tmp_path / "tfcluster_agent" / "planted_b.py").write_text("from tfcluster_agent import planted_a\n")
    proc = lint_imports(str(tmp_path))
    assert proc.returncode != 0, proc.stdout
    assert "planted_a" in proc.stdout and "No cycles are allowed in tfcluster_agent" in proc.stdout


def project_modules():
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def test_no_private_name_is_imported_across_modules():
    crossing = []
    for path in project_modules():
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                crossing += ["%s:%d %s.%s" % (os.path.relpath(path, REPO), node.lineno,
                                              node.module, alias.name)
                             for alias in node.names
                             if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert crossing == []


def test_lazy_imports_stay_in_the_top_room():
    """import-linter reads import statements, not tfcluster.lazy's names: lazy modules are taken
    only in cli/, the room above all others, where no layer can be crossed."""
    callers = []
    for path in project_modules():
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        if any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy"
               for node in ast.walk(tree)):
            callers.append(os.path.relpath(path, REPO))
    assert callers and all(path.startswith("tfcluster/cli/") for path in callers), callers
