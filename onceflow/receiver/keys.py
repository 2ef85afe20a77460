"""The Idempotency-Key header as draft-ietf-httpapi-idempotency-key-header-07 defines it, and a
request's fingerprint.

The header is an Item Structured Header (RFC 8941) whose value is a String:

    Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"

so the key travels in double quotes, with `\\"` and `\\\\` the only escapes and nothing but printable
ASCII inside. A value that is not such a string (no quotes, a control character, a stray escape,
two header lines, parameters after the string), an empty key, or a key over 255 characters is a bad
key: the kit answers 400 and stores nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import rfc8785

KEY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


class BadKeyError(ValueError):
    """The Idempotency-Key header is present but is not a usable key; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_key_header(value: str) -> str:
    """The key carried by one Idempotency-Key field value (several lines joined with ", ")."""
    text = value.strip(" \t")
    if not text.startswith('"'):
        raise BadKeyError('the value must be a Structured Field string, in double quotes: "<key>"')
    key: list[str] = []
    position = 1
    while position < len(text):
        char = text[position]
        position += 1
        if char == "\\":
            if position >= len(text) or text[position] not in '"\\':
                raise BadKeyError('inside the quotes, a backslash may only escape " or \\')
            key.append(text[position])
            position += 1
        elif char == '"':
            rest = text[position:]
            if rest.startswith(";"):
                raise BadKeyError("parameters after the key are not accepted")
            if rest:
                raise BadKeyError("one key, one header: nothing may follow the closing quote")
            return check_key("".join(key))
        elif not 0x20 <= ord(char) <= 0x7E:
            raise BadKeyError("a key holds printable ASCII only: no control or non-ASCII characters")
        else:
            key.append(char)
    raise BadKeyError("the closing double quote is missing")


def check_key(key: str) -> str:
    """`key` itself, if it may be used as a key (1 to 255 printable ASCII characters)."""
    if not key:
        raise BadKeyError("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise BadKeyError(f"the key has {len(key)} characters; at most {MAX_KEY_LENGTH} are allowed")
    if any(not 0x20 <= ord(char) <= 0x7E for char in key):
        raise BadKeyError("a key holds printable ASCII only: no control or non-ASCII characters")
    return key


def key_header_value(key: str) -> str:
    """`key` written as the header's Structured Field string (what a client sends)."""
    check_key(key)
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class RequestShape:
    """What a key is bound to: the method, the path (with its query) and the body."""

    method: str
    path: str
    body: bytes
    json_body: bool = False

    def fingerprint(self) -> str:
        """SHA-256 (hex) of method, path and canonical body: JSON bodies in RFC 8785 canonical
        form, so that key order and whitespace do not make two equal requests differ."""
        body = canonical_json(self.body) if self.json_body else None
        digest = hashlib.sha256()
        for part in (
            self.method.upper().encode(),
            self.path.encode(),
            body if body is not None else self.body,
        ):
            # Length-prefixed, so no part can be made to look like the next one.
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return digest.hexdigest()


def canonical_json(body: bytes) -> bytes | None:
    """`body` in RFC 8785 canonical JSON, or None when it is not JSON that form can carry."""
    try:
        return bytes(rfc8785.dumps(json.loads(body)))
    except (ValueError, rfc8785.CanonicalizationError):
        return None


def is_json_media_type(content_type: str | None) -> bool:
    """`application/json` or any `+json` type, whatever its parameters."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")
