"""The grading page of `firstword bench grade` in a real browser: Debian's Chromium, headless,
driven by Playwright (never Playwright's own browser download), as console_checks.py drives the
console. tests/grade_page.rs runs one check per call against a grading server over a run
directory it wrote (four items: capital, lights, hello, timer; two servers):

    grade_checks.py BASE_URL RUN_DIR CHECK

With FIRSTWORD_GRADE_SCREENSHOT=PATH the names_hidden check saves a screenshot of the page
before the submission and another (PATH with -revealed before its extension) after the reveal.
"""

import json
import os
import re
import sys

from playwright.sync_api import expect

from chromium import STEP_MS, expect_that, run_check


# The servers' names in the run: distinctive, so that any trace of them is found.
NAMES = ["server-alpha-7731", "server-bravo-5520"]
ITEMS = ["capital", "lights", "hello", "timer"]


def open_page(page, base, item):
    page.goto(f"{base}/")
    expect(page.locator("#item-id")).to_have_text(item, timeout=STEP_MS)


def grades(run_dir):
    path = os.path.join(run_dir, "grades.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def names_in(text):
    return [name for name in NAMES if name in text]


def focused(page):
    return page.evaluate("document.activeElement ? document.activeElement.id : ''")


def score_with_the_mouse(page, label, score):
    page.click(f"#choice-{label} .scale label:nth-child({score})")


def check_names_hidden(page, base, run_dir):
    requests, responses = [], []
    page.on("request", lambda request: requests.append(request))
    page.on("response", lambda response: responses.append(response))
    open_page(page, base, "capital")
    expect(page.locator("#choices .choice")).to_have_count(2)
    score_with_the_mouse(page, "A", 4)
    score_with_the_mouse(page, "B", 2)
    expect(page.locator("#submit")).to_be_enabled()

    # Before the submission: not in the DOM, not in any request made, not in any response got.
    expect_that(not names_in(page.content()), f"a name in the page: {names_in(page.content())}")
    for request in requests:
        sent = request.url + (request.post_data or "")
        expect_that(not names_in(sent), f"a name in the request {request.url}")
    for response in responses:
        body = response.body().decode("utf-8", "replace")
        expect_that(not names_in(body), f"a name in the response of {response.url}")
    urls = sorted({r.url.removeprefix(base) for r in responses})
    expect_that("/api/next" in urls, f"the page asked for its unit: {urls}")
    screenshot = os.environ.get("FIRSTWORD_GRADE_SCREENSHOT")
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)

    with page.expect_response(lambda r: r.url.endswith("/api/grade"), timeout=STEP_MS) as graded:
        page.click("#submit")
    expect_that(graded.value.status == 200, f"the grade was refused: {graded.value.text()}")
    expect(page.locator("#reveal")).to_be_visible()
    for name in NAMES:
        expect(page.locator("#reveal-list")).to_contain_text(name)
    written = [page.locator(f"#choice-{label} .written-by").inner_text() for label in ("A", "B")]
    expect_that(sorted(names_in(" ".join(written))) == sorted(NAMES), f"each card names its server: {written}")
    if screenshot:
        stem, extension = os.path.splitext(screenshot)
        page.screenshot(path=f"{stem}-revealed{extension}", full_page=True)
    # Stored before it was revealed: the grade is in the file.
    stored = grades(run_dir)
    expect_that(len(stored) == 1 and stored[0]["item"] == "capital", f"the grades file: {stored}")
    print(f"PASS names_hidden: {len(responses)} responses without a name, then {written}")


def check_resume(page, base, run_dir):
    open_page(page, base, "capital")
    expect(page.locator("#progress")).to_have_text("0 of 4 graded")
    score_with_the_mouse(page, "A", 3)
    score_with_the_mouse(page, "B", 5)
    page.click("#submit")
    expect(page.locator("#reveal")).to_be_visible()
    expect(page.locator("#progress")).to_have_text("1 of 4 graded")
    expect(page.locator("#next")).to_be_focused()
    page.click("#next")
    expect(page.locator("#item-id")).to_have_text("lights", timeout=STEP_MS)
    # A score given but not submitted is not a grade: the reload shows lights unscored.
    score_with_the_mouse(page, "A", 1)

    page.reload()
    expect(page.locator("#item-id")).to_have_text("lights", timeout=STEP_MS)
    expect(page.locator("#progress")).to_have_text("1 of 4 graded")
    expect(page.locator("#choices .choice.scored")).to_have_count(0)
    stored = grades(run_dir)
    expect_that(len(stored) == 1, f"one grade stored: {stored}")
    grade = stored[0]
    expect_that(grade["item"] == "capital" and grade["grader"] == "person", f"the stored grade: {grade}")
    expect_that(sorted(grade["scores"].values()) == [3, 5], f"its scores: {grade}")
    expect_that(sorted(grade["scores"]) == sorted(NAMES), f"scored per server: {grade}")
    # The conversation of a follow-up shows the earlier tool call and its result.
    expect(page.locator("#conversation .call")).to_contain_text("HassTurnOn")
    expect(page.locator("#tools")).to_contain_text("HassTurnOn")
    print(f"PASS resume: after the reload the page shows lights, 1 of 4 graded ({grade['scores']})")


