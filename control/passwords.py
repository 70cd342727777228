"""Password hashing: scrypt from the standard library (OpenSSL's implementation).

scrypt is memory-hard (each guess costs ``128 * r * n`` bytes, 32 MiB here), which is what
makes a stolen hash expensive to attack on GPUs; it ships with Python (``hashlib.scrypt``),
so it adds no dependency, and its parameters are stored with every hash so they can be
raised later without invalidating existing passwords. Stored form:
``scrypt$<log2 n>$<r>$<p>$<salt b64>$<hash b64>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

LOG2_N: Final = 15
R: Final = 8
P: Final = 1
_MAXMEM: Final = 128 * 1024 * 1024
MIN_PASSWORD: Final = 12
MAX_PASSWORD: Final = 1024


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _derive(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**log2_n, r=r, p=p, maxmem=_MAXMEM, dklen=32)


def password_problem(password: str) -> str | None:
    """Why ``password`` cannot be used, else None."""
    if len(password) < MIN_PASSWORD:
        return f"password: at least {MIN_PASSWORD} characters"
    if len(password) > MAX_PASSWORD:
        return f"password: at most {MAX_PASSWORD} characters"
    if "\x00" in password:
        return "password: contains a NUL character"
    return None


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _derive(password, salt, LOG2_N, R, P)
    return f"scrypt${LOG2_N}${R}${P}${_b64(salt)}${_b64(digest)}"


#: Verified against when the account does not exist, so an unknown name costs as much time
#: as a wrong password (no user enumeration by timing).
DUMMY_HASH: Final = "scrypt$15$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time compare; False on a malformed hash)."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt" or len(password) > MAX_PASSWORD:
        return False
    try:
        log2_n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = base64.b64decode(parts[4]), base64.b64decode(parts[5])
    except ValueError:
        return False
    if not (10 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 4):
        return False
    return hmac.compare_digest(_derive(password, salt, log2_n, r, p), expected)
