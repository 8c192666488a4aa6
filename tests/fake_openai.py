"""A small OpenAI-compatible chat-completions server on 127.0.0.1 for tests and benchmarks.

It serves scripted replies so that the real HTTP path (DSPy's LM client, our adapters, retries and
log-prob handling) is exercised end to end. Only the model's judgement is scripted: a `responder`
callable gets the request body and returns a `Reply`.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    # Per-token log-probs in OpenAI's shape: [(token, logprob, [(alt_token, alt_logprob), ...]), ...]
    logprobs: Optional[list] = None
    error_body: Optional[dict] = None
    # Sent verbatim instead of a chat completion (a captive portal's HTML page, say), with this content type.
    raw_body: Optional[bytes] = None
    content_type: str = "application/json"


def chat_body(content: str, model: str, logprobs: Optional[list]) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {
                    "token": tok,
                    "logprob": lp,
                    "bytes": list(tok.encode()),
                    "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in alts],
                }
                for tok, lp, alts in logprobs
            ]
        }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 10, "completion_tokens": max(1, len(content) // 4), "total_tokens": 10 + max(1, len(content) // 4)},
    }


def tokenize_with_letter_logprobs(content: str, letter_probs: dict[str, float] | None) -> list:
    """Split `content` into crude tokens; the first token that is exactly one of A–E right after a
    `"level"` key gets `letter_probs` (letter -> logprob) as its alternatives. Enough to emulate a
    provider that returns top_logprobs for a JSON answer."""
    tokens = re.findall(r'\w+|[^\w\s]|\s+', content)
    out, seen_level = [], False
    for tok in tokens:
        if tok == "level":
            seen_level = True
        if seen_level and letter_probs and tok in letter_probs:
            alts = sorted(letter_probs.items(), key=lambda kv: -kv[1])[:5]
            out.append((tok, letter_probs[tok], alts))
            seen_level = False
        else:
            out.append((tok, -0.01, [(tok, -0.01)]))
    return out


class FakeOpenAIServer:
    """`with FakeOpenAIServer(responder) as srv: dspy.LM("openai/fake", api_base=srv.base_url, api_key="x")`."""

    def __init__(self, responder: Callable[[dict], Reply], latency: float = 0.0):
        self.responder = responder
        self.latency = latency
        self.requests: list[dict] = []
        self.in_flight = 0        # chat requests being answered right now
        self.peak_in_flight = 0   # the most seen at once (tests check a client-side cap holds)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def setup(self):
                super().setup()
                # As real inference servers do: without it, Nagle's algorithm and the client's delayed
                # ACK stall some responses by ~40 ms, which would distort latency benchmarks.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with server._lock:
                    server.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                if not self.path.rstrip("/").endswith("chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                with server._lock:
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                try:
                    reply = server.responder(body)
                    if server.latency or reply.delay:
                        time.sleep(server.latency + reply.delay)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                if reply.raw_body is not None:
                    return self._send(reply.status, reply.raw_body, {"Content-Type": reply.content_type, **reply.headers})
                if reply.status != 200:
                    err = reply.error_body or {"error": {"message": f"scripted {reply.status}", "type": "server_error"}}
                    return self._send(reply.status, err, reply.headers)
                want_lp = bool(body.get("logprobs"))
                lps = reply.logprobs if want_lp else None
                self._send(200, chat_body(reply.content, body.get("model", "fake"), lps), reply.headers)

            def _send(self, status, payload, headers=None):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, str(v))
                    self._headers_buffer.append(b"\r\n")  # end of headers, sent with the body in one write
                    self.wfile.write(b"".join(self._headers_buffer) + data)
                    self._headers_buffer = []
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (e.g. its timeout); nothing to do

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


_OUTPUTS = re.compile(r"Your output fields are:\s*(.*?)(?:\n\n|All interactions)", re.S)
_FIELD = re.compile(r"^\d+\. `(\w+)`", re.M)
_ROUTES = {"planner_output": "plan", "distortion_set": "detect", "distortion_analysis": "analyze",
           "selected_tools": "select", "final_answer": "explain", "level": "score"}


def route_of(body: dict) -> str:
    """Which signature a chat request is for, from the output fields DSPy lists in the system message."""
    system = next((m.get("content") for m in body.get("messages", []) if m.get("role") == "system"), "") or ""
    if isinstance(system, list):
        system = "".join(p.get("text", "") for p in system if isinstance(p, dict))
    m = _OUTPUTS.search(system)
    fields = _FIELD.findall(m.group(1)) if m else []
    return _ROUTES.get(fields[0], "unknown") if fields else "unknown"


def scripted(routes: dict) -> Callable[[dict], Reply]:
    """A responder answering each route from its list of replies in order (the last one repeats).

    Values: a dict (sent as JSON, with letter log-probs when it holds "level" and the route's entry in
    `routes["_logprobs"]`), a str (verbatim), or a Reply."""
    served: dict[str, int] = {}
    lock = threading.Lock()

    def respond(body: dict) -> Reply:
        route = route_of(body)
        items = routes.get(route)
        if items is None:
            return Reply(status=500, error_body={"error": {"message": f"no script for route {route}"}})
        items = items if isinstance(items, list) else [items]
        with lock:
            i = served.get(route, 0)
            served[route] = i + 1
        item = items[min(i, len(items) - 1)]
        if isinstance(item, Reply):
            return item
        if isinstance(item, dict):
            content = json.dumps(item)
            probs = routes.get("_logprobs") if "level" in item else None
            return Reply(content=content, logprobs=tokenize_with_letter_logprobs(content, probs))
        return Reply(content=str(item))

    return respond
