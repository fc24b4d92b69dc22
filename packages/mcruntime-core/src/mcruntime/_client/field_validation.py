"""``fieldValidation``: what the API server does with a write's fields its kind does not have.

Its default (``Warn``) stores the object without them and sends a warning;
``Strict`` refuses the write, naming them; ``Ignore`` drops them in silence.
Checked where it is given, so a misspelt ``"strict"`` fails at construction,
not as a 400 on the first write.
"""

from __future__ import annotations

from typing import Any, Literal

FieldValidation = Literal["Strict", "Warn", "Ignore"]
"""What the API server does with a write's unknown or duplicate fields: refuse, warn, or drop them."""
FIELD_VALIDATIONS: tuple[str, ...] = ("Strict", "Warn", "Ignore")


def checked_field_validation(value: Any, where: str = "field_validation") -> Any:
    """``value`` if the API server knows it (or ``None``); a ``ValueError`` naming ``where`` otherwise."""
    if value is not None and value not in FIELD_VALIDATIONS:
        raise ValueError(f"{where} must be one of {', '.join(FIELD_VALIDATIONS)} or None, not {value!r}")
    return value
