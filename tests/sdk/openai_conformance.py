"""Conformance of a firstword server with the official `openai` Python SDK.

Usage: python openai_conformance.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:8080/v1)

Every request is built and every response parsed by the SDK itself, the way applications use it,
so a field the SDK cannot read shows up here. Prints `PASS name`, `FAIL name: reason` or
`SKIP name: reason` per check and exits 1 when any check failed. tests/openai_sdk.rs runs it.
"""

import openai
from pydantic import BaseModel

from harness import (
    WEATHER_QUESTION,
    WEATHER_SCHEMA,
    CheckFailed,
    Skipped,
    checks,
    client,
    expect,
    expect_api_error,
    expect_matches,
    is_int,
    main,
)

# The model is tiny and runs on a CPU: short answers keep the whole run well under a minute.
TEXT_TOKENS = 48
STRUCTURED_TOKENS = 96

TIMER_REQUEST = [{"role": "user", "content": "Set a timer for 10 minutes."}]
WEATHER_AS_JSON = [
    {"role": "user", "content": "Give the weather in Paris as JSON: the city and the temperature in celsius."}
]

TOOL_SCHEMAS = {
    "get_weather": WEATHER_SCHEMA,
    "set_timer": {
        "type": "object",
        "properties": {"minutes": {"type": "integer", "minimum": 1}},
        "required": ["minutes"],
        "additionalProperties": False,
    },
}
# strict: the SDK's stream helper parses the arguments of strict tools only (parsed_arguments).
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema, "strict": True}}
    for name, schema in TOOL_SCHEMAS.items()
]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


class Weather(BaseModel):
    city: str
    celsius: int


def expect_tool_call(call_id, kind, name, arguments):
    expect(call_id is None or call_id.startswith("call_"), f"tool call id {call_id!r} does not start with call_")
    expect(kind == "function", f"tool call type {kind!r}")
    expect(name in TOOL_SCHEMAS, f"tool call name {name!r} is not a given tool")
    return expect_matches(arguments, TOOL_SCHEMAS[name], f"{name} arguments")


def expect_usage(usage):
    expect(usage is not None, "no usage")
    counts = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    expect(all(is_int(n) for n in counts), f"token counts are not ints: {counts}")
    expect(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"total is not the sum: {counts}")
    details = usage.prompt_tokens_details
    expect(details is not None and is_int(details.cached_tokens), f"prompt_tokens_details.cached_tokens: {details}")


class Session:
    def __init__(self, base_url, model):
        self.client = client(base_url)
        self.model = model
        # The assistant message of `tools_required`, sent back by `tool_result_follow_up`.
        self.weather_call = None

    def create(self, **params):
        return self.client.chat.completions.create(model=self.model, **params)

    def helper(self, name):
        """`chat.completions.<name>` (parse, stream); older SDKs have them under `beta`."""
        owners = [self.client.chat.completions]
        beta_chat = getattr(getattr(self.client, "beta", None), "chat", None)
        if beta_chat is not None:
            owners.append(beta_chat.completions)
        for owner in owners:
            method = getattr(owner, name, None)
            if method is not None:
                return method
        raise Skipped(f"openai {openai.__version__} has no chat.completions.{name}")


CHECKS, check = checks()


@check
def models_list(session):
    ids = [model.id for model in session.client.models.list()]
    expect(session.model in ids, f"{session.model!r} not in {ids}")


