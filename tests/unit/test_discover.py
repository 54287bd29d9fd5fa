"""The one reader of OpenAI model lists (/v1/models), used by the sidecar (a model name for llama.cpp targets),
`check --send-test-completion` and the probe: every id in order, an empty list told apart from not a list."""

from __future__ import annotations

import json

import pytest

from specdecode_exporter.sidecar.discover import first_model_id, model_ids


def listing(*entries: object) -> bytes:
    return json.dumps({"object": "list", "data": list(entries)}).encode()


def test_every_named_model_in_order() -> None:
    body = listing({"id": "tiny", "object": "model"}, {"id": "tiny-lora"})
    assert model_ids(body) == ["tiny", "tiny-lora"]
    assert first_model_id(body) == "tiny"


def test_entries_without_a_usable_name_are_left_out() -> None:
    body = listing("tiny", {"object": "model"}, {"id": ""}, {"id": 7}, {"id": "named"})
    assert model_ids(body) == ["named"]
    assert first_model_id(body) == "named"


def test_an_empty_list_is_no_model_not_a_broken_answer() -> None:
    assert model_ids(listing()) == []
    assert first_model_id(listing()) is None


@pytest.mark.parametrize("body", [b"", b"<html>404</html>", b"[]", b'{"data": {"id": "tiny"}}', b'{"error": "x"}',
                                  b"\xff\xfe"])
def test_a_body_that_is_not_a_model_list_is_none(body: bytes) -> None:
    assert model_ids(body) is None
    assert first_model_id(body) is None
