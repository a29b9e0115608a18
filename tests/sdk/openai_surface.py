"""The OpenAI surface beyond chat text, through the official `openai` Python SDK: chat logprobs
(streamed and not), legacy text completions, and the Responses API (create, stream, structured
output, previous_response_id with the cache it keeps, a function call round trip, retrieve and
delete), with the 4xx envelopes of what this server refuses.

Usage: python openai_surface.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:8080/v1)

Prints `PASS name` or `FAIL name: reason` per check and exits 1 when any check failed.
tests/openai_sdk.rs runs it.
"""

import json

import openai
from pydantic import BaseModel

from harness import (
    WEATHER_QUESTION,
    WEATHER_SCHEMA,
    CheckFailed,
    checks,
    client,
    expect,
    expect_api_error,
    expect_matches,
    is_int,
    main,
    schema_errors,
)

# The Responses API's function tools are flat; strict: the SDK parses their arguments.
RESPONSE_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}]
# The one call the model must make, as the Responses API asks for it.
FORCED_CALL = dict(
    input=WEATHER_QUESTION,
    tools=RESPONSE_TOOLS,
    tool_choice="required",
    parallel_tool_calls=False,
    max_output_tokens=96,
    temperature=0,
)


class Weather(BaseModel):
    city: str
    celsius: int


class Session:
    def __init__(self, base_url, model):
        self.client = client(base_url)
        self.model = model


CHECKS, check = checks()


def expect_entry(entry, top):
    """One token of chat logprobs: text, bytes, a log-probability and `top` alternatives."""
    expect(isinstance(entry.token, str) and isinstance(entry.bytes, list), f"entry {entry}")
    expect(bytes(entry.bytes).decode("utf-8", "replace") == entry.token, f"token and bytes differ: {entry}")
    expect(isinstance(entry.logprob, float) and entry.logprob <= 0, f"logprob {entry.logprob}")
    expect(len(entry.top_logprobs) == top, f"{len(entry.top_logprobs)} alternatives, asked {top}")


