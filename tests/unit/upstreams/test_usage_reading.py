"""A response's token usage is read in one module, `app.upstreams.usage`: the tail of a body,
a parsed usage object (OpenAI's or Anthropic's names) and the stripped SSE usage event."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from app.routing.exchange import Exchange
from app.routing.registry import Route
from app.upstreams.http import BufferedResponse
from app.upstreams.usage import TokenCounter, UsageStripper, tokens_of, usage_in_tail


def test_tokens_of_reads_openai_and_anthropic_names() -> None:
    assert tokens_of({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}) == (3, 4)
    assert tokens_of({"input_tokens": 5, "output_tokens": 6}) == (5, 6)
    assert tokens_of({"prompt_tokens": 3}) is None
    assert tokens_of({"prompt_tokens": "3", "completion_tokens": 4}) is None


def test_the_tail_and_the_parsed_object_agree() -> None:
    body = b'{"id":"x","usage":{"input_tokens":7,"output_tokens":2}}'
    assert usage_in_tail(body) == tokens_of({"input_tokens": 7, "output_tokens": 2}) == (7, 2)


def test_the_stripper_counts_the_usage_event_once_and_drops_it() -> None:
    counted: list[tuple[int, int]] = []
    strip = UsageStripper(lambda p, c: counted.append((p, c)))
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}\n\n'
    relayed = strip.feed(b'data: {"choices":[{"delta":{}}]}\n\n' + usage + b"data: [DONE]\n\n")
    assert relayed == b'data: {"choices":[{"delta":{}}]}\n\ndata: [DONE]\n\n'
    assert counted == [(9, 1)]


def test_the_token_counter_ignores_negative_counts() -> None:
    registry = CollectorRegistry()
    tokens = Counter("t", "t", ["type"], registry=registry)
    counter = TokenCounter(tokens.labels("prompt"), tokens.labels("completion"))
    counter.add(5, -1)
    assert registry.get_sample_value("t_total", {"type": "prompt"}) == 5
    assert registry.get_sample_value("t_total", {"type": "completion"}) == 0


def test_an_answer_is_counted_once_whoever_reports_it() -> None:
    """The stripper, the tail and a chain's hooks may each see an answer's usage; the
    exchange counts the first report only (a double count once came from two of them)."""
    registry = CollectorRegistry()
    tokens = Counter("t", "t", ["type"], registry=registry)
    exchange = Exchange(
        Route("m", "b", "m"),
        "b",
        BufferedResponse(200, b"{}"),
        None,
        tokens=TokenCounter(tokens.labels("prompt"), tokens.labels("completion")),
    )
    exchange.count(7, 3)
    exchange.body_done(b'{"usage":{"prompt_tokens":7,"completion_tokens":3}}')
    exchange.count(7, 3)
    assert exchange.usage == (7, 3)
    assert registry.get_sample_value("t_total", {"type": "prompt"}) == 7
    assert registry.get_sample_value("t_total", {"type": "completion"}) == 3


def test_the_tail_of_an_ollama_answer() -> None:
    """`/api/chat` answers in Ollama's words (app.api.ollama): its last line's counts;
    a count of 0 is left out as Ollama leaves it out; a piece not yet done counts nothing."""
    last = b'{"model":"m","done":true,"done_reason":"stop","prompt_eval_count":12,"eval_count":5}\n'
    assert usage_in_tail(b'{"message":{"content":"hi"},"done":false}\n' + last) == (12, 5)
    assert usage_in_tail(b'{"done":true,"prompt_eval_count":4,"total_duration":9}') == (4, 0)
    assert usage_in_tail(b'{"done":false,"eval_count":3}\n') is None
    text = b'{"message":{"content":"\\"eval_count\\": 99"},"done":true}'
    assert usage_in_tail(text) is None  # a quoted name inside content is not a count
