"""The estate as IT writes it (estate.md), as pydantic models with unknown fields forbidden.

These models are the single source of the estate's shape: the compiler validates with them
and ``schemas/estate.schema.json`` is generated from them, so an editor and the compiler can
never disagree. Amounts are parsed straight to integer thousandths, durations to seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    model_validator,
)

from . import units

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$"
DURATION_PATTERN = r"^\d+(s|m|h|d|w)?$"


def _amount(what: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, str) or isinstance(value, bool):
            raise ValueError(f"{what} must be a number such as 0.25, 1 or 8, found {value!r}")
        return units.to_milli(value, what)

    return parse


def _duration(value: Any) -> int:
    return units.parse_duration(value)


def _time(value: Any) -> str:
    return units.time_str(units.parse_time(value))


def _money(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise ValueError("a price must be a number")
    d = units.to_decimal(value)
    if d < 0:
        raise ValueError(f"a price must be >= 0, found {d}")
    return d


_NUMBER_SCHEMA = {"type": "number", "minimum": 0}

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case name: a-z, 0-9, -")]
User = Annotated[str, Field(pattern=USER_PATTERN, description="a user identity")]
HANDLE_PATTERN = (
    r"^(@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:/[A-Za-z0-9._-]+)?"
    r"|[^@\s]+@[^@\s]+)$"
)
Handle = Annotated[
    str,
    Field(
        pattern=HANDLE_PATTERN,
        description="a forge handle as CODEOWNERS writes it: @user, @org/team or an email",
    ),
]
GpuAmount = Annotated[
    int,
    BeforeValidator(_amount("a GPU amount")),
    WithJsonSchema(
        {**_NUMBER_SCHEMA, "description": "GPUs: a decimal >= 0 with at most 3 decimal places"}
    ),
]
Weight = Annotated[
    int,
    BeforeValidator(_amount("a time weight")),
    WithJsonSchema(
        {**_NUMBER_SCHEMA, "description": "budget hours per hour of one task, at most 3 decimals"}
    ),
]
Hours = Annotated[
    int,
    BeforeValidator(_amount("budget hours")),
    WithJsonSchema({**_NUMBER_SCHEMA, "description": "budget hours, at most 3 decimals"}),
]
LendWeight = Annotated[
    int,
    BeforeValidator(_amount("a lend weight")),
    WithJsonSchema(
        {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "a level's weight in fair lending (lending.md): above 0, "
            "at most 3 decimals; default 1",
        }
    ),
]
Fraction = Annotated[
    int,
    BeforeValidator(_amount("an alert fraction")),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
]
Duration = Annotated[
    int,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "integer", "minimum": 0},
            ],
            "description": "30s, 15m, 2h, 1d, 1w or a number of seconds",
        }
    ),
]
Time = Annotated[
    str,
    BeforeValidator(_time),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339, UTC, e.g. 2026-01-01T00:00:00Z",
        }
    ),
]
Money = Annotated[
    Decimal,
    BeforeValidator(_money),
    WithJsonSchema({**_NUMBER_SCHEMA, "description": "price per GPU-hour"}),
]
Labels = dict[str, str]
PoolKind = Literal["kubernetes", "baremetal", "hpc", "cloud"]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=False
    )


class _Named(_Model):
    name: Name
    description: str | None = Field(None, description="free text for people (extension)")
    renamed_from: Name | None = Field(
        None, description="the old name: `kliqued plan` shows a rename (extension)"
    )


Audience = Literal["admins", "it"]


def _everyone() -> list[Audience]:
    return ["admins", "it"]


class AlertChannel(_Model):
    """Where alerts go: a generic JSON webhook (signed), a Slack-compatible incoming webhook,
    or e-mail over SMTP. Secrets are named (an environment variable or a file), never written
    here, so the estate can live in git."""

    name: Name
    kind: Literal["webhook", "slack", "email"]
    url: str | None = Field(None, description="webhook and slack: the URL to POST to")
    secret_env: str | None = Field(
        None, description="webhook: the environment variable holding the HMAC-SHA256 key"
    )
    secret_file: str | None = Field(
        None, description="webhook: the file holding the HMAC-SHA256 key"
    )
    smtp_host: str | None = Field(None, description="email: the SMTP server")
    smtp_port: Annotated[int, Field(ge=1, le=65535)] = 25
    sender: str | None = Field(None, description="email: the From address")
    to: list[Audience] = Field(
        default_factory=_everyone,
        description="who this channel speaks to: the policy's group admins, IT, or both",
    )
    timeout: Duration = Field(
        "10s", validate_default=True, description="each delivery attempt's time limit"
    )

    @model_validator(mode="after")
    def _complete(self) -> "AlertChannel":
        if self.kind in ("webhook", "slack") and not self.url:
            raise ValueError(f"channel '{self.name}': a {self.kind} channel needs 'url'")
        if self.kind == "email" and not (self.smtp_host and self.sender):
            raise ValueError(
                f"channel '{self.name}': an email channel needs 'smtp_host' and 'sender'"
            )
        if self.kind != "webhook" and (self.secret_env or self.secret_file):
            raise ValueError(f"channel '{self.name}': only a webhook channel is signed")
        if self.secret_env and self.secret_file:
            raise ValueError(f"channel '{self.name}': give secret_env or secret_file, not both")
        return self


class Alerts(_Model):
    channels: list[AlertChannel] = Field(default_factory=list)
    contacts: dict[User, str] = Field(
        default_factory=dict,
        description="estate user -> e-mail address (or chat handle): "
        "where a group admin's alerts are addressed",
    )
    it: list[str] = Field(
        default_factory=list, description="IT's addresses: every alert goes to them"
    )
    waiting_after: Duration | None = Field(
        None,
        description="alert when the head of a queue, never placed yet, has waited this "
        "long since its submission (once per task); absent: no waiting alerts",
    )


class Attribution(_Model):
    reserved_idle: Literal["group", "overhead"] = Field(
        "overhead",
        description="who pays for reserved GPUs nobody used: the reserving "
        "group (a line on its statement) or the overhead account",
    )
    overhead_account: Name = Field(
        "overhead", description="the name idle capacity is charged to in reports"
    )
    borrowed: Literal["borrower", "split"] = Field(
        "borrower",
        description="who pays for borrowed GPU-hours that ran on GPUs other "
        "groups reserved and left idle (lent): the borrower, or split half and half between "
        "the borrower and the lenders (docs/ledger.md)",
    )
    lost_work: Literal["owner", "taker", "overhead"] = Field(
        "owner",
        description="who pays for the GPU-hours a reclaim or rebalance threw away "
        "(lending.md's lost work): the preempted task's group (owner: as its usage already "
        "bills it), the group that took the GPUs back (taker: the owner is credited, the taker "
        "billed), or the overhead account (the owner is credited) (docs/ledger.md)",
    )


class Lending(_Model):
    """lending.md: every part opt-in; the defaults keep engine.md's rules."""

    order: Literal["ordered", "fair"] = Field(
        "ordered",
        description="phase 3 (lend): ordered = engine.md's order among competitors; "
        "fair = the lowest share of borrowed GPUs per lend_weight first, and phase 4 "
        "rebalances borrowed work between borrowers",
    )
    protect_for: Duration = Field(
        0,
        description="borrowed work younger than this (since its current placement) is not "
        "taken back by a reclaim or rebalance; 0s = no protection",
    )
    victims: Literal["newest", "least_lost_work"] = Field(
        "newest",
        description="the order reclaim and rebalance choose victims in: newest "
        "placement first, or least work lost since the last checkpoint first",
    )


ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""The signatures an identity provider may use: asymmetric only. ``none`` and the HMAC
algorithms (HS*) are not expressible, so no estate can accept an unsigned token or one
signed with a secret the daemon would have to share."""
Algorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]
CLAIM_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$"
Claim = Annotated[str, Field(pattern=CLAIM_PATTERN, description="a JWT claim name")]
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _issuer(value: Any) -> str:
    """An issuer is an https URL (OpenID Connect Discovery 1.0, section 3); plain http only
    on the loopback, for a provider on the same machine (development, the tests)."""
    if not isinstance(value, str):
        raise ValueError(f"an issuer must be a URL, found {value!r}")
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        host = None
    if not host or parts.query or parts.fragment or " " in value:
        raise ValueError(
            f"{value!r} is not an issuer URL: write it as the provider's tokens carry it in "
            "'iss', such as https://login.example.org/realms/research"
        )
    if parts.scheme == "http" and host in _LOOPBACK_HOSTS:
        return value
    if parts.scheme != "https":
        raise ValueError(
            f"issuer {value!r} must use https (http is accepted only on 127.0.0.1, localhost "
            "or ::1)"
        )
    return value


Issuer = Annotated[
    str,
    BeforeValidator(_issuer),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^(https://|http://(127\.0\.0\.1|localhost|\[::1\])[:/])[^ ?#]+$",
            "description": "the provider's issuer URL, exactly as its tokens' 'iss' (https; "
            "http only on the loopback)",
        }
    ),
]
Audience_ = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\s]+$",
        description="the value the tokens' 'aud' must contain",
    ),
]


def _default_algorithms() -> list[Algorithm]:
    return ["RS256", "ES256"]


class _Issued(_Model):
    """What every trusted issuer has: where its keys are, what its tokens must say."""

    name: Name = Field(description="the provider's name in the audit log and the dashboard")
    issuer: Issuer
    audience: Audience_
    algorithms: list[Algorithm] = Field(
        default_factory=_default_algorithms,
        min_length=1,
        description="the signature algorithms accepted (never none or HS*)",
    )
    leeway: Duration = Field(
        "60s",
        validate_default=True,
        description="clock skew allowed on exp, nbf and iat (at most 5m)",
    )


class PeopleProvider(_Issued):
    """A site's identity provider for people (Keycloak, Entra ID, Okta, Google, Dex): it
    says who someone is; what they may do stays in this estate (groups and roles)."""

    client_id: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="the public client (PKCE) the dashboard and kliqued login use; "
        "default: the audience",
    )
    user_claim: Claim = Field(
        "preferred_username",
        description="the claim whose value is the estate user (or is mapped by 'users'): "
        "preferred_username, email, upn, ...",
    )
    users: dict[User, Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=dict,
        description="estate user -> their value of user_claim, where the two differ "
        "(alice: a.smith@example.org); a value not listed is the user's own name",
    )
    scopes: list[Annotated[str, Field(pattern=r"^[!-~]+$")]] = Field(
        default_factory=lambda: ["openid", "profile", "email"],
        description="the scopes the dashboard and kliqued login ask for",
    )


class WorkloadIssuer(_Issued):
    """A CI system's token service (GitHub Actions, GitLab): a job whose ID token matches
    every claim condition acts as ``role``, with no stored secret."""

    claims: dict[Claim, Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        description="claim -> the value it must have; a value ending in '*' matches by prefix "
        "(ref: refs/heads/release-*). At least one, and name the repository or project: an "
        "issuer like GitHub's signs tokens for every repository on it"
    )
    role: Literal["planner"] = Field(
        "planner",
        description="the principal a matching job acts as (planner: read-only, for "
        "kliqued plan --against)",
    )


class Roles(_Model):
    """Who holds a platform role when they sign in through a provider: reviewed in git like
    any change. Department heads are the groups' ``admins`` (groups.yaml), not a role here."""

    admin: list[User] = Field(default_factory=list, description="platform admins")
    finance: list[User] = Field(default_factory=list, description="the ledger's readers")
    planner: list[User] = Field(
        default_factory=list, description="people who may read the plan state (as CI does)"
    )


