#!/usr/bin/env bash
# Creates (or reuses) target/template-venv with Hugging Face `transformers` and `jinja2`, for the
# chat-template reference renderer tests/templates/reference.py (used by tests/template_collection.rs).
# No torch: chat-template rendering needs none. Every package is pinned to the set pip resolved
# when the test was written, so a transformers or jinja2 release cannot change the reference.
# Prints the venv's python path as its last stdout line.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/template-venv
pins="annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
click==8.5.1
filelock==4.3.1
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
Jinja2==3.1.6
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
numpy==2.4.6
packaging==26.4
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
regex==2026.11.19
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.24.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0"

# shellcheck source=scripts/pinned-venv.sh
source scripts/pinned-venv.sh
ensure_pinned_venv "$venv" "$pins" template-venv
echo "$PWD/$venv/bin/python"
