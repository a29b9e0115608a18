#!/usr/bin/env bash
# Creates (or reuses) target/sdk-venv with the official `openai` Python SDK, for the conformance
# test tests/openai_sdk.rs. Every package is pinned to the set the test was written against, so
# an SDK release cannot change the result. Prints the venv's python path as its last stdout line.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/sdk-venv
# openai and its dependencies, exactly as pip resolved them when the test was written, and
# Prometheus's own parser for tests/metrics.rs (no dependencies), and the official `ollama`
# client (with the httpx it needs) for tests/ollama.rs.
pins="annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.19.post1
h11==0.16.0
httpcore==1.0.9
httpx==0.29.0
httpcore2==2.16.2
httpx2==2.16.2
idna==3.20
jiter==0.19.0
ollama==0.6.3
openai==3.57.0
prometheus_client==0.26.0
pydantic==2.14.4
pydantic_core==2.50.5
sniffio==1.3.1
truststore==0.10.5
typing-inspection==0.4.5
typing_extensions==4.16.0"

# shellcheck source=scripts/pinned-venv.sh
source scripts/pinned-venv.sh
ensure_pinned_venv "$venv" "$pins" sdk-venv
echo "$PWD/$venv/bin/python"
