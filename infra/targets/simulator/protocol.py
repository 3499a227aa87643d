"""OpenAI/vLLM wire format: request validation, token counting and pre-encoded SSE chunks.

Pure functions and small classes, no I/O, so the format is testable without sockets.

Token counting (the simulator has no tokenizer):

- completions: one token per whitespace-separated word of ``prompt`` (a list of token ids counts
  its length);
- chat: the words of every message's text content, plus :data:`CHAT_TOKENS_PER_MESSAGE` per
  message (role and separators of a chat template) and :data:`CHAT_TOKENS_GENERATION_PROMPT`
  once (the assistant header the template appends).

Streaming chunks follow vLLM's OpenAI server byte for byte in shape: ``data: {json}\\n\\n`` events,
the last token's chunk carries ``finish_reason``, an optional usage chunk has ``"choices": []``,
and ``data: [DONE]\\n\\n`` ends the stream. Chat streams open with a role-only chunk
(``delta = {"role": "assistant", "content": ""}``), which carries no token.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_GENERATION_PROMPT = 3
# vLLM's CompletionRequest defaults max_tokens to 16; chat defaults to what is left of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# The generated text cycles through these words; each token is " word".
_VOCAB = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their can has more been will if would "
    "when what so no out up said into about than them time only could new some these two may "
    "first then do any like my now over such our man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()
VOCAB_SIZE = len(_VOCAB)
TOKEN_TEXTS: tuple[str, ...] = tuple(" " + word for word in _VOCAB)

DONE_EVENT = b"data: [DONE]\n\n"


class RequestError(Exception):
    """A request the server refuses; carries the HTTP status and vLLM's error ``type``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    @property
    def error_type(self) -> str:
        return {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(
            self.status, "BadRequestError"
        )

    def body(self) -> dict[str, Any]:
        """vLLM's current error body: ``{"error": {message, type, param, code}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def count_prompt_tokens(prompt: Any) -> int:
    """Tokens of a completions ``prompt``: words of a string, or the length of a token-id list."""
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            return count_prompt_tokens(prompt[0])
        if all(isinstance(item, int) for item in prompt):
            return len(prompt)
        raise RequestError("the simulator serves one prompt per request", param="prompt")
    raise RequestError("prompt must be a string or a list of token ids", param="prompt")


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts carry tokens here
        return " ".join(
            part.get("text", "") for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    raise RequestError("message content must be a string or a list of parts", param="messages")


def count_chat_tokens(messages: Any) -> int:
    """Tokens of a chat ``messages`` list: words of each text plus the template overhead."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    words = 0
    for message in messages:
        if not isinstance(message, dict):
            raise RequestError("each message must be an object", param="messages")
        words += len(_message_text(message.get("content")).split())
    return words + CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_TOKENS_GENERATION_PROMPT


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a validated request asks the engine for."""

    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}", param=name)
    return value


def parse_generation_request(
    body: Any, *, chat: bool, served_model: str, max_model_len: int
) -> GenerationRequest:
    """Validate a completions/chat body the way vLLM does; raise :class:`RequestError`."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")
    if chat:
        prompt_tokens = count_chat_tokens(body.get("messages"))
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required", param="prompt")
        prompt_tokens = count_prompt_tokens(body["prompt"])
    n = _int_field(body, "n", 1)
    if n != 1:
        raise RequestError(f"the simulator serves n=1 only, got n={n}", param="n")
    max_tokens = _int_field(body, "max_tokens", None)
    if chat and max_tokens is None:
        max_tokens = _int_field(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = (
            max(max_model_len - prompt_tokens, 1) if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
        )
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    if prompt_tokens + max_tokens > max_model_len:
        where = "messages" if chat else "prompt"
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, "
            f"{max_tokens} in the completion). Please reduce the length of the {where} or "
            "completion.",
            param="max_tokens",
        )
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if not 0 <= min_tokens <= max_tokens:
        raise RequestError(
            f"min_tokens must be in [0, max_tokens={max_tokens}], got {min_tokens}",
            param="min_tokens",
        )
    stream = bool(body.get("stream", False))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    if stream_options and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.",
                           param="stream_options")
    return GenerationRequest(
        chat=chat,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
    )


def _choice_tail(finish_reason: str | None, chat: bool) -> str:
    reason = "null" if finish_reason is None else f'"{finish_reason}"'
    if chat:
        return f'}},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]}}\n\n'
    return f',"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]}}\n\n'