class Identity(_Model):
    """Sign-in with the organisation's identity (extension; docs/identity.md)."""

    providers: list[PeopleProvider] = Field(
        default_factory=list, description="identity providers people sign in with"
    )
    workloads: list[WorkloadIssuer] = Field(
        default_factory=list, description="CI token services trusted for jobs"
    )
    roles: Roles = Field(default_factory=Roles)
    token_lifetime: Duration = Field(
        "8h",
        validate_default=True,
        description="how long the Klique token made at a sign-in (dashboard, kliqued login) "
        "lives; kliqued login renews it (at most 7d)",
    )


class Settings(_Model):
    pass_interval: Duration = Field(
        "1s", validate_default=True, description="how often the engine runs a pass"
    )
    low_watermark: Duration = Field(
        "15m", validate_default=True, description="default start check for every budget"
    )
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] = "EUR"
    approvers: list[User] | None = Field(
        default=None,
        description="who approves changes to shared objects (pools, profiles, prices, "
        "settings) in `kliqued plan` and CODEOWNERS; default: the admins of each top group "
        "with groups below it "
        "(extension)",
    )
    forge_handles: dict[User, Handle] = Field(
        default_factory=dict,
        description="estate user -> forge handle (@user, @org/team or "
        "an email), for `kliqued codeowners` and the plan's approvals (extension)",
    )
    start_timeout: Duration = Field(
        "10m",
        validate_default=True,
        description="a placed task no worker has taken within this long goes back to the "
        "front of its queue; 0 = never (extension)",
    )
    alerts: Alerts | None = Field(
        None, description="alert channels and their recipients (extension; docs/alerts.md)"
    )
    attribution: Attribution | None = Field(
        None, description="who pays for idle capacity (extension; docs/ledger.md)"
    )
    lending: Lending | None = Field(
        None,
        description="protection of young borrowed work, least lost work first and "
        "fair shares between borrowers (lending.md)",
    )
    identity: Identity | None = Field(
        None,
        description="sign-in through identity providers for people and CI token services "
        "for jobs (extension; docs/identity.md)",
    )


