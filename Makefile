# attn-audit. `make audit` audits the default grid for this machine (gpu preset
# with CUDA, cpu preset without); `make test` runs the unit tests and the quick suites.
PYTHON ?= python3
AUDIT_ARGS ?=
DIR ?= reports/latest

.PHONY: deps audit quick test report clean

deps:  ## install whatever is missing (nothing when all is importable)
	$(PYTHON) -m audit.bootstrap

audit: deps  ## run the default preset and write the report under reports/
	$(PYTHON) -m audit run $(AUDIT_ARGS)

quick: deps  ## the quick preset (about 30 s on 2 cores)
	$(PYTHON) -m audit run --preset quick $(AUDIT_ARGS)

test: deps  ## unit tests and quick suites
	$(PYTHON) -m pytest -q tests suites

report:  ## rebuild the report of DIR (default reports/latest)
	$(PYTHON) -m audit report $(DIR)

clean:
	rm -rf .pytest_cache .benchmarks