# Per-token chunk bodies after the per-request prefix, pre-encoded once per process:
# the whole per-token write is ``prefix + _TOKEN_TAILS[k]``, one bytes concatenation.
_COMPLETION_TOKEN_TAILS = tuple(
    (_dumps(text) + _choice_tail(None, chat=False)).encode() for text in TOKEN_TEXTS
)
_CHAT_TOKEN_TAILS = tuple(
    (_dumps(text) + _choice_tail(None, chat=True)).encode() for text in TOKEN_TEXTS
)
# a tool call's argument pieces close the function, the call and the tool_calls list first
_TOOL_CLOSE = "}}]"
_TOOL_TOKEN_TAILS = tuple(
    (_dumps(text) + _TOOL_CLOSE + _choice_tail(None, chat=True)).encode() for text in TOKEN_TEXTS
)
# a request offering tools (tool_choice not "none") is answered with one call of the first tool,
# streamed as vLLM does (id and name first, then the arguments in pieces), this many tokens long
TOOL_CALL_TOKENS = 8


def tool_call_name(body: dict[str, Any]) -> str | None:
    """The tool a chat body makes the simulator call (its first), or None to answer in text."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    function = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return str(name) if name else "tool"


class ChunkEncoder:
    """Builds the SSE bytes of one streamed response; the per-token path is one concatenation.

    ``reasoning_events`` (chat only): the first that many tokens go out as reasoning deltas
    (``delta.<reasoning_field>``, vLLM 0.32's ``reasoning`` by default, ``reasoning_content`` as
    older vLLM, DeepSeek and SGLang name it) before the answer's ``delta.content``.
    """

    __slots__ = ("chat", "request_id", "created", "model", "token_prefix", "token_tails", "_head",
                 "reasoning_events", "reasoning_prefix", "tool_name", "_finish_reason")
    done_event = DONE_EVENT  # what ends the stream after the usage chunk

    def __init__(self, *, chat: bool, model: str, reasoning_events: int = 0,
                 reasoning_field: str = "reasoning", tool_name: str | None = None) -> None:
        self.chat = chat
        self.tool_name = tool_name if chat else None
        self.reasoning_events = reasoning_events if chat else 0
        self.request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            f'data: {{"id":"{self.request_id}","object":"{obj}","created":{self.created},'
            f'"model":{_dumps(model)},"choices":'
        )
        field_start = '[{"index":0,"delta":{"content":' if chat else '[{"index":0,"text":'
        self.token_prefix = (self._head + field_start).encode()
        self.token_tails = _CHAT_TOKEN_TAILS if chat else _COMPLETION_TOKEN_TAILS
        self.reasoning_prefix = (
            self._head + f'[{{"index":0,"delta":{{"{reasoning_field}":').encode()
        if self.tool_name is not None:  # the answer is a tool call: its arguments, piece by piece
            self.reasoning_events = 0
            self.token_prefix = (self._head + '[{"index":0,"delta":{"tool_calls":[{"index":0,'
                                 '"function":{"arguments":').encode()
            self.token_tails = _TOOL_TOKEN_TAILS

    def prefix_of(self, n: int) -> bytes:
        """The chunk prefix of the ``n``-th token (1-based): reasoning first, then the answer."""
        return self.reasoning_prefix if n <= self.reasoning_events else self.token_prefix

    def role_chunk(self) -> bytes:
        """Chat only: the opening chunk that names the role and carries no token."""
        return (
            self._head + '[{"index":0,"delta":{"role":"assistant","content":""'
            + _choice_tail(None, chat=True)
        ).encode()

    def tool_call_head(self) -> bytes:
        """A tool call's id and name, in a chunk of their own before its first argument piece
        (sent with the first token, as vLLM does once the model has begun the call)."""
        call = {"id": "call-" + self.request_id[-12:], "type": "function", "index": 0,
                "function": {"name": self.tool_name, "arguments": ""}}
        return (self._head + '[{"index":0,"delta":{"tool_calls":[' + _dumps(call) + "]"
                + _choice_tail(None, chat=True)).encode()

    def token_chunk(self, index: int) -> bytes:
        return self.token_prefix + self.token_tails[index % VOCAB_SIZE]

    def last_token_chunk(self, index: int, finish_reason: str, n: int = 0) -> bytes:
        text = _dumps(TOKEN_TEXTS[index % VOCAB_SIZE])
        prefix = self.prefix_of(n) if n else self.token_prefix
        if self.tool_name is not None:
            return prefix + (text + _TOOL_CLOSE + _choice_tail("tool_calls", True)).encode()
        return prefix + (text + _choice_tail(finish_reason, self.chat)).encode()

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = _usage(prompt_tokens, completion_tokens,
                       min(self.reasoning_events, completion_tokens))
        return (self._head + f'[],"usage":{_dumps(usage)}}}\n\n').encode()


def _usage(prompt_tokens: int, completion_tokens: int,
           reasoning_tokens: int = 0) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if reasoning_tokens:  # OpenAI's field; reasoning tokens are part of completion_tokens
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def generated_text(first_index: int, count: int) -> str:
    return "".join(TOKEN_TEXTS[(first_index + i) % VOCAB_SIZE] for i in range(count))


def full_response_body(
    encoder: ChunkEncoder, *, text: str, finish_reason: str, prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """The non-streaming response of vLLM for one choice."""
    if encoder.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        obj = "text_completion"
    return {
        "id": encoder.request_id,
        "object": obj,
        "created": encoder.created,
        "model": encoder.model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens,
                        min(encoder.reasoning_events, completion_tokens)),
    }


def word_token_ids(text: str) -> list[int]:
    """Stable fake token ids for ``/tokenize``: one per word."""
    return [zlib.crc32(word.encode()) % 32000 for word in text.split()]


# ---- the Responses API (POST /v1/responses), streamed as vLLM streams it ------------------------

def parse_responses_request(body: Any, *, served_model: str,
                            max_model_len: int) -> GenerationRequest:
    """Validate a Responses body (``input``: text or messages, ``max_output_tokens``) as vLLM
    does; the generation it asks for, usage always on (``response.completed`` carries it)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if "input" not in body:
        raise RequestError("input is required", param="input")
    given = body["input"]
    chat_body = {**body, "messages": given if isinstance(given, list) else
                 [{"role": "user", "content": given}]}
    chat_body.pop("stream_options", None)
    chat_body["max_tokens"] = _int_field(body, "max_output_tokens", None)
    gen = parse_generation_request(chat_body, chat=True, served_model=served_model,
                                   max_model_len=max_model_len)
    return GenerationRequest(chat=True, stream=gen.stream, include_usage=True,
                             prompt_tokens=gen.prompt_tokens, max_tokens=gen.max_tokens,
                             min_tokens=gen.min_tokens, ignore_eos=gen.ignore_eos)


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {_dumps({'type': kind, **data})}\n\n"


