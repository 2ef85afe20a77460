"""Canonical payloads: equal meaning gives equal bytes and an equal hash; anything else is refused."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from onceflow.ledger import canonical_payload


def test_key_order_and_whitespace_do_not_change_the_hash() -> None:
    ordered = canonical_payload(
        "issue_credit", {"account_id": "acct_1", "amount_cents": 500, "memo": {"a": 1, "b": [1, 2]}}
    )
    shuffled = json.loads('{ "memo" : {"b":[1,  2], "a":1},\n "amount_cents":500, "account_id":"acct_1" }')
    assert canonical_payload("issue_credit", shuffled) == ordered


def test_one_point_zero_and_one_are_the_same_number() -> None:
    assert canonical_payload("t", {"amount": 1.0}) == canonical_payload("t", {"amount": 1})
    assert canonical_payload("t", {"amount": 1e2}).sha256 == canonical_payload("t", {"amount": 100}).sha256


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"amount_cents": 500}, {"amount_cents": 501}),
        ({"amount_cents": 500}, {"amount_cents": "500"}),
        ({"flag": True}, {"flag": 1}),
        ({"items": [1, 2]}, {"items": [2, 1]}),
        ({"memo": None}, {}),
        ({"memo": "café"}, {"memo": "cafe"}),
    ],
)
def test_different_values_give_different_hashes(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert canonical_payload("t", left).sha256 != canonical_payload("t", right).sha256


def test_the_tool_name_is_part_of_the_payload() -> None:
    arguments = {"account_id": "acct_1"}
    assert (
        canonical_payload("issue_credit", arguments).sha256
        != canonical_payload("void_credit", arguments).sha256
    )


def test_payload_text_is_rfc8785_and_the_hash_is_its_sha256() -> None:
    payload = canonical_payload("issue_credit", {"b": 1.5, "a": "x"})
    assert payload.text == '{"arguments":{"a":"x","b":1.5},"tool":"issue_credit"}'
    assert payload.sha256 == hashlib.sha256(payload.text.encode()).hexdigest()
    assert payload.value == {"tool": "issue_credit", "arguments": {"a": "x", "b": 1.5}}


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        ({1, 2}, "set"),
        (b"bytes", "bytes"),
        (object(), "object"),
    ],
)
def test_non_json_values_are_refused_with_a_clear_error(value: Any, complaint: str) -> None:
    with pytest.raises(ValueError, match="not canonical JSON") as caught:
        canonical_payload("issue_credit", {"amount": value})
    assert "'issue_credit'" in str(caught.value)
    assert complaint in str(caught.value)
