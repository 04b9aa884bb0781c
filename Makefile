# The two commands a newcomer needs: `make serve` and `make test`. Everything else is setup.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHP := $(VENV)/node_modules/.bin/configurable-http-proxy
CHP_VERSION := 5.2.0

.PHONY: serve test lint system-deps-serve system-deps-test clean

serve: system-deps-serve $(VENV)/.lab-installed $(CHP)
	$(VENV)/bin/meterhub serve

test: system-deps-test $(VENV)/.test-installed $(CHP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest --durations=15

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

$(CHP): | $(PY)
	npm install --prefix $(VENV) --no-audit --no-fund --loglevel=error configurable-http-proxy@$(CHP_VERSION)

clean:
	rm -rf $(VENV) meterhub-data
