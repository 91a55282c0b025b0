"""`localspec serve`: the real server (uvicorn on a free 127.0.0.1 port) over real tiny GGUF
models, driven by the official `openai` client and by raw HTTP for what a client library would
never send."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
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
from localspec.errors import InvalidParameterError
from localspec.options import MAX_DRAFT, check_draft_source, check_n_draft, check_stops, check_tree
from localspec.server import create_app
from localspec.server.run import listen

from helpers.server import running, running_server, wait_until

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
        self.notes: list[str] = []  # added to last_stats.notes (the engine's own, if any)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._eng, name)

    @property
    def last_stats(self) -> Any:
        stats = self._eng.last_stats
        if self.notes:
            stats.notes = [*stats.notes, *self.notes]
        return stats

    def complete_stream(self, prompt: Any, **kw: Any) -> Iterator[localspec.Event]:
        return self._record(lambda: self._eng.complete_stream(prompt, **kw), prompt, kw)

    def chat_stream(self, messages: Any, **kw: Any) -> Iterator[localspec.Event]:
        return self._record(lambda: self._eng.chat_stream(messages, **kw), messages, kw)

    def _record(
        self, start: Callable[[], Iterator[localspec.Event]], what: Any, kw: dict[str, Any]
    ) -> Any:
        if self.fail_at_start:
            raise RuntimeError("boom at start")
        events = start()  # validation errors surface here, as from the engine
        rec = {"what": what, "kw": kw, "tokens": 0, "ids": [], "reason": None, "done": False}
        self.log.append(rec)
        return self._events(events, rec)

    def _events(self, events: Any, rec: dict[str, Any]) -> Iterator[localspec.Event]:
        try:
            for i, ev in enumerate(events):
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("boom mid-generation")
                time.sleep(self.delay)
                rec["tokens"] += len(ev.tokens)
                rec["ids"] += ev.tokens
                rec["reason"] = ev.finish_reason
                yield ev
        finally:
            events.close()
            rec["done"] = True


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
    engine.delay, engine.fail_at_start, engine.fail_after, engine.notes = 0.0, False, None, []
    yield engine
    engine.delay, engine.fail_at_start, engine.fail_after, engine.notes = 0.0, False, None, []


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
    engine.reset()  # an empty cache: nothing can be reused, whatever ran before
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
    assert u.prompt_tokens_details.cached_tokens == 0
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
    assert t["notes"] == []  # the request was honoured as asked
    assert t["auto"] is None  # a fixed chain: auto chose nothing

    again = client.chat.completions.create(
        model="x", messages=CHAT, max_tokens=10, temperature=0, extra_body={"n_draft": 4}
    )
    # the same prompt again: all of it is in the cache, but its last token is decoded again
    # for the logits of the first new token (Target.reusable)
    assert again.usage.prompt_tokens_details.cached_tokens == n_prompt - 1
    assert again.model_extra["timings"]["cache_n"] == n_prompt - 1
    assert again.choices[0].message.content == LETTERS[:10]


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
            want = ref.complete("Once upon", seed=seed, **_ref(ref, sampling))
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
            prompt, seed=7, stop=stops, add_special=False, parse_special=True,
            **_ref(ref, sampling),
        )  # fmt: skip
        assert r.choices[0].message.content == want.text


# llama.cpp's samplers as clients send them: OpenAI's fields through the client's own
# arguments, llama-server's and vLLM's through extra_body
SAMPLERS = {
    "min_p": 0.05,
    "typical_p": 0.9,
    "repeat_penalty": 1.2,
    "repeat_last_n": 32,
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 48,
    "dry_sequence_breakers": ["\n", ":"],
}


def test_samplers_give_the_text_of_engine_complete(models) -> None:
    """Penalties, DRY, min-p, typical-p and logit bias (OpenAI's {"id": bias}, llama-server's
    [[text, bias]] and false) on both endpoints, through the OpenAI client: the text a second
    engine gives through Engine.complete with the same settings, for three seeds."""
    sampling = {"temperature": 0.9, "top_k": 40, "max_tokens": 40}
    openai_kw = {"presence_penalty": 0.4, "frequency_penalty": 0.3}
    with (
        localspec.load(models["target"], draft=models["draft31"], **OPTS) as served,
        localspec.load(models["target"], draft=models["draft31"], **OPTS) as ref,
        running(served) as u,
    ):
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
        a = ref.tokenize("a")[0]
        texts = {}
        for seed, bias_in, bias_ref in (
            (1, {"logit_bias": {str(a): 3}}, {a: 3.0}),
            (2, {"logit_bias": {str(a): -100}}, {a: -100.0}),
            (3, {}, {}),
        ):
            r = client.completions.create(
                model="x",
                prompt="Once upon",
                seed=seed,
                extra_body={"top_k": 40, **SAMPLERS},
                **openai_kw,
                **bias_in,
                **_chat(sampling),
            )
            want = ref.complete(
                "Once upon", seed=seed,
                **_ref(ref, {**sampling, **openai_kw, **SAMPLERS, "logit_bias": bias_ref}),
            )  # fmt: skip
            assert r.choices[0].text == want.text
            texts[seed] = want.text
        assert len(set(texts.values())) == 3
        # the settings matter: without them the same seed gives another text
        assert ref.complete("Once upon", seed=3, **_ref(ref, sampling)).text != texts[3]
        # chat, with vLLM's spelling and llama-server's [[text, bias]] and false
        msgs = [{"role": "user", "content": "Hi"}]
        body = {**SAMPLERS, "top_k": 40, "logit_bias": [["a", 2.0], [a + 1, False]]}
        body["repetition_penalty"] = body.pop("repeat_penalty")
        r = client.chat.completions.create(
            model="x", messages=msgs, seed=5, extra_body=body, **openai_kw, **_chat(sampling)
        )
        prompt, stops = ref.format_chat(msgs)
        bias = [("a", 2.0), (a + 1, float("-inf"))]
        want = ref.complete(
            prompt, seed=5, stop=stops, add_special=False, parse_special=True,
            **_ref(ref, {**sampling, **openai_kw, **SAMPLERS, "logit_bias": bias}),
        )  # fmt: skip
        assert r.choices[0].message.content == want.text


BAD_SAMPLERS = [
    ({"min_p": 2.0}, "min_p", "min_p must be in"),
    ({"repeat_penalty": 0}, "repeat_penalty", "repeat_penalty must be in"),
    ({"repetition_penalty": -1.0}, "repetition_penalty", "repetition_penalty must be in"),
    ({"logit_bias": {"5": 10**400}}, "logit_bias", "logit_bias values must be numbers in"),
    ({"logit_bias": {"5": 1e30}}, "logit_bias", "logit_bias values must be numbers in"),
    ({"min_p": 10**400}, "min_p", None),
    ({"dry_sequence_breakers": ["x"] * 65}, "dry_sequence_breakers", "at most 64"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.3}, "repetition_penalty", "disagree"),
    ({"dry_base": 0.5}, "dry_base", "dry_base must be in"),
    ({"logit_bias": {"99999": 1}}, "logit_bias", "outside this model's vocabulary"),
    ({"logit_bias": [[1, "much"]]}, "logit_bias", "numbers or false"),
    ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers", "non-empty strings"),
    ({"presence_penalty": 1e9}, "presence_penalty", "presence_penalty must be in"),
]


@pytest.mark.parametrize(("extra", "param", "message"), BAD_SAMPLERS, ids=lambda x: str(x))
def test_bad_sampler_settings_are_400s_naming_them(url, rec, extra, param, message) -> None:
    for path, body in (
        ("/v1/chat/completions", _chat_body(**extra)),
        ("/v1/completions", {"prompt": "abc", "max_tokens": 2, **extra}),
    ):
        r = post(url, path, body)
        assert r.status_code == 400, r.text
        err = _error(r)
        assert err["param"] == param, err
        assert message is None or message in err["message"], err


def _ref(eng: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """What the server runs for a request with these settings: the model's recommended
    sampling with them in its place (max_tokens passed on)."""
    rest = {k: v for k, v in settings.items() if k != "max_tokens"}
    return {"max_tokens": settings["max_tokens"], "sampling": eng.sampling_with(**rest)}


def _chat(sampling: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sampling.items() if k != "top_k"}


def test_second_turn_reuses_the_prompt_cache(client) -> None:
    # plain decoding (n_draft 0) for an exact count: the cache then holds the first prompt and
    # every answer token but the last, which is emitted without being decoded
    def plain(msgs: list[dict[str, str]]) -> Any:
        return client.chat.completions.create(
            model="x", messages=msgs, max_tokens=8, temperature=0, extra_body={"n_draft": 0}
        )

    msgs: list[dict[str, str]] = [{"role": "user", "content": "abc"}]
    first = plain(msgs)
    assert first.choices[0].message.content == LETTERS[:8]
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "more"},
    ]
    second = plain(msgs)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the template writes the answer back as the same tokens (one per letter), so the second
    # prompt extends the cached history: all of it is reused
    assert cached == first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert cached < second.usage.prompt_tokens
    assert second.model_extra["timings"]["cache_n"] == cached


# --- refusals and errors ------------------------------------------------------------------------

UNSUPPORTED_CHAT = [
    ("n", 2),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"),
    ("logprobs", True),
    ("top_logprobs", 3),
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
        "messages[0].content[0].type",
    ),
    (
        "text part without text",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
    ),
    (
        "part without a type",
        {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
        "messages[0].content[0].type",
    ),
    (
        "unknown part type",
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]},
        "messages[0].content[0].type",
    ),
    (
        "text part with an unknown field",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]},
        "messages[0].content[0].y",
    ),
    ("null content", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("part a number", {"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
    ("temperature a string", _chat_body(temperature="hot"), "temperature"),
    ("max_tokens a string", _chat_body(max_tokens="5"), "max_tokens"),
    ("stream a string", _chat_body(stream="yes"), "stream"),
    ("stop a number", _chat_body(stop=5), "stop"),
    ("stop an object", _chat_body(stop={"x": 1}), "stop"),
    ("empty stop", _chat_body(stop=[""]), "stop"),
    ("17 stops", _chat_body(stop=list(LETTERS[:17])), "stop"),
    ("unknown field", _chat_body(frobnicate=1), "frobnicate"),
    ("temperature 5", _chat_body(temperature=5), "temperature"),
    ("negative max_tokens", _chat_body(max_tokens=-1), "max_tokens"),
    ("huge max_tokens", _chat_body(max_tokens=10**12), "max_tokens"),
    ("top_p 0", _chat_body(top_p=0), "top_p"),
    ("negative top_k", _chat_body(top_k=-3), "top_k"),
    ("negative seed", _chat_body(seed=-5), "seed"),
    ("n_draft 99", _chat_body(n_draft=99), "n_draft"),
    ("n_draft a word", _chat_body(n_draft="many"), "n_draft"),
    ("n_draft 3.0", _chat_body(n_draft=3.0), "n_draft"),
    ("n_draft true", _chat_body(n_draft=True), "n_draft"),
    ("tree 0,0,0", _chat_body(tree="0,0,0"), "tree"),
    ("tree of two", _chat_body(tree=[2, 2]), "tree"),
    ("draft_source unknown", _chat_body(draft_source="both"), "draft_source"),
    ("draft_source a number", _chat_body(draft_source=1), "draft_source"),
    ("draft_source upper case", _chat_body(draft_source="NGRAM"), "draft_source"),
    ("ngram with a fixed tree", _chat_body(draft_source="ngram", tree="2,2,4"), "tree"),
]


@pytest.mark.parametrize("what,body,param", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_400(url, rec, what, body, param) -> None:
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    return err


NDRAFT_MESSAGE = f'n_draft must be "auto" or an integer in [0, {MAX_DRAFT}], got '
SOURCE_MESSAGE = 'draft_source must be one of "auto", "eagle", "mtp", "ngram", "none", got '


@pytest.mark.parametrize(
    "body,param,message",
    [
        (_chat_body(n_draft=3.0), "n_draft", NDRAFT_MESSAGE + '3.0'),
        (_chat_body(n_draft="3"), "n_draft", NDRAFT_MESSAGE + '"3"'),
        (_chat_body(n_draft=True), "n_draft", NDRAFT_MESSAGE + 'true'),
        (_chat_body(draft_source="both"), "draft_source", SOURCE_MESSAGE + '"both"'),
        (_chat_body(draft_source=False), "draft_source", SOURCE_MESSAGE + 'false'),
        (
            {"messages": [CHAT[0], {"role": "user", "content": [{"type": "text"}]}]},
            "messages[1].content[0].text",
            "content part 0 of messages[1] has type 'text' but no 'text' field",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "messages[0].content must be a string or a list of content parts, got 5",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
            "content part 0 of messages[0]: 'text' must be a string, got 5",
        ),
        (
            {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}
            ]}]},
            "messages[0].content[1].type",
            "unsupported content part type 'image_url' in content part 1 of messages[0]: "
            "localspec serve takes text only",
        ),
    ],
    ids=["n_draft 3.0", "n_draft '3'", "n_draft true", "draft_source 'both'", "draft_source false",
         "no text", "content 5", "text 5", "image"],
)  # fmt: skip
def test_error_messages_name_the_real_problem(url, rec, body, param, message) -> None:
    err = _error(post(url, "/v1/chat/completions", body))
    assert (err["param"], err["message"]) == (param, message)


def _engine_verdict(field: str, value: Any) -> str | None:
    """The engine's own check's message for this value, None when it accepts it."""
    check = {
        "n_draft": check_n_draft,
        "tree": check_tree,
        "stop": check_stops,
        "draft_source": check_draft_source,
    }[field]
    try:
        check(value)
    except InvalidParameterError as exc:
        return str(exc)
    return None


ENGINE_CHECKED: list[tuple[str, Any]] = [
    *[("n_draft", v) for v in ("auto", 0, 5, MAX_DRAFT, MAX_DRAFT + 1, -1, 3.0, "3", True, [4])],
    *[
        ("tree", v)
        for v in ("2,2,4", [2, 2, 4], [3, 1, 3], "0,1,1", [1, 9, 4], [2, 2], "a,b,c", [2.0, 2, 4])
    ],
    *[("tree", v) for v in (7, [2, 2, 63], {"depth": 2})],
    *[("stop", v) for v in ("x", ["x", "y"], [], [""], [5], "", 5, {"x": 1}, [None])],
    *[
        ("draft_source", v)
        for v in ("auto", "eagle", "ngram", "none", "NGRAM", "", "both", 0, True, ["ngram"])
    ],
]


@pytest.mark.parametrize(
    "field,value", ENGINE_CHECKED, ids=[f"{f}={json.dumps(v)}" for f, v in ENGINE_CHECKED]
)
def test_n_draft_tree_and_stop_are_judged_as_the_engine_judges_them(url, rec, field, value) -> None:
    verdict = _engine_verdict(field, value)
    # the engine's own calls use the same checks: they refuse exactly these values
    try:
        rec._eng.complete_stream("abc", max_tokens=1, **{field: value}).close()
    except InvalidParameterError as exc:
        assert str(exc) == verdict
    else:
        assert verdict is None
    r = post(url, "/v1/chat/completions", {**_chat_body(max_tokens=1, temperature=0), field: value})
    if verdict is None:
        assert r.status_code == 200, r.text
        return
    err = _error(r)
    assert err["param"] == field
    if field == "n_draft":  # reworded to name both forms, with the JSON value
        assert err["message"].startswith(NDRAFT_MESSAGE)
    elif field == "draft_source":  # reworded to show the names and the value as JSON
        assert err["message"] == SOURCE_MESSAGE + json.dumps(value)
    else:  # the engine's message, prefixed with the field when it does not name it
        assert err["message"] in (verdict, f"{field}: {verdict}")


def test_openais_own_response_message_can_be_sent_back(client) -> None:
    first = client.chat.completions.create(model="x", messages=CHAT, max_tokens=4, temperature=0)
    message = first.choices[0].message
    dumped = message.model_dump()
    # what clients send back: the response's fields, unused ones null
    assert {"refusal", "tool_calls", "annotations", "audio", "function_call"} <= set(dumped)
    assert all(dumped[k] is None for k in ("refusal", "tool_calls", "annotations", "audio"))
    more = {"role": "user", "content": "more"}
    plain = {"role": "assistant", "content": message.content}
    want = client.chat.completions.create(
        model="x", messages=[*CHAT, plain, more], max_tokens=3, temperature=0
    )
    # the dict with its nulls, and the message object itself (serialised by the client)
    for back in (dumped, message):
        r = client.chat.completions.create(
            model="x",
            messages=[*CHAT, back, more],  # type: ignore[list-item]
            max_tokens=3,
            temperature=0,
        )
        assert r.choices[0].message.content == want.choices[0].message.content
        assert r.usage.prompt_tokens == want.usage.prompt_tokens  # the same prompt


def test_null_and_empty_fields_ask_for_nothing(url, rec) -> None:
    def ask(body: dict[str, Any]) -> dict[str, Any]:
        r = post(url, "/v1/chat/completions", {"max_tokens": 3, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        return r.json()

    bare = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "def"},
        {"role": "user", "content": "abc"},
    ]
    nulls = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}], "name": None},
        {"role": "user", "content": [{"type": "text", "text": "ab"},
                                     {"type": "text", "text": "c"}]},
        {"role": "assistant", "content": "def", "tool_calls": [], "refusal": None,
         "annotations": [], "audio": None, "function_call": None},
        {"role": "user", "content": "abc", "name": "bob"},
    ]  # fmt: skip
    want = ask({"messages": bare})
    got = ask(
        {
            "messages": nulls,
            "stream": None,
            "stream_options": None,
            "stop": None,
            "n_draft": None,
            "tree": None,
            "seed": None,
            "tools": [],
            "tool_choice": None,
            "functions": None,
            "logprobs": None,
            "user": None,
        }
    )
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    # and a null stream is a whole answer, not a stream
    assert got["object"] == "chat.completion"


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
REFUSED_MESSAGES: list[tuple[str, dict[str, Any], str]] = [
    ("tool calls", {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}, "tool_calls"),
    ("function call", {"role": "assistant", "function_call": {"name": "f"}}, "function_call"),
    ("tool role", {"role": "tool", "content": "42", "tool_call_id": "c1"}, "role"),
    ("function role", {"role": "function", "content": "42", "name": "f"}, "role"),
    ("audio reference", {"role": "assistant", "content": "x", "audio": {"id": "a1"}}, "audio"),
    ("refusal", {"role": "assistant", "content": None, "refusal": "I can't"}, "refusal"),
    (
        "audio content",
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]},
        "content[0].type",
    ),
    (
        "refusal part",
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        "content[0].type",
    ),
]


@pytest.mark.parametrize(
    "what,message,param", REFUSED_MESSAGES, ids=[m[0] for m in REFUSED_MESSAGES]
)
def test_what_changes_a_messages_meaning_is_refused_by_name(url, rec, what, message, param) -> None:
    err = _error(post(url, "/v1/chat/completions", _chat_body(messages=[*CHAT, message])))
    assert err["param"] == f"messages[1].{param}"
    assert err["code"] == "unsupported_parameter"
    assert "not supported" in err["message"] or "unsupported" in err["message"]


def test_notes_from_the_engine_reach_the_timings(client, rec) -> None:
    rec.notes = ["a note from the engine"]
    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=3, temperature=0)
    assert r.model_extra["timings"]["notes"] == ["a note from the engine"]
    chunks = list(
        client.completions.create(model="x", prompt="abc", max_tokens=3, temperature=0, stream=True)
    )
    assert chunks[-1].model_extra["timings"]["notes"] == ["a note from the engine"]


def test_n_draft_or_tree_without_a_drafter_runs_plain_and_says_so(agree) -> None:
    target, _ = agree
    with localspec.load(target, draft=False, **OPTS) as eng, running(eng) as u:
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=30)
        for extra in ({"n_draft": 4}, {"tree": "2,2,4"}):
            r = client.chat.completions.create(
                model="x", messages=CHAT, max_tokens=5, temperature=0, extra_body=extra
            )
            assert r.choices[0].message.content == LETTERS[:5]
            t = r.model_extra["timings"]
            assert t["mode"] == "plain" and t["draft_n"] == 0
            assert t["notes"] == eng.last_stats.notes
            assert len(t["notes"]) == 1 and "runs plain decoding" in t["notes"][0], extra


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
    err = _error(r)
    assert "token ids" in err["message"] and err["param"] == "prompt"


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


def test_internal_failure_is_500_and_the_server_keeps_serving(url, client, rec) -> None:
    rec.fail_at_start = True
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="x", messages=CHAT, max_tokens=3)
    assert e.value.status_code == 500 and e.value.body["type"] == "server_error"
    # fails at the third event: plain decoding (one token per event), so that it comes
    # before the 30th token whatever auto would run (a step may emit many tokens)
    rec.fail_at_start, rec.fail_after = False, 2
    plain = {"n_draft": 0}
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="x", messages=CHAT, max_tokens=30, extra_body=plain)
    # after the 200 headers: an error event, which the client raises as an APIError (not a
    # status error: the status was 200) after the chunks that came before it
    got: list[Any] = []
    with pytest.raises(openai.APIError, match="boom mid-generation") as mid:
        for chunk in client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=30, stream=True, extra_body=plain
        ):
            got.append(chunk)
    assert not isinstance(mid.value, openai.APIStatusError)
    assert mid.value.body == {
        "message": "internal error: boom mid-generation",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert got[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in got) == "ab"
    # as a raw reader sees it: a data event holding OpenAI's error object, then [DONE]
    raw = post(url, "/v1/completions", {"prompt": "abc", "max_tokens": 30, "stream": True, **plain})
    assert raw.status_code == 200
    events = [e for e in raw.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "internal_error"
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


def test_disconnect_mid_stream_stops_the_generation(url, client, rec, server_log) -> None:
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
    _assert_clean(server_log)


def test_request_that_leaves_while_queued_never_runs(url, rec, server_log) -> None:
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
    _assert_clean(server_log)


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


def test_max_queue_0_runs_one_and_refuses_any_that_would_wait(engine, rec) -> None:
    with running(engine, max_queue=0) as u:
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=30)
        # idle: served, whole and streamed
        r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=3, temperature=0)
        assert r.choices[0].message.content == "abc"
        stream = client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=3, temperature=0, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "abc"
        rec.delay = 0.02  # 400 plain steps take 8 s
        a = _slow_stream(u, 400, key=None)
        try:
            wait_until(lambda: health(u)["busy"], "the first request to run")
            r2 = post(u, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3}, key=None)
            assert r2.status_code == 503, r2.text
            err = r2.json()["error"]
            assert err["code"] == "queue_full" and "0 of at most 0" in err["message"]
            assert health(u) == {"status": "ok", "busy": True, "queued": 0}
        finally:
            a.close()
        rec.delay = 0.0
        wait_until(lambda: not health(u)["busy"], "the first request to stop")
        r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=3, temperature=0)
        assert r.choices[0].message.content == "abc"


@pytest.fixture
def server_log() -> Iterator[list[logging.LogRecord]]:
    """Warnings and errors logged while the test runs, by the server (localspec.server),
    uvicorn (whose loggers do not propagate to the root) or asyncio."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("", "uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _assert_clean(records: list[logging.LogRecord]) -> None:
    gc.collect()  # asyncio reports a task whose exception nobody read when it is collected
    lines = [f"{r.name}: {r.getMessage()}" for r in records]
    assert not lines, lines
    assert not any(r.exc_info for r in records)