def check_keyboard(page, base, run_dir):
    keys = page.keyboard
    open_page(page, base, "capital")
    expect_that(focused(page) == "choice-A", f"the first answer has the focus: {focused(page)!r}")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    expect_that(outline not in ("", "none"), f"the focus is visible: outline {outline!r}")

    keys.press("4")
    expect_that(focused(page) == "choice-B", f"a score moves to the next answer: {focused(page)!r}")
    keys.press("ArrowUp")
    expect_that(focused(page) == "choice-A", f"the arrow goes back: {focused(page)!r}")
    keys.press("5")
    keys.press("2")
    expect_that(focused(page) == "submit", f"with every answer scored, Submit: {focused(page)!r}")
    keys.press("Enter")
    expect(page.locator("#reveal")).to_be_visible(timeout=STEP_MS)
    expect_that(focused(page) == "next", f"after the reveal, Next: {focused(page)!r}")
    author_of_a = names_in(page.locator("#choice-A .written-by").inner_text())
    expect_that(len(author_of_a) == 1, f"A was written by one server: {author_of_a}")
    stored = grades(run_dir)
    expect_that(len(stored) == 1 and stored[0]["scores"][author_of_a[0]] == 5, f"A's 5 went to its server: {stored}")
    expect_that(sorted(stored[0]["scores"].values()) == [2, 5], f"{stored}")

    keys.press("n")
    expect(page.locator("#item-id")).to_have_text("lights", timeout=STEP_MS)
    keys.press("Tab")
    expect_that(focused(page) == "choice-B", f"Tab moves to the next answer: {focused(page)!r}")
    keys.press("t")
    expect(page.locator("#tie")).to_be_checked()
    keys.press("3")
    expect(page.locator("#choices .choice.scored")).to_have_count(2)
    keys.press("Enter")
    expect(page.locator("#reveal")).to_be_visible(timeout=STEP_MS)
    tie = grades(run_dir)[-1]
    expect_that(tie["item"] == "lights" and tie["tie"] and set(tie["scores"].values()) == {3}, f"the tie: {tie}")

    keys.press("Enter")
    expect(page.locator("#item-id")).to_have_text("hello", timeout=STEP_MS)
    # Equal answers share one label: both servers are named under it.
    expect(page.locator("#choices .choice")).to_have_count(1)
    keys.press("5")
    keys.press("Enter")
    expect(page.locator("#choice-A .written-by")).to_contain_text(NAMES[0])
    expect(page.locator("#choice-A .written-by")).to_contain_text(NAMES[1])
    keys.press("Enter")
    expect(page.locator("#item-id")).to_have_text("timer", timeout=STEP_MS)
    # Enter before every answer has a score submits nothing.
    keys.press("1")
    keys.press("Enter")
    expect(page.locator("#error")).to_contain_text("Score every answer")
    expect_that(len(grades(run_dir)) == 3, f"nothing stored for timer yet: {grades(run_dir)}")
    keys.press("1")
    keys.press("Enter")
    expect(page.locator("#reveal")).to_be_visible(timeout=STEP_MS)
    keys.press("n")
    expect(page.locator("#done")).to_be_visible(timeout=STEP_MS)
    expect(page.locator("#done")).to_contain_text(re.compile(r"All graded.*firstword bench verdict", re.S))
    expect(page.locator("#progress")).to_have_text("4 of 4 graded")
    items = [g["item"] for g in grades(run_dir)]
    expect_that(items == ITEMS, f"every item graded once, in order: {items}")
    print(f"PASS keyboard: four items graded with keys alone ({items})")


CHECKS = {
    "names_hidden": check_names_hidden,
    "resume": check_resume,
    "keyboard": check_keyboard,
}


def main():
    base, run_dir, name = sys.argv[1], sys.argv[2], sys.argv[3]
    run_check(name, lambda page: CHECKS[name](page, base, run_dir))


if __name__ == "__main__":
    main()
