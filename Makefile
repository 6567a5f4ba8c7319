# make demo: a real distributed TensorFlow job (1 ps + 2 workers) on this machine.
# make check: the fast tier, after every edit. make test: the whole test suite.
# demo and test set up .venv (and, as root, the Debian packages) first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEBIAN_PACKAGES := iproute2 openssh-server openssh-client python3-venv procps rsync pciutils docker.io debootstrap ruby nftables python3-packaging

.PHONY: setup system-packages demo check test test-docker lint bench wheelhouse clean

setup: $(STAMP) system-packages

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The multi-host tests need network namespaces and sshd; only root can install or use them.
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
test: setup
	PYTHON=$(BIN)/python scripts/testsuite

# Only deploy, launch, stop and teardown on bare Debian containers (root).
test-docker: setup
	$(BIN)/python -m pytest -m docker tests

# The control plane against hand-started processes (see benchmarks/RESULTS.md).
bench: setup
	$(BIN)/python scripts/bench $(BENCH_ARGS)

lint: setup
	$(BIN)/ansible-lint --offline --profile production playbooks/ roles/

wheelhouse: setup
	scripts/wheelhouse

clean:
	rm -rf .work runs
