# The README's two commands are `make demo` and `make test`; both build .venv
# from nothing when it is missing. `make install GPU=1` installs CUDA builds.
VENV   ?= .venv
PY     := $(VENV)/bin/python
CLI    := $(VENV)/bin/dlrm-platform
GPU    ?= 0
STAMP  := $(VENV)/.installed-$(if $(filter 1,$(GPU)),gpu,cpu)
CONFIG ?= configs/demo.yaml
PYTEST_ARGS ?=

.PHONY: install demo test test-unit test-integration ui serve bench clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints-cpu.txt scripts/install.sh
	GPU=$(GPU) VENV=$(VENV) scripts/install.sh
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(CLI) gen-data $(CONFIG) --if-missing
	$(CLI) run $(CONFIG) --summary-json runs/demo-summary.json

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

ui: $(STAMP)
	$(CLI) ui

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs data .pytest_cache
