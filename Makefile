# scrapy-fleet: `make demo` (a real multi-worker crawl) and `make test` (the whole suite).
# Works on a fresh Debian 12 machine: missing system packages are installed with apt-get
# (as root, else with sudo), Python packages into ./.venv.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# make demo SITE=../shared/sites/docs.python.org START=/3/ [WORKERS=3] [MONGO_URI=mongodb://...]
SITE    ?=
START   ?=
WORKERS ?= 3
# With a MongoDB URI the demo's workers also write items through MongoPipeline.
MONGO_URI ?=
PYTEST_ARGS ?=
# The suite mostly waits on real processes (crawls, servers, kills; it keeps ~0.7 of 2 cores
# busy with two pytest workers): three pytest workers, each with its own redis-server, on 2
# cores take ~0.77x the time of two (bench/README.md); a test file stays on one worker.
PYTEST_WORKERS ?= 3

.PHONY: venv system redis demo test test-oldest dist lint clean distclean

venv: $(VENV)/.installed

# Re-installed when the package metadata changes.
$(VENV)/.installed: setup.cfg pyproject.toml
	@if ! $(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then \
	    echo "python3-venv is missing: installing it"; \
	    $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends python3-venv; \
	fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

# Debian packages the demo and the tests start for real: Redis (and its Sentinel), a forward
# proxy for the proxy-pool tests, a browser for the dashboard and scrapy-playwright tests.
SYSTEM_PACKAGES := redis-server redis-sentinel tinyproxy chromium openssl
system:
	@missing=""; \
	for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	    echo "installing from Debian:$$missing"; \
	    $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y --no-install-recommends $$missing; \
	fi
	@redis-server --version

# The demo needs Redis only.
redis:
	@if ! command -v redis-server >/dev/null 2>&1; then \
	    echo "redis-server is missing: installing it from Debian"; \
	    $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends redis-server; \
	fi
	@redis-server --version

demo: venv redis
	$(PY) example_project/run_demo.py --workers $(WORKERS) \
	    $(if $(SITE),--site $(SITE)) $(if $(START),--start $(START)) \
	    $(if $(MONGO_URI),--mongo-uri '$(MONGO_URI)')

# An empty suite must not look green: pytest's exit code 5 ("no tests collected") fails.
test: venv system
	@$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

# The oldest releases setup.cfg allows (constraints/oldest.txt: Scrapy 2.15.0, Twisted 23.8.0,
# redis-py 5.0.1, ...) on the oldest Python claimed, 3.10: tox.ini's `oldest` environment, a
# subset of the suite that covers every component (tox.ini says which). Python 3.10 is taken
# from pyenv when it has one (the machines here do), else python3.10 on PATH; nothing is
# downloaded but the packages, from the package index.
OLDEST_PYTHON ?= $(shell v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.10(\.[0-9]+)?$$' | tail -1); \
	if [ -n "$$v" ]; then echo "$$(pyenv root)/versions/$$v/bin/python3.10"; else command -v python3.10; fi)
test-oldest: venv system
	@py="$(OLDEST_PYTHON)"; over=""; \
	if [ -z "$$py" ] || [ ! -x "$$py" ]; then \
	    py=$$(command -v python3); over="--override testenv:oldest.basepython=python3"; \
	    echo "WARNING: no Python 3.10 found (the oldest Python scrapy-fleet claims): the oldest"; \
	    echo "dependencies run on $$($$py --version) instead; name one with OLDEST_PYTHON=/path/to/python3.10"; \
	fi; \
	$(VENV)/bin/tox run -e oldest $$over --discover $$py -- $(PYTEST_ARGS)

# An sdist and a wheel in dist/ (what a release uploads): the package, its Lua scripts, the
# dashboard's static files, py.typed and LICENSE; not tests/, bench/ or testsite/.
dist: venv
	rm -rf dist
	$(PY) -m build

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf .demo .pytest_cache .mypy_cache .ruff_cache .tox build dist
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
