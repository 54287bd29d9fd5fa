"""The served model's name, for engines whose metrics do not carry it (llama.cpp): the OpenAI-compatible
``/v1/models`` beside the target's /metrics, fetched with the target's own deadline, size cap and credentials."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from specdecode_exporter.pipeline.scrape import fetch
from specdecode_exporter.sidecar.config import api_base

MODELS_MAX_BYTES = 1024 * 1024


def models_url(metrics_url: str) -> str:
    """The /v1/models URL of the server that serves ``metrics_url`` (same scheme, host and port)."""
    return api_base(metrics_url) + "/v1/models"


def model_ids(body: bytes) -> list[str] | None:
    """The ``data[].id`` of an OpenAI model list, in its order (entries without a name left out); None when the
    body is not a model list."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        return None
    ids = (entry.get("id") for entry in data if isinstance(entry, dict))
    return [model for model in ids if isinstance(model, str) and model]


def first_model_id(body: bytes) -> str | None:
    """The first model of an OpenAI model list (vLLM serves one), or None when there is none."""
    ids = model_ids(body)
    return ids[0] if ids else None


async def served_model(client: httpx.AsyncClient, metrics_url: str, timeout: float, bearer_token: str | None,
                       clock: Callable[[], float] = time.monotonic, sni_hostname: str | None = None
                       ) -> tuple[str | None, str]:
    """(model id, "") or (None, why not)."""
    url = models_url(metrics_url)
    result = await fetch(client, url, timeout, MODELS_MAX_BYTES, bearer_token, clock, sni_hostname=sni_hostname)
    if result.failure is not None or result.body is None:
        return None, f"{url}: {result.failure}: {result.detail}"
    model = first_model_id(result.body)
    return (model, "") if model else (None, f"{url}: not an OpenAI model list")
