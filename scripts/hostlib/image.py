"""The containers' image tfcluster-sshd:debian12: deploy/compose/Dockerfile built on BASE_IMAGE
(pulled by the engine) or on a debootstrap minbase root filesystem of this machine's Debian
mirror, kept as a tarball in /var/cache/tfcluster/dockerhosts/ (DOCKERHOSTS_CACHE overrides)."""

import hashlib
import os
import re
from pathlib import Path

from .common import REPO, Fail, find_tools, remove_tree, run, tool
from .engine import STATE_FILE, docker

COMPOSE_DIR = REPO / "deploy" / "compose"
CACHE = Path(os.environ.get("DOCKERHOSTS_CACHE", "/var/cache/tfcluster/dockerhosts"))
LABEL = "tfcluster.dockerhosts"
IMAGE = "tfcluster-sshd:debian12"
BASE = "tfcluster-base:bookworm"
SUITE = "bookworm"


def packages():
    """The Dockerfile's ARG PACKAGES: what the debootstrap base gets, so the build needs no net."""
    m = re.search(r'^ARG PACKAGES="([^"]+)"', (COMPOSE_DIR / "Dockerfile").read_text(), re.M)
    return m.group(1).split()


def debian_mirror():
    """The Debian mirror this machine's apt uses (DEBIAN_MIRROR overrides)."""
    if os.environ.get("DEBIAN_MIRROR"):
        return os.environ["DEBIAN_MIRROR"].rstrip("/")
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and \
                        SUITE in fields.get("Suites", "").split():
                    return fields["URIs"].split()[0].rstrip("/")
        else:
            for line in text.splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and m.group(2) == SUITE:
                    return m.group(1).rstrip("/")
    return "http://deb.debian.org/debian"


def base_tarball(mirror):
    key = hashlib.sha256(f"{SUITE} {mirror} {' '.join(packages())}".encode()).hexdigest()[:12]
    return CACHE / f"debian-{SUITE}-minbase-{key}.tar"


def need_debootstrap():
    """Fail (exit 2) before anything starts where the base must be built and cannot be."""
    if os.environ.get("BASE_IMAGE") or base_tarball(debian_mirror()).exists():
        return
    if find_tools({"debootstrap": "debootstrap"})[1]:
        raise Fail("dockerhosts needs debootstrap to build the base image once: install the "
                   "Debian package debootstrap (apt-get install debootstrap), or set "
                   "BASE_IMAGE to an image the engine can pull (e.g. debian:12)", 2)


def build_base_tarball(tarball, mirror):
    """debootstrap a minbase root filesystem with the packages, then tar it into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    build = CACHE / f".build-{os.getpid()}"
    rootfs = build / "rootfs"
    print(f"dockerhosts: building the base image with debootstrap from {mirror} "
          f"(once; cached in {CACHE})", flush=True)
    try:
        run([tool("debootstrap"), "--variant=minbase", "--include=" + ",".join(packages()),
             SUITE, str(rootfs), mirror], timeout=900)
        # per-container host keys; no package caches in the image
        for p in rootfs.glob("etc/ssh/ssh_host_*"):
            p.unlink()
        for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / d).glob("*"):
                if p.is_file():
                    p.unlink()
        tmp = build / "rootfs.tar"
        run([tool("tar"), "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(tmp), "."],
            timeout=300)
        os.replace(tmp, tarball)
        for old in CACHE.glob(f"debian-{SUITE}-minbase-*.tar"):  # earlier package lists
            if old != tarball:
                old.unlink()
    finally:
        remove_tree(build)


def build(state):
    base = os.environ.get("BASE_IMAGE")
    if base:
        if docker(state, "image", "inspect", base, check=False).returncode != 0:
            docker(state, "pull", base, timeout=600)
    else:
        base = BASE
        mirror = debian_mirror()
        tarball = base_tarball(mirror)
        if not tarball.exists():
            build_base_tarball(tarball, mirror)
        state["base_image"] = base
        STATE_FILE.save(state)
        docker(state, "import", "--change", f"LABEL {LABEL}=1", str(tarball), base, timeout=300)
    state["image"] = IMAGE
    STATE_FILE.save(state)
    # No network for the build on the debootstrap base (every package is there); another base
    # installs them with apt over the machine's network (a private engine has no bridge).
    docker(state, "build", "--quiet", "--network", "none" if base == BASE else "host",
           "--label", f"{LABEL}=1", "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE,
           str(COMPOSE_DIR), timeout=900)