Amount = Annotated[
    Decimal,
    BeforeValidator(_money),
    WithJsonSchema({**_NUMBER_SCHEMA, "description": "an amount in settings.currency"}),
]
NodeHourPrice = Annotated[
    Decimal,
    BeforeValidator(_money),
    WithJsonSchema({**_NUMBER_SCHEMA, "description": "price of one node for one hour"}),
]


class NodePrice(_Model):
    """What one cloud node of an instance type costs an hour: the provider's price table,
    in the estate so that cloud spend is known and capped (extension)."""

    instance_type: Annotated[
        str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    ]
    on_demand: NodeHourPrice
    spot: NodeHourPrice | None = Field(
        None, description="the spot price to count; unset: spot nodes count at on_demand"
    )


class Autoscale(_Model):
    max: GpuAmount
    idle_timeout: Duration = Field("10m", validate_default=True)
    spot_first: bool = True
    spend_cap: Amount | None = Field(
        None,
        description="cloud spend per UTC calendar month, in settings.currency, past "
        "which the autoscaler adds no node (extension; docs/autoscaling.md)",
    )
    node_prices: list[NodePrice] = Field(
        default_factory=list,
        description="price per node-hour by instance type; a node of a type not listed "
        "costs its GPUs x the pool gpu_type's per_gpu_hour (extension)",
    )


