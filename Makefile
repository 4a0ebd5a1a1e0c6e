PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_MODEL := models/small_bert.onnx
DEMO_SHAPES := --input-shape input_ids=1x64 --input-shape attention_mask=1x64

.PHONY: demo test test-quick clean browser

# uv installs the packages (from PyPI, as pip does): its downloads run in parallel, and the
# test extras took 15 s where pip took 93 s on a 2-core machine with an empty cache.  Where
# uv cannot be had, pip installs them
$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q uv || $(BIN)/python -m pip install -q --upgrade pip

# --compile-bytecode: uv writes no .pyc files of its own (pip does), and where Python may
# not write them either (PYTHONDONTWRITEBYTECODE, set on some machines and CI images) every
# process compiled onnx, numpy, onnxruntime's and Ray's sources again: a Ray Serve test took
# 80 CPU seconds so and 45 compiled, `onnxsplit devices` 1.1 s so and 0.5 compiled.  PYC compiles
# onnxsplit's own sources (an editable install: no installer compiles them) where they changed
UV_PIP := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
PIP    := $(BIN)/python -m pip install -q
PYC    := $(BIN)/python -m compileall -q onnxsplit

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(UV_PIP) -e ".[test]" || $(PIP) -e ".[test]"
	$(BIN)/python -m onnxsplit.solve.precompile
	touch $@

# the tests also run what optional extras give (Ray: the engine and the server; OpenVINO:
# its runtime and plugin EP as providers and peers; onnxruntime-genai: generate's peer)
$(VENV)/.installed-extras: $(VENV)/.installed
	$(UV_PIP) -e ".[test,ray,serve,openvino,genai]" || $(PIP) -e ".[test,ray,serve,openvino,genai]"
	touch $@

# the demo measures the split beside OpenVINO too, the peer a CPU user would pick
$(VENV)/.installed-openvino: $(VENV)/.installed
	$(UV_PIP) -e ".[openvino]" || $(PIP) -e ".[openvino]"
	touch $@

demo: $(VENV)/.installed-openvino
	@$(PYC)
	$(BIN)/onnxsplit $(DEMO_MODEL) $(DEMO_SHAPES) --out $(VENV)/demo_parts --force
	@echo
	@echo "The result, measured beside onnxruntime's own sessions on the same inputs:"
	$(BIN)/onnxsplit run $(VENV)/demo_parts --samples 200

# three workers (pytest-xdist) on CI's two cores: most of a slow test waits on the clock (Ray
# and its servers starting, sessions settling, subprocesses), not on a core; the slow tests
# start first and an idle worker takes tests queued for another (worksteal), so the run ends
# on quick ones.  Every measurement lasts a fifth of a user's (ONNXSPLIT_TIMING_SCALE), and a
# worker's tests share one profile cache (tests/conftest.py)
XDIST := -n 3 --dist worksteal

# headless Chromium opens the parts folder's report.html as a user would
# (tests/test_parts_report.py): installed where it can be (apt-get, as root), never failing
# the target; without it those tests are skipped, saying why
browser:
	-@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    timeout 900 sh -c 'export DEBIAN_FRONTEND=noninteractive; \
	      apt-get install -y -qq chromium >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1'; } || \
	  echo "(Chromium not installed: the browser tests will be skipped)"

test: $(VENV)/.installed-extras browser
	@$(PYC)
	$(BIN)/python -m pytest $(XDIST) --durations=10

# the quick tier, under a minute: no slow tests, no paper workloads, 3 seeds a randomised test
# (tiers and how the slow list is made: tests/conftest.py)
test-quick: $(VENV)/.installed-extras
	@$(PYC)
	ONNXSPLIT_TEST_SEEDS=3 $(BIN)/python -m pytest $(XDIST) -m "not slow and not paper" --durations=5

clean:
	rm -rf $(VENV) build *.egg-info
