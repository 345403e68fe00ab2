"""The endpoint configuration of the OpenAI-compatible client (``combee.llm_openai.config``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from combee.llm import Role, Usage
from combee.llm_openai import DEFAULT_API_KEY, EndpointConfig


def test_config_defaults_and_env_style_construction() -> None:
    config = EndpointConfig(base_url=" http://127.0.0.1:8080/v1 ", api_key="", default_model="gemma")
    assert config.base_url == "http://127.0.0.1:8080/v1"
    assert config.api_key.get_secret_value() == DEFAULT_API_KEY
    assert EndpointConfig(base_url="https://x.test/v1", api_key=None, default_model="m").api_key == SecretStr(
        DEFAULT_API_KEY
    )
    padded = EndpointConfig(base_url="https://x.test/v1", api_key="k\n", default_model="m")
    assert padded.api_key == SecretStr("k")
    assert config.structured_output == "auto"
    assert (config.max_concurrency, config.timeout_s, config.max_attempts) == (64, 120, 6)
    assert (config.backoff_base_s, config.backoff_max_s) == (0.5, 30)
    assert config.cache_dir is None and config.cost_usd(Usage(prompt_tokens=5)) is None
    assert config.model_for(Role.CURATOR) == "gemma"
    with pytest.raises(ValidationError):
        config.max_attempts = 3  # type: ignore[misc]


def test_config_display_url_hides_credentials() -> None:
    config = EndpointConfig(base_url="https://user:pw@host.test:8443/v1?token=abc", default_model="m")
    assert config.display_url == "https://host.test:8443/v1"
    assert "pw" not in json.dumps(config.display_url)


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"base_url": "127.0.0.1:8080/v1"}, "base_url"),
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"default_model": "  "}, "default_model"),
        ({"models": {"reflector": ""}}, "models"),
        ({"models": {"planner": "m"}}, "models"),
        ({"structured_output": "xml"}, "structured_output"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_base_s": 5, "backoff_max_s": 1}, "backoff_max_s"),
        ({"price_per_1k_prompt": -1}, "price_per_1k_prompt"),
        ({"max_retries": 3}, "max_retries"),
    ],
)
def test_config_validation_errors_name_the_field(overrides: dict[str, Any], field_name: str) -> None:
    values: dict[str, Any] = {"base_url": "http://127.0.0.1:8080/v1", "default_model": "m"}
    values.update(overrides)
    with pytest.raises(ValidationError) as caught:
        EndpointConfig(**values)
    assert field_name in str(caught.value)
