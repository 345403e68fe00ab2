"""The redaction rules of combee.redaction and the places that must apply them (issue 26, item 4): credentials in
a URL's query, a password with an unencoded ``@``, overlapping secrets, embeddings errors, metrics.json."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import openai
import pytest
from pydantic import SecretStr

from combee import redaction
from combee.cli.learn import metrics_document
from combee.embed_openai import OpenAIEmbedder
from combee.errors import LLMUnavailable
from combee.learner import LearnResult
from combee.meter import Meter
from combee.models import Playbook
from combee.redaction import endpoint_url, redact, redact_url
from combee.settings import Settings
from streams.redis_connection import RedisOptions

SECRET = "hunter2-secret"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://db:6379/0?password={SECRET}",
        f"redis://db:6379/0?db=1&password={SECRET}&x=1",
        f"https://api.example/v1?api_key={SECRET}",
        f"https://api.example/v1?access_token={SECRET}#top",
        f"redis://alice:p@ss@{SECRET}@db:6379/0",  # unencoded "@" in the password: all of it is masked
        f"redis://:{SECRET}@db:6379/0",
    ],
)
def test_query_credentials_and_passwords_with_an_at_sign_are_masked(url: str) -> None:
    assert SECRET not in redact(f"cannot connect to {url}: refused", [])
    assert SECRET not in redact_url(url)
    assert "db" in redact_url(url) or "api.example" in redact_url(url)  # the rest is kept
    assert SECRET not in endpoint_url(url)
    assert any(SECRET in s for s in redaction.url_secrets(url))


def test_a_password_with_an_at_sign_leaves_no_tail() -> None:
    assert redact_url("redis://alice:p@ss@db:6379/0") == "redis://alice:***@db:6379/0"
    assert redact("at redis://alice:p@ss@db:6379/0 now", []) == "at redis://alice:***@db:6379/0 now"


def test_ordinary_query_parameters_are_kept() -> None:
    assert redact_url("redis://db:6379/0?db=2&design=x") == "redis://db:6379/0?db=2&design=x"


def test_overlapping_secrets_are_replaced_longest_first() -> None:
    assert redact("token abcdef", ["abc", "abcdef"]) == "token ***"
    assert redact("token abcdef", ["abcdef", "abc"]) == "token ***"


def test_redis_options_list_a_query_password_as_a_secret() -> None:
    options = RedisOptions(url=f"redis://db:6379/0?password={SECRET}")
    assert SECRET in options.secrets()
    assert SECRET not in options.safe_url and SECRET not in repr(options)


class _FailingEmbeddings:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def create(self, **_: Any) -> Any:
        raise self.exc


class _Client:
    def __init__(self, exc: Exception) -> None:
        self.embeddings = _FailingEmbeddings(exc)


def _request(url: str) -> httpx2.Request:
    return httpx2.Request("POST", url)


@pytest.mark.parametrize("status", [401, None])
def test_embeddings_errors_carry_no_secret(status: int | None) -> None:
    base_url = f"http://bob:{SECRET}@emb.example/v1?api_key={SECRET}-q"
    quoted = f"key {SECRET}-key rejected at {base_url}"
    exc: Exception
    if status is None:
        exc = openai.APIConnectionError(message=quoted, request=_request("http://emb.example/v1/embeddings"))
    else:
        response = httpx2.Response(status, request=_request("http://emb.example/v1/embeddings"))
        exc = openai.AuthenticationError(quoted, response=response, body=None)
    embedder = OpenAIEmbedder(
        base_url,
        "m",
        SecretStr(f"{SECRET}-key"),
        max_attempts=1,
        client=_Client(exc),  # type: ignore[arg-type]
    )
    with pytest.raises(LLMUnavailable) as caught:
        asyncio.run(embedder.embed(["a text"]))
    assert SECRET not in str(caught.value)
    shown_chain = caught.value.__cause__ or (None if caught.value.__suppress_context__ else caught.value.__context__)
    assert shown_chain is None  # a traceback does not print the raw error either


def test_metrics_json_keeps_no_credentials_or_query_of_the_endpoint() -> None:
    settings = Settings(openai_base_url=f"http://bob:{SECRET}@llm.example:8000/v1?api_key={SECRET}")
    result = LearnResult(playbook=Playbook(namespace="ns"), iterations=[], meter=Meter(), wall_s=0.0)
    doc = metrics_document(result, method="combee", settings=settings)
    assert doc["endpoint"] == "http://llm.example:8000/v1"
