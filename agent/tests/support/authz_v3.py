"""InfluxDB 3's tokens and what each may do: the authorizer of the InfluxDB 3 stand-in (``support.fake_influx_v3``).

Stands in for the server's token catalog and authorizer, following ``influxdata/influxdb`` (3.10
nightly, d7834110) function by function. Short names: **P** = ``influxdb3_authz/src/permissions.rs``,
**L** = ``influxdb3_authz/src/lib.rs``, **A** = ``influxdb3_authz/src/authorizer.rs``, **C** =
``influxdb3_catalog/src/catalog/versions/v3/catalog.rs``, **N** =
``influxdb3_catalog/src/catalog/versions/v3/inner/enterprise.rs``.

* A token is stored by the SHA-512 of its string (L ``TokenAuthenticator::authenticate``); an expired
  one does not authenticate. Its string is ``apiv3_`` and 64 random bytes in unpadded URL-safe base64
  (``influxdb3_catalog/src/catalog.rs`` ``create_token_and_hash``), shown once, at creation.
* An admin token holds the one permission ``*:*:*`` (L ``TokenInfo::is_admin``), whose actions are
  every bit (P ``ADMIN_ACTIONS_BITMAP``).
* A resource token's permissions are specs ``{"resource_type", "resource_names", "actions"}`` checked by
  C ``validate_permission_specs``: the type ``db`` or ``system`` (``*`` only for admin tokens); names
  resolved to ids by N ``resource_name_to_id`` (a database that does not exist, a system name other than
  ``health``, ``metrics``, ``ping``, ``ready``, or ``*`` mixed with names is refused); actions through
  P ``DatabaseActions::new`` (``create``, ``describe``, ``read``, ``write``, ``delete``) or
  ``SystemActions::new`` (``read``). Each name becomes its own key whose action bits are OR-ed (P
  ``TokenPermissions::add_permission``), bound to the database's *id*: a database dropped and made
  again under the same name is not the token's any more.
* A request is allowed by P ``TokenPermissions::is_allowed_access`` after A ``authorize_action``:
  the exact key, else ``<type>:*``, else ``*:*`` (``get_permission``), and every requested bit held
  (``DatabaseActions::is_allowed``); a database that does not exist yet matches only ``db:*`` or
  ``*:*`` (``get_permission_without_resource_identifier``); any request on ``_internal`` (id 0) needs
  the admin token (A ``_INTERNAL_DB_ID``).

Where it differs: which request each HTTP endpoint of Enterprise asks for is in Enterprise's own
``http.rs``, not in the public source. The stand-in asks what the public code and InfluxData's docs
say (writes: ``write`` on the database; InfluxQL: ``read`` through ``core/iox_v1_query_api``'s
handler, ``describe`` for ``SHOW DATABASES``; ``/ping`` and ``/health``: ``system:ping:read`` and
``system:health:read``, docs ``content/shared/identify-version.md``), ``read`` for SQL queries, and
the admin token for everything else gpulse calls (databases, plugins, triggers, request triggers,
tokens), which may be stricter than the server, never more lenient.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

# P DatabaseActions (only these five can be granted: DatabaseActions::new)
CREATE, DESCRIBE, UPDATE, DROP, READ, WRITE, DELETE = (1 << i for i in range(7))
DATABASE_ACTIONS = {"create": CREATE, "describe": DESCRIBE, "read": READ, "write": WRITE, "delete": DELETE}
SYSTEM_READ = 1  # P SystemActions::READ
#: P SystemResourceIdentifier (N resource_name_to_id lower-cases and trims the name)
SYSTEM_RESOURCES = {"health": 0, "metrics": 1, "ping": 2, "ready": 3}
ADMIN_BITS = 0xFFFF  # P ADMIN_ACTIONS_BITMAP = ActionsBitmap::MAX
WILDCARD = "*"
INTERNAL_DB_ID = 0  # A _INTERNAL_DB_ID
ADMIN_NAME = "_admin"  # the operator token's name (DEFAULT_OPERATOR_TOKEN_NAME)


class CannotParsePermission(Exception):
    """C ``CatalogError::CannotParsePermissionForToken``: ``cannot parse token permission, <why>``."""

    def __init__(self, why: str) -> None:
        super().__init__(f"cannot parse token permission, {why}")


@dataclass(frozen=True)
class Key:
    """P ``PermissionKey``: a resource type (``db``, ``system``, ``*``) and one identifier (an id or ``*``)."""

    resource_type: str
    identifier: int | str


@dataclass(frozen=True)
class Request:
    """L ``AccessRequest``, the variants gpulse's calls meet: ``database`` (``MaybeDatabase``: None when the
    database does not exist yet), ``system`` (an id of :data:`SYSTEM_RESOURCES`), or ``admin``."""

    kind: str
    resource: int | None = None
    actions: int = 0

    @staticmethod
    def database(db_id: int | None, actions: int) -> Request:
        return Request("database", db_id, actions)

    @staticmethod
    def system(name: str) -> Request:
        return Request("system", SYSTEM_RESOURCES[name], SYSTEM_READ)

    @staticmethod
    def admin() -> Request:
        return Request("admin")


@dataclass
class Token:
    """L ``TokenInfo``: the hash (never the string), its expiry, and its permissions as P keeps them."""

    id: int
    name: str
    hash: bytes
    created_at_ms: int
    expiry_ms: int | None
    grants: dict[Key, int] = field(default_factory=dict)
    #: the permissions as given, ``type:names:actions`` each (what ``system.tokens`` lists)
    text: str = "*:*:*"

    def expired(self, now_ms: int) -> bool:
        return self.expiry_ms is not None and self.expiry_ms <= now_ms

    def allows(self, request: Request) -> bool:
        """A ``authorize_action`` for a token subject, then P ``is_allowed_access``."""
        if request.kind == "database" and request.resource == INTERNAL_DB_ID:
            return self.allows(Request.admin())
        if request.kind == "admin":
            return self.grants.get(Key(WILDCARD, WILDCARD)) == ADMIN_BITS
        rtype = "db" if request.kind == "database" else "system"
        if request.resource is None:  # get_permission_without_resource_identifier
            held = self.grants.get(Key(rtype, WILDCARD), self.grants.get(Key(WILDCARD, WILDCARD)))
        else:  # get_permission: exact, then <type>:*, then *:*
            held = self.grants.get(Key(rtype, request.resource))
            if held is None:
                held = self.grants.get(Key(rtype, WILDCARD), self.grants.get(Key(WILDCARD, WILDCARD)))
        return held is not None and (held & request.actions) == request.actions


def new_token_string() -> str:
    """``create_token_and_hash``: ``apiv3_`` + 64 random bytes, URL-safe base64 without padding."""
    return "apiv3_" + base64.urlsafe_b64encode(secrets.token_bytes(64)).decode().rstrip("=")


def token_hash(token: str) -> bytes:
    """``compute_token_hash``: SHA-512 of the string."""
    return hashlib.sha512(token.encode()).digest()


def admin_token(token_id: int, token: str, created_at_ms: int) -> Token:
    return Token(token_id, ADMIN_NAME, token_hash(token), created_at_ms, None, {Key(WILDCARD, WILDCARD): ADMIN_BITS})


def grants_from_specs(specs: list[dict], db_id: Callable[[str], int | None]) -> tuple[dict[Key, int], str]:
    """C ``validate_permission_specs`` and P ``add_permission``: the keys and their bits, and the text of the
    permissions; :class:`CannotParsePermission` with the catalog's words for a spec it refuses."""
    grants: dict[Key, int] = {}
    texts = []
    for spec in specs:
        rtype, names, actions = spec["resource_type"], list(spec["resource_names"]), list(spec["actions"])
        if rtype == WILDCARD:
            raise CannotParsePermission("* resource type can only be set for admin token")
        if rtype not in ("db", "system"):  # P ResourceType::from_str
            raise CannotParsePermission(f"resource type not supported {rtype}")
        if WILDCARD in names and any(n != WILDCARD for n in names):
            raise CannotParsePermission("mixed wildcard (*) and resource name")
        ids: list[int | str] = [WILDCARD] if WILDCARD in names else [_resource_id(rtype, n, db_id) for n in names]
        bits = 0
        for action in actions:
            if rtype == "db" and action in DATABASE_ACTIONS:
                bits |= DATABASE_ACTIONS[action]
            elif rtype == "system" and action == "read":
                bits |= SYSTEM_READ
            else:
                kind = "database" if rtype == "db" else "system"
                raise CannotParsePermission(f"action not supported, {kind} action {action}")
        for ident in ids:
            key = Key(rtype, ident)
            grants[key] = grants.get(key, 0) | bits
        texts.append(f"{rtype}:{','.join(names)}:{','.join(actions)}")
    return grants, ", ".join(texts)


def _resource_id(rtype: str, name: str, db_id: Callable[[str], int | None]) -> int:
    """N ``resource_name_to_id``: a database's id, or a system resource's."""
    found = db_id(name) if rtype == "db" else SYSTEM_RESOURCES.get(name.lower().strip())
    if found is None:
        raise CannotParsePermission(f"invalid resource name {name}")
    return found
