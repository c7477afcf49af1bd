"""An OpenAI-compatible front door on the frontend: /v1/completions, /v1/chat/completions
(streamed as server-sent events, or whole), /v1/models. Standard clients and benchmark tools
can then drive the emulated system; each response's last chunk carries the emulator's record of
the request (`pddemu`), which clients ignore (its WAN bytes leave out a transfer still in flight
when the stream ends; `pddemu emulate` waits for those). A streamed response's record also says
when the door received the request and wrote its first chunk (`door`, in seconds of
CLOCK_MONOTONIC, the clock every process of the host shares and benchmark clients time with):
a client's TTFT contains that interval (`door.ttft_s`, the TTFT the request was served), which
contains the emulator's TTFT, request by request.
With `stream_options.include_usage` a last chunk carries the token counts, as benchmark clients
expect. A request the emulator fails ends as an OpenAI error: status 500 when whole; when
streamed, an `error` event and a cut connection (`_fail_stream`). A completion's prompt may be
token ids (`prompt: [int, ...]`), taken as they are.

Timing, by construction: a request's modelled arrival is the instant the door received it (not
when its body was parsed), and each chunk is written at its token's modelled delivery time: held
until then if it is ready earlier, written at once if not. A chunk written more than
`LATE_WRITE_S` after its token's time is a late write: the host could not keep the modelled time
(the record keeps the modelled time; the client sees the delay). Late writes are counted in the
request's `door` record and in the door's totals (the frontend's stats, `pddemu serve`'s last
line). For the first token the record says by how much (`first_token_late_s`) and how much of it
its instance sent the token late (`first_token_sent_late_s`: in real time a step whose genuine
work outlasts its modelled length dates its tokens at its modelled end and sends them when done),
so the served TTFT is the modelled one plus what the record names.

Decoding is greedy (the model's weights are random, sampling parameters would change nothing
worth measuring); `temperature`, `top_p` and the like are accepted and ignored. Prompts are
byte-tokenized; with a token scale above 1 each genuine token stands for several modelled ones
(`pddemu serve` uses token scale 1); a prompt over `[serve] max_prompt_tokens` is refused with
OpenAI's `context_length_exceeded` rather than risking the machine's memory.

At most `[serve] max_concurrent_requests` requests are held at once; one more is refused with
status 429 and `Retry-After` (OpenAI clients retry it). A client that goes away (its connection
closes) gives its request up: it fails as cancelled and frees what it holds in the system.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from pddemu.metrics.distribution import percentile
from pddemu.metrics.reservoir import Reservoir
from pddemu.model import ByteTokenizer
from pddemu.roles.client_gone import client_gone_abandons

MODEL_NAME = "pddemu"
MAX_TOKENS_LIMIT = 65536
RETRY_AFTER_S = 1  # what a refused client is told to wait before trying again
# A chunk written this much (modelled seconds) after its token's time is late: beyond the event
# loop's timer grain (a millisecond), so a chunk held for its time is not counted late.
LATE_WRITE_S = 0.002


class RequestError(Exception):
    """A malformed request: becomes an OpenAI-style error body."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def _error_body(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    message: str, status: int, param: str | None = None, code: str | None = None
) -> web.Response:
    return web.json_response(_error_body(message, status, param, code), status=status)


