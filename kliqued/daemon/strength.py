"""Is a chosen admin token strong enough? (``KLIQUE_ADMIN_TOKEN``)

Tokens the daemon makes are 256 random bits; a token an operator chooses may be
``password123``. A chosen token must have at least 32 characters and an estimated guess count
of at least 10^30 (about 100 bits) by zxcvbn, the password-strength estimator, which sees
through repeats (``abcabc...``), sequences, keyboard walks and dictionary words that a length
rule alone lets through.
"""

from __future__ import annotations

MIN_LENGTH = 32
MAX_LENGTH = 256
MIN_GUESSES_LOG10 = 30.0
HOW = "python3 -c \"import secrets; print('kq_' + secrets.token_urlsafe(32))\""


def weakness(token: str) -> str | None:
    """Why ``token`` is too weak to be an admin token, or None when it is fine."""
    if len(token) < MIN_LENGTH:
        return f"it has {len(token)} characters; at least {MIN_LENGTH} are needed"
    if len(token) > MAX_LENGTH:
        return f"it has {len(token)} characters; at most {MAX_LENGTH} are allowed"
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        return "it must be printable ASCII without spaces (it travels in an HTTP header)"
    from zxcvbn import zxcvbn

    guesses = float(zxcvbn(token[:72])["guesses_log10"])  # its limit; 72 strong is enough
    if guesses < MIN_GUESSES_LOG10:
        return (
            f"it is guessable (about 10^{guesses:.0f} guesses by a strength estimate; at "
            f"least 10^{MIN_GUESSES_LOG10:.0f} are needed): repeats, sequences and words "
            f"count for little"
        )
    return None


def advice() -> str:
    return f"make one with: {HOW}"