@check
def chat_logprobs(session):
    completion = session.client.chat.completions.create(
        model=session.model,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = completion.choices[0]
    content = choice.logprobs.content
    expect(len(content) == completion.usage.completion_tokens, f"{len(content)} entries, {completion.usage}")
    for entry in content:
        expect_entry(entry, 3)
    expect("".join(e.token for e in content) == choice.message.content, "the tokens make up the content")


@check
def chat_logprobs_stream(session):
    chunks = list(
        session.client.chat.completions.create(
            model=session.model,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    expect(len(entries) == chunks[-1].usage.completion_tokens, f"{len(entries)} entries, {chunks[-1].usage}")
    for entry in entries:
        expect_entry(entry, 0)


@check
def completions_text(session):
    completion = session.client.completions.create(
        model=session.model, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
    )
    expect(completion.object == "text_completion", f"object {completion.object!r}")
    choice = completion.choices[0]
    expect(isinstance(choice.text, str) and choice.text, f"text {choice.text!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect("".join(choice.logprobs.tokens) == choice.text, f"tokens {choice.logprobs.tokens}")
    expect(len(choice.logprobs.top_logprobs) == len(choice.logprobs.tokens), "one top_logprobs map per token")
    usage = completion.usage
    expect(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage {usage}")
    expect(is_int(usage.prompt_tokens_details.cached_tokens), f"cached_tokens {usage.prompt_tokens_details}")


@check
def completions_stream(session):
    chunks = list(
        session.client.completions.create(
            model=session.model,
            prompt="Once upon a time",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *text_chunks, usage_chunk = chunks
    text = "".join(c.choices[0].text for c in text_chunks)
    expect(text, "no text")
    finishes = [c.choices[0].finish_reason for c in text_chunks if c.choices[0].finish_reason]
    expect(finishes == ["length"] or finishes == ["stop"], f"finish reasons {finishes}")
    expect(usage_chunk.choices == [] and usage_chunk.usage is not None, f"last chunk {usage_chunk}")
    expect(1 <= usage_chunk.usage.completion_tokens <= 8, f"usage {usage_chunk.usage}")


@check
def responses_create(session):
    response = session.client.responses.create(
        model=session.model, instructions="Answer briefly.", input="Say hello.", max_output_tokens=48, temperature=0
    )
    expect(response.id.startswith("resp_") and response.object == "response", f"{response.id} {response.object}")
    expect(response.status in ("completed", "incomplete"), f"status {response.status}")
    expect(isinstance(response.output_text, str) and response.output_text, f"output_text {response.output_text!r}")
    usage = response.usage
    expect(is_int(usage.input_tokens) and is_int(usage.output_tokens), f"usage {usage}")
    expect(is_int(usage.input_tokens_details.cached_tokens), f"input_tokens_details {usage.input_tokens_details}")
    expect(usage.total_tokens == usage.input_tokens + usage.output_tokens, f"usage {usage}")
    expect(response.instructions == "Answer briefly.", f"instructions {response.instructions!r}")


@check
def responses_stream(session):
    with session.client.responses.stream(
        model=session.model, input="Say hello.", max_output_tokens=64, temperature=0
    ) as stream:
        events = list(stream)
    final = stream.get_final_response()
    kinds = [event.type for event in events]
    expect(kinds[:2] == ["response.created", "response.in_progress"], f"opening {kinds[:2]}")
    expect(kinds[-1] == "response.completed", f"last event {kinds[-1]}")
    numbers = [event.sequence_number for event in events]
    expect(numbers == list(range(len(events))), f"sequence numbers {numbers}")
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    expect(deltas and final.output_text == "".join(deltas), f"final {final.output_text!r}, deltas {deltas}")
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        expect(kind in kinds, f"no {kind} in {kinds}")


@check
def responses_structured_output(session):
    response = session.client.responses.parse(
        model=session.model,
        input=[{"role": "user", "content": "Give the weather in Paris as JSON: the city and the temperature in celsius."}],
        text_format=Weather,
        max_output_tokens=96,
        temperature=0,
    )
    expect(isinstance(response.output_parsed, Weather), f"parsed {response.output_parsed!r} from {response.output_text!r}")


@check
def responses_previous_response_id(session):
    first = session.client.responses.create(
        model=session.model, input="My name is Ada. Say hi.", max_output_tokens=24, temperature=0
    )
    second = session.client.responses.create(
        model=session.model,
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=24,
        temperature=0,
    )
    expect(second.previous_response_id == first.id, f"previous_response_id {second.previous_response_id!r}")
    expect(second.usage.input_tokens > first.usage.input_tokens, "the earlier turn is part of the prompt")
    cached = second.usage.input_tokens_details.cached_tokens
    expect(cached >= first.usage.input_tokens, f"cached_tokens {cached}: the earlier prompt was not reused")
    expect(session.client.responses.retrieve(first.id).id == first.id, "retrieve")
    session.client.responses.delete(first.id)
    try:
        session.client.responses.retrieve(first.id)
        raise CheckFailed("a deleted response was retrieved")
    except openai.NotFoundError as error:
        expect_api_error(error, 404)
    # The chain stays whole: the later response still holds the earlier turn.
    third = session.client.responses.create(
        model=session.model, previous_response_id=second.id, input="Thanks.", max_output_tokens=8, temperature=0
    )
    expect(third.usage.input_tokens > second.usage.input_tokens, "the deleted turn is still in the chain")
    try:
        session.client.responses.create(model=session.model, previous_response_id="resp_unknown", input="Hi")
        raise CheckFailed("an unknown previous_response_id was accepted")
    except openai.NotFoundError as error:
        expect_api_error(error, 404)
        expect(error.body.get("param") == "previous_response_id", f"param {error.body}")


@check
def responses_function_call_round_trip(session):
    response = session.client.responses.create(model=session.model, **FORCED_CALL)
    calls = [item for item in response.output if item.type == "function_call"]
    expect(len(calls) == 1, f"output {response.output}")
    call = calls[0]
    expect(call.name == "get_weather" and call.call_id.startswith("call_"), f"call {call}")
    expect_matches(call.arguments, WEATHER_SCHEMA, "arguments")
    follow_up = session.client.responses.create(
        model=session.model,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}],
        tools=RESPONSE_TOOLS,
        tool_choice="none",
        max_output_tokens=32,
        temperature=0,
    )
    expect(follow_up.output_text, f"no answer: {follow_up.output}")
    expect(not [item for item in follow_up.output if item.type == "function_call"], "a call despite tool_choice none")
    cached = follow_up.usage.input_tokens_details.cached_tokens
    expect(cached >= response.usage.input_tokens, f"cached_tokens {cached}: the call's turn was not reused")


@check
def responses_stream_function_call(session):
    with session.client.responses.stream(model=session.model, **FORCED_CALL) as stream:
        kinds = [event.type for event in stream]
    final = stream.get_final_response()
    for kind in ("response.function_call_arguments.delta", "response.function_call_arguments.done"):
        expect(kind in kinds, f"no {kind} in {kinds}")
    calls = [item for item in final.output if item.type == "function_call"]
    expect(len(calls) == 1, f"output {final.output}")
    parsed = calls[0].parsed_arguments
    expect(parsed == json.loads(calls[0].arguments), f"parsed_arguments {parsed!r}")
    expect(not schema_errors(parsed, WEATHER_SCHEMA), f"arguments {parsed!r}")


@check
def refusals_name_their_field(session):
    cases = [
        (lambda: session.client.completions.create(model=session.model, prompt="def f(", suffix=")"), "suffix"),
        (lambda: session.client.completions.create(model=session.model, prompt="x", echo=True), "echo"),
        (lambda: session.client.responses.create(model=session.model, input="Hi", tools=[{"type": "web_search"}]),
         "tools[0].type"),
        (lambda: session.client.responses.create(
            model=session.model,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]),
         "input[0].content[0].type"),
        (lambda: session.client.responses.create(model=session.model, input="Hi", max_output_tokens=0),
         "max_output_tokens"),
        (lambda: session.client.chat.completions.create(
            model=session.model, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=21),
         "top_logprobs"),
    ]
    for send, param in cases:
        try:
            send()
            raise CheckFailed(f"accepted: {param}")
        except openai.BadRequestError as error:
            expect_api_error(error, 400)
            expect(error.body.get("param") == param, f"param {error.body.get('param')!r}, expected {param!r}")


if __name__ == "__main__":
    main(CHECKS, Session)