@check
def chat_non_stream(session):
    completion = session.create(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=TEXT_TOKENS, temperature=0
    )
    choice = completion.choices[0]
    expect(isinstance(choice.message.content, str) and choice.message.content, f"content {choice.message.content!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect_usage(completion.usage)


@check
def chat_stream_with_usage(session):
    chunks = list(
        session.create(
            messages=[{"role": "user", "content": "Count from one to five."}],
            max_tokens=TEXT_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    expect(chunks and chunks[0].choices, f"first chunk has no choice: {chunks[:1]}")
    expect(chunks[0].choices[0].delta.role == "assistant", f"first delta {chunks[0].choices[0].delta}")
    *choice_chunks, usage_chunk = chunks
    text = "".join(chunk.choices[0].delta.content or "" for chunk in choice_chunks if chunk.choices)
    expect(text, "no content deltas")
    finishes = [
        chunk.choices[0].finish_reason for chunk in choice_chunks if chunk.choices and chunk.choices[0].finish_reason
    ]
    expect(len(finishes) == 1 and finishes[0] in ("stop", "length"), f"finish reasons {finishes}")
    expect(usage_chunk.choices == [], f"last chunk has choices: {usage_chunk}")
    expect(all(chunk.usage is None for chunk in choice_chunks), "usage before the last chunk")
    expect_usage(usage_chunk.usage)


@check
def stream_helper_text(session):
    with session.helper("stream")(
        model=session.model,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=TEXT_TOKENS,
        temperature=0,
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
    choice = stream.get_final_completion().choices[0]
    expect(
        choice.message.content and choice.message.content == "".join(deltas),
        f"content {choice.message.content!r}, deltas {deltas}",
    )
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")


@check
def error_out_of_range_temperature(session):
    try:
        session.create(messages=[{"role": "user", "content": "hi"}], temperature=5, max_tokens=4)
    except openai.BadRequestError as error:
        expect_api_error(error, 400)
        expect(error.param == "temperature", f"param {error.param!r}")
        return
    raise CheckFailed("temperature=5 was accepted")


@check
def error_unknown_route(session):
    try:
        session.client.get("/no-such-endpoint", cast_to=object)
    except openai.NotFoundError as error:
        expect_api_error(error, 404)
        return
    raise CheckFailed("an unknown route answered")


@check
def error_empty_messages(session):
    try:
        session.create(messages=[], max_tokens=4)
    except openai.BadRequestError as error:
        expect_api_error(error, 400)
        return
    raise CheckFailed("messages=[] was accepted")


@check
def tools_required(session):
    completion = session.create(
        messages=WEATHER_QUESTION, tools=TOOLS, tool_choice="required", max_tokens=STRUCTURED_TOKENS, temperature=0
    )
    choice = completion.choices[0]
    message = choice.message
    expect(message.tool_calls, f"no tool_calls (finish_reason {choice.finish_reason!r}, content {message.content!r})")
    for call in message.tool_calls:
        expect_tool_call(call.id, call.type, call.function.name, call.function.arguments)
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    expect(message.content in (None, ""), f"content beside the tool calls: {message.content!r}")
    session.weather_call = message


# Runs right after tools_required: the server's cache then holds that prompt, which this one extends.
@check
def tool_result_follow_up(session):
    expect(session.weather_call is not None, "needs the tool call of tools_required")
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'} for call in session.weather_call.tool_calls
    ]
    # The SDK's own message object goes back as is, as applications append it.
    completion = session.create(
        messages=[*WEATHER_QUESTION, session.weather_call, *results],
        tools=TOOLS,
        tool_choice="none",
        max_tokens=TEXT_TOKENS,
        temperature=0,
    )
    choice = completion.choices[0]
    expect(isinstance(choice.message.content, str) and choice.message.content, f"content {choice.message.content!r}")
    expect(not choice.message.tool_calls, f"tool calls despite tool_choice none: {choice.message.tool_calls}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect_usage(completion.usage)
    cached = completion.usage.prompt_tokens_details.cached_tokens
    expect(cached > 0, f"cached_tokens {cached}: the previous turn's prompt was not reused")


@check
def tools_named_stream(session):
    stream = session.create(
        messages=TIMER_REQUEST,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_timer"}},
        max_tokens=STRUCTURED_TOKENS,
        temperature=0,
        stream=True,
    )
    # Accumulated by index, as clients do: strings are concatenated, so id and name must come once.
    calls = {}
    contents = []
    finishes = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                contents.append(choice.delta.content)
            started = 0
            for delta in choice.delta.tool_calls or []:
                expect(is_int(delta.index), f"tool call delta without an integer index: {delta}")
                function = delta.function
                if delta.index not in calls:
                    started += 1
                    expect(delta.type == "function" and function and function.name, f"first delta of a call: {delta}")
                    calls[delta.index] = {"id": delta.id, "name": function.name, "arguments": ""}
                else:
                    expect(delta.id is None, f"id sent again for index {delta.index}: {delta}")
                    expect(
                        function is None or function.name is None, f"name sent again for index {delta.index}: {delta}"
                    )
                if function and function.arguments:
                    calls[delta.index]["arguments"] += function.arguments
            # Pipecat reads only tool_calls[0] of a chunk: a second call starting there is lost.
            expect(started <= 1, f"{started} tool calls start in one chunk")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    expect(calls, f"no tool call deltas (finish reasons {finishes}, content {''.join(contents)!r})")
    for call in calls.values():
        expect(call["name"] == "set_timer", f"called {call['name']!r}, named set_timer")
        expect_tool_call(call["id"], "function", call["name"], call["arguments"])
    expect(finishes == ["tool_calls"], f"finish reasons {finishes}")
    leaked = [text for text in contents if "<tool_call>" in text or '{"name"' in text]
    expect(not leaked, f"tool call markup in content deltas: {leaked}")


@check
def stream_helper_tools(session):
    with session.helper("stream")(
        model=session.model,
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=STRUCTURED_TOKENS,
        temperature=0,
    ) as stream:
        for _ in stream:
            pass
    choice = stream.get_final_completion().choices[0]
    calls = choice.message.tool_calls
    expect(calls, f"no tool_calls (finish_reason {choice.finish_reason!r}, content {choice.message.content!r})")
    for call in calls:
        arguments = expect_tool_call(call.id, call.type, call.function.name, call.function.arguments)
        parsed = call.function.parsed_arguments
        expect(parsed == arguments, f"parsed_arguments {parsed!r}, arguments {call.function.arguments!r}")
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")


@check
def parse_pydantic_model(session):
    completion = session.helper("parse")(
        model=session.model,
        messages=WEATHER_AS_JSON,
        response_format=Weather,
        max_tokens=STRUCTURED_TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    expect(isinstance(message.parsed, Weather), f"parsed {message.parsed!r} from content {message.content!r}")


@check
def json_schema_response(session):
    completion = session.create(
        messages=WEATHER_AS_JSON,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True},
        },
        max_tokens=STRUCTURED_TOKENS,
        temperature=0,
    )
    choice = completion.choices[0]
    expect_matches(choice.message.content, WEATHER_SCHEMA, f"content (finish_reason {choice.finish_reason!r})")


if __name__ == "__main__":
    main(CHECKS, Session)
