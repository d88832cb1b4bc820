"""The OpenAI HTTP API over a Batcher (Starlette on uvicorn).

This layer only translates: JSON requests into token ids and SamplingParams, the Batcher's
token events into OpenAI responses (whole or as server-sent events), engine errors into
OpenAI's error shape. Scheduling, caches and sampling live in engine/runtime/batcher.py.

    GET  /v1/models             the one model served
    POST /v1/completions        prompt -> text
    POST /v1/chat/completions   messages -> the model's chat template -> text
    GET  /health                liveness and load
    GET  /metrics               Prometheus text format
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from core.errors import UserError, as_flags
from engine.runtime.batcher import Batcher, QueueFull, SamplingParams
from engine.loading.tokenizer import StopText

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class APIError(Exception):
    def __init__(self, status: int, message: str, param=None, code=None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = \
            status, message, param, code, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status,
                            headers={"Retry-After": "1"} if self.status == 429 else None)


# ---- request fields --------------------------------------------------------------------------
_MISSING = object()


def _field(body: dict, name: str, types, default=_MISSING, what: str = ""):
    """body[name] if of `types` (bool is not a number here), else a 400 naming the field."""
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise APIError(400, f"'{name}' is required", name, "missing_required_parameter")
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise APIError(400, f"'{name}' must be {what}, got {json.dumps(value)[:60]}", name,
                       "invalid_type")
    return value


def _number(body, name, default, lo, hi, what):
    value = _field(body, name, (int, float), default, what)
    if not lo <= value <= hi:
        raise APIError(400, f"'{name}' must be {what}, got {value}", name, "invalid_value")
    return float(value)


def _int(body, name, default, lo, what):
    value = _field(body, name, (int,), default, what)
    if value is not None and value < lo:
        raise APIError(400, f"'{name}' must be {what}, got {value}", name, "invalid_value")
    return value


def sampling_params(body: dict, default_max_tokens: int, max_tokens_name="max_tokens"):
    max_tokens = _int(body, max_tokens_name, default_max_tokens, 1, "an integer >= 1")
    if body.get("n", 1) != 1:
        raise APIError(400, "only n=1 is supported: send one request per choice", "n",
                       "invalid_value")
    unsupported = [k for k in ("logprobs", "top_logprobs", "echo", "suffix", "tools",
                               "functions", "logit_bias") if body.get(k) not in (None, False, 0)]
    if body.get("best_of") not in (None, 1):
        unsupported.append("best_of")
    if unsupported:
        raise APIError(400, f"'{unsupported[0]}' is not supported by this server",
                       unsupported[0], "unsupported_parameter")
    top_k = _int(body, "top_k", None, -1, "an integer >= 1 (or -1: off)")
    seed = _int(body, "seed", None, -(2**63), "an integer")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0, "a number in [0, 2]"),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0, "a number in (0, 1]"),
        top_k=None if top_k in (None, -1, 0) else top_k,
        seed=None if seed is None else seed % 2**63)


def stop_strings(body: dict) -> list:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise APIError(400, "'stop' must be a string or a list of up to 4 strings", "stop",
                       "invalid_type")
    return stop


def chat_messages(body: dict) -> list:
    messages = _field(body, "messages", (list,), what="a list of messages")
    if not messages:
        raise APIError(400, "'messages' is empty", "messages", "invalid_value")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"{where} must be an object with a 'role'", where, "invalid_type")
        if m["role"] not in ("system", "developer", "user", "assistant"):
            raise APIError(400, f"{where}: role {m['role']!r} is not supported (system, user, "
                                f"assistant)", where, "invalid_value")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and
                       isinstance(p.get("text"), str) for p in content):
                raise APIError(400, f"{where}: only text content parts are supported", where,
                               "invalid_value")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"{where}: 'content' must be a string or text parts", where,
                           "invalid_type")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


# ---- response shapes -------------------------------------------------------------------------
class CompletionShape:
    """/v1/completions objects: chunks of a stream, its last objects, the whole response."""
    prefix, obj, chunk_obj = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, include_usage: bool):
        self.id, self.created = f"{self.prefix}-{uuid.uuid4().hex[:24]}", int(time.time())
        self.model, self.include_usage = model, include_usage

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, text, reason) -> dict:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

    def chunk(self, text: str, reason=None) -> dict:
        return dict(self.head(self.chunk_obj), choices=[self.choice(text, reason)])

    def final(self, reason: str, usage: dict) -> list:
        """The stream's last objects: the finish reason, then usage if asked for."""
        last = [self.chunk(None, reason)]
        if self.include_usage:
            last.append(dict(self.head(self.chunk_obj), choices=[], usage=usage))
        return last

    def whole(self, text: str, reason: str, usage: dict) -> dict:
        return dict(self.head(self.obj), choices=[self.choice(text, reason)], usage=usage)


