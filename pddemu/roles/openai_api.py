"""An OpenAI-compatible front door on the frontend: /v1/completions, /v1/chat/completions
(streamed as server-sent events, or whole), /v1/models. Standard clients and benchmark tools
can then drive the emulated system; each response's last chunk carries the emulator's record of
the request (`pddemu`), which clients ignore (its WAN bytes leave out a transfer still in flight
when the stream ends; `pddemu emulate` waits for those).

Decoding is greedy (the model's weights are random, sampling parameters would change nothing
worth measuring); `temperature`, `top_p` and the like are accepted and ignored. Prompts are
byte-tokenized; with a token scale above 1 each genuine token stands for several modelled ones
(`pddemu serve` uses token scale 1).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from pddemu.model import ByteTokenizer

MODEL_NAME = "pddemu"
MAX_TOKENS_LIMIT = 65536


class RequestError(Exception):
    """A malformed request: becomes an OpenAI-style error body."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def error_response(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> web.Response:
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
        status, "invalid_request_error"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


class OpenAIFrontDoor:
    def __init__(self, frontend: Any) -> None:
        self.frontend = frontend
        self.tokenizer = ByteTokenizer(frontend.model_config.vocab_size)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "pddemu"},
                ],
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt = self._chat_prompt(body) if chat else self._prompt(body)
            max_tokens = self._max_tokens(body, chat)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError("'stream' must be a boolean", "stream")
            if body.get("n", 1) != 1:
                raise RequestError("only n=1 is supported", "n")
        except RequestError as error:
            return error_response(str(error), error.status, error.param, error.code)
        scale = self.frontend.config.scale.token_scale
        ids = self.tokenizer.encode(prompt)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            flight = self.frontend.admit(
                {
                    "rid": rid,
                    "prompt_ids": ids,
                    "input_tokens": len(ids) * scale,
                    "output_tokens": max_tokens,
                    "session": body.get("user"),
                }
            )
        except ValueError as error:
            return error_response(str(error), 400)
        self.frontend.spawn(self.frontend.serve_flight(flight), f"request {rid}")
        if stream:
            return await self._stream(request, flight, rid, chat)
        return await self._whole(flight, rid, chat)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("'model' is required and must be a string", "model")
        if model != MODEL_NAME:
            raise RequestError(
                f"The model '{model}' does not exist; this server has '{MODEL_NAME}'",
                "model",
                404,
                "model_not_found",
            )
        return body

    def _prompt(self, body: dict[str, Any]) -> str:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("'prompt' must be a non-empty string", "prompt")
        return prompt

    def _chat_prompt(self, body: dict[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty array", "messages")
        lines = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(
                    f"messages[{i}] must be an object with a 'role'", f"messages[{i}]"
                )
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise RequestError(
                    f"messages[{i}].content must be a string", f"messages[{i}].content"
                )
            lines.append(f"{message['role']}: {content}")
        return "\n".join(lines) + "\nassistant:"

    def _max_tokens(self, body: dict[str, Any], chat: bool) -> int:
        key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        value = body.get(key, 16 if not chat else 64)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= MAX_TOKENS_LIMIT
        ):
            raise RequestError(f"'{key}' must be an integer from 1 to {MAX_TOKENS_LIMIT}", key)
        return value

    def _chunk(
        self, rid: str, chat: bool, text: str | None, finish: str | None, first: bool = False
    ) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [choice],
        }

    async def _stream(
        self, request: web.Request, flight: Any, rid: str, chat: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        decoder = self.tokenizer.stream_decoder()
        first = True
        while (item := await flight.stream.get()) is not None:
            chunk = self._chunk(rid, chat, decoder.push([item["id"]]), None, first)
            first = False
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = self._chunk(rid, chat, decoder.finish(), self._finish_reason(flight))
        last["pddemu"] = flight.record.to_dict()
        await response.write(f"data: {json.dumps(last)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _whole(self, flight: Any, rid: str, chat: bool) -> web.Response:
        ids = []
        while (item := await flight.stream.get()) is not None:
            ids.append(item["id"])
        text = self.tokenizer.decode(ids)
        finish = self._finish_reason(flight)
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        record = flight.record
        usage = {
            "prompt_tokens": len(flight.prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(flight.prompt) + len(ids),
        }
        return web.json_response(
            {
                "id": rid,
                "object": kind,
                "created": int(time.time()),
                "model": MODEL_NAME,
                "choices": [choice],
                "usage": usage,
                "pddemu": record.to_dict(),
            }
        )

    def _finish_reason(self, flight: Any) -> str:
        return "length" if flight.record.state == "completed" else "error"
