"""API keys: created by `dlrm-platform api-key create`, stored hashed.

A key looks like ``dlrm_<key_id>_<secret>``. The database keeps the key id
(to find the record) and the SHA-256 of the whole key; the key itself is shown
once, at creation. Keys carry 256 bits of randomness, so a fast hash is the
right one here (as for GitHub tokens): a slow password hash would only add
latency to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from dlrm_platform.api.db import ApiKeyRecord, utcnow
from dlrm_platform.errors import UserError

KEY_PREFIX = "dlrm"
_KEY_RE = re.compile(r"^dlrm_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})$")
USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling."""

    user: str
    is_admin: bool
    key_id: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str]:
    """Returns (key_id, full key)."""
    key_id = secrets.token_hex(8)
    return key_id, f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"


def create_api_key(session: Session, user: str, admin: bool = False) -> tuple[ApiKeyRecord, str]:
    """Store a new key for ``user``; returns the record and the plaintext key (shown once)."""
    if not USER_RE.match(user):
        raise UserError(f"invalid user name {user!r}: letters, digits, '.', '_', '-'; at most 64 characters")
    key_id, key = generate_key()
    record = ApiKeyRecord(key_id=key_id, key_hash=hash_key(key), user=user, is_admin=admin)
    session.add(record)
    session.flush()
    return record, key


def revoke_api_key(session: Session, key_id: str) -> bool:
    record = session.scalar(select(ApiKeyRecord).where(ApiKeyRecord.key_id == key_id))
    if record is None or record.revoked_at is not None:
        return False
    record.revoked_at = utcnow()
    return True


def verify_key(session: Session, key: str) -> Principal | None:
    """The principal a key belongs to, or None for a malformed, unknown, wrong or revoked key."""
    m = _KEY_RE.match(key.strip())
    if not m:
        return None
    record = session.scalar(select(ApiKeyRecord).where(ApiKeyRecord.key_id == m.group(1)))
    if record is None or record.revoked_at is not None:
        return None
    if not hmac.compare_digest(record.key_hash, hash_key(key.strip())):
        return None
    return Principal(user=record.user, is_admin=record.is_admin, key_id=record.key_id)


class KeyCache:
    """Verified keys for ``ttl_s`` seconds, so that polling clients cost no key lookup.

    A revoked key stops working within ``ttl_s`` (0 disables the cache). Entries
    are keyed by the key's hash, never by the key.
    """

    def __init__(self, ttl_s: float, max_entries: int = 10_000):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, key: str) -> Principal | None:
        if self.ttl_s <= 0:
            return None
        hit = self._entries.get(hash_key(key))
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, key: str, principal: Principal) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[hash_key(key)] = (time.monotonic() + self.ttl_s, principal)


def extract_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key from ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    if x_api_key:
        return x_api_key
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None