class ChatShape(CompletionShape):
    prefix, obj, chunk_obj = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str, include_usage: bool):
        super().__init__(model, include_usage)
        self.sent_role = False

    def chunk(self, text, reason=None) -> dict:
        delta = {} if text is None else {"content": text}
        if not self.sent_role:  # the first delta names the role
            delta, self.sent_role = {"role": "assistant", **delta}, True
        return dict(self.head(self.chunk_obj), choices=[
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}])

    def whole(self, text: str, reason: str, usage: dict) -> dict:
        return dict(self.head(self.obj), choices=[
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": reason}], usage=usage)


# ---- the app ---------------------------------------------------------------------------------
def create_app(batcher: Batcher, tokenizer, model_name: str,
               default_max_tokens: int = 256) -> Starlette:
    """default_max_tokens: a chat request's limit when it sets none."""
    started = int(time.time())

    async def read_json(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        model = _field(body, "model", (str,), what="a string")
        if model != model_name:
            raise APIError(404, f"the model '{model}' does not exist; this server serves "
                                f"'{model_name}' (GET /v1/models)", "model", "model_not_found")
        return body

    def submit(prompt: list, params: SamplingParams, events: asyncio.Queue, param: str):
        loop = asyncio.get_running_loop()

        def listener(kind, value):
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))
        try:
            return batcher.submit(prompt, params, tokenizer.eos_ids, listener)
        except QueueFull as e:
            raise APIError(429, str(e), None, "rate_limit_exceeded", "rate_limit_error") from None
        except UserError as e:
            code = "context_length_exceeded" if prompt else "invalid_value"
            raise APIError(400, as_flags(str(e)), param, code) from None

    async def generate(http: Request, prompt: list, params: SamplingParams, stop: list,
                       stream: bool, param: str, shape):
        """Run one request. shape.chunk(text), shape.final(reason, usage) (the stream's last
        objects) and shape.whole(text, reason, usage) give the endpoint's JSON."""
        events: asyncio.Queue = asyncio.Queue()
        job = submit(prompt, params, events, param)
        text = StopText(tokenizer, stop, tokenizer.eos_ids)

        def usage():
            return {"prompt_tokens": len(prompt), "completion_tokens": len(job.tokens),
                    "total_tokens": len(prompt) + len(job.tokens),
                    "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

        async def pieces():
            """(text, None) as it comes, then (text, finish_reason) once."""
            while True:
                kind, value = await events.get()
                if kind == "token":
                    piece = text.add(value)
                    if text.stopped:  # a stop string: the rest is not wanted
                        batcher.cancel(job)
                        yield piece, "stop"
                        return
                    if piece:
                        yield piece, None
                elif value == "error":
                    raise APIError(500, f"generation failed: {job.error}", None,
                                   "engine_error", "server_error")
                else:
                    yield text.flush(), "length" if value == "length" else "stop"
                    return

        if stream:
            async def sse():
                try:
                    async for piece, reason in pieces():
                        if piece:
                            yield f"data: {json.dumps(shape.chunk(piece))}\n\n"
                        if reason is not None:
                            for obj in shape.final(reason, usage()):
                                yield f"data: {json.dumps(obj)}\n\n"
                    yield "data: [DONE]\n\n"
                except APIError as e:
                    yield f"data: {e.response().body.decode()}\n\n"
                finally:  # the stream ended, or the client went away: free the row
                    if job.finish_reason is None:
                        batcher.cancel(job)
            return StreamingResponse(sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        async def watch():  # a client that hangs up cancels its request
            while not await http.is_disconnected():
                await asyncio.sleep(0.25)
            batcher.cancel(job)
        watcher = asyncio.create_task(watch())
        out, reason = [], "stop"
        try:
            async for piece, reason in pieces():
                out.append(piece)
        finally:
            watcher.cancel()
            if job.finish_reason is None:
                batcher.cancel(job)
        return JSONResponse(shape.whole("".join(out), reason, usage()))

    async def completions(http: Request):
        body = await read_json(http)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            prompt_ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            V = batcher.model.args.vocab_size
            if not all(0 <= t < V for t in prompt):
                raise APIError(400, f"'prompt' token ids must be in [0, {V})", "prompt",
                               "invalid_value")
            prompt_ids = list(prompt)
        elif prompt is None:
            raise APIError(400, "'prompt' is required", "prompt", "missing_required_parameter")
        else:
            raise APIError(400, "'prompt' must be a string or a list of token ids (one prompt "
                                "per request)", "prompt", "invalid_type")
        params = sampling_params(body, COMPLETION_MAX_TOKENS)
        stream = _field(body, "stream", (bool,), False, "true or false")
        return await generate(http, prompt_ids, params, stop_strings(body), stream, "prompt",
                              CompletionShape(model_name, stream_usage(body)))

    async def chat_completions(http: Request):
        body = await read_json(http)
        messages = chat_messages(body)
        max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
            else "max_tokens"
        params = sampling_params(body, default_max_tokens, max_name)
        stream = _field(body, "stream", (bool,), False, "true or false")
        try:
            prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), bos=False)
        except UserError as e:
            raise APIError(400, str(e), "messages", "invalid_value") from None
        return await generate(http, prompt_ids, params, stop_strings(body), stream, "messages",
                              ChatShape(model_name, stream_usage(body)))

    def stream_usage(body) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    async def models(_):
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": started, "owned_by": "regionkv"}]})

    async def health(_):
        return JSONResponse({"status": "ok", "slots": batcher.slots, "active": batcher.active,
                             "queued": batcher.queued})

    async def metrics(_):
        return PlainTextResponse(metrics_text(batcher),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def on_api_error(_, exc: APIError):
        return exc.response()

    async def on_http_error(_, exc: HTTPException):
        return APIError(exc.status_code, exc.detail or "not found").response()

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={APIError: on_api_error, HTTPException: on_http_error})


METRICS = [  # (name, type, help, value of batcher)
    ("requests_total", "counter", "requests accepted", lambda b: b.stats["requests"]),
    ("rejected_total", "counter", "requests refused with 429 (queue full)",
     lambda b: b.stats["rejected"]),
    ("prompt_tokens_total", "counter", "prompt tokens of admitted requests",
     lambda b: b.stats["prompt_tokens"]),
    ("cached_prompt_tokens_total", "counter", "prompt tokens found in a kept history",
     lambda b: b.stats["cached_tokens"]),
    ("prefilled_tokens_total", "counter", "prompt tokens read by the model",
     lambda b: b.stats["prefilled_tokens"]),
    ("generated_tokens_total", "counter", "tokens sampled", lambda b: b.stats["generated_tokens"]),
    ("decode_steps_total", "counter", "batched decode steps", lambda b: b.stats["steps"]),
    ("active_slots", "gauge", "rows running a request", lambda b: b.active),
    ("slots", "gauge", "rows of the decode batch", lambda b: b.slots),
    ("queue_length", "gauge", "requests waiting for a row", lambda b: b.queued),
    ("cache_bytes", "gauge", "KV cache bytes (rows and parked histories)",
     lambda b: b.cache_bytes),
]


def metrics_text(batcher: Batcher) -> str:
    lines = []
    for name, kind, help_, value in METRICS:
        lines += [f"# HELP regionkv_{name} {help_}", f"# TYPE regionkv_{name} {kind}",
                  f"regionkv_{name} {value(batcher)}"]
    lines += ["# HELP regionkv_finished_total requests finished, by reason",
              "# TYPE regionkv_finished_total counter"]
    for reason in ("stop", "length", "cancelled", "error"):
        lines.append(f'regionkv_finished_total{{reason="{reason}"}} '
                     f'{batcher.stats["finished_" + reason]}')
    return "\n".join(lines) + "\n"