class NodeGroup(_Model):
    """Nodes of one shape behind a pool (issue 15): ``count`` machines of ``gpus`` each."""

    count: Annotated[int, Field(ge=1, le=100_000)]
    gpus: GpuAmount


class Pool(_Named):
    kind: PoolKind
    capacity: GpuAmount | None = Field(
        None, description="declared GPUs; a cloud pool with autoscale uses autoscale.max"
    )
    gpu_type: Name
    gpu_memory_gb: Annotated[int, Field(ge=0)] | None = None
    generation: int | None = None
    labels: Labels = Field(default_factory=dict)
    execution_order: list[Name] | None = None
    autoscale: Autoscale | None = None
    start_timeout: Duration | None = Field(
        None,
        description="this pool's start timeout, else settings.start_timeout: longer "
        "where a start waits for a node to boot (extension)",
    )
    settings: dict[str, str] = Field(
        default_factory=dict, description="executor settings for the pool's workers (extension)"
    )
    nodes: NodeGroup | list[NodeGroup] | None = Field(
        None,
        description="the machines behind the pool: {count, gpus} or a list of them; "
        "a task must fit one node (or, with a profile's nodes: N, N nodes) "
        "(extension)",
    )

    def node_groups(self) -> list[NodeGroup]:
        if self.nodes is None:
            return []
        return list(self.nodes) if isinstance(self.nodes, list) else [self.nodes]


class FromTask(_Model):
    from_task: Literal["gpus"]
    default: GpuAmount = Field(1, validate_default=True)
    max: GpuAmount


class PoolsBy(_Model):
    min_gpu_memory_gb: Annotated[int, Field(ge=0)] | None = None
    min_generation: int | None = None
    labels: Labels = Field(default_factory=dict)
    kinds: list[PoolKind] | None = None
    gpu_types: list[Name] | None = None


def _size_tag(value: Any) -> str:
    return "from_task" if isinstance(value, dict) else "fixed"


GpuSize = Annotated[
    Union[Annotated[FromTask, Tag("from_task")], Annotated[GpuAmount, Tag("fixed")]],
    Discriminator(_size_tag),
]


