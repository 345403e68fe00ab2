"""An in-process SIMULATED model: the world model behind the :class:`combee.llm.LLM` port, without HTTP.

For fast tests and calibration only. Answers are identical to the HTTP simulator's for the same seed
(both seed each request's rng from the same canonical body), and every response is labelled simulated.
Latency is *virtual*: the modelled service time is reported, never slept, unless ``sleep`` is true.

It injects no faults of its own; given the HTTP server's log of malformed-content faults (``malformed``, from
``GET /admin/malformed``) it gives those requests the same malformed answers, so a replay of a faulty run takes
the same repair turns and ends with the same answers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from combee.llm import ChatRequest, ChatResponse, Usage
from combee.sim.faults import malformed_again
from combee.sim.generic import generic_answer, truncate_answer, within_contract
from combee.sim.protocol import Responder, SimRequest, request_digest
from combee.tokens import estimate_tokens

__all__ = ["InProcessSim", "request_rng"]


def request_rng(seed: int, body: dict[str, Any]) -> random.Random:
    """The rng of a request's answer: seeded from its digest, as the HTTP server seeds it."""
    return random.Random(int.from_bytes(request_digest(seed, body)[:8], "big"))


class InProcessSim:
    """LLM port implementation backed directly by a responder (SIMULATED)."""

    def __init__(
        self,
        responder: Responder,
        *,
        seed: int = 0,
        model: str = "combee-sim",
        ttft_s: float = 0.4,
        prefill_s_per_token: float = 0.0002,
        decode_tokens_per_s: float = 60.0,
        time_scale: float = 1.0,
        sleep: bool = False,
        malformed: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.responder = responder
        self.seed = seed
        self.model = model
        self.ttft_s = ttft_s
        self.prefill = prefill_s_per_token
        self.decode = decode_tokens_per_s
        self.time_scale = time_scale
        self.sleep = sleep
        self.calls = 0
        # digest hex -> the server's request counters of its malformed answers, consumed in order
        self.malformed = {d: list(counters) for d, counters in (malformed or {}).items()}

    def body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                # the same body the OpenAI adapter sends, so in-process and HTTP answers are identical
                "json_schema": {
                    "name": request.schema_name or "answer",
                    "schema": dict(request.json_schema),
                    "strict": True,
                },
            }
        if request.seed is not None:
            body["seed"] = request.seed
        return body

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls += 1
        body = self.body(request)
        digest = request_digest(self.seed, body)
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        sim_request = SimRequest(
            model=self.model,
            messages=body["messages"],
            response_format=body.get("response_format"),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
        )
        # The request's contract before the world model, as the HTTP server does (combee.sim.generic).
        said = self.responder.respond(sim_request, rng)
        answer = within_contract(sim_request, said, rng) if said is not None else None
        if answer is None:
            answer = generic_answer(sim_request, rng)
        finish_reason = None
        counters = self.malformed.get(digest.hex())
        if counters:  # the server malformed this request's answer: the same content, then its truncation
            answer = truncate_answer(malformed_again(answer, digest, counters.pop(0)), request.max_tokens)
            finish_reason = answer.finish_reason
        text = answer.completion_text
        prompt_tokens = sum(estimate_tokens(m.content) + 4 for m in request.messages)
        completion_tokens = estimate_tokens(text)
        jitter = rng.lognormvariate(0.0, 0.1)
        service = (self.ttft_s + prompt_tokens * self.prefill + completion_tokens / self.decode) * jitter
        service *= self.time_scale
        if self.sleep and service > 0:
            await asyncio.sleep(service)
        return ChatResponse(
            text=text,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            model=self.model,
            service_time_s=service,
            simulated=True,
            finish_reason=finish_reason,
        )
