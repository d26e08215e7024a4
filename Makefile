# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS ?= cpu,test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-loaded bench venv system clean constraints chromium dist docs

venv: system $(STAMP)

# From the system: libfuse3 and fusermount3 (Debian's fuse3) for `storage serve --mount`, installed where
# apt-get runs as root; elsewhere the FUSE tests skip and say what is missing.
system:
	@command -v fusermount3 >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y --no-install-recommends fuse3 >/dev/null 2>&1 || \
	    { apt-get update >/dev/null && apt-get install -y --no-install-recommends fuse3 >/dev/null; } || \
	    echo "note: could not install fuse3; storage serve --mount and its tests will not run"; \
	  else echo "note: fuse3 is not installed (apt-get install fuse3 as root); storage serve --mount and its tests will not run"; fi; }

# constraints.txt is the one tested resolution; without it pip gives up on a fresh machine
# (resolution-too-deep) on the test extra's object-store packages.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

# After changing dependencies in pyproject.toml: install them into .venv, then rewrite constraints.txt
# from what pip resolves for cpu,test with the venv's current versions as the starting point.
constraints: venv
	$(BIN)/python -m pip freeze --exclude-editable > $(VENV)/freeze.txt
	$(BIN)/python -m pip install --quiet --dry-run --ignore-installed -c $(VENV)/freeze.txt \
	    --report $(VENV)/resolution.json -e ".[cpu,test]"
	$(BIN)/python tools/write_constraints.py $(VENV)/resolution.json constraints.txt

demo: venv
	$(BIN)/python -m stallscope.demo --out demo-output

# The suite runs where loopback is the only network, where the machine allows a namespace; two tests at
# a time (pytest-xdist), a file's tests in one worker so its module fixtures are made once. Most tests
# wait on subprocesses, servers and sleeps, so two share 2 cores well; those that need the CPUs to
# themselves are marked whole_machine (tests/conftest.py). The 20 slowest are named at the end: the
# suite's budget is 10 minutes on a fresh clone of a 2-core machine.
PYTEST := $(BIN)/python tools/loopback_only.py $(BIN)/python -m pytest -q -n 2 --dist loadscope --durations=20
test: venv chromium docs
	$(PYTEST)

# The same suite while one core is kept busy by a process of its own (tools/cpu_hog.py, ended by PID):
# a test whose outcome depends on how fast or loaded the machine is fails here first.
test-loaded: venv chromium docs
	$(BIN)/python tools/cpu_hog.py --cores 1 -- $(PYTEST)

# The sweep report's test renders it in headless Chromium: installed from Debian where we are root
# with apt; otherwise that test skips and says why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; } || \
	  echo "note: chromium not installed (needs root and apt); the sweep report's browser test will skip"

# The documentation site (docs/, mkdocs.yml) into site/, warnings as errors; installs the docs extra first.
# The CLI reference and the pipeline knobs are generated from the code (tools/docs_hooks.py).
docs: venv
	@$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || \
	  $(BIN)/python -m pip install --quiet -c constraints.txt -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The sdist and wheel users install (dist/), their metadata checked as PyPI would. No isolation: the
# setuptools and wheel pinned in constraints.txt build it, offline and in seconds.
dist: venv
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

bench: venv
	$(BIN)/python benchmarks/cli_startup.py
	$(BIN)/python benchmarks/convert.py
	$(BIN)/python benchmarks/convert_mount.py
	$(BIN)/python benchmarks/convert_scale.py listing
	$(BIN)/python benchmarks/convert_scale.py memory
	$(BIN)/python benchmarks/source_scale.py --store gcs
	$(BIN)/python benchmarks/prepare_train.py
	$(BIN)/python benchmarks/beam_convert.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/workload.py
	$(BIN)/python benchmarks/analysis.py
	$(BIN)/python benchmarks/own_profiles.py
	$(BIN)/python benchmarks/diagnose.py
	$(BIN)/python benchmarks/advice.py
	$(BIN)/python benchmarks/advice_programs.py
	$(BIN)/python benchmarks/own_dataset_window.py
	$(BIN)/python benchmarks/api_overhead.py
	$(BIN)/python benchmarks/storage.py
	$(BIN)/python benchmarks/s3_reader.py
	$(BIN)/python benchmarks/storage_emulator.py
	$(BIN)/python benchmarks/own_pipeline.py
	$(BIN)/python benchmarks/store_as_read.py
	$(BIN)/python benchmarks/cpu_quota.py

clean:
	rm -rf $(VENV) demo-output bench-output dist
