"""A scripted OpenAI-compatible chat server, for tests and benchmarks that need no model.

A Python function decides every reply (text, reported completion tokens, HTTP status, delay), so
a test can play a planner and a worker whose correctness and token spend are known exactly. The
server runs on 127.0.0.1 in its own thread and event loop, so synchronous and asynchronous callers
alike can use it, and its delays (asyncio.sleep) cost no CPU.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class ScriptedReply:
    text: str
    completion_tokens: int
    status: int = 200
    delay: float = 0.0


Responder = Callable[[str, list[dict[str, Any]]], ScriptedReply]


class ScriptedOpenAIServer:
    """`/v1/chat/completions` answered by `responder(model, messages)`; `/v1/models` from `models`.

    `models` are model cards, e.g. [{"id": "base"}, {"id": "lora", "parent": "base"}] (vLLM's
    shape). `requests` records every chat request body; `max_in_flight` the peak concurrency.
    """

    def __init__(self, responder: Responder, models: list[dict[str, Any]] | None = None) -> None:
        self.responder = responder
        self.models = models or [{"id": "scripted"}]
        self.requests: list[dict[str, Any]] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _serve(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._list_models)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return self._runner.addresses[0][1]

    async def _list_models(self, _: web.Request) -> web.Response:
        cards = [{"object": "model", "owned_by": "scripted", **card} for card in self.models]
        return web.json_response({"object": "list", "data": cards})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            reply = self.responder(body["model"], body["messages"])
            await asyncio.sleep(reply.delay)
        finally:
            self._in_flight -= 1
        if reply.status != 200:
            return web.json_response({"error": {"message": reply.text}}, status=reply.status)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": prompt_tokens + reply.completion_tokens,
                },
            }
        )
