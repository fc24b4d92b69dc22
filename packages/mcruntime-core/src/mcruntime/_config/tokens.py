"""Is a bearer token sendable? Checked where a token enters, never by quoting it.

A token travels in the ``Authorization`` header, where a line break or any
other control character is forbidden (the HTTP client refuses to send it) and
a non-ASCII character is never part of a real token. Rather than let every
request fail deep in the HTTP client, a token is checked where it comes in: a
kubeconfig's ``token`` when the kubeconfig is loaded, a ``tokenFile`` when it
is read, a plugin's token when the plugin prints it. The message says what is
wrong and where in the token, never the token itself.

Surrounding whitespace: an inline ``token`` is taken verbatim, as client-go
takes it, so a trailing newline (what ``echo`` adds) is refused with a hint;
a ``tokenFile`` is stripped of surrounding whitespace first, as client-go
strips it, because files end in newlines.
"""

from __future__ import annotations

__all__ = ["token_problem"]


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent in a header, or ``None``; names positions, never characters' values."""
    for index, character in enumerate(token):
        code = ord(character)
        if character in "\r\n":
            at_end = not token[index:].strip()
            where = "ends with a line break" if at_end else f"has a line break at character {index + 1}"
            return f"{where} (a trailing newline is what `echo` adds: write it with `printf %s` or `echo -n`)"
        if code < 0x20 or code == 0x7F:
            return f"has a control character at character {index + 1}"
        if code > 0x7E:
            return f"has a non-ASCII character at character {index + 1}"
    return None