def test_client_that_gives_up_on_a_whole_answer_stops_it_with_a_clean_log(
    url, rec, server_log
) -> None:
    rec.delay = 0.02  # 400 plain steps take 8 s
    n_before = len(rec.log)
    body = json.dumps({"messages": CHAT, "max_tokens": 400, "n_draft": 0}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: len(rec.log) > n_before, "the generation to start")
    # the client has gone (the socket is closed) while its whole answer generates
    wait_until(lambda: rec.log[n_before]["done"], "the generation to stop", timeout=6)
    run = rec.log[n_before]
    assert run["reason"] is None and run["tokens"] < 400  # stopped between steps
    wait_until(lambda: not health(url)["busy"], "the worker to be free")
    rec.delay = 0.0
    r = post(url, "/v1/chat/completions", _chat_body(temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ab"
    _assert_clean(server_log)


# --- the request log and the metrics -----------------------------------------------------------


def _log_fields(line: str) -> tuple[list[str], dict[str, str]]:
    """A request's log line: its client, method, path and status, and its key=value fields
    (a bare word such as client_gone maps to "")."""
    words = line.split(" ")
    return words[:4], dict(w.split("=", 1) if "=" in w else (w, "") for w in words[4:])


def _request_lines(records: list[logging.LogRecord], path: str, n: int) -> list[str]:
    """The request log's lines for path, once there are n (a line is written as its response
    ends, which the client may see first)."""

    def lines() -> list[str]:
        return [
            r.getMessage()
            for r in list(records)
            if r.name == "localspec.server" and r.getMessage().split(" ")[2:3] == [path]
        ]

    wait_until(lambda: len(lines()) >= n, f"{n} log lines for {path}")
    assert len(lines()) == n, lines()
    return lines()


def test_each_request_is_logged_once_with_its_generation(engine, rec, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="localspec.server")
    with running(engine) as u:
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=30)
        r = client.chat.completions.create(
            model="x", messages=CHAT, max_tokens=10, temperature=0, extra_body={"n_draft": 4}
        )
        assert post(u, "/v1/chat/completions", {"messages": "hi"}, key=None).status_code == 400
        chunks = list(
            client.completions.create(
                model="x",
                prompt="abc",
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        health(u)
        chat = _request_lines(caplog.records, "/v1/chat/completions", 2)
        (stream,) = _request_lines(caplog.records, "/v1/completions", 1)
        _request_lines(caplog.records, "/health", 1)
    head, f = _log_fields(chat[0])
    assert head == ["127.0.0.1", "POST", "/v1/chat/completions", "200"]
    assert set(f) == {"prompt_tokens", "completion_tokens", "tokens_per_s", "tau", "queue_s",
                      "total_s"}  # fmt: skip
    t = r.model_extra["timings"]
    assert (f["prompt_tokens"], f["completion_tokens"]) == (str(r.usage.prompt_tokens), "10")
    assert f["tau"] == f"{t['tau']:.2f}" and t["tau"] > 1.5  # the engine's own statistics
    assert f["tokens_per_s"] == f"{t['predicted_per_second']:.1f}"
    assert float(f["queue_s"]) >= 0 and float(f["total_s"]) >= 0
    head, f = _log_fields(chat[1])
    assert head[3] == "400" and set(f) == {"error", "total_s"}
    assert f["error"] == "invalid_request_error"
    head, f = _log_fields(stream)  # written as the stream ends, with its usage
    assert head == ["127.0.0.1", "POST", "/v1/completions", "200"]
    usage = chunks[-1].usage
    assert (f["prompt_tokens"], f["completion_tokens"]) == (str(usage.prompt_tokens), "8")
    levels = {
        r.getMessage().split(" ")[2]: r.levelno
        for r in caplog.records
        if r.name == "localspec.server"
    }
    # requests at INFO; health checks (and scrapes), which probes poll, at DEBUG
    assert levels == {
        "/v1/chat/completions": logging.INFO,
        "/v1/completions": logging.INFO,
        "/health": logging.DEBUG,
    }


def test_a_failure_mid_stream_and_a_client_that_leaves_are_logged(engine, rec, caplog) -> None:
    caplog.set_level(logging.INFO, logger="localspec.server")
    with running(engine) as u:
        rec.fail_after = 2
        body = {"prompt": "abc", "max_tokens": 30, "stream": True, "n_draft": 0}
        r = post(u, "/v1/completions", body, key=None)
        assert r.status_code == 200 and "boom mid-generation" in r.text
        (line,) = _request_lines(caplog.records, "/v1/completions", 1)
        head, f = _log_fields(line)
        assert head[3] == "200" and f["error"] == "internal_error"
        assert f["completion_tokens"] == str(rec.last_stats.generated)
        assert "client_gone" not in f
        rec.fail_after, rec.delay = None, 0.02  # 400 plain steps take 8 s
        a = _slow_stream(u, 400, key=None)
        next(a.iter_lines())
        a.close()
        (line,) = _request_lines(caplog.records, "/v1/chat/completions", 1)
        head, f = _log_fields(line)
        assert head[3] == "200" and "client_gone" in f
        wait_until(lambda: not health(u)["busy"], "the generation to stop")


Key = tuple[str, tuple[tuple[str, str], ...]]


def _metrics(u: str, key: str | None = KEY) -> dict[Key, float]:
    """/metrics parsed by prometheus_client: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(u + "/metrics", headers=headers, timeout=5)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _requests(endpoint: str, status: int) -> Key:
    return ("localspec_requests_total", (("endpoint", endpoint), ("status", str(status))))


def test_metrics_count_requests_tokens_and_drafts(engine, rec, url) -> None:
    assert httpx.get(url + "/metrics").status_code == 404  # off by default
    with running(engine, api_key=KEY, metrics=True) as u:
        assert httpx.get(u + "/metrics").status_code == 401  # behind the key, as /v1 is
        m0 = _metrics(u)
        assert m0[("localspec_prompt_tokens_total", ())] == 0
        assert m0[("localspec_draft_tokens_total", (("source", "ngram"),))] == 0
        client = openai.OpenAI(base_url=u + "/v1", api_key=KEY, max_retries=0, timeout=30)
        usages, sources = [], []
        for n in (5, 9):
            r = client.chat.completions.create(
                model="x", messages=CHAT, max_tokens=n, temperature=0, extra_body={"n_draft": 4}
            )
            usages.append(r.usage)
            sources.append(r.model_extra["timings"]["sources"])
        r2 = client.completions.create(
            model="x",
            prompt=LETTERS,
            max_tokens=12,
            temperature=0,
            extra_body={"draft_source": "ngram", "n_draft": 4},  # a chain: auto may run plain
        )
        usages.append(r2.usage)
        sources.append(r2.model_extra["timings"]["sources"])
        chunks = list(
            client.chat.completions.create(
                model="x",
                messages=CHAT,
                max_tokens=7,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usages.append(chunks[-1].usage)
        sources.append(chunks[-1].model_extra["timings"]["sources"])
        assert post(u, "/v1/completions", {"prompt": 5}).status_code == 400
        m = _metrics(u)
        # a generation running and one waiting: the gauges read them while they last
        rec.delay = 0.02  # 400 plain steps take 8 s
        a = _slow_stream(u, 400)
        try:
            wait_until(lambda: health(u)["busy"], "the first request to run")
            b_thread, b = _in_thread(lambda: post(u, "/v1/completions", {"prompt": "abc"}))
            wait_until(lambda: health(u)["queued"] == 1, "the second request to queue")
            busy = _metrics(u)
        finally:
            a.close()
        b_thread.join(30)
        assert b["value"].status_code == 200
    assert m[_requests("/v1/chat/completions", 200)] == 3
    assert m[_requests("/v1/completions", 200)] == 1
    assert m[_requests("/v1/completions", 400)] == 1
    assert m[_requests("/metrics", 200)] == 1 and m[_requests("/metrics", 401)] == 1
    assert m[("localspec_prompt_tokens_total", ())] == sum(u.prompt_tokens for u in usages)
    assert m[("localspec_completion_tokens_total", ())] == 5 + 9 + 12 + 7
    for name, field in (("draft_tokens", "drafted"), ("draft_accepted_tokens", "accepted"),
                        ("draft_steps", "steps")):  # fmt: skip
        for source in ("eagle", "ngram"):
            want = sum(s.get(source, {}).get(field, 0) for s in sources)
            assert m[(f"localspec_{name}_total", (("source", source),))] == want, (name, source)
    assert sources[0]["eagle"]["accepted"] > 0 and sources[2]["ngram"]["accepted"] > 0
    ttft = "localspec_time_to_first_token_seconds"
    assert m[(f"{ttft}_count", ())] == 4 and m[(f"{ttft}_bucket", (("le", "+Inf"),))] == 4
    assert m[("localspec_queue_depth", ())] == 0 and m[("localspec_requests_running", ())] == 0
    assert busy[("localspec_queue_depth", ())] == 1
    assert busy[("localspec_requests_running", ())] == 1


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


def test_the_socket_listens_before_the_address_is_printed() -> None:
    """A client that connects as soon as the address is printed is queued by the kernel until
    uvicorn accepts (a bound socket that does not listen yet refused it: a flaky CI run)."""
    import socket

    with listen("127.0.0.1", 0) as sock, socket.create_connection(sock.getsockname(), 5) as c:
        c.sendall(b"GET / HTTP/1.0\r\n\r\n")  # queued: nobody accepts yet, nothing refuses
        conn, _ = sock.accept()
        with conn:
            assert conn.recv(5) == b"GET /"


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


def test_serve_command_logs_each_request_and_serves_metrics(agree) -> None:
    """`serve --metrics`: /metrics answers, and each request is one line on stderr (uvicorn's
    own access log is off); scrapes are not logged at the default level."""
    import signal

    target, draft = agree
    proc = _serve([target, "--draft", draft, "--port", "0", "-t", "1", "--ctx", "512", "--metrics"])
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        base = line.split(" at ")[1].strip()
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=30)
        r = client.completions.create(model="x", prompt="abc", max_tokens=4, temperature=0)
        m = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=5)
        assert m.status_code == 200 and "\nlocalspec_completion_tokens_total 4.0\n" in m.text
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = [x for x in err.splitlines() if "/v1/completions" in x]
    assert len(lines) == 1, err
    want = f" INFO 127.0.0.1 POST /v1/completions 200 prompt_tokens={r.usage.prompt_tokens} "
    assert want + "completion_tokens=4 " in lines[0], lines[0]
    assert "/metrics" not in err


def test_auto_says_why_in_the_timings(models) -> None:
    """The statistics extension carries auto's reason, as Stats.auto gives it."""
    with localspec.load(models["target"], draft=models["draft"], **OPTS) as eng, running(eng) as u:
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=8)
        t = r.model_extra["timings"]
        want = eng.last_stats.auto
    assert t["mode"] == "auto" and want is not None
    assert t["auto"] == json.loads(json.dumps(want.as_dict()))
    assert t["auto"]["reason"].startswith("auto ")


def test_draft_source_per_request_and_per_source_timings(client, rec) -> None:
    """draft_source reaches the engine; timings.sources carries each source's drafted,
    accepted and tau, as Stats.sources gives them."""
    prompt = LETTERS  # the agreeing target repeats the alphabet: the context drafts it
    for source, want in (("ngram", {"ngram"}), ("none", set())):
        r = client.completions.create(
            model="x",
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            extra_body={"draft_source": source},
        )
        assert rec.log[-1]["kw"]["draft_source"] == source
        assert r.choices[0].text == LETTERS[:20]
        t = r.model_extra["timings"]
        assert set(t["sources"]) == want
        stats = rec.last_stats
        assert t["sources"] == {n: x.as_dict() for n, x in stats.sources.items()}
        if source == "ngram":
            ngram = t["sources"]["ngram"]
            assert ngram["accepted"] > 0 and ngram["tau"] > 1
            assert set(ngram) == {"steps", "drafted", "accepted", "tau", "acceptance_rate"}
        else:
            assert t["mode"] == "plain" and t["draft_n"] == 0
    # streamed: the last chunk's timings carry them too
    chunks = list(
        client.completions.create(
            model="x",
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            extra_body={"draft_source": "ngram"},
        )
    )
    assert chunks[-1].model_extra["timings"]["sources"]["ngram"]["accepted"] > 0
    # not given: the engine's own default, not sent at all
    client.completions.create(model="x", prompt="abc", max_tokens=2, temperature=0)
    assert "draft_source" not in rec.log[-1]["kw"]


def test_serve_draft_source_flag_sets_the_default(agree) -> None:
    """`serve --draft-source ngram`: requests that do not choose draft from the context only;
    `--no-draft` serves plain decoding (no drafter, no n-gram drafts)."""
    import signal

    target, draft = agree
    cases = ((["--draft", draft, "--draft-source", "ngram"], {"ngram"}), (["--no-draft"], set()))
    for flags, want in cases:
        proc = _serve([target, *flags, "--port", "0", "-t", "1", "--ctx", "512"])
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line.startswith("serving agree.gguf at http://127.0.0.1:"), line
            client = openai.OpenAI(
                base_url=line.split(" at ")[1].strip(), api_key="none", max_retries=0, timeout=30
            )
            r = client.completions.create(model="x", prompt=LETTERS, max_tokens=12, temperature=0)
            assert r.choices[0].text == LETTERS[:12]
            assert set(r.model_extra["timings"]["sources"]) == want, flags
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        source = "ngram" if want else "none"
        assert f"draft source {source}" in err


# --- conversations longer than the context (--context-overflow) -------------------------------

SMALL_CTX = 256


def long_chat(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "count letters"}]
    for i in range(turns):
        msgs += [
            {"role": "user", "content": f"turn {i}: abc"},
            {"role": "assistant", "content": "defghijklmnop"},
        ]
    return [*msgs, {"role": "user", "content": "abc"}]


@pytest.fixture(scope="module")
def small(agree) -> Iterator[localspec.Engine]:
    target, draft = agree
    with localspec.load(target, draft=draft, **{**OPTS, "n_ctx": SMALL_CTX}) as eng:
        yield eng


def test_rolling_answers_a_conversation_longer_than_the_context(small) -> None:
    from localspec.text.context_fit import count_tokens, fit_messages

    msgs = long_chat(30)
    assert count_tokens(small, msgs) > 3 * SMALL_CTX
    want = fit_messages(small, msgs, max_tokens=8)
    assert want.dropped_turns > 0
    report = {"context_overflow": "rolling", "dropped_turns": want.dropped_turns}
    with running(small) as u:  # rolling is the default
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == LETTERS[:8]
        assert r.usage.prompt_tokens == want.use.used  # the fitted conversation was sent
        assert r.model_extra["localspec"] == report
        chunks = list(
            client.chat.completions.create(
                model="x", messages=msgs, max_tokens=8, temperature=0, stream=True
            )
        )
        assert chunks[-1].model_extra["localspec"] == report  # beside the timings
        assert all("localspec" not in (c.model_extra or {}) for c in chunks[:-1])
        chunks = list(
            client.chat.completions.create(
                model="x",
                messages=msgs,
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].choices == [] and chunks[-1].model_extra["localspec"] == report
        # what fits is sent as it is, and says so
        short = client.chat.completions.create(model="x", messages=CHAT, max_tokens=4)
        assert short.model_extra["localspec"] == {"context_overflow": "rolling", "dropped_turns": 0}
        # a last message that cannot fit even alone is the usual 400
        huge = [{"role": "user", "content": "xy" * SMALL_CTX}]
        r2 = post(u, "/v1/chat/completions", {"messages": huge}, key=None)
        err = _error(r2)
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert "the system prompt and the last message alone take" in err["message"]
        assert f"the context holds {SMALL_CTX}" in err["message"]
        meta = client.models.list().data[0].model_extra["meta"]
        assert meta["context_overflow"] == "rolling"


def test_stop_refuses_a_conversation_longer_than_the_context_as_before(small) -> None:
    with running(small, context_overflow="stop") as u:
        r = post(u, "/v1/chat/completions", {"messages": long_chat(30), "max_tokens": 8}, key=None)
        err = _error(r)
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert err["message"].startswith("the prompt has ")
        assert err["message"].endswith(f"tokens; the context holds {SMALL_CTX}")
        ok = post(u, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}, key=None)
        assert ok.json()["localspec"] == {"context_overflow": "stop", "dropped_turns": 0}
    with pytest.raises(InvalidParameterError, match="one of rolling, stop"):
        create_app(small, context_overflow="drop")


def test_serve_context_overflow_flag(agree) -> None:
    import signal

    target, draft = agree
    proc = _serve(
        [
            target,
            "--no-draft",
            "--port",
            "0",
            "-t",
            "1",
            "--ctx",
            str(SMALL_CTX),
            "--context-overflow",
            "stop",
        ]
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        base = line.split(" at ")[1].strip()
        r = post(
            base.removesuffix("/v1"),
            "/v1/chat/completions",
            {"messages": long_chat(30), "max_tokens": 4},
            key=None,
        )
        assert _error(r)["code"] == "context_length_exceeded"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "context overflow stop" in err
