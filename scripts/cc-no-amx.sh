#!/bin/sh
# Compiler launcher for llama.cpp's CMake build (CMAKE_{C,CXX}_COMPILER_LAUNCHER, set in
# .cargo/config.toml): runs the compiler with AMX switched off after ggml's -march=native.
# The AMX matrix kernels of the vendored llama.cpp crashed the process with a general
# protection fault (ldtilecfg in ggml_backend_amx_mul_mat) on the first request on an AMX
# machine; without them ggml uses its AVX-512/AVX2 kernels. Other CPUs get the command as is.
case "$(uname -m)" in
  x86_64 | amd64) exec "$@" -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 ;;
  *) exec "$@" ;;
esac
