"""The tests' own shape: the helpers they share are in tests/support/, the fixtures registered
once (tests/conftest.py's pytest_plugins). No test module imports another, nor names one in a
monkeypatch target or in code it hands a child process, and no fixture is imported by name."""
import ast
import glob
import os
import re

TESTS = os.path.dirname(os.path.abspath(__file__))
# An import of a test module on a line of its own: in code or in code held in a string.
TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(test_\w+)", re.MULTILINE)
# A dotted path into a module (a monkeypatch target): "test_x.Name", not the file "test_x.py".
DOTTED = re.compile(r"(\w+)\.(?!py$)\w+(?:\.\w+)*")


def shaped_files():
    """{module name: path} of every Python file of tests/ and tests/support/."""
    paths = glob.glob(os.path.join(TESTS, "*.py")) + glob.glob(os.path.join(TESTS, "support", "*.py"))
    return {module_name(path): path for path in sorted(paths)}


def module_name(path):
    name = os.path.splitext(os.path.relpath(path, TESTS))[0].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def fixtures_defined(tree):
    """Names of the fixtures TREE defines (@pytest.fixture, with or without arguments or name=)."""
    names = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if (isinstance(target, ast.Attribute) and target.attr == "fixture") or \
                    (isinstance(target, ast.Name) and target.id == "fixture"):
                renamed = [k.value.value for k in (call.keywords if call else [])
                           if k.arg == "name" and isinstance(k.value, ast.Constant)]
                names.add(renamed[0] if renamed else node.name)
    return names


def offences(sources):
    """What breaks the shape in SOURCES ({module name: source text}): 'module:line what'."""
    trees = {module: ast.parse(text, module) for module, text in sources.items()}
    test_modules = {module for module in sources if module.startswith("test_")}
    fixtures = {module: fixtures_defined(tree) for module, tree in trees.items()}
    found = []
    for module, text in sources.items():
        for match in TEST_MODULE_IMPORT.finditer(text):
            if match.group(1) in test_modules:
                found.append("%s:%d imports test module %s" % (
                    module, text.count("\n", 0, match.start()) + 1, match.group(1)))
        for node in ast.walk(trees[module]):
            if isinstance(node, ast.ImportFrom) and node.module in fixtures:
                found += ["%s:%d imports fixture %s.%s" % (module, node.lineno, node.module,
                                                           alias.name)
                          for alias in node.names if alias.name in fixtures[node.module]]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                dotted = DOTTED.fullmatch(node.value)
                if dotted and dotted.group(1) in test_modules:
                    found.append("%s:%d names %s" % (module, node.lineno, node.value))
    return sorted(found)


def test_no_test_module_imports_another_or_a_fixture():
    sources = {}
    for module, path in shaped_files().items():
        with open(path) as handle:
            sources[module] = handle.read()
    assert offences(sources) == []


def test_planted_imports_of_a_test_module_and_of_a_fixture_are_found():
    sources = {
        "support.gpus": "import pytest\n\n@pytest.fixture\ndef fake_gpus():\n    pass\n\n"
                        "@pytest.fixture(name='smi')\ndef smi_fixture():\n    pass\n",
        "test_cli": "def run_cli():\n    pass\n",
        "test_a": "from test_cli import run_cli\nfrom support.gpus import fake_gpus, smi\n",
        "test_b": "WRITER = '''\nimport sys\nfrom test_cli import run_cli\n'''\n\n"
                  "def test_x(monkeypatch):\n"
                  "    monkeypatch.setattr('test_cli.run_cli', None)\n"
                  "    open('test_batch.bin'), open('test_cli.py')\n",
    }
    assert offences(sources) == [
        "test_a:1 imports test module test_cli",
        "test_a:2 imports fixture support.gpus.fake_gpus",
        "test_a:2 imports fixture support.gpus.smi",
        "test_b:3 imports test module test_cli",
        "test_b:7 names test_cli.run_cli",
    ]
