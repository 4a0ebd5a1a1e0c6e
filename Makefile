PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_WORKLOAD := models/demo_workload.json

.PHONY: demo test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/onnxsplit solve $(DEMO_WORKLOAD) --objective throughput --method dp -o $(VENV)/demo_plan.json
	@echo
	@echo "The same plan, scored for single-stream latency:"
	$(BIN)/onnxsplit evaluate $(DEMO_WORKLOAD) $(VENV)/demo_plan.json --objective latency

test: $(VENV)/.installed
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
