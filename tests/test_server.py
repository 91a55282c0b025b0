"""`localspec serve`: the real server (uvicorn on a free 127.0.0.1 port) over real tiny GGUF
models, driven by the official `openai` client and by raw HTTP for what a client library would
never send."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

import localspec
from localspec.server import create_app
from localspec.server.run import base_url, listen, make_server

KEY = "test-key"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# one thread: the box is shared and small, and llama.cpp's threads spin while they wait
OPTS = {"kv_type": "f32", "flash_attn": False, "n_threads": 1, "n_ctx": 1024}
CHAT = [{"role": "user", "content": "abc"}]


class Recorder:
    """The real engine, with a log of the generations it ran; optionally slowed down (a
    delay before each step's event) or failing, to stand for a slow model or a broken one."""

    def __init__(self, eng: localspec.Engine) -> None:
        self._eng = eng
        self.log: list[dict[str, Any]] = []
        self.delay = 0.0
        self.fail_at_start = False
        self.fail_after: int | None = None  # events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._eng, name)

    def generate(self, prompt: Any, **kw: Any) -> Iterator[localspec.Event]:
        return self._record(lambda: self._eng.generate(prompt, **kw), prompt)

    def chat(self, messages: Any, **kw: Any) -> Iterator[localspec.Event]:
        return self._record(lambda: self._eng.chat(messages, **kw), messages)

    def _record(self, start: Callable[[], Iterator[localspec.Event]], what: Any) -> Any:
        if self.fail_at_start:
            raise RuntimeError("boom at start")
        events = start()  # validation errors surface here, as from the engine
        rec = {"what": what, "tokens": 0, "reason": None, "done": False}
        self.log.append(rec)
        return self._events(events, rec)

    def _events(self, events: Any, rec: dict[str, Any]) -> Iterator[localspec.Event]:
        try:
            for i, ev in enumerate(events):
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("boom mid-generation")
                time.sleep(self.delay)
                rec["tokens"] += len(ev.tokens)
                rec["reason"] = ev.finish_reason
                yield ev
        finally:
            events.close()
            rec["done"] = True


@contextlib.contextmanager
def running(engine: Any, **kw: Any) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port in a background thread."""
    with running_server(engine, **kw) as (url, _):
        yield url


@contextlib.contextmanager
def running_server(engine: Any, **kw: Any) -> Iterator[tuple[str, Any]]:
    sock = listen("127.0.0.1", 0)
    server = make_server(create_app(engine, **kw))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    try:
        yield base_url(sock), server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def engine(agree) -> Iterator[Recorder]:
    target, draft = agree
    with localspec.load(target, draft=draft, **OPTS) as eng:
        yield Recorder(eng)


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with running(engine, api_key=KEY, max_queue=1, max_body=1 << 16, model_id="agree") as u:
        yield u


@pytest.fixture
def rec(engine) -> Iterator[Recorder]:
    engine.delay, engine.fail_at_start, engine.fail_after = 0.0, False, None
    yield engine
    engine.delay, engine.fail_at_start, engine.fail_after = 0.0, False, None


@pytest.fixture
def client(url, rec) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def post(
    url: str, path: str, body: Any, key: str | None = KEY, timeout: float = 30
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers["Content-Type"] = "application/json"
    return httpx.post(url + path, content=content, headers=headers, timeout=timeout)


def health(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/health", timeout=5)
    assert r.status_code == 200
    return r.json()


# --- the answers ---------------------------------------------------------------------------------


def test_chat(client, engine) -> None:
    r = client.chat.completions.create(
        model="whatever-name",
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        extra_body={"n_draft": 4},
    )
    assert r.model == "agree"  # any name is accepted; the served id comes back
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == LETTERS[:10]  # the agreeing pair counts letters
    assert choice.finish_reason == "length"
    prompt, _ = engine.format_chat(CHAT)
    n_prompt = len(engine.tokenize(prompt, add_special=False, parse_special=True))
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (n_prompt, 10, n_prompt + 10)
    assert u.prompt_tokens_details.cached_tokens is not None
    t = r.model_extra["timings"]
    assert t["mode"] == "chain 4" and set(t["shapes"]) <= {
        "chain 4",
        "chain 3",
        "chain 2",
        "chain 1",
    }
    assert t["predicted_n"] == 10 and t["prompt_n"] == n_prompt
    assert t["draft_n_accepted"] > 0 and t["draft_n_accepted"] == t["draft_n"]  # they agree
    assert t["tau"] > 1.5 and t["steps"] < 10
    assert t["acceptance_at"][0] == 1.0
    for k in ("prompt_ms", "predicted_ms", "target_ms", "draft_ms", "glue_ms"):
        assert t[k] >= 0
    assert t["predicted_per_second"] > 0


def test_a_message_name_is_accepted_and_changes_nothing(client) -> None:
    named = [{**m, "name": "bob"} for m in CHAT]
    kw = {"model": "m", "max_tokens": 6, "temperature": 0}
    r = client.chat.completions.create(messages=named, **kw)
    assert (
        r.choices[0].message.content
        == client.chat.completions.create(messages=CHAT, **kw).choices[0].message.content
    )


def test_chat_stream(client) -> None:
    stream = client.chat.completions.create(
        model="x",
        messages=CHAT,
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == LETTERS + LETTERS[:4]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and not any(reasons[:-1])
    last = chunks[-1]  # include_usage: a last chunk without choices, with usage and timings
    assert last.choices == [] and last.usage.completion_tokens == 30
    assert last.model_extra["timings"]["predicted_n"] == 30
    assert all(c.usage is None for c in chunks[:-1])
    assert all(c.model == "agree" and c.id == chunks[0].id for c in chunks)


def test_stream_without_usage_puts_timings_in_the_finishing_chunk(client) -> None:
    chunks = list(
        client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=5, temperature=0, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 5
    assert all("timings" not in (c.model_extra or {}) for c in chunks[:-1])


def test_completions(client) -> None:
    r = client.completions.create(model="x", prompt="abc", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == "defghijk"
    assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens == 3
    ids = client.completions.create(model="x", prompt=[97, 98, 99], max_tokens=8, temperature=0)
    assert ids.choices[0].text == "defghijk"
    assert (
        client.completions.create(model="x", prompt="abc", temperature=0).usage.completion_tokens
        == 16
    )
    chunks = list(
        client.completions.create(model="x", prompt="abc", max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == "defghijk"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 8


def test_stop_strings(client) -> None:
    r = client.chat.completions.create(
        model="x", messages=CHAT, max_tokens=20, temperature=0, stop=["fg", "zz"]
    )
    assert r.choices[0].message.content == "abcde" and r.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model="x", prompt="abc", max_tokens=20, temperature=0, stop="hi", stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == "defg"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_models_and_health(client, url) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["agree"]
    assert models[0].model_extra["meta"]["n_ctx"] == 1024
    h = httpx.get(url + "/health")  # no key needed
    assert h.status_code == 200 and h.json()["status"] == "ok"


def test_seed_gives_the_text_of_engine_complete(models) -> None:
    """A random tiny model (real choices when sampling); the reference is a second engine
    loaded from the same files, asked through Engine.complete."""
    sampling = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "max_tokens": 40}
    with (
        localspec.load(models["target"], draft=models["draft31"], **OPTS) as served,
        localspec.load(models["target"], draft=models["draft31"], **OPTS) as ref,
        running(served) as u,
    ):
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
        texts = {}
        for seed in (1, 2, 3):
            r = client.completions.create(
                model="x",
                prompt="Once upon",
                seed=seed,
                extra_body={"top_k": 40},
                **_chat(sampling),
            )
            want = ref.complete("Once upon", seed=seed, **sampling)
            assert r.choices[0].text == want.text
            assert r.usage.completion_tokens == len(want.tokens)
            texts[seed] = want.text
        assert len(set(texts.values())) == 3  # the seed matters: the check can fail
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        r = client.chat.completions.create(
            model="x", messages=msgs, seed=7, extra_body={"top_k": 40}, **_chat(sampling)
        )
        prompt, stops = ref.format_chat(msgs)
        want = ref.complete(
            prompt, seed=7, stop=stops, add_special=False, parse_special=True, **sampling
        )
        assert r.choices[0].message.content == want.text


def _chat(sampling: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sampling.items() if k != "top_k"}


def test_second_turn_reuses_the_prompt_cache(client) -> None:
    msgs: list[dict[str, str]] = [{"role": "user", "content": "abc"}]
    first = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "more"},
    ]
    second = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0, "the second turn should reuse the first turn's prompt from the cache"
    assert cached < second.usage.prompt_tokens
    assert second.model_extra["timings"]["cache_n"] == cached


# --- refusals and errors ------------------------------------------------------------------------

UNSUPPORTED_CHAT = [
    ("n", 2),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("logit_bias", {"97": 5}),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 1.0),
    ("response_format", {"type": "json_object"}),
    ("functions", [{"name": "f"}]),
    ("reasoning_effort", "high"),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("store", True),
]


@pytest.mark.parametrize("field,value", UNSUPPORTED_CHAT)
def test_unsupported_chat_field_is_refused_by_name(client, field, value) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=2, extra_body={field: value}
        )
    assert e.value.status_code == 400
    err = e.value.body
    assert err["param"] == field and field in err["message"]
    assert err["code"] == "unsupported_parameter" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "field,value", [("echo", True), ("best_of", 3), ("suffix", "end"), ("logprobs", 2), ("n", 3)]
)
def test_unsupported_completion_field_is_refused_by_name(client, field, value) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", prompt="abc", max_tokens=2, extra_body={field: value})
    assert e.value.body["param"] == field


def test_neutral_values_of_unsupported_fields_are_accepted(client) -> None:
    r = client.chat.completions.create(
        model="x",
        messages=CHAT,
        max_tokens=3,
        temperature=0,
        n=1,
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0.0,
        response_format={"type": "text"},
        user="someone",
    )
    assert r.choices[0].message.content == "abc"


def test_max_completion_tokens(client) -> None:
    r = client.chat.completions.create(
        model="x", messages=CHAT, max_completion_tokens=4, temperature=0
    )
    assert r.choices[0].message.content == "abcd"


def test_api_key(url, rec) -> None:
    for key in (None, "wrong"):
        r = post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, key=key)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert set(err) == {"message", "type", "param", "code"}
    assert httpx.get(url + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).status_code == 200


def _chat_body(**kw: Any) -> dict[str, Any]:
    return {"messages": CHAT, "max_tokens": 2, **kw}


MALFORMED: list[tuple[str, Any, str | None]] = [
    # (what, body, the param named)
    ("not JSON", b'{"messages": [', None),
    ("not UTF-8", b'{"messages": "\xff\xfe"}', None),
    ("not an object", b"[1, 2]", None),
    ("no messages", {"max_tokens": 2}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("messages not a list", {"messages": "hi"}, "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("tool role", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("no content", {"messages": [{"role": "user"}]}, "messages[0].content"),
    (
        "image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content",
    ),
    ("temperature a string", _chat_body(temperature="hot"), "temperature"),
    ("max_tokens a string", _chat_body(max_tokens="5"), "max_tokens"),
    ("stream a string", _chat_body(stream="yes"), "stream"),
    ("stop a number", _chat_body(stop=5), "stop"),
    ("empty stop", _chat_body(stop=[""]), "stop"),
    ("unknown field", _chat_body(frobnicate=1), "frobnicate"),
    ("temperature 5", _chat_body(temperature=5), "temperature"),
    ("negative max_tokens", _chat_body(max_tokens=-1), "max_tokens"),
    ("huge max_tokens", _chat_body(max_tokens=10**12), "max_tokens"),
    ("top_p 0", _chat_body(top_p=0), "top_p"),
    ("negative top_k", _chat_body(top_k=-3), "top_k"),
    ("negative seed", _chat_body(seed=-5), "seed"),
    ("n_draft 99", _chat_body(n_draft=99), "n_draft"),
    ("n_draft a word", _chat_body(n_draft="many"), "n_draft"),
    ("tree 0,0,0", _chat_body(tree="0,0,0"), "tree"),
    ("tree of two", _chat_body(tree=[2, 2]), "tree"),
]


@pytest.mark.parametrize("what,body,param", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_400(url, rec, what, body, param) -> None:
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_completion_prompt_errors(url, rec) -> None:
    for body, param in [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "abc", "messages": CHAT}, "messages"),
    ]:
        r = post(url, "/v1/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = post(url, "/v1/completions", {"prompt": [97, 100000]})  # not a token id
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]


def test_prompt_longer_than_the_context(url, client, rec) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "xy" * 800}], stream=True
        )
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "messages"
    r = post(url, "/v1/completions", {"prompt": "z" * 1100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_body_size_limit(url, rec) -> None:
    big = json.dumps({"prompt": "a" * (1 << 16)}).encode()
    r = post(url, "/v1/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    # and without a Content-Length (chunked upload), counted while reading
    r = httpx.post(
        url + "/v1/completions",
        content=iter([big[:40000], big[40000:]]),
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 413


def test_unknown_route_and_method(url) -> None:
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405 and "error" in r.json()


def test_internal_failure_is_500_and_the_server_keeps_serving(client, rec) -> None:
    rec.fail_at_start = True
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="x", messages=CHAT, max_tokens=3)
    assert e.value.status_code == 500 and e.value.body["type"] == "server_error"
    rec.fail_at_start, rec.fail_after = False, 2
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="x", messages=CHAT, max_tokens=30)
    with pytest.raises(openai.APIError, match="boom mid-generation"):  # after the 200 headers
        list(client.chat.completions.create(model="x", messages=CHAT, max_tokens=30, stream=True))
    rec.fail_after = None
    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=3, temperature=0)
    assert r.choices[0].message.content == "abc"


# --- the queue ------------------------------------------------------------------------------------


def _slow_stream(url: str, max_tokens: int, key: str | None = KEY) -> httpx.Response:
    """Start a streaming chat and return its open response (headers read, body not)."""
    client = httpx.Client(timeout=30)
    req = client.build_request(
        "POST",
        url + "/v1/chat/completions",
        json={"messages": CHAT, "max_tokens": max_tokens, "stream": True, "n_draft": 0},
        headers={"Authorization": f"Bearer {key}"} if key else {},
    )
    resp = client.send(req, stream=True)
    assert resp.status_code == 200
    return resp


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # reported by the test that joins
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_queue_bound_and_health_during_generation(url, client, rec) -> None:
    rec.delay = 0.02  # a slow model: 400 plain steps take 8 s
    a = _slow_stream(url, 400)
    try:
        wait_until(lambda: health(url)["busy"], "the first request to run")
        # answers while a generation runs (within health()'s 5 s timeout; the run takes 8 s)
        assert health(url)["busy"]
        b_thread, b = _in_thread(
            lambda: client.chat.completions.create(
                model="x", messages=CHAT, max_tokens=3, temperature=0
            )
        )
        wait_until(lambda: health(url)["queued"] == 1, "the second request to queue")
        r = post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3})
        assert r.status_code == 503
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "queue_full" and err["type"] == "server_error"
    finally:
        a.close()  # disconnect: stops the first generation, the queued one runs
    b_thread.join(30)
    assert b["value"].choices[0].message.content == "abc"


def test_disconnect_mid_stream_stops_the_generation(url, client, rec) -> None:
    rec.delay = 0.02
    n_before = len(rec.log)
    a = _slow_stream(url, 400)
    lines = a.iter_lines()
    got = [next(lines) for _ in range(6)]  # a few events have arrived
    assert any('"content":"a"' in line for line in got)
    b_thread, b = _in_thread(
        lambda: client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=5, temperature=0
        )
    )
    wait_until(lambda: health(url)["queued"] == 1, "the second request to queue")
    a.close()
    b_thread.join(30)
    assert b["value"].choices[0].message.content == "abcde"
    first, second = rec.log[n_before], rec.log[n_before + 1]
    assert first["done"] and first["reason"] is None  # closed between steps, not finished
    assert first["tokens"] < 400
    assert second["reason"] == "length"


def test_request_that_leaves_while_queued_never_runs(url, rec) -> None:
    rec.delay = 0.02
    n_before = len(rec.log)
    a = _slow_stream(url, 400)
    try:
        wait_until(lambda: health(url)["busy"], "the first request to run")
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while queued
            post(url, "/v1/completions", {"prompt": "queued", "max_tokens": 3}, timeout=0.5)
        # dropped at once, not when its turn comes (the first request runs for 8 s)
        wait_until(lambda: health(url)["queued"] == 0, "the queue to drop it", timeout=4)
    finally:
        a.close()
    wait_until(lambda: not health(url)["busy"], "the first request to stop")
    assert [r["what"] for r in rec.log[n_before:]] == [rec.log[n_before]["what"]]
    assert all(r["what"] != "queued" for r in rec.log)


def test_shutdown_ends_open_requests_instead_of_cutting_them(engine, rec) -> None:
    rec.delay = 0.02
    with running_server(engine, max_queue=4) as (u, server):
        a = _slow_stream(u, 400, key=None)
        wait_until(lambda: health(u)["busy"], "the first request to run")
        b_thread, b = _in_thread(lambda: post(u, "/v1/completions", {"prompt": "abc"}, key=None))
        wait_until(lambda: health(u)["queued"] == 1, "the second request to queue")
        server.should_exit = True
        lines = [line for line in a.iter_lines() if line]  # the stream ends by itself
        b_thread.join(30)
    assert lines[-1] == "data: [DONE]" and '"code":"shutting_down"' in lines[-2]
    assert b["value"].status_code == 503 and b["value"].json()["error"]["code"] == "shutting_down"


# --- the command -------------------------------------------------------------------------------


def _serve(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LOCALSPEC_API_KEY": ""},
    )


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_serve_command_serves_and_stops_cleanly(agree, sig) -> None:
    import signal

    target, draft = agree
    proc = _serve([target, "--draft", draft, "--port", "0", "-t", "1", "--ctx", "512"])
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("serving agree.gguf at http://127.0.0.1:"), line
        base = line.split(" at ")[1].strip()
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=4, temperature=0)
        assert r.choices[0].message.content == "abcd"
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert err.strip().endswith("localspec: server stopped")


def test_serve_command_errors_are_one_line(agree, tmp_path) -> None:
    target, draft = agree
    busy = listen("127.0.0.1", 0)
    busy.listen()
    port = busy.getsockname()[1]
    cases = [
        ([str(tmp_path / "missing.gguf"), "--port", "0"], "no such file"),
        ([target, "--port", "70000"], "--port"),
        ([target, "--port", str(port)], "cannot listen on 127.0.0.1"),
        ([target, "--port", "0", "--max-queue", "-1"], "--max-queue"),
        ([target, "--port", "0", "--api-key", " "], "--api-key"),
        ([target, "--port", "0", "--tree", "0,1,2"], "tree"),
    ]
    with busy:
        for args, needle in cases:
            proc = _serve(args)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 1, (args, err)
            assert err.startswith("localspec: error:") and err.count("\n") == 1, (args, err)
            assert needle in err, (args, err)
