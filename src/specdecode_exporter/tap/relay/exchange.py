"""One request and its response as the relay carries them, and the result it reports of them."""

from __future__ import annotations

import json

from specdecode_exporter.tap import model
from specdecode_exporter.tap.model import Route, TapRequest, TapResult
from specdecode_exporter.tap.openai import BodyFindings, read_response_body, sglang_spec_details
from specdecode_exporter.tap.sse import SseWatcher, StreamFindings, UsageStripper

# What is done with an inspected response body
PASS, CAPTURE, WATCH, STRIP, REFRAME = range(5)


class Exchange:
    """One request and its response, from the request head to the response's end. The request reader creates it,
    the routing sets where it went, the response reader fills in what came back."""

    __slots__ = (
        "body",
        "body_too_large",
        "first_body",
        "first_byte",
        "method",
        "mode",
        "request",
        "request_read",
        "resend",
        "route",
        "single_prompt",
        "started",
        "status",
        "stream",
        "tunnel",
    )

    def __init__(self, method: bytes, started: float) -> None:
        self.method = method
        self.started = started
        self.request: TapRequest | None = None  # set for inspected requests only
        # Not the plan itself: it holds the request body, which need not live as long as the response.
        self.single_prompt = True
        self.request_read = False  # the whole request has been read from the client
        self.tunnel = False  # an upgrade (or CONNECT): raw bytes both ways once its response starts
        self.first_byte: float | None = None
        self.first_body: float | None = None
        self.route: Route | None = None  # routing: where it was sent
        self.resend: bytes | None = None  # sent to the fallback: the request, until its response starts
        self.status = 0
        self.mode = PASS
        self.stream: SseWatcher | UsageStripper | None = None
        self.body: bytearray | None = None
        self.body_too_large = False

    def held_bytes(self) -> int:
        """What the relay holds of this response: a captured body, an event held back."""
        return len(self.body or b"") + (self.stream.held_bytes() if self.stream else 0)

    def result(self, failure: str | None, now: float) -> TapResult:
        findings: StreamFindings | BodyFindings | None = self.stream.findings if self.stream is not None else None
        unparsable = self.body_too_large or (isinstance(findings, StreamFindings) and findings.gave_up)
        if findings is None and self.body is not None and failure is None and not self.body_too_large:
            findings = read_response_body(bytes(self.body))
            unparsable = findings is None
        usage = findings.usage if findings is not None else None
        metrics = findings.metrics if findings is not None else None
        reason = failure or self._reason(findings, unparsable)
        return TapResult(self.status, metrics, findings.timings if findings is not None else None, usage, reason,
                         self.started, self.first_byte, now, self.first_body, self.route,
                         findings.sglext if findings is not None else None)

    def _reason(self, findings: StreamFindings | BodyFindings | None, unparsable: bool) -> str | None:
        if self.status >= 400:
            return model.HTTP_ERROR
        if findings is not None and (findings.metrics is not None or sglang_spec_details(findings.sglext) is not None):
            return None
        if self.request is not None and self.request.n > 1:
            return model.N_GT_1
        if not self.single_prompt:
            return model.MULTI_PROMPT
        if unparsable or self.mode == PASS:
            return model.UNPARSABLE
        if isinstance(findings, StreamFindings) and not findings.saw_usage:
            return model.NO_USAGE
        if findings is not None and findings.sglang and not (self.request and self.request.spec_details_requested):
            return model.SPEC_DETAILS_NOT_REQUESTED
        return model.NOT_ENABLED


def bad_gateway(reason: str, head_request: bool) -> bytes:
    """The tap's own answer when the upstream cannot be reached: a 502 in the OpenAI API's error shape."""
    body = json.dumps(
        {
            "error": {
                "message": f"upstream unavailable: {reason}",
                "type": "BadGatewayError",
                "param": None,
                "code": 502,
            }
        },
        separators=(",", ":"),
    ).encode()
    head = (
        b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % len(body)
    )
    return head if head_request else head + body
