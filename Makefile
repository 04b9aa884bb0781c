# The two commands a newcomer needs: `make serve` and `make test`. Everything else is setup.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHP := $(VENV)/node_modules/.bin/configurable-http-proxy
CHP_VERSION := 5.2.0
# the installer: uv (many times faster than pip) from PATH, else bootstrapped into the venv
# by pip at this version, else pip itself (scripts/install-python)
UV_VERSION := 0.13.8
# set-up steps print one line each; their output is kept here and shown when one fails
LOGS := $(VENV)/setup-logs
QUIETLY := scripts/quietly
# more for `meterhub serve`, e.g. make serve ARGS="--config meterhub.yaml --port 8080"
ARGS ?=
LAB_SRC := extensions/labextension
LAB := extensions/lab/package.json
LAB_NODE := $(LAB_SRC)/node_modules/.package-lock.json
SERVER_CONFIG := $(VENV)/etc/jupyter/jupyter_server_config.d/meterhub.json

.PHONY: serve test test-fast lint system-deps-serve system-deps-test clean

# the Python packages ($(INSTALLED): the servers', or the tests' too) and the npm packages
# install side by side, the JupyterLab extension is built once both are there
INSTALLED ?= $(VENV)/.lab-installed
SETUP = $(MAKE) --no-print-directory -j4 INSTALLED=$(1) $(1) $(CHP) $(LAB) $(SERVER_CONFIG)

serve: system-deps-serve
	@$(call SETUP,$(VENV)/.lab-installed)
	@$(VENV)/bin/meterhub serve $(ARGS)

test: system-deps-test
	@$(call SETUP,$(VENV)/.test-installed)
	$(VENV)/bin/ruff check .
	cd $(LAB_SRC) && npm run --silent lint && npm test --silent
	# four workers on two cores: most of a hub test is waiting for its processes and its
	# timers (meter passes, idle timeouts); three took 15 min here, four 13
	$(VENV)/bin/pytest -n 4 --dist loadfile --durations=15

# in-process hub tests: no proxy, no JupyterLab servers; seconds, not minutes
test-fast: $(VENV)/.test-installed
	$(VENV)/bin/pytest -q tests/fast

lint: $(VENV)/.test-installed $(LAB_NODE)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd $(LAB_SRC) && npm run --silent lint && npm run --silent prettier:check

system-deps-serve:
	@PYTHON=$(PYTHON) scripts/system-deps serve

system-deps-test:
	@PYTHON=$(PYTHON) scripts/system-deps test

# without pip: a second, not eight; scripts/install-python gives it the same pip
$(PY):
	@$(QUIETLY) $(LOGS)/venv.log "a virtual environment in $(VENV)" $(PYTHON) -m venv --without-pip $(VENV)

$(VENV)/.lab-installed: pyproject.toml | $(PY)
	@$(QUIETLY) $(LOGS)/python.log "meterhub and the servers' packages into $(VENV) (uv, else pip)" \
		$(PYTHON) scripts/install-python $(VENV) $(UV_VERSION) -e '.[lab]'
	@touch $@

$(VENV)/.test-installed: pyproject.toml | $(PY)
	@$(QUIETLY) $(LOGS)/python.log "meterhub, the servers' and the tests' packages into $(VENV) (uv, else pip)" \
		$(PYTHON) scripts/install-python $(VENV) $(UV_VERSION) -e '.[lab,test]'
	@touch $(VENV)/.lab-installed $@

# the JupyterLab extension (status bar credit, warnings), prebuilt with JupyterLab's builder
# (jupyter-builder, from the Python packages) and linked where the servers' JupyterLab finds
# prebuilt extensions
$(LAB): $(wildcard $(LAB_SRC)/src/*.ts $(LAB_SRC)/style/*) $(LAB_SRC)/tsconfig.json $(LAB_NODE) | $(INSTALLED)
	@$(QUIETLY) $(LOGS)/lab-build.log "building the JupyterLab extension" \
		sh -c 'cd $(LAB_SRC) && PATH="$(abspath $(VENV))/bin:$$PATH" npm run --silent build'
	@mkdir -p $(VENV)/share/jupyter/labextensions/@meterhub
	@ln -sfn "$(abspath extensions/lab)" $(VENV)/share/jupyter/labextensions/@meterhub/credit-status

# the extension's build, lint and test tools, exactly as package-lock.json pins them
$(LAB_NODE): $(LAB_SRC)/package.json $(LAB_SRC)/package-lock.json
	@$(QUIETLY) $(LOGS)/lab-npm.log "the JupyterLab extension's build tools (npm ci)" \
		sh -c 'cd $(LAB_SRC) && npm ci --no-audit --no-fund --loglevel=error'

# the server extension switched on in the servers' environment. An editable install skips
# [tool.setuptools.data-files] (a wheel carries them), so put it where a wheel would; a copy,
# not a link: the bwrap sandbox binds the environment, not this repository
$(SERVER_CONFIG): jupyter-config/jupyter_server_config.d/meterhub.json | $(PY)
	@install -D -m 644 $< $@

$(CHP): | $(PY)
	@$(QUIETLY) $(LOGS)/proxy.log "configurable-http-proxy $(CHP_VERSION) (npm)" \
		npm install --prefix $(VENV) --no-audit --no-fund --loglevel=error configurable-http-proxy@$(CHP_VERSION)

clean:
	rm -rf $(VENV) meterhub-data extensions/lab $(LAB_SRC)/node_modules $(LAB_SRC)/lib
