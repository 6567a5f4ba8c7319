"""The README's Install section as a test runs it (tests/test_dockerhosts.py): its own lines,
read from README.md, run one after another in bash, so that the two cannot drift apart. The
shell blocks of the documentation that the fast tier runs go the same way (tests/test_docs.py)."""
import fcntl
import os
import re
import subprocess
import time

from support import REPO

MARK = "@@tfcluster-readme-line"


def install_lines():
    """The lines of the Install section's sh block that runs `tfcluster init`."""
    with open(os.path.join(REPO, "README.md")) as handle:
        blocks = fenced_blocks(handle.read())
    found = [lines for heading, language, lines in blocks
             if heading == "Install" and language == "sh"
             and any(re.search(r"\btfcluster init\b", line) for line in lines)]
    assert len(found) == 1, "README.md's Install section has no single sh block with tfcluster init"
    return found[0]


def fenced_blocks(text):
    """[(heading, language, lines)]: TEXT's fenced code blocks (``` at a line's start), each with
    its language and the title of the last heading above it."""
    blocks, heading, language, block = [], None, None, None
    for line in text.splitlines():
        if block is not None:
            if line.startswith("```"):
                blocks.append((heading, language, block))
                block = None
            else:
                block.append(line)
        elif line.startswith("```"):
            language, block = line[3:].strip(), []
        elif re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip()
    assert block is None, "a code block under %r is not closed" % heading
    return blocks


def substitute(lines, substitutions):
    """LINES with each {text: replacement} made; every text must occur (a README edit that
    drops one fails here, not later)."""
    script = "\n".join(lines)
    for text, replacement in substitutions.items():
        assert text in script, "the README's Install lines no longer contain %r" % text
        script = script.replace(text, replacement)
    return script.splitlines()


def run_lines(lines, cwd, env, timeout):
    """Run LINES in one bash (set -e) in CWD. Returns (exit code, [(line, seconds, stdout,
    stderr)] for each line that ran)."""
    script = ["set -e"]
    for number, line in enumerate(lines):
        script += ['echo "%s %d $EPOCHREALTIME"; echo "%s %d" >&2' % (MARK, number, MARK, number),
                   line]
    script.append('echo "%s end $EPOCHREALTIME"; echo "%s end" >&2' % (MARK, MARK))
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    outs = re.split(r"^%s (\S+) (\S+)\n" % MARK, proc.stdout, flags=re.M)
    errs = re.split(r"^%s \S+\n" % MARK, proc.stderr, flags=re.M)
    # outs: [before, number, time, output, number, time, output, ...]
    marks = [(outs[i], float(outs[i + 1]), outs[i + 2]) for i in range(1, len(outs) - 1, 3)]
    ends = [t for _, t, _ in marks[1:]] + [time.time()]  # the last: the line that failed
    ran = []
    for (number, begin, out), end, err in zip(marks, ends, errs[1:] + [""] * len(marks)):
        if number != "end":
            ran.append((lines[int(number)], end - begin, out, err))
    return proc.returncode, ran


def pack_cache_unused(cache):
    """True when CACHE (`tfcluster wheelhouse --pack-cache`) is unset, or holds no pack and no
    wheelhouse uses it: a wheelhouse started now packs from nothing."""
    if not cache or not os.path.isdir(cache):
        return True
    if [name for name in os.listdir(cache) if not name.startswith(".")]:
        return False
    lock = os.path.join(cache, ".lock")
    if not os.path.exists(lock):
        return True
    with open(lock) as handle:
        try:  # a shared lock: refused while a wheelhouse holds the exclusive one
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True
