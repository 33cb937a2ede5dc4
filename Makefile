# msmemscope — build, test, demo and benchmark. Every target installs what it
# needs on a fresh Debian 12 machine with Go, gcc and pyenv's CPython 3.10-3.13
# (python3 on PATH, the 3.11 one, makes .venv).
SHELL := /bin/bash
GO ?= go
BUILD := build
LIB := $(BUILD)/lib/libmemscope.so
CLI := $(BUILD)/bin/msmemscope
GOSRC := $(shell find . -name '*.go' -not -path './.venv/*' -not -path './build/*') $(wildcard libmemscope/*.c libmemscope/*.h capi/*.c include/*.h) internal/version/VERSION go.mod go.sum
# The real interpreter: python3 on PATH may be a pyenv shim (a bash script
# that would become ~39 traced processes).
PYTHON_REAL := $(shell python3 -c 'import sys; print(sys.executable)' 2>/dev/null)
VENV := .venv
PYTHON := $(abspath $(VENV))/bin/python
APT_PKGS := valgrind libc6-dbg heaptrack libunwind8 gcc g++ sqlite3 chromium
export PYTHON

.PHONY: all build deps venv pymatrix test unit e2e fuzz demo bench clean fmt vet pyinstall generate gencheck gpu-check

all: build

# System packages: installed only when missing (needs root or sudo).
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@$(GO) mod download

build: $(LIB) $(CLI)

$(LIB): $(GOSRC)
	@mkdir -p $(dir $@)
	$(GO) build -buildmode=c-shared -o $@ ./capi
	@rm -f $(BUILD)/lib/libmemscope.h

$(CLI): $(GOSRC) python/msmemscope/_startup/sitecustomize.py
	@mkdir -p $(dir $@)
	$(GO) build -ldflags "-X main.sourceStartup=$(abspath python/msmemscope/_startup)" -o $@ ./cmd/msmemscope
	@# The startup hook the CLI gives a traced Python, compiled now for the
	@# interpreters here: compiled at the program's start, its compiler's
	@# blocks would be the program's rows (with PYTHONDONTWRITEBYTECODE, every run).
	@for py in $(PYTHON_REAL) $(wildcard $(PYENV_VERSIONS)/*/bin/python3); do \
		$$py -m py_compile python/msmemscope/_startup/sitecustomize.py 2>/dev/null || true; done

$(VENV)/.ok:
	@test -n "$(PYTHON_REAL)" || { echo "python3 not found"; exit 1; }
	$(PYTHON_REAL) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q pytest torch numpy memray pytest-memray nvtx nvidia-nvtx
	@touch $@

venv: $(VENV)/.ok

# The package on every CPython pyenv has here (issue 19): $(VENV) is the
# 3.11 one; .venv-3.X for the others, from pyenv's newest 3.X build. Torch
# goes into PY_TORCH's too (its tests run on 3.11 and those).
PYENV_VERSIONS ?= $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions
PY_MATRIX ?= 3.10 3.12 3.13
PY_TORCH ?= 3.12
pyver = $(lastword $(sort $(wildcard $(PYENV_VERSIONS)/$(1).*/bin/python$(1))))

.venv-%/.ok:
	@interp="$(call pyver,$*)"; test -n "$$interp" || { echo "python$* not found under $(PYENV_VERSIONS)"; exit 1; }; \
	set -x; "$$interp" -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q pytest numpy $(if $(filter $*,$(PY_TORCH)),torch)
	@touch $@

# The whole package suite on each version of PY_MATRIX (the 3.11 run is
# test's own).
pymatrix: build $(foreach v,$(PY_MATRIX),.venv-$(v)/.ok)
	@for v in $(PY_MATRIX); do \
		echo "== pytest on CPython $$v"; \
		.venv-$$v/bin/python -m pip install -q . && \
		(cd $(BUILD) && ../.venv-$$v/bin/python -m pytest -q -p no:cacheprovider $(abspath python/tests)) || exit 1; \
	done

fmt:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

vet:
	$(GO) vet ./...

# The record format's C header, Go constants and Python constants, written
# from format/records.def; fails when the committed ones were stale.
GENERATED := libmemscope/records_gen.h format/records_gen.go python/msmemscope/_records.py
generate:
	$(GO) generate ./format/
	@git diff --exit-code -- $(GENERATED) || { echo "generated files were stale: commit them"; exit 1; }

# The same check without writing (and without git).
gencheck:
	$(GO) run ./format/gen -check

# Unit tests beside the code, then end-to-end tests of the built library and
# CLI on real programs (tests/), then a few seconds of each fuzz target.
test: deps build venv fmt vet gencheck
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /tests)
	MSMEMSCOPE_BUILD=$(abspath $(BUILD)) $(GO) test -count=1 -timeout 15m -v ./tests/... 2>&1 | tee $(BUILD)/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)' ; exit $${PIPESTATUS[0]}
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory pyinstall && cd $(BUILD) && $(PYTHON) -m pytest -q -p no:cacheprovider $(abspath python/tests)
	$(PYTHON) bench/gpu_check.py --smoke --steps 2 --pairs 1 --build $(abspath $(BUILD)) --out $(BUILD)/gpu_check_smoke.json  # the GPU check's own runs, on the CPU
	$(MAKE) --no-print-directory pymatrix

