# attn-audit. `make audit` audits the default grid for this machine (gpu preset
# with CUDA, cpu preset without); `make test` runs the unit tests and the quick suites.
PYTHON ?= python3
AUDIT_ARGS ?=
DIR ?= reports/latest
# Regression gate (docs/testing.md). BENCH_FAIL is chosen from measured noise.
BENCH_OPTS ?= --benchmark-only --benchmark-min-rounds=15 --benchmark-max-time=0.3 --benchmark-columns=min,median,iqr,rounds --benchmark-sort=name
BENCH_FAIL ?= min:50%
BENCH_STORAGE ?= .benchmarks
BENCH_SUITE ?= suites/test_performance.py --audit-preset quick --audit-seq-len 512 1024
# make test: the tests that time nothing on TEST_WORKERS pytest-xdist workers, then those that
# time things (marked serial) alone; TEST_BENCH_OPTS keeps the speed suite's rounds short there;
# TEST_OPTS goes to both pytest calls (e.g. TEST_OPTS=--durations=25). TEST_THREADS: torch
# threads of every test process (one each: what the workers run shares the cores; and one
# count for the whole session, so Inductor's CPU kernels, built per thread count, are shared).
# Bytecode is written (PYTHONDONTWRITEBYTECODE emptied, the package compiled first): every test
# process and every run a test starts would otherwise compile the audit and the tests again
# (pytest's collection: 13 s without, 7 s with, on 2 cores of an AMD EPYC).
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
# TEST_COMPILE_THREADS: Inductor's compile threads in every test process. With its default (one a
# core) each process that compiles starts a pool of compile workers, each importing torch; the
# test processes fill the cores already, so the pool buys no parallelism, only its start-up
# (a cold-cache compiled run: 113 CPU-s with the pool, 103 without, 2-core AVX2-only AMD EPYC).
TEST_COMPILE_THREADS ?= 1
TEST_BENCH_OPTS ?= --benchmark-min-rounds=3 --benchmark-max-time=0.05
TEST_OPTS ?=
# The files holding serial tests (a `mark.serial` in them): the serial phase collects only these. It
# runs in two steps: first, side by side, the serial tests marked one_core (a process that times on one
# thread, its own core's worth of the machine) and the rest but those marked every_core (the benchmark
# suite and the regression gate, one thread too); then those marked every_core (they time processes on
# every core, or a neighbour burning them all), alone. One serial process at a time, timing on one
# thread, left one of 2 cores idle for about 30 s of the phase.
SERIAL_FILES = $(shell grep -l 'mark\.serial' tests/*.py suites/*.py)
ONE_CORE_FILES = $(shell grep -l 'mark\.one_core' tests/*.py suites/*.py)
EVERY_CORE_FILES = $(shell grep -l 'mark\.every_core' tests/*.py suites/*.py)
# The other CPU kinds, emulated on this one (docs/testing.md): the tests whose outcome rests on floating-point
# results (marked cpu_kinds) run again under each setting, `;` between settings: ATen's kernels without a
# vector ISA, then an AVX2-only CPU (ATen's AVX2 kernels and oneDNN's matmul capped at AVX2: bf16 at 1-2
# GFLOP/s). Empty: no emulated phase.
EMULATED_CPUS ?= ATEN_CPU_CAPABILITY=default;ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
CPU_KINDS_FILES = $(shell grep -l 'mark\.cpu_kinds' tests/*.py suites/*.py)
# The session's folder (ATTN_AUDIT_TEST_HOME) goes when the recipe ends, Ctrl-C included (sh runs no EXIT
# trap on a signal it does not trap: each interrupted run left its folder, with its quick run, in /tmp).
# The emulated phase runs beside the parallel one, niced: it takes the cycles the parallel phase leaves
# idle (a worker waiting on a hung cell or on its last test) and gives them back at once; the serial phase
# waits for both, as it needs an idle machine.
EMULATED_NICE ?= 10

.PHONY: deps test-deps audit quick test test-findings test-cpu-kinds report bench-save bench-check gpu-check clean

deps:  ## install whatever is missing (nothing when all is importable)
	$(PYTHON) -m audit deps

test-deps:  ## install what is missing: also what the tests use (ray, transformers, pytest-xdist, a Chromium: Debian's, as root)
	$(PYTHON) -m audit deps --test

audit: deps  ## run the default preset and write the report under reports/
	$(PYTHON) -m audit run $(AUDIT_ARGS)

quick: deps  ## the quick preset (60 s budget; 48-62 s on a 2-core AMD EPYC with AVX2 only, Inductor's cache warm or cold)
	$(PYTHON) -m audit run --preset quick $(AUDIT_ARGS)

test: test-deps  ## unit tests and quick suites: in parallel what times nothing (beside it, at low priority, the other CPU kinds emulated), then what times things: one-thread timers side by side, then what loads every core alone
	@home=$$(mktemp -d); trap 'rm -rf "$$home"' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; export ATTN_AUDIT_TEST_HOME="$$home" OMP_NUM_THREADS=$(TEST_THREADS) TORCHINDUCTOR_COMPILE_THREADS=$(TEST_COMPILE_THREADS); \
	export PYTHONDONTWRITEBYTECODE=; $(PYTHON) -m compileall -q audit tests suites conftest.py > /dev/null; \
	nice -n $(EMULATED_NICE) $(MAKE) --no-print-directory test-cpu-kinds-here > "$$home/emulated.log" 2>&1 & emulating=$$!; \
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not serial" $(TEST_OPTS) tests suites; parallel=$$?; \
	wait $$emulating; emulated=$$?; cat "$$home/emulated.log"; \
	one_core=0; every_core=0; [ -z "$(ONE_CORE_FILES)" ] || { \
	  $(PYTHON) -m pytest -q -p no:xdist -m "serial and one_core" $(TEST_OPTS) $(ONE_CORE_FILES) > "$$home/one_core.log" 2>&1 & beside=$$!; }; \
	$(PYTHON) -m pytest -q -p no:xdist -m "serial and not one_core and not every_core" $(TEST_BENCH_OPTS) $(TEST_OPTS) $(SERIAL_FILES); serial=$$?; \
	[ -z "$(ONE_CORE_FILES)" ] || { wait $$beside; one_core=$$?; cat "$$home/one_core.log"; }; \
	[ -z "$(EVERY_CORE_FILES)" ] || { $(PYTHON) -m pytest -q -p no:xdist -m "serial and every_core" $(TEST_OPTS) $(EVERY_CORE_FILES); every_core=$$?; }; \
	exit $$(( parallel != 0 || serial != 0 || emulated != 0 || one_core != 0 || every_core != 0 ))

test-findings: test-deps  ## docs/findings.md: every third-party defect's script, the transformers ones included (about a minute of compiles)
	ATTN_AUDIT_SLOW_FINDINGS=1 $(PYTHON) -m pytest -q $(TEST_OPTS) tests/test_findings_gallery.py

test-cpu-kinds:  ## only the tests marked cpu_kinds, natively then under each of EMULATED_CPUS (another CPU's results, here)
	@home=$$(mktemp -d); trap 'rm -rf "$$home"' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; export ATTN_AUDIT_TEST_HOME="$$home" OMP_NUM_THREADS=$(TEST_THREADS) TORCHINDUCTOR_COMPILE_THREADS=$(TEST_COMPILE_THREADS); \
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "cpu_kinds and not serial and not shared_run" $(TEST_OPTS) $(CPU_KINDS_FILES); native=$$?; \
	$(MAKE) --no-print-directory test-cpu-kinds-here; emulated=$$?; \
	exit $$(( native != 0 || emulated != 0 ))

# (in the test session's own folder, ATTN_AUDIT_TEST_HOME: the emulated phase of `make test` and of
# test-cpu-kinds) One pytest session, one worker per setting (pytest-xdist's `--tx popen//env:NAME=value`,
# `--dist each`: every marked test on every worker), the workers side by side: each collects once.
# A setting that is this machine's own kind (ATEN_CPU_CAPABILITY=avx2 on an AVX2-only CPU) is left out,
# saying so (tests/cpu_kinds.py): its tests ran natively.
test-cpu-kinds-here:
	@tx=; n=0; cpus=$$($(PYTHON) tests/cpu_kinds.py '$(EMULATED_CPUS)') || exit 2; IFS=';'; for cpu in $$cpus; do \
	  spec=popen; IFS=' '; for kv in $$cpu; do spec="$$spec//env:$$kv"; done; \
	  echo "CPU kind emulated on worker gw$$n: $$cpu"; tx="$$tx --tx $$spec"; n=$$((n + 1)); IFS=';'; \
	done; IFS=' '; [ -z "$$tx" ] || $(PYTHON) -m pytest -q $$tx --dist each -m "cpu_kinds and not serial and not shared_run" $(TEST_OPTS) $(CPU_KINDS_FILES)

report:  ## rebuild the report of DIR (default reports/latest)
	$(PYTHON) -m audit report $(DIR)

bench-save: deps  ## save a speed baseline with pytest-benchmark's storage
	$(PYTHON) -m pytest -q $(BENCH_SUITE) $(BENCH_OPTS) --benchmark-storage=file://$(BENCH_STORAGE) --benchmark-save=baseline

bench-check: deps  ## rerun and fail (non-zero exit) on a regression against the latest saved baseline
	$(PYTHON) -m pytest -q $(BENCH_SUITE) $(BENCH_OPTS) --benchmark-storage=file://$(BENCH_STORAGE) --benchmark-compare --benchmark-compare-fail=$(BENCH_FAIL)

gpu-check:  ## every GPU acceptance check in one call (docs/gpu.md); copies results to $$OUT when set
	$(PYTHON) -m audit gpu-check

clean:
	rm -rf .pytest_cache .benchmarks
