"""One line per event, logfmt by default or JSON; fields passed as keyword arguments."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

LOGGER_NAME = "specdecode_exporter"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _logfmt_value(value: Any) -> str:
    """A logfmt value: bare when it is a plain word, else quoted with its backslashes, quotes and control characters
    escaped (a client's header or a target's label can carry a CR or an escape sequence into a log line)."""
    text = str(value)
    if text and all(c.isalnum() or c in "-._:/@+" for c in text):
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text) + '"'


class EventFormatter(logging.Formatter):
    def __init__(self, json_format: bool) -> None:
        super().__init__()
        self.json_format = json_format

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower().replace("warning", "warn"),
            "msg": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}))
        if record.exc_info and record.levelno >= logging.ERROR:
            fields["error"] = self.formatException(record.exc_info).splitlines()[-1]
        if self.json_format:
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def setup_logging(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EventFormatter(fmt == "json"))
    root = logging.getLogger(LOGGER_NAME)
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    root.propagate = False
    # uvicorn's access log would print a line per Prometheus scrape; its errors still come through. The handler
    # goes on "uvicorn" alone: "uvicorn.error" propagates to it, and a handler on both printed each message twice.
    logging.getLogger("uvicorn").handlers[:] = [handler]
    logging.getLogger("uvicorn.error").handlers[:] = []
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").disabled = True


def reconfigure_logging(level: str, fmt: str) -> None:
    """A reloaded log level and format, applied to the handlers setup_logging installed."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(_LEVELS.get(level, logging.INFO))
    for handler in logger.handlers:
        if isinstance(handler.formatter, EventFormatter):
            handler.setFormatter(EventFormatter(fmt == "json"))


def event(level: int, msg: str, **fields: Any) -> None:
    logging.getLogger(LOGGER_NAME).log(level, msg, extra={"fields": fields})
