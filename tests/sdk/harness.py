"""What the SDK check scripts share: the check runner, expectations, and a checker of the JSON
Schema subset the checks use. A script lists its checks with `@check` and calls `main`.
"""

import json
import sys
import traceback

import openai


class CheckFailed(Exception):
    pass


class Skipped(Exception):
    pass


def expect(condition, reason):
    if not condition:
        raise CheckFailed(reason)


# The question and the tool schema both scripts ask the model to call with.
WEATHER_QUESTION = [{"role": "user", "content": "What's the weather in Paris in celsius?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def is_int(value):
    # JSON true/false load as bool, a subclass of int.
    return isinstance(value, int) and not isinstance(value, bool)

def schema_errors(value, schema, path="$"):
    """The violations of the JSON Schema subset the checks use (type, properties, required,
    additionalProperties false, enum, minimum)."""
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path} is not an object: {value!r}"]
        properties = schema.get("properties", {})
        errors = [f"{path}.{key} is missing" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key} is not allowed")
        return errors
    if kind == "string" and not isinstance(value, str):
        return [f"{path} is not a string: {value!r}"]
    if kind == "integer" and not is_int(value):
        return [f"{path} is not an integer: {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path} is not one of {schema['enum']}: {value!r}"]
    if "minimum" in schema and value < schema["minimum"]:
        return [f"{path} is below {schema['minimum']}: {value!r}"]
    return []


def expect_matches(text, schema, what):
    """Parses `text` as JSON and checks it against `schema`; returns the value."""
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError) as error:
        raise CheckFailed(f"{what} is not JSON ({error}): {text!r}")
    errors = schema_errors(value, schema)
    expect(not errors, f"{what} {text!r}: {'; '.join(errors)}")
    return value


def expect_api_error(error, status):
    """The SDK's view of an OpenAI error envelope: `body` is the unwrapped `error` object."""
    expect(error.status_code == status, f"status {error.status_code}, expected {status}")
    envelope = error.response.json()
    expect(isinstance(envelope, dict) and isinstance(envelope.get("error"), dict), f"no error envelope: {envelope}")
    missing = {"message", "type", "param", "code"} - envelope["error"].keys()
    expect(not missing, f"error envelope lacks {sorted(missing)}: {envelope}")
    expect(isinstance(error.body, dict) and error.body == envelope["error"], f"SDK body {error.body!r}")
    expect(
        isinstance(error.message, str) and envelope["error"]["message"] in error.message, f"message {error.message!r}"
    )


def client(base_url):
    """An SDK client without retries: a failing request must fail its check, not be retried
    into a pass."""
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)


def checks():
    """A list of checks and the decorator that adds to it."""
    listed = []

    def check(function):
        listed.append(function)
        return function

    return listed, check


def one_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 600 else text[:600] + "..."


def run(listed, session):
    """Runs each check against `session`; prints PASS, FAIL or SKIP per check and exits 1 when
    any failed."""
    failed = 0
    for check_function in listed:
        name = check_function.__name__
        try:
            check_function(session)
            print(f"PASS {name}")
        except Skipped as reason:
            print(f"SKIP {name}: {reason}")
        except CheckFailed as reason:
            failed += 1
            print(f"FAIL {name}: {one_line(reason)}")
        except Exception as error:  # one broken check must not hide the others
            failed += 1
            print(f"FAIL {name}: {type(error).__name__}: {one_line(error)}")
            if not isinstance(error, openai.OpenAIError):
                traceback.print_exc()
        sys.stdout.flush()
    print(f"{failed} of {len(listed)} checks failed")
    sys.exit(1 if failed else 0)


def main(listed, session_class):
    """The scripts' command line: `SCRIPT BASE_URL MODEL`; runs `listed` against a
    `session_class(BASE_URL, MODEL)`."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL MODEL")
    session = session_class(*sys.argv[1:])
    print(f"openai {openai.__version__} against {sys.argv[1]} (model {sys.argv[2]})")
    run(listed, session)