class OpenAIFrontDoor:
    def __init__(self, frontend: Any) -> None:
        self.frontend = frontend
        self.tokenizer = ByteTokenizer(frontend.model_config.vocab_size)
        self.held = 0  # requests admitted here that the system has not released yet
        self.timing = WriteTiming()  # every streamed chunk's write against its token's time
        self.completed = 0  # requests served here to their end
        # theirs: the scale of the lag bound serve judges by (a bounded sample: serve has no end)
        self.tpots_s = Reservoir(seed="door:tpot")
        self.ttfts_s = Reservoir(seed="door:ttft")  # the records' TTFTs, beside a client's
        self.served_ttfts_s = Reservoir(seed="door:served_ttft")  # streamed ones, as served

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": MODEL_NAME,
                        "object": "model",
                        "created": 0,
                        "owned_by": "pddemu",
                        "root": MODEL_NAME,  # vLLM's benchmark reads it
                    },
                ],
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def stats(self) -> dict[str, Any]:
        tpot = percentile(self.tpots_s, 50) if self.tpots_s else None
        ttft = {
            f"{name}_p{q}_s": percentile(values, q) if values else None
            for name, values in (("ttft", self.ttfts_s), ("served_ttft", self.served_ttfts_s))
            for q in (50, 90)
        }
        return {**self.timing.as_dict(), "completed": self.completed, "tpot_p50_s": tpot, **ttft}

    def _completed(self, record: Any) -> None:
        self.completed += 1
        if record.tpot_s:
            self.tpots_s.append(record.tpot_s)
        if record.ttft_s is not None:
            self.ttfts_s.append(record.ttft_s)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = time.monotonic()
        arrival = self.frontend.clock.now()  # the request's modelled zero: the door's receipt
        try:
            body = await self._body(request)
            ids = self._chat_prompt_ids(body) if chat else self._prompt_ids(body)
            max_tokens = self._max_tokens(body, chat)
            stream = _given(body, "stream", False)
            if not isinstance(stream, bool):
                raise RequestError("'stream' must be a boolean", "stream")
            include_usage = self._include_usage(body, stream)
            if _given(body, "n", 1) != 1:
                raise RequestError("only n=1 is supported", "n")
            session = _given(body, "user", None)
            if session is not None and not isinstance(session, str):
                raise RequestError("'user' must be a string", "user")
        except RequestError as error:
            return error_response(str(error), error.status, error.param, error.code)
        scale = self.frontend.config.scale.token_scale
        limit = self.frontend.config.serve.max_prompt_tokens
        if len(ids) > limit:
            return error_response(
                f"the prompt is {len(ids)} tokens; this server takes at most {limit}",
                400,
                "messages" if chat else "prompt",
                "context_length_exceeded",
            )
        if self.held >= self.frontend.config.serve.max_concurrent_requests:
            return web.json_response(
                _error_body(
                    f"this server holds at most {self.held} requests at once; retry later",
                    429,
                    code="rate_limit_exceeded",
                ),
                status=429,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            flight = self.frontend.admit(
                {
                    "rid": rid,
                    "prompt_ids": ids,
                    "input_tokens": len(ids) * scale,
                    "output_tokens": max_tokens,
                    "session": session,
                },
                arrival,
            )
        except ValueError as error:
            return error_response(str(error), 400)
        self.held += 1
        served = self.frontend.spawn(self.frontend.serve_flight(flight), f"request {rid}")
        served.add_done_callback(self._released)
        with client_gone_abandons(flight):
            if stream:
                return await self._stream(request, flight, rid, chat, include_usage, received)
            return await self._whole(flight, rid, chat)

    def _released(self, _served: Any) -> None:
        self.held -= 1

    def _include_usage(self, body: dict[str, Any], stream: bool) -> bool:
        options = _given(body, "stream_options", None)
        if options is None:
            return False
        if not stream:
            raise RequestError(
                "'stream_options' is only allowed with stream: true", "stream_options"
            )
        include_usage = (
            _given(options, "include_usage", False) if isinstance(options, dict) else None
        )
        if not isinstance(include_usage, bool):
            raise RequestError(
                "'stream_options' must be an object with a boolean 'include_usage'",
                "stream_options",
            )
        return include_usage

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

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """A text prompt's tokens (BOS first), or a token-id prompt's ids as given."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and prompt and all(_is_int(i) for i in prompt):
            if not all(0 <= i < self.tokenizer.vocab_size for i in prompt):
                raise RequestError(
                    f"token ids must be in [0, {self.tokenizer.vocab_size})", "prompt"
                )
            return list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(
                "'prompt' must be a non-empty string or array of token ids", "prompt"
            )
        return self.tokenizer.encode(prompt)

    def _chat_prompt_ids(self, body: dict[str, Any]) -> list[int]:
        return self.tokenizer.encode(self._chat_prompt(body))

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
            content = _given(message, "content", "")  # an assistant turn may have none
            if isinstance(content, list):
                content = "".join(
                    self._text_part(part, f"messages[{i}].content[{j}]")
                    for j, part in enumerate(content)
                )
            if not isinstance(content, str):
                raise RequestError(
                    f"messages[{i}].content must be a string", f"messages[{i}].content"
                )
            lines.append(f"{message['role']}: {content}")
        return "\n".join(lines) + "\nassistant:"

    def _text_part(self, part: Any, where: str) -> str:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise RequestError(
                f"{where} must be a text part (images and audio are not supported)", where
            )
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.text must be a string", f"{where}.text")
        return part["text"]

    def _max_tokens(self, body: dict[str, Any], chat: bool) -> int:
        chosen = chat and _given(body, "max_completion_tokens", None) is not None
        key = "max_completion_tokens" if chosen else "max_tokens"
        value = _given(body, key, 16 if not chat else 64)
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
        self,
        request: web.Request,
        flight: Any,
        rid: str,
        chat: bool,
        include_usage: bool,
        received: float,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        decoder = self.tokenizer.stream_decoder()
        door: dict[str, Any] = {
            "received_s": received,
            "first_chunk_s": None,
            "ttft_s": None,
            "first_token_late_s": None,
            "first_token_sent_late_s": None,
            "late_writes": 0,
            "max_late_s": 0.0,
        }
        sent = 0
        while (item := await flight.stream.get()) is not None:
            chunk = self._chunk(rid, chat, decoder.push([item["id"]]), None, sent == 0)
            event = _event(chunk, include_usage)
            late = await self.frontend.clock.sleep_until(item["time"])  # held until its time
            if sent == 0:
                self._first_written(door, flight, item["time"])
            await response.write(event)
            self.timing.wrote(door, late)
            sent += 1
        record = {**flight.record.to_dict(), "door": door}
        if flight.record.state != "completed":
            await _fail_stream(request, response, flight.record.failure_reason, record)
            return response
        self._completed(flight.record)
        if door["ttft_s"] is not None:
            self.served_ttfts_s.append(door["ttft_s"])
        last = self._chunk(rid, chat, decoder.finish(), "length")
        await _send_event(response, {**last, "pddemu": record}, include_usage)
        if include_usage:
            usage = {**last, "choices": [], "usage": _usage(len(flight.prompt), sent)}
            await _send_event(response, usage, False)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _first_written(self, door: dict[str, Any], flight: Any, token_time: float) -> None:
        """The request's first chunk, encoded, is about to be handed to the kernel: no client
        can read it sooner (a stamp after the write can be later than a client's read, which
        may run on the other core meanwhile). Its record then says what the client was served beside what was modelled: the door's
        TTFT (`ttft_s`, wall seconds from the door's receipt), and how much later than the
        record's first-token time the chunk went out (`first_token_late_s`, modelled seconds),
        of which its instance sent the token late (`first_token_sent_late_s`: a step's genuine
        work outlasting its modelled length where nothing holds the clock, `pddemu serve`);
        the rest is the frontend's, reading the token and writing its chunk."""
        door["first_chunk_s"] = time.monotonic()
        door["first_token_late_s"] = max(0.0, self.frontend.clock.now() - token_time)
        door["ttft_s"] = door["first_chunk_s"] - door["received_s"]
        door["first_token_sent_late_s"] = flight.first_token_sent_late_s

    async def _whole(self, flight: Any, rid: str, chat: bool) -> web.Response:
        ids = []
        while (item := await flight.stream.get()) is not None:
            ids.append(item["id"])
        record = flight.record
        if record.state != "completed":
            failure = _error_body(f"the request failed: {record.failure_reason}", 500)
            return web.json_response(
                {**failure, "pddemu": record.to_dict()},
                status=500,
                headers={"x-should-retry": "false"},  # a retry would add load to an overload
            )
        self._completed(record)
        text = self.tokenizer.decode(ids)
        finish = "length"
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
        usage = _usage(len(flight.prompt), len(ids))
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


class WriteTiming:
    """The door's streamed chunks against their tokens' modelled times: how many were written,
    how many late (`LATE_WRITE_S`), by how much at most and in total (modelled seconds)."""

    def __init__(self) -> None:
        self.written = 0
        self.late = 0
        self.late_total_s = 0.0
        self.max_late_s = 0.0

    def wrote(self, door: dict[str, Any], late: float) -> None:
        """A chunk is written `late` seconds after its token's time (0 if on time); `door` is
        its request's record."""
        self.written += 1
        self.max_late_s = max(self.max_late_s, late)
        door["max_late_s"] = max(door["max_late_s"], late)
        if late > LATE_WRITE_S:
            self.late += 1
            self.late_total_s += late
            door["late_writes"] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "chunks_written": self.written,
            "late_writes": self.late,
            "late_after_s": LATE_WRITE_S,
            "late_total_s": self.late_total_s,
            "max_late_s": self.max_late_s,
        }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _given(body: dict[str, Any], key: str, default: Any) -> Any:
    """A field's value, with JSON null meaning "not given" (as OpenAI's API treats it)."""
    value = body.get(key)
    return default if value is None else value


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _fail_stream(
    request: web.Request, response: web.StreamResponse, reason: str | None, record: dict[str, Any]
) -> None:
    """End a stream that failed midway so every client counts a failure: an SSE `error` event
    (the `openai` client raises it; AIPerf reads `event: error` and its comment), then the
    connection cut before the chunked body's end (vLLM's benchmark and any HTTP client see an
    incomplete response rather than a clean end)."""
    message = f"the request failed: {reason}"
    data = json.dumps({**_error_body(message, 500), "pddemu": record})
    comment = message.replace("\n", " ").replace("\r", " ")
    await response.write(f"event: error\n: {comment}\ndata: {data}\n\n".encode())
    if request.transport is not None:
        request.transport.close()


def _event(data: dict[str, Any], usage_field: bool) -> bytes:
    """One server-sent event; with include_usage every chunk says `usage: null` until the last."""
    if usage_field:
        data = {**data, "usage": None}
    return f"data: {json.dumps(data)}\n\n".encode()


async def _send_event(
    response: web.StreamResponse, data: dict[str, Any], usage_field: bool
) -> None:
    await response.write(_event(data, usage_field))
