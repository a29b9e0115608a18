#!/usr/bin/env python3
"""Renders chat templates exactly as Hugging Face transformers' `apply_chat_template` does.

The reference of tests/template_collection.rs. It calls transformers' own rendering
(`transformers.utils.chat_template_utils.render_jinja_template`: the same sandboxed jinja2
environment, `tojson`, `raise_exception`, `strftime_now`, `{% generation %}` blocks and message
normalization) after the message normalization `apply_chat_template` does first (keys whose value
is None dropped). The special tokens that `apply_chat_template` passes from the tokenizer
(`bos_token`, `eos_token`) come in each case's `kwargs`.

Reads JSON from stdin: {"cases": [{"template": PATH, "messages": [...], "tools": [...] or null,
"add_generation_prompt": BOOL, "kwargs": {...}}, ...]}. Writes one JSON list to stdout, one entry
per case: {"text": RENDERED} or {"error": "ExceptionType: message"}.

Run with the pinned venv of scripts/template-venv.sh.
"""
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template  # noqa: E402


def render(case, sources):
    path = case["template"]
    if path not in sources:
        with open(path, encoding="utf-8") as f:
            sources[path] = f.read()
    messages = _normalize_chat_messages(case["messages"])
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=case.get("tools"),
        chat_template=sources[path],
        add_generation_prompt=case["add_generation_prompt"],
        **case.get("kwargs", {}),
    )
    return rendered[0]


def main():
    cases = json.load(sys.stdin)["cases"]
    sources = {}
    results = []
    for case in cases:
        try:
            results.append({"text": render(case, sources)})
        except Exception as e:  # noqa: BLE001 - every failure is reported, with its type
            results.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
