#!/usr/bin/env bash
# Generates the test models that are not downloaded, with the `gguf` Python package in
# target/fixtures-venv. Random but seeded weights: the same bytes on every run.
# Tiny GGUFs with an MTP (NextN) head, by tests/fixtures/make_tiny_mtp.py (hy_v3, F32):
#   models/tiny-mtp.gguf          SmolLM2's tokenizer and chat template (~40 MB)
#   models/tiny-mtp-vocab260.gguf self-contained 260-token vocabulary (<1 MB)
# Tiny models of other architectures, by tests/fixtures/make_tiny_models.py (n_embd 64, token
# embedding and LM head F16, the rest F32; all with every tokenizer.* key of SmolLM2, so SmolLM2
# can draft for them; greedy output never ends early, it runs to max_tokens):
#   models/tiny-tekken.gguf       `llama`, 2 blocks, tokenizer.ggml.pre = "tekken": llama.cpp
#                                 splits with std::regex (no custom splitter), which recurses per
#                                 character of a long run of e.g. spaces (~15 MB)
#   models/tiny-deepseek3.gguf    the same with tokenizer.ggml.pre = "deepseek-v3" (letters and
#                                 combining marks are one run) (~15 MB)
#   models/tiny-exaone-moe.gguf   the same with "exaone-moe" (words joined by single spaces are
#                                 one run) (~15 MB)
#   models/tiny-lfm2.gguf         `lfm2` hybrid: conv, conv, attention, conv blocks; llama.cpp can
#                                 roll its recurrent state back (~15 MB)
#   models/tiny-mamba.gguf        `mamba`, 2 blocks: recurrent, no rollback (~15 MB)
#   models/tiny-gemma2.gguf       `gemma2`, 4 blocks, no attention.sliding_window key (llama.cpp
#                                 defaults to a 4096 window), context length 8192 (~9 MB)
# Tiny multimodal projectors (mmproj) for SmolLM2-135M (output width 576), by
# tests/fixtures/make_tiny_projectors.py; load with `--mmproj`; no begin/end marker text:
#   models/tiny-mmproj-vision.gguf     `mlp` (LLaVA-1.5): CLIP ViT (n_embd 64, 2 blocks) + GELU MLP;
#                                      every image is resized to 32x32 px (patch 8, no tiles):
#                                      16 embeddings per image, any size or aspect (<1 MB)
#   models/tiny-mmproj-degenerate.gguf the same, but the MLP's last matrix is zero: every image
#                                      gives the same 16 embeddings (<1 MB)
#   models/tiny-mmproj-audio.gguf      `ultravox`: Whisper-style encoder (80 mel bins, n_embd 64,
#                                      2 blocks) + SwiGLU MLP; audio is resampled to 16 kHz and cut
#                                      into 30 s chunks: 60 * (1 + floor(seconds / 30)) embeddings,
#                                      i.e. 60 for any clip under 30 s (~3 MB)
# A model is rewritten when it is missing or older than its generator (or make_tiny_mtp.py,
# whose tokenizer helpers make_tiny_models.py imports), the venv's pins or its tokenizer source;
# otherwise this is a quick no-op. Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (`make models`).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/fixtures-venv
# gguf and its dependencies, exactly as pip resolved them when the generator was written.
pins="certifi==2026.10.19.post1
charset-normalizer==3.5.3
gguf==0.19.0
idna==3.20
numpy==2.4.6
PyYAML==6.0.4
requests==2.34.2
tqdm==4.70.1
urllib3==2.8.0"

# shellcheck source=scripts/pinned-venv.sh
source scripts/pinned-venv.sh
ensure_pinned_venv "$venv" "$pins" fixtures
python="$PWD/$venv/bin/python"
stamp="$venv/firstword-pins.txt"

mtp_generator=tests/fixtures/make_tiny_mtp.py
models_generator=tests/fixtures/make_tiny_models.py
projectors_generator=tests/fixtures/make_tiny_projectors.py
tokenizer=models/SmolLM2-135M-Instruct.Q4_1.gguf

# make_fixture OUT GENERATOR [generator args...]: runs GENERATOR unless OUT is newer than it,
# make_tiny_mtp.py, the pins and every argument that names a file (the tokenizer source).
make_fixture() {
  local out=$1 generator=$2
  shift 2
  local dep
  local stale=false
  [ -f "$out" ] || stale=true
  for dep in "$generator" "$mtp_generator" "$stamp" "$@"; do
    if [ -f "$dep" ] && [ "$dep" -nt "$out" ]; then stale=true; fi
  done
  if $stale; then
    "$python" "$generator" "$out" "$@"
  fi
}

make_fixture models/tiny-mtp.gguf "$mtp_generator" --tokenizer-from "$tokenizer"
make_fixture models/tiny-mtp-vocab260.gguf "$mtp_generator" --tiny-vocab
for kind in tekken deepseek3 exaone-moe lfm2 mamba gemma2; do
  make_fixture "models/tiny-$kind.gguf" "$models_generator" --kind "$kind" --tokenizer-from "$tokenizer"
done
make_fixture models/tiny-mmproj-vision.gguf "$projectors_generator" --kind vision
make_fixture models/tiny-mmproj-degenerate.gguf "$projectors_generator" --kind vision-degenerate
make_fixture models/tiny-mmproj-audio.gguf "$projectors_generator" --kind audio
