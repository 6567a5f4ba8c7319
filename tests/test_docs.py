"""The README and the documentation site (docs/, mkdocs.yml), the fast tier: the site builds
with --strict (a broken link or anchor, a page missing from nav), every code block names its
language, and every `sh` block is run by a test: those below here, the README's Install lines on
bare containers (tests/test_dockerhosts.py). `console` blocks are examples."""
import glob
import os
import re
import subprocess
import sys

import markdown

from support import readme_install
from support import REPO

DOCS = ["README.md", "COLLECTION.md"] + sorted(
    os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, "docs", "*.md")))
LANGUAGES = {"sh", "console", "text", "yaml", "json", "python"}
# (file, heading above the block): the folder its lines run in ("tmp": the test's own).
RUN_HERE = {("docs/inventory.md", "What each task gets"): "repo",
            ("docs/deploy.md", "A larger cluster"): "tmp",
            ("docs/launch.md", "Launch"): "repo"}
RUN_ON_CONTAINERS = {("README.md", "Install")}  # tests/test_dockerhosts.py, as root


def read(path):
    with open(os.path.join(REPO, path)) as handle:
        return handle.read()


def sh_blocks():
    """{(file, heading): [the lines of each sh block under that heading]}."""
    found = {}
    for path in DOCS:
        for heading, language, lines in readme_install.fenced_blocks(read(path)):
            if language == "sh":
                found.setdefault((path, heading), []).append(lines)
    return found


def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           os.path.join(REPO, "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The README's sections and benchmarks/RESULTS.md are included, not copied.
    front = (site / "index.html").read_text()
    assert 'id="quick-start"' in front and 'id="install"' in front
    assert 'id="launch-cost-at-scale"' in (site / "results" / "index.html").read_text()


def test_every_code_block_is_fenced_with_its_language():
    for path in DOCS:
        text = read(path)
        html = markdown.markdown(text, extensions=["fenced_code", "tables"])
        rendered = re.findall(r"<pre><code(?: class=\"language-([^\"]+)\")?>", html)
        fenced = [language for _, language, _ in readme_install.fenced_blocks(text)]
        assert "" not in fenced, "%s: a fenced block without a language" % path
        assert len(rendered) == len(fenced), (
            "%s: an indented code block; fence it with its language" % path)
        assert set(fenced) <= LANGUAGES, "%s: %s; a shell block is sh (a test runs it) or " \
            "console (an example)" % (path, set(fenced) - LANGUAGES)


def test_every_sh_block_is_run_by_a_test():
    found = sh_blocks()
    run = set(RUN_HERE) | RUN_ON_CONTAINERS
    assert set(found) - run == set(), "sh blocks that no test runs: run them, or mark examples console"
    assert run - set(found) == set(), "the tests run sh blocks that are gone"
    assert all(len(blocks) == 1 for blocks in found.values()), found
    assert found[("README.md", "Install")] == [readme_install.install_lines()]


def test_the_docs_sh_blocks_run(tmp_path):
    """Each block as a user types it, `tfcluster` being the venv's."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for (path, heading), where in RUN_HERE.items():
        (lines,) = sh_blocks()[(path, heading)]
        code, ran = readme_install.run_lines(lines, REPO if where == "repo" else str(tmp_path),
                                             env, timeout=120)
        assert code == 0 and len(ran) == len(lines), (path, ran[-1:])
        for line, _, out, err in ran:
            assert out.strip() and "Traceback" not in err, (line, out, err)
    assert (tmp_path / "inventory" / "mycluster" / "hosts.yml").is_file()


def test_the_readme_is_a_front_page():
    readme = read("README.md")
    assert len(readme.splitlines()) <= 250
    for path in ("README.md", "COLLECTION.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(path)):
            if not re.match(r"[a-z]+://", target):
                assert os.path.exists(os.path.join(REPO, target)), "%s links %s" % (path, target)


def test_the_readme_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "tfcluster", "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    listed = proc.stdout.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    commands = re.findall(r"^    (\w+)", listed, re.M)
    section = read("README.md").split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    assert len(commands) > 10 and sorted(re.findall(r"^\| `tfcluster (\w+)`", section, re.M)) \
        == sorted(commands)
