"""What the browser checks share (console_checks.py, grade_checks.py): Debian's Chromium,
headless, driven by Playwright (never Playwright's own browser download), and the run of one
check that fails with the page's state and errors."""

import os
import sys

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("FIRSTWORD_CHROMIUM", "/usr/bin/chromium")
# As a root process on a machine without a display or outside network: no sandbox, no GPU, and
# none of Chromium's own background connections (refused here, and slow to fail).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
# Far above what a step takes on 2 busy cores; only a hang reaches it.
STEP_MS = 90_000


class CheckFailed(Exception):
    pass


def expect_that(condition, reason):
    if not condition:
        raise CheckFailed(reason)


def run_check(name, check, extra_args=(), ignored_console=lambda text: False):
    """Runs `check(page)` in a fresh headless Chromium; any failure, or an error the page logged
    (but those `ignored_console` accepts), prints FAIL with the page's errors and exits 1."""
    if not os.access(CHROMIUM, os.X_OK):
        print(f"FAIL {name}: no Chromium at {CHROMIUM}: install Debian's chromium (bash scripts/setup-system.sh browser; make test does)")
        sys.exit(1)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + list(extra_args))
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not ignored_console(m.text) else None)
        try:
            check(page)
            expect_that(not errors, f"errors in the page: {errors}")
        except Exception as e:  # noqa: BLE001 - every failure is reported with the page's state
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            print(f"page errors: {errors}")
            sys.exit(1)
        finally:
            browser.close()
