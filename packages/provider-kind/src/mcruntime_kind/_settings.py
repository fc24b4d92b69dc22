"""The kind provider's options, also settable from the environment (``MCRUNTIME_KIND_*``).

A controller developer switches between "every kind cluster on my laptop" and
"only the ones my test created" without touching code, so every option the
provider has is also an environment variable. A wrong value fails before the
provider starts, naming the variable, like the manager's own settings.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

import mcruntime as mcr

ENV_PREFIX = "MCRUNTIME_KIND_"

KIND_NAME = re.compile(r"^[a-z0-9.-]+$")
"""What kind accepts as a cluster name; anything else cannot come from ``kind get clusters``."""


class KindSettings(BaseSettings):
    """Every option of :class:`~mcruntime_kind.KindProvider`; each is ``MCRUNTIME_KIND_<FIELD>``.

    ``clusters`` is read from the environment as a comma-separated list
    (``MCRUNTIME_KIND_CLUSTERS=dev,staging``); empty or unset means every
    cluster the prefix lets through.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    binary: str = Field(
        default="kind", min_length=1, description="the kind executable: a name on PATH or a path"
    )
    poll_interval: float = Field(default=2.0, gt=0, description="seconds between two listings")
    prefix: str = Field(default="", description="only clusters whose kind name starts with this")
    clusters: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        default=None, description="only these kind cluster names (an allow-list)"
    )
    internal: bool = Field(
        default=False,
        description="ask for the internal kubeconfig (`--internal`): for controllers in containers",
    )
    command_timeout: float = Field(default=30.0, gt=0, description="seconds one kind command may take")

    @field_validator("clusters", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            names = tuple(part.strip() for part in value.split(",") if part.strip())
            return names or None
        return value

    @field_validator("clusters")
    @classmethod
    def _valid_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            if not KIND_NAME.match(name):
                raise ValueError(
                    f"{name!r} is not a kind cluster name (lower-case letters, digits, '.', '-')"
                )
        return value

    @classmethod
    def load(cls, **overrides: object) -> KindSettings:
        """Read the environment (and ``overrides``).

        Raises:
            mcruntime.SettingsError: one or more values are invalid; the message
                names each option, its variable and what is wrong with it.
        """
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as error:
            problems = []
            for detail in error.errors():
                field = str(detail["loc"][0]) if detail["loc"] else "settings"
                problems.append(f"{field} ({ENV_PREFIX}{field.upper()}): {detail['msg']}")
            raise mcr.SettingsError("invalid kind provider settings: " + "; ".join(problems)) from None
