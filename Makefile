# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS ?= cpu,test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: venv
	$(BIN)/python -m stallscope.demo --out demo-output

test: venv
	$(BIN)/python -m pytest -q

bench: venv
	$(BIN)/python benchmarks/convert.py
	$(BIN)/python benchmarks/beam_convert.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/workload.py
	$(BIN)/python benchmarks/analysis.py
	$(BIN)/python benchmarks/own_profiles.py
	$(BIN)/python benchmarks/diagnose.py
	$(BIN)/python benchmarks/api_overhead.py
	$(BIN)/python benchmarks/storage.py

clean:
	rm -rf $(VENV) demo-output bench-output
