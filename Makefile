# The two commands a newcomer needs: `make serve` and `make test`. Everything else is setup.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHP := $(VENV)/node_modules/.bin/configurable-http-proxy
CHP_VERSION := 5.2.0
LAB_SRC := extensions/labextension
LAB := extensions/lab/package.json

.PHONY: serve test lint system-deps-serve system-deps-test clean

serve: system-deps-serve $(VENV)/.lab-installed $(CHP) $(LAB)
	$(VENV)/bin/meterhub serve

test: system-deps-test $(VENV)/.test-installed $(CHP) $(LAB)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -n 2 --dist loadfile --durations=15

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

system-deps-serve:
	@PYTHON=$(PYTHON) scripts/system-deps serve

system-deps-test:
	@PYTHON=$(PYTHON) scripts/system-deps test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.lab-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[lab]'
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[lab,test]'
	touch $(VENV)/.lab-installed $@

# the JupyterLab extension (status bar credit, warnings), prebuilt with JupyterLab's builder
# and linked where the servers' JupyterLab finds prebuilt extensions
$(LAB): $(LAB_SRC)/src/index.ts $(LAB_SRC)/package.json $(LAB_SRC)/package-lock.json | $(PY)
	cd $(LAB_SRC) && npm ci --no-audit --no-fund --loglevel=error
	cd $(LAB_SRC) && PATH="$(abspath $(VENV))/bin:$$PATH" npm run --silent build
	mkdir -p $(VENV)/share/jupyter/labextensions/@meterhub
	ln -sfn "$(abspath extensions/lab)" $(VENV)/share/jupyter/labextensions/@meterhub/credit-status

$(CHP): | $(PY)
	npm install --prefix $(VENV) --no-audit --no-fund --loglevel=error configurable-http-proxy@$(CHP_VERSION)

clean:
	rm -rf $(VENV) meterhub-data extensions/lab $(LAB_SRC)/node_modules $(LAB_SRC)/lib