_DELTA_TAILS = tuple((_dumps(text) + ',"logprobs":[]}\n\n').encode() for text in TOKEN_TEXTS)


class ResponsesEncoder(ChunkEncoder):
    """The Responses API's typed events in place of chat chunks, on the same engine hooks:
    the opening events (``response.created``, ``output_item.added``, ``content_part.added``),
    one ``response.output_text.delta`` per token (``response.reasoning_text.delta`` for the
    first ``reasoning_events``), the closing ``*.done`` events after the last token, and
    ``response.completed`` with the usage (``status: incomplete`` when ``max_output_tokens`` cut
    it). No ``[DONE]``: the body ends after ``response.completed``."""

    __slots__ = ("message_id",)
    done_event = b""

    def __init__(self, *, model: str, reasoning_events: int = 0, **_kw: Any) -> None:
        super().__init__(chat=True, model=model, reasoning_events=reasoning_events)
        self.request_id = "resp_" + uuid.uuid4().hex
        self.message_id = "msg_" + uuid.uuid4().hex
        index = 1 if reasoning_events else 0
        self.token_prefix = (
            'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            f'"item_id":"{self.message_id}","output_index":{index},"content_index":0,'
            '"delta":').encode()
        self.reasoning_prefix = (
            b'event: response.reasoning_text.delta\ndata: {"type":"response.reasoning_text.'
            b'delta","item_id":"rs_0","output_index":0,"content_index":0,"delta":')
        self.token_tails = _DELTA_TAILS

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return {"id": self.request_id, "object": "response", "created_at": self.created,
                "model": self.model, "status": status, **extra}

    def role_chunk(self) -> bytes:
        item = {"id": self.message_id, "type": "message", "role": "assistant",
                "status": "in_progress", "content": []}
        return (_sse("response.created", {"response": self._response("in_progress")})
                + _sse("response.in_progress", {"response": self._response("in_progress")})
                + _sse("response.output_item.added", {"output_index": 0, "item": item})
                + _sse("response.content_part.added", {
                    "item_id": self.message_id, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}})).encode()

    def last_token_chunk(self, index: int, finish_reason: str, n: int = 0) -> bytes:
        prefix = self.prefix_of(n) if n else self.token_prefix
        self._finish_reason = finish_reason
        return prefix + self.token_tails[index % VOCAB_SIZE] + (
            _sse("response.content_part.done", {"item_id": self.message_id, "output_index": 0,
                                                "content_index": 0})
            + _sse("response.output_item.done", {"output_index": 0, "item": {
                "id": self.message_id, "type": "message", "status": "completed"}})).encode()

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens,
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": min(self.reasoning_events,
                                                                   completion_tokens)}}
        cut = getattr(self, "_finish_reason", "stop") == "length"
        response = self._response(
            "incomplete" if cut else "completed", usage=usage,
            incomplete_details={"reason": "max_output_tokens"} if cut else None)
        return _sse("response.completed", {"response": response}).encode()
