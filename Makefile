# Every target creates .venv when missing (Python 3.11 + pip is all a fresh machine needs).
VENV ?= .venv
BIN := $(VENV)/bin
export ROUTER_LITE_HOME ?= $(CURDIR)/.router-lite
export DAGSTER_HOME ?= $(CURDIR)
# models and datasets come from bundled files: never reach for a hub at run time
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# the tests run on one pytest-xdist worker per core (`auto`); a module's tests stay on one worker (`loadscope`), so a
# module-scoped fixture (a trained cascade, a served world) is built once. PYTEST_WORKERS=0 runs them in one process
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadscope

.PHONY: install run test test-fast test-docs docs docs-check bench ui standin clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/router-lite run

# the tests never use the DAGSTER_HOME / ROUTER_LITE_HOME above: tests/conftest.py (`no_trace`) runs them on a temporary
# instance and home, and fails the suite when it wrote under the repository's instance folders or left a process
# (each xdist worker checks the processes it started itself)
test: install
	$(BIN)/ruff check .
	$(BIN)/pytest $(PYTEST_PARALLEL)

# the fast lane: everything but the tests marked slow (backbone, servers, lineage materialisations, smoke_home)
test-fast: install
	$(BIN)/ruff check .
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow"

# every fenced shell block of README.md and docs/ run as written on a scratch demo home (tests/test_docs_commands.py;
# opt-in: the whole lineage from scratch, then every page: 14 min 45 s on 2 idle cores (2026-12-02), not in CI's budget).
# `make test` runs the tutorial's and serving.md's blocks on the small smoke lineage and checks `git status` stays clean
test-docs: install
	ROUTER_LITE_DOCS_RUN=1 $(BIN)/pytest tests/test_docs_commands.py

# README.md is generated (docs/README.template.md + the value section from docs/results/router_value_demo.json), and so
# is docs/training.md's TrainConfig table (its docstring): `make docs` rewrites them, `make docs-check` fails with a diff
# when a committed one differs (tests/test_readme.py checks the same). After `make run`:
# `$(BIN)/python scripts/readme.py --from-home` takes the new reports/router_value.json first.
docs: install
	$(BIN)/python scripts/readme.py

docs-check: install
	$(BIN)/python scripts/readme.py --check

# the three tables (embed, serve, collect) in one run; JSON under $(ROUTER_LITE_HOME)/bench/ (embed.json: static;
# serve.json: static, workers; collect.json: realistic; docs/backbones.md has the generated table)
bench: install
	$(BIN)/python bench/embed.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/collect.py
	$(BIN)/python bench/train.py
	# cascades (they read the lineage `make run` materialised): ablation + guard + goal bound; stage walls
	$(BIN)/python bench/cascade.py || echo "bench/cascade.py needs \`make run\` first"
	$(BIN)/python bench/serve_cascade.py || echo "bench/serve_cascade.py needs \`make run\` first"
	@echo; echo "== bench results ($(ROUTER_LITE_HOME)/bench/)"; for f in embed serve collect; do \
	  echo "-- $$f.json"; $(BIN)/python -c "import json,sys; d=json.load(open(sys.argv[1])); \
	  print(json.dumps({k: v for k, v in d.items() if k not in ('speed','routing','levels','rows')}, indent=1))" \
	  "$(ROUTER_LITE_HOME)/bench/$$f.json" || true; done
	@echo; echo "== backbone tables (python scripts/backbone_table.py --write puts them into docs/backbones.md)"
	$(BIN)/python scripts/backbone_table.py || true

ui: install
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# a local OpenRouter stand-in on 127.0.0.1:8765 (pipeline/collect/standin.py; its command line pipeline/standin.py); in another shell:
#   OPENROUTER_API_KEY=any .venv/bin/router-lite run --profile pilot --override $(ROUTER_LITE_HOME)/standin.yaml
standin: install
	@mkdir -p $(ROUTER_LITE_HOME)
	$(BIN)/python -m pipeline.standin --port 8765 --write-override $(ROUTER_LITE_HOME)/standin.yaml

clean:
	rm -rf $(ROUTER_LITE_HOME)
