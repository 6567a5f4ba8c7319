# make demo: a real distributed TensorFlow job (1 ps + 2 workers) on this machine.
# make check: the fast tier, after every edit. make test: the whole test suite. make docs: the site.
# Each installs what it needs and no more: demo and check the venv (.venv); test also, as root,
# the Debian packages of the test hosts and containers.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := roles/tensorflow/files/constraints.txt
UV = $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode --system-certs
PIP = $(BIN)/pip install --quiet
# $(call install,INSTALLER): the venv's packages. The checkout on sys.path by a plain .pth line
# (compat): setuptools' default editable finder costs every Python start in this venv 15 ms (each
# tfcluster command, each local agent). tf-keras comes without its dependencies: it requires
# `tensorflow`, and tensorflow-cpu is that.
install = $(1) --upgrade pip && $(1) -e '.[test]' --config-settings editable_mode=compat && \
  $(1) --no-deps -c $(CONSTRAINTS) -r trainers/requirements-no-deps.txt
# The test hosts (network namespaces, sshd) and containers; only root can install or use them.
DEBIAN_PACKAGES := iproute2 openssh-server openssh-client python3-venv procps rsync pciutils docker.io debootstrap ruby nftables python3-packaging

.PHONY: setup system-packages xprof demo check test test-docker lint bench wheelhouse collection docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py trainers/requirements-no-deps.txt $(CONSTRAINTS)
	@# Debian's python3 makes venvs only with python3-venv: as root, installed when missing.
	$(PYTHON) -m venv $(VENV) || { $(MAKE) --no-print-directory system-packages \
	  DEBIAN_PACKAGES=python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@# uv (from PyPI, into the venv) installs and byte-compiles on every core: 22 s instead of
	@# pip's 74 s on a fresh clone. It reads no pip.conf: it trusts the system's certificates (a
	@# TLS-inspecting proxy's CA), and where it still fails (an index only pip.conf names) pip
	@# installs the same.
	$(BIN)/pip install --quiet uv && { $(call install,$(UV)); } || { \
	  echo "make setup: uv could not install; pip installs instead"; $(call install,$(PIP)); }
	@# The checkout byte-compiled once: where PYTHONDONTWRITEBYTECODE is set, every tfcluster
	@# command, agent and task would compile its modules again (`tfcluster runs`: 125 -> 70 ms
	@# of CPU). A stale file is compiled again in memory, as without it.
	$(BIN)/python -m compileall -q tfcluster tfcluster_agent trainers scripts/hostlib tests >/dev/null
	touch $(STAMP)

system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(DEBIAN_PACKAGES); do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  fi; \
	fi

demo: setup
	@scripts/demo

# The fast tier, after every edit: in-process tests and short subprocesses on this machine (CLI
# commands, the agent with placeholder tasks), the docs site's strict build; no TensorFlow launch,
# no playbook run, no test hosts or containers, no root. Whole files per worker, two workers per
# core: many tests wait on a subprocess or a deadline, and a second worker computes meanwhile
# (benchmarks/RESULTS.md: 2 cores, 4 workers against 2).
CHECK_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))
check: $(STAMP)
	$(BIN)/python -m pytest -q -n $(CHECK_WORKERS) --dist loadfile -m "not slow and not root" tests

# Everything (CI): the fast tier, real launches, learning checks, test hosts and containers as
# root. The container tests run as a second pytest session beside the others (scripts/testsuite).
test: setup system-packages xprof
	PYTHON=$(BIN)/python scripts/testsuite

# TensorBoard's profile plugin's converter (xprof, the version the viz extra's
# tensorboard-plugin-profile pins), for the tests that read traces as the plugin shows them:
# unpacked aside, not installed (the package would bring its web server's dependencies).
XPROF := 2.24.2
XPROF_DIR := $(VENV)/xprof-$(XPROF)
xprof: $(XPROF_DIR)/.unpacked

$(XPROF_DIR)/.unpacked: $(STAMP)
	rm -rf $(XPROF_DIR) && mkdir -p $(XPROF_DIR)
	$(BIN)/pip download --quiet --no-deps --dest $(XPROF_DIR) xprof==$(XPROF)
	$(BIN)/python -m zipfile -e $(XPROF_DIR)/xprof-$(XPROF)-*.whl $(XPROF_DIR)
	rm -f $(XPROF_DIR)/xprof-$(XPROF)-*.whl
	touch $@

# Only deploy, launch, stop and teardown on bare Debian containers (root).
test-docker: setup system-packages
	$(BIN)/python -m pytest -m docker tests

# The control plane against hand-started processes (see benchmarks/RESULTS.md).
bench: setup
	$(BIN)/python scripts/bench $(BENCH_ARGS)

lint: setup
	$(BIN)/ansible-lint --offline --profile production playbooks/ roles/

# The hosts' wheels and packed venv for an offline deploy, into wheelhouse/ (tfcluster wheelhouse).
wheelhouse: setup
	$(BIN)/tfcluster wheelhouse $(WHEELHOUSE_ARGS)

# The documentation site (MkDocs, Material theme) from docs/ into site/; the fast tier builds it
# with --strict too (tests/test_docs.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The collection tfcluster.cluster as a tarball in dist/, for sites that install collections
# from files (the wheel carries the same collection).
collection: setup
	$(BIN)/ansible-galaxy collection build --force --output-path dist .

clean:
	rm -rf .work runs
