# make demo: a real distributed TensorFlow job (1 ps + 2 workers) on this machine.
# make check: the fast tier, after every edit. make test: the whole test suite.
# Each installs what it needs and no more: demo and check the venv (.venv); test also, as root,
# the Debian packages of the test hosts and containers.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := roles/tensorflow/files/constraints.txt
UV = $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode
# The test hosts (network namespaces, sshd) and containers; only root can install or use them.
DEBIAN_PACKAGES := iproute2 openssh-server openssh-client python3-venv procps rsync pciutils docker.io debootstrap ruby nftables python3-packaging

.PHONY: setup system-packages demo check test test-docker lint bench wheelhouse collection clean

setup: $(STAMP)

# tf-keras comes without its dependencies: it requires `tensorflow`, and tensorflow-cpu is that.
$(STAMP): pyproject.toml setup.py trainers/requirements-no-deps.txt $(CONSTRAINTS)
	@# Debian's python3 makes venvs only with python3-venv: as root, installed when missing.
	$(PYTHON) -m venv $(VENV) || { $(MAKE) --no-print-directory system-packages \
	  DEBIAN_PACKAGES=python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	@# uv (from PyPI, into the venv) unpacks and byte-compiles on every core: the set-up takes
	@# ~25 s instead of pip's ~70 s, which every fresh clone (CI) waits for before any test.
	$(BIN)/pip install --quiet --disable-pip-version-check uv
	$(UV) --upgrade pip
	@# The checkout on sys.path by a plain .pth line (compat): setuptools' default editable finder
	@# costs every Python start in this venv 15 ms (each tfcluster command, each local agent).
	$(UV) -e '.[test]' --config-settings editable_mode=compat
	$(UV) --no-deps -c $(CONSTRAINTS) -r trainers/requirements-no-deps.txt
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

# The fast tier, after every edit: in-process tests, no TensorFlow launch, no test hosts (< 60 s).
check: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not root" tests

# Everything (CI): the fast tier, real launches, learning checks, test hosts and containers as
# root. The container tests run as a second pytest session beside the others (scripts/testsuite).
test: setup system-packages
	PYTHON=$(BIN)/python scripts/testsuite

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

# The collection tfcluster.cluster as a tarball in dist/, for sites that install collections
# from files (the wheel carries the same collection).
collection: setup
	$(BIN)/ansible-galaxy collection build --force --output-path dist .

clean:
	rm -rf .work runs
