"""What the timing scripts share: the ~4K-token system prompt they send and the wait for a
server's /health. Imported by scripts/cold-ttft.py and scripts/warm-ttft.py."""
import time
import urllib.request


def system_prompt(tokens=4000):
    """A smart-home fact list of about `tokens` tokens (3/8 of a token per character)."""
    text = "You are a helpful voice assistant for a smart home. Facts you know:\n"
    i = 0
    while len(text) * 3 // 8 < tokens:
        room = ["kitchen", "hall", "garage", "attic"][i % 4]
        colour = ["red", "blue", "green"][i % 3]
        text += f"Fact {i}: the {room} sensor {i} reports {i * 13 % 97} units and a {colour} light.\n"
        i += 1
    return text


def wait_for_health(base, seconds=120):
    """Polls `base`/health until it answers (or `seconds` pass)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/health")
            return
        except Exception:
            time.sleep(0.2)