class IdleLimits(_Model):
    """The idle limits of the sessions sent to a profile (``kliqued session start``): IT's
    ceiling, which a session may lower and never raise (docs/channels.md, "Sessions")."""

    wall: Duration | None = Field(None, description="a session's longest life, idle or not")
    cpu: Duration | None = Field(
        None, description="stopped after this long with its processes below 5% of one core"
    )
    gpu: Duration | None = Field(
        None, description="stopped after this long with its GPUs unused (from nvidia-smi)"
    )
    network: Duration | None = Field(
        None,
        description="stopped after this long with under "
        "1 KiB/s of traffic (its own network namespace)",
    )


class Profile(_Named):
    gpus: GpuSize
    time_weight: Weight = Field(1, validate_default=True)
    pools: list[Name] | None = None
    pools_by: PoolsBy | None = None
    policies: list[Name] = Field(default_factory=list)
    queueing: Literal["strict", "best_effort"] = "strict"
    nodes: Annotated[int, Field(ge=1, le=1024)] = Field(
        1,
        description="a gang over this many nodes, the task's GPUs split evenly between "
        "them, all placed or none (extension)",
    )
    idle: IdleLimits | None = Field(
        None, description="idle limits of the sessions on this profile (extension)"
    )


class Budget(_Model):
    hours: Hours
    period: Literal["day", "week", "month"]
    low_watermark: Duration | None = None
    alert_at: list[Fraction] = Field(default_factory=list)


class PoolsAllowed(_Model):
    labels: Labels = Field(default_factory=dict)
    pools: list[Name] | None = Field(None, description="pool names (extension)")


class Policy(_Named):
    group: Name
    reservation: GpuAmount = 0
    limit: GpuAmount
    budget: Budget | None = None
    pools_allowed: PoolsAllowed | None = Field(
        None,
        description="pools the group's work may use; on an envelope (the policy of a "
        "group with groups below it) it binds every profile of every policy below",
    )
    user_limit: GpuAmount | None = Field(
        None, description="most GPUs one user of the group holds at once (not on an envelope)"
    )
    lend_weight: LendWeight | None = Field(
        None,
        description="with settings.lending.order fair: this level's weight in sharing "
        "borrowed GPUs (its share is borrowed / lend_weight); default 1",
    )
    protect_for: Duration | None = Field(
        None,
        description="this policy's borrowed work is protected this long after its "
        "placement, instead of settings.lending.protect_for (not on an envelope)",
    )


class Group(_Named):
    parent: Name | None = None
    users: list[User] = Field(default_factory=list)
    admins: list[User] = Field(default_factory=list)
    projects: list[Name] = Field(default_factory=list)
    project_priority: bool = Field(
        False,
        description="queue the group's work by the position of its project in "
        "'projects', earlier first (needs 'projects')",
    )


class Price(_Model):
    gpu_type: Name
    per_gpu_hour: Money
    effective_from: Time
    list_per_gpu_hour: Money | None = Field(
        None,
        description="the provider's list price when per_gpu_hour is a contracted "
        "(committed-use) price below it; default: per_gpu_hour (extension; the FOCUS "
        "export's ListUnitPrice)",
    )


SECTIONS: dict[str, type[_Model]] = {
    "pools": Pool,
    "profiles": Profile,
    "policies": Policy,
    "groups": Group,
    "pricing": Price,
}
"""Top-level list sections and the model of one item; ``settings`` and ``version`` aside."""

KIND_OF_SECTION = {
    "pools": "pool",
    "profiles": "profile",
    "policies": "policy",
    "groups": "group",
    "pricing": "price",
}


class EstateFile(_Model):
    """One file of the estate: every section optional, lists merged across files. Used for
    the JSON Schema; the compiler validates item by item to report every error."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        title="Klique estate file",
        json_schema_extra={"$id": "https://klique.dev/schemas/estate.schema.json"},
    )
    version: Literal[1] | None = None
    settings: Settings | None = None
    pools: list[Pool] = Field(default_factory=list)
    profiles: list[Profile] = Field(default_factory=list)
    policies: list[Policy] = Field(default_factory=list)
    groups: list[Group] = Field(default_factory=list)
    pricing: list[Price] = Field(default_factory=list)
