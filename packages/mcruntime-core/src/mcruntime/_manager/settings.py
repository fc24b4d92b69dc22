"""Manager settings from the environment (``MCRUNTIME_*``), validated before anything starts.

In a pod, configuration comes from environment variables set in the
Deployment. A wrong value must fail at start with the variable's name, not
half an hour later inside a reconcile: :meth:`ManagerSettings.load` turns
pydantic's validation errors into one :class:`SettingsError` listing each bad
variable and what is wrong with it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .._base.errors import MCRuntimeError
from .._coordination.leaderelection import LeaderElectionConfig, lease_name_problem
from .._coordination.sharding import ShardedCoordinator, ShardingConfig
from .serving import EVERY_INTERFACE, bind_key, parse_address

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from .._webhook.options import WebhookOptions

ENV_PREFIX = "MCRUNTIME_"
MAX_SECONDS = 86_400.0
"""The longest any timing setting may be: a day. Longer is a typo (or ``inf``), and the
clocks and timers that take these values fail on absurd ones long after the start."""


def _seconds(default: float, description: str, *, zero: bool = False) -> Any:
    """A timing field: finite, above 0 (or at least 0 with ``zero``), and at most :data:`MAX_SECONDS`."""
    if zero:
        return Field(default=default, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description=description)
    return Field(default=default, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description=description)


class SettingsError(MCRuntimeError, ValueError):
    """One or more ``MCRUNTIME_*`` variables are invalid; the message names each."""


class ManagerSettings(BaseSettings):
    """Everything an operator tunes without code. Each field is ``MCRUNTIME_<FIELD>``."""

    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True
    )

    metrics_bind_address: str | None = Field(
        default=":8080", description="host:port, :port or [IPv6]:port for /metrics; empty disables"
    )
    health_probe_bind_address: str | None = Field(
        default=":8081",
        description="host:port, :port or [IPv6]:port for /healthz and /readyz; empty disables",
    )
    leader_election: bool = Field(default=False, description="elect one active replica with a Lease")
    leader_election_id: str = Field(default="mcruntime-leader", description="the Lease's name")
    leader_election_namespace: str = Field(default="default", description="the Lease's namespace")
    lease_duration: float = _seconds(15.0, "seconds a standby waits before taking over")
    renew_deadline: float = _seconds(10.0, "seconds a leader keeps trying to renew")
    retry_period: float = _seconds(2.0, "seconds between election attempts")
    sharding: bool = Field(
        default=False,
        description="split the clusters between replicas with Leases (instead of leader election)",
    )
    shard_group: str = Field(default="mcruntime", description="the shard group: Lease name prefix and label")
    shard_namespace: str = Field(default="default", description="where the shard Leases live")
    shard_weight: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="this replica's relative share of clusters"
    )
    shard_count: int = Field(
        default=256,
        ge=1,
        le=4096,
        description="how many shards (fence Leases) the fleet is split into; the same on every replica",
    )
    max_concurrent_reconciles: int = Field(
        default=1, ge=1, description="default concurrent reconciles per cluster (lane width) per controller"
    )
    max_total_reconciles: int = Field(
        default=256,
        ge=1,
        description="default bound on a controller's concurrent reconciles over all clusters",
    )
    keys_per_turn: int = Field(
        default=32,
        ge=1,
        description="default number of requests a cluster is handed in a row while others wait for a slot",
    )
    cache_sync_timeout: float = _seconds(
        60.0, "seconds a cluster's caches may take to sync (every cluster, every controller)"
    )
    graceful_shutdown_timeout: float = _seconds(30.0, "seconds in-flight reconciles get", zero=True)
    ready_min_share: float = Field(
        default=1.0, ge=0, le=1, allow_inf_nan=False, description="share of clusters that must be synced"
    )
    gc_freeze: bool = Field(
        default=True,
        description="after caches sync, move their objects out of the cyclic GC's reach (gc.freeze)",
    )
    webhook_bind_address: str | None = Field(
        default=None,
        description="host:port, :port or [IPv6]:port of the admission/conversion webhook server; "
        "empty: only if used",
    )
    webhook_cert_dir: str | None = Field(
        default=None, description="directory with tls.crt and tls.key; empty: a CA of the process's own"
    )
    webhook_url_host: str | None = Field(
        default=None, description="host the API servers call the webhooks at (default: the bind host)"
    )
    webhook_http2: bool = Field(
        default=True, description="offer HTTP/2 to the API servers calling the webhooks; false: HTTP/1.1 only"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO")
    log_format: Literal["text", "json"] = Field(default="text")
    event_loop: Literal["asyncio", "uvloop"] = Field(
        default="asyncio",
        description="the event loop `mcruntime run` runs on; uvloop needs the [uvloop] extra",
    )

    @field_validator("metrics_bind_address", "health_probe_bind_address", "webhook_bind_address")
    @classmethod
    def _bindable(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Checked with the other settings, so a malformed address is a bad setting at start
        # (exit 2, naming the flag or variable), not a traceback from the bind. The value is
        # kept as given: --check shows it, and the flags are exported as they were written.
        if value:
            try:
                parse_address(value)
            except ValueError as error:
                # "0" turns an endpoint off in controller-runtime: say what does here.
                off = "" if info.field_name == "webhook_bind_address" else "; empty disables"
                raise ValueError(f"{error}{off}") from None
        return value

    @field_validator("leader_election_id", "leader_election_namespace")
    @classmethod
    def _lease_name(cls, value: str, info: ValidationInfo) -> str:
        # Checked with the other settings, so a name the API server refuses is a bad setting at
        # start (exit 2, naming the flag or variable), not a replica that campaigns forever and
        # never leads. Only with leader election on, as the shard group only counts with sharding:
        # unused, they harm nothing. leader_election is declared, so validated, before these two.
        if info.data.get("leader_election"):
            problem = lease_name_problem(
                "name" if info.field_name == "leader_election_id" else "namespace", value
            )
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("shard_namespace")
    @classmethod
    def _shard_namespace(cls, value: str, info: ValidationInfo) -> str:
        # As the leader election's names: a namespace the API server refuses is a bad setting at
        # start, not replicas that campaign forever. Only with sharding on (declared before this).
        if info.data.get("sharding"):
            problem = lease_name_problem("namespace", value)
            if problem is not None:
                raise ValueError(problem.replace("the Lease's", "the shard Leases'"))
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        # --log-level takes debug or DEBUG; the variable must too, as the flag and it follow one rule.
        # A value that is no level stays as written, for the error to quote.
        if isinstance(value, str) and value.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"):
            return value.upper()
        return value

    @field_validator("event_loop")
    @classmethod
    def _loop_installed(cls, value: str) -> str:
        # Checked with the other settings, so a missing package is a bad setting at start
        # (exit 2, naming the flag or variable), not an ImportError after the target loaded.
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("uvloop is not installed: pip install 'mcruntime-core[uvloop]'")
        return value

    @model_validator(mode="after")
    def _lease_timing(self) -> ManagerSettings:
        if self.leader_election and self.sharding:
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION and {ENV_PREFIX}SHARDING are alternatives; set one"
            )
        if (self.leader_election or self.sharding) and not (
            self.lease_duration > self.renew_deadline > self.retry_period
        ):
            order = " > ".join(
                f"{ENV_PREFIX}{name}" for name in ("LEASE_DURATION", "RENEW_DEADLINE", "RETRY_PERIOD")
            )
            raise ValueError(f"{order} must hold")
        return self

    @model_validator(mode="after")
    def _distinct_ports(self) -> ManagerSettings:
        # /metrics and the probes may share an address (one server serves both); the webhook
        # server is HTTPS of its own, so an address it shares with them fails only at bind time.
        webhook = self.webhook_bind_address
        if not webhook:
            return self
        for name in ("metrics_bind_address", "health_probe_bind_address"):
            other = getattr(self, name)
            if other and _overlap(webhook, other):
                given = name in self.model_fields_set or f"{ENV_PREFIX}{name.upper()}" in os.environ
                default = "" if given else " (its default)"
                raise ValueError(
                    f"{ENV_PREFIX}WEBHOOK_BIND_ADDRESS {webhook!r} and {ENV_PREFIX}{name.upper()} "
                    f"{other!r}{default} are the same port: the webhook server needs one of its own"
                )
        return self

    def leader_election_config(self) -> LeaderElectionConfig | None:
        """The Lease to elect a leader on, when ``MCRUNTIME_LEADER_ELECTION`` is set."""
        if not self.leader_election:
            return None
        return LeaderElectionConfig(
            name=self.leader_election_id,
            namespace=self.leader_election_namespace,
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )

    def sharded_coordinator(self) -> ShardedCoordinator | None:
        """The coordinator sharing clusters among replicas, when ``MCRUNTIME_SHARDING`` is set."""
        if not self.sharding:
            return None
        return ShardedCoordinator(
            ShardingConfig(
                name=self.shard_group,
                namespace=self.shard_namespace,
                weight=self.shard_weight,
                shards=self.shard_count,
                lease_duration=self.lease_duration,
                renew_deadline=self.renew_deadline,
                retry_period=self.retry_period,
            )
        )

    def webhook_options(self) -> WebhookOptions | None:
        """The webhook server's options, when any ``MCRUNTIME_WEBHOOK_*`` variable is set."""
        given = (self.webhook_bind_address, self.webhook_cert_dir, self.webhook_url_host)
        if not any(given) and self.webhook_http2:
            return None
        from .._webhook.options import WebhookOptions

        address = WebhookOptions.address
        if self.webhook_bind_address:
            # WebhookOptions takes an IPv6 host bare (it splits at the last colon and
            # brackets the host in its URLs itself), so [::1]:9443 binds too.
            host, port = parse_address(self.webhook_bind_address)
            address = f"{host}:{port}"
        try:
            return WebhookOptions(
                address=address,
                cert_dir=self.webhook_cert_dir or None,
                url_host=self.webhook_url_host or None,
                http2=self.webhook_http2,
            )
        except ValueError as error:
            raise SettingsError(f"{ENV_PREFIX}WEBHOOK_BIND_ADDRESS: {error}") from None

    @classmethod
    def load(cls, **overrides: object) -> ManagerSettings:
        """Read the environment (and ``overrides``); raise :class:`SettingsError` naming bad variables."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as error:
            problems = []
            for detail in error.errors():
                field = ".".join(str(part) for part in detail["loc"])
                # The value too, as `mcruntime run` shows it: a variable set by a
                # template may not hold what its author thinks.
                problem = problem_of(detail)  # a check of several fields names them itself
                where = f"{ENV_PREFIX}{field.upper()}={detail['input']!r}: " if field else ""
                problems.append(where + problem)
            raise SettingsError("invalid manager settings: " + "; ".join(problems)) from None


def problem_of(detail: ErrorDetails) -> str:
    """What pydantic found wrong, in our words: a check of ours says it without pydantic's "Value error, "."""
    error = detail.get("ctx", {}).get("error")
    if detail["type"] == "value_error" and isinstance(error, ValueError):
        return str(error)
    return detail["msg"]


def misspelled_variables(environment: Mapping[str, str]) -> list[str]:
    """``MCRUNTIME_*`` variables that are no setting but nearly spell one, each with the one it resembles.

    pydantic-settings reads the variables it knows and passes over the rest,
    so ``MCRUNTIME_LEADER_ELECTON=true`` would run a replica without leader
    election, in silence. Only near misses are named: other ``MCRUNTIME_*``
    variables (the testbed's, the kind provider's) are someone else's.
    """
    known = [ENV_PREFIX + name.upper() for name in ManagerSettings.model_fields]
    found = []
    for name in sorted(environment):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                found.append(f"{name} is not a setting (did you mean {close[0]}?)")
    return found


_EVERY_INTERFACE = (EVERY_INTERFACE, "::")


def _overlap(first: str, second: str) -> bool:
    """Whether two validated addresses would bind the same port (port 0 never does)."""
    first_host, first_port = bind_key(first)
    second_host, second_port = bind_key(second)
    if first_port != second_port or first_port == 0:
        return False
    return first_host == second_host or first_host in _EVERY_INTERFACE or second_host in _EVERY_INTERFACE