# pip install . (setup.py builds the library and the CLI with go build) in a
# fresh virtual environment gives a working package; then into $(VENV) for pytest.
pyinstall: venv
	rm -rf $(BUILD)/pyvenv $(BUILD)/pyinstall_out && mkdir -p $(BUILD) && $(PYTHON_REAL) -m venv $(BUILD)/pyvenv
	$(BUILD)/pyvenv/bin/python -m pip install -q .
	cd $(BUILD) && printf 'import msmemscope\nmsmemscope.mstx.mark("installed")\n' > pyinstall_check.py && \
	pyvenv/bin/python -m msmemscope run --output=pyinstall_out pyinstall_check.py && \
	grep -q 'MSTX,Mark,installed,' pyinstall_out/msmemscope_*/dump/memscope_dump_*.csv && echo "pyinstall: ok"
	$(PYTHON) -m pip install -q .

# A count, not a duration: Go 1.26's fuzz coordinator can fail a run with
# "context deadline exceeded" when a -fuzztime duration ends under load
# (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline to race.
FUZZ_EXECS ?= 20000x
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseAttr -fuzztime=$(FUZZ_EXECS) ./trace/
	$(GO) test -run='^$$' -fuzz=FuzzLeanAttr -fuzztime=$(FUZZ_EXECS) ./trace/
	$(GO) test -run='^$$' -fuzz=FuzzCSVReader -fuzztime=$(FUZZ_EXECS) ./trace/
	$(GO) test -run='^$$' -fuzz=FuzzOpenCSV -fuzztime=$(FUZZ_EXECS) ./trace/
	$(GO) test -run='^$$' -fuzz=FuzzSQLiteRoundTrip -fuzztime=$(FUZZ_EXECS) ./trace/
	$(GO) test -run='^$$' -fuzz=FuzzAlign -fuzztime=$(FUZZ_EXECS) ./analyzer/
	$(GO) test -run='^$$' -fuzz=FuzzSpool -fuzztime=$(FUZZ_EXECS) ./spool/

# The main job on a bundled example: a C program leaking inside mstx steps.
demo: deps build venv
	@mkdir -p $(BUILD)/demo
	gcc -g -O0 -fno-omit-frame-pointer -I include -o $(BUILD)/demo/leak_demo examples/leak_demo.c -L$(BUILD)/lib -lmemscope -Wl,-rpath,$(abspath $(BUILD))/lib
	rm -rf $(BUILD)/demo/out
	$(CLI) --call-stack=c:8 --export=html --output=$(BUILD)/demo/out $(BUILD)/demo/leak_demo
	@echo; echo "== leak report ($$(ls $(BUILD)/demo/out/msmemscope_*/analysis/leaks_*.csv))"; \
	cat $(BUILD)/demo/out/msmemscope_*/analysis/leaks_*.csv | head -20
	@echo; echo "== PyTorch: examples/train_mlp.py (decompose and inefficient summaries)"
	rm -rf $(BUILD)/demo/torch_out
	PYTHONPATH=$(abspath python) MSMEMSCOPE_LIB=$(abspath $(LIB)) MSMEMSCOPE_CLI=$(abspath $(CLI)) \
		$(PYTHON) -m msmemscope run --output=$(BUILD)/demo/torch_out --collect-mode=deferred \
		--events=alloc,free,launch,access --analysis=decompose,inefficient --export=html examples/train_mlp.py
	@echo; echo "== HTML reports (open them in a browser):"; ls $(BUILD)/demo/out/msmemscope_*/export/report_*.html $(BUILD)/demo/torch_out/msmemscope_*/export/report_*.html

# The CUDA layer on a real GPU (bench/gpu_check.py): run where a GPU is, with
# build/ made elsewhere and carried (no Go there, no build here). Results go
# to GPU_CHECK_OUT; record them in bench/results.md.
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= bench/gpu_check.json
GPU_CHECK_ARGS ?=
gpu-check:
	@test -x $(CLI) -a -f $(LIB) || { echo "gpu-check: $(CLI) and $(LIB) are needed: run make build first (and carry build/)"; exit 2; }
	$(GPU_PYTHON) bench/gpu_check.py --build $(BUILD) --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

bench: deps build venv
	$(PYTHON) -m pip install -q memray pytest-memray .
	bash bench/run.sh
	bash bench/python.sh
	bash bench/pytest_plugin.sh
	bash bench/offline.sh
	{ echo; echo "## PyTorch training loop (issue 4)"; echo; echo '```'; bash bench/torch.sh; echo '```'; } | tee -a bench/results.md
	{ echo; echo "## The operator hooks per operator (issues 17, 21)"; echo; \
	  PYTHONPATH=$(CURDIR)/python MSMEMSCOPE_LIB=$(abspath $(LIB)) MSMEMSCOPE_CLI=$(abspath $(CLI)) \
	  $(PYTHON) bench/torch_ops.py 2>/dev/null; } | tee -a bench/results.md
	{ echo; $(PYTHON) bench/gpu_results.py; } | tee -a bench/results.md

clean:
	rm -rf $(BUILD)
