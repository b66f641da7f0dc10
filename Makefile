# attn-audit. `make audit` audits the default grid for this machine (gpu preset
# with CUDA, cpu preset without); `make test` runs the unit tests and the quick suites.
PYTHON ?= python3
AUDIT_ARGS ?=
DIR ?= reports/latest
# Regression gate (README: CI regression gate). BENCH_FAIL is chosen from measured noise.
BENCH_OPTS ?= --benchmark-only --benchmark-min-rounds=15 --benchmark-max-time=0.3 --benchmark-columns=min,median,iqr,rounds --benchmark-sort=name
BENCH_FAIL ?= min:50%
BENCH_STORAGE ?= .benchmarks
BENCH_SUITE ?= suites/test_performance.py --audit-preset quick --audit-seq-len 512 1024

.PHONY: deps test-deps audit quick test report bench-save bench-check gpu-check clean

deps:  ## install whatever is missing (nothing when all is importable)
	$(PYTHON) -m audit.bootstrap

test-deps:  ## install what is missing, the optional extras the tests exercise (ray) included
	$(PYTHON) -m audit.bootstrap --test

audit: deps  ## run the default preset and write the report under reports/
	$(PYTHON) -m audit run $(AUDIT_ARGS)

quick: deps  ## the quick preset (60 s budget; about 44 s on a 2-core AMD EPYC)
	$(PYTHON) -m audit run --preset quick $(AUDIT_ARGS)

test: test-deps  ## unit tests and quick suites
	$(PYTHON) -m pytest -q tests suites

report:  ## rebuild the report of DIR (default reports/latest)
	$(PYTHON) -m audit report $(DIR)

bench-save: deps  ## save a speed baseline with pytest-benchmark's storage
	$(PYTHON) -m pytest -q $(BENCH_SUITE) $(BENCH_OPTS) --benchmark-storage=file://$(BENCH_STORAGE) --benchmark-save=baseline

bench-check: deps  ## rerun and fail (non-zero exit) on a regression against the latest saved baseline
	$(PYTHON) -m pytest -q $(BENCH_SUITE) $(BENCH_OPTS) --benchmark-storage=file://$(BENCH_STORAGE) --benchmark-compare --benchmark-compare-fail=$(BENCH_FAIL)

gpu-check:  ## every GPU acceptance check in one call (README: On a GPU machine); copies results to $$OUT when set
	$(PYTHON) -m audit.gpucheck

clean:
	rm -rf .pytest_cache .benchmarks
