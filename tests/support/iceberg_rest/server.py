#!/usr/bin/env python3
"""An Iceberg REST catalog for weir's tests. NOT FOR PRODUCTION.

A thin HTTP front (Iceberg REST OpenAPI spec, v1) over pyiceberg's own
SqlCatalog on a SQLite file: every requirement check, metadata update,
metadata file write and compare-and-swap is pyiceberg's code
(`SqlCatalog.create_table`, `SqlCatalog.commit_table`, ...). This file only
maps routes onto those calls, parses bodies with pyiceberg's own request
models, and maps exceptions to HTTP status codes. It exists because no real
REST catalog server installs here without containers.

    server.py [--host 127.0.0.1] --port 0 --db catalog.db --warehouse file:///tmp/x/lake
              [--prefix P]
              [--s3-endpoint http://127.0.0.1:9000 --s3-access-key K
               --s3-secret-key S --s3-region us-east-1]
              [--token T] [--client-id ID --client-secret S --token-ttl 3600]

Once listening it prints exactly one line, `listening on <port>`, to stdout.
Requests are logged to stderr.

Routes (without --prefix the `/{prefix}` part is absent):

    GET  /v1/config[?warehouse=..]         defaults, overrides (prefix), endpoints
    POST /v1/oauth/tokens                  OAuth2 client credentials (form-encoded)
    GET  /v1/{prefix}/namespaces[?parent=]  POST (create)
    GET  HEAD DELETE /v1/{prefix}/namespaces/{ns}
    POST /v1/{prefix}/namespaces/{ns}/properties
    GET  /v1/{prefix}/namespaces/{ns}/tables   POST (create; stage-create too)
    GET  HEAD DELETE /v1/{prefix}/namespaces/{ns}/tables/{table}
    POST /v1/{prefix}/namespaces/{ns}/tables/{table}   commit
    POST /v1/{prefix}/namespaces/{ns}/register
    POST /v1/{prefix}/tables/rename
    POST /v1/{prefix}/transactions/commit

Multi-level namespaces are joined by the unit separator (%1F) in the path.
Errors are `{"error": {"message", "type", "code"}}`: CommitFailedException
409, NoSuchTable/NoSuchNamespace 404, AlreadyExists and NamespaceNotEmpty
409, bad JSON or a request pyiceberg rejects as invalid 400, a missing,
wrong or expired token 401, anything else 500 with its message.

Auth: with neither --token nor --client-id every request is served. With
--token T, `Authorization: Bearer T` is required on /v1 routes (not on the
token route). With --client-id/--client-secret, POST /v1/oauth/tokens with
`grant_type=client_credentials&client_id=..&client_secret=..[&scope=..]`
(or the client in HTTP Basic auth) answers `{"access_token", "token_type":
"bearer", "expires_in", "issued_token_type"}`; an issued token is accepted
until its TTL has passed, then answered 401. Both may be given.

Test-only routes (never authenticated), for kill and uncertain-commit tests:

    POST /test/faults  {"commit_status": 503, "times": 1}
        The next `times` (default 1) commits (table commits and
        transactions/commit) are answered with that status and NOT applied.
    POST /test/faults  {"drop_answer_after_commit": 1}
        The next N commits are applied, then the connection is closed
        without an answer: the client cannot know whether it landed.
    POST /test/faults  {"hold_before_commit_ms": 5000}
        The next commit waits that long (outside the catalog lock) before
        it is applied: a request that reaches the catalog after its writer
        died.
    POST /test/faults  {"hold_answer_after_commit_ms": 5000}
        The next commit is applied, then its answer waits that long: a
        writer killed in between never learns that its commit landed.
        GET /test/faults says `holding` while a commit waits.
    POST /test/faults  {"reset": true}
        Clears every pending fault. Every answer is the pending faults
        (also GET /test/faults).
    GET  /test/commits
        Applied commits per table, `{"ns.table": n}` (namespace levels
        joined by "."), counting commits answered and commits whose answer
        was dropped; `POST .../tables` (create) is not a commit, a staged
        create's later commit is.

Concurrency: requests are served on threads, and every catalog call runs
under one lock (SQLite and the session handling are then simple). That lock
does not decide conflicts: a commit built on an old table state fails
because pyiceberg's own requirement checks (assert-ref-snapshot-id,
assert-table-uuid, ...) fail against the current metadata, exactly as in a
real catalog, and is answered 409. transactions/commit checks every table's
requirements before applying any, then commits table by table: only an I/O
failure half-way could leave part of it applied (SqlCatalog has no
multi-table commit).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import pydantic
from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationError as IcebergValidationError,
    ValidationException,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AssertCreate

# The separator of namespace levels in a path segment (the spec's default).
NAMESPACE_SEPARATOR = "\x1f"


class ApiError(Exception):
    """An error answered as the spec's ErrorModel."""

    def __init__(self, code: int, kind: str, message: str):
        super().__init__(message)
        self.code = code
        self.kind = kind
        self.message = message


class DropAnswer(Exception):
    """The commit was applied; close the connection without answering."""


# pyiceberg's exceptions, by the status and ErrorModel type a REST catalog
# answers them with (the types are the Java reference implementation's
# names, which clients match on). Order matters: first match wins.
ERROR_MAP = [
    (CommitFailedException, 409, "CommitFailedException"),
    (NoSuchTableError, 404, "NoSuchTableException"),
    (NoSuchNamespaceError, 404, "NoSuchNamespaceException"),
    (TableAlreadyExistsError, 409, "AlreadyExistsException"),
    (NamespaceAlreadyExistsError, 409, "AlreadyExistsException"),
    (NamespaceNotEmptyError, 409, "NamespaceNotEmptyException"),
    # Invalid requests: malformed JSON, a body pyiceberg's models reject,
    # an update pyiceberg refuses to apply (it raises ValueError where the
    # Java catalog raises IllegalArgumentException, answered 400 there too).
    (ValidationException, 400, "ValidationException"),
    (IcebergValidationError, 400, "ValidationException"),
    (pydantic.ValidationError, 400, "BadRequestException"),
    (ValueError, 400, "BadRequestException"),
    (NotImplementedError, 501, "NotImplementedException"),
]


class CommitShim:
    """What `SqlCatalog.commit_table` reads of the table it is handed: only
    its identifier. It loads the current table itself (inside the call, so
    the requirements are checked against what is current), and a table that
    does not exist yet (a staged create) has nothing else to hand."""

    def __init__(self, identifier: tuple[str, ...]):
        self._identifier = identifier

    def name(self) -> tuple[str, ...]:
        return self._identifier


class State:
    """The catalog, the lock around it, tokens, faults and counters."""

    def __init__(self, args: argparse.Namespace):
        properties = {
            "uri": "sqlite:///" + os.path.abspath(args.db),
            "warehouse": args.warehouse,
        }
        if args.s3_endpoint:
            properties["s3.endpoint"] = args.s3_endpoint
            # Path-style addressing, as moto and most local S3 servers need.
            properties["s3.force-virtual-addressing"] = "false"
        if args.s3_access_key:
            properties["s3.access-key-id"] = args.s3_access_key
        if args.s3_secret_key:
            properties["s3.secret-access-key"] = args.s3_secret_key
        if args.s3_region:
            properties["s3.region"] = args.s3_region
        self.catalog = SqlCatalog("weir_test", **properties)
        self.catalog_lock = threading.Lock()
        self.prefix = args.prefix.strip("/") if args.prefix else None

        self.static_token = args.token
        self.client_id = args.client_id
        self.client_secret = args.client_secret
        self.token_ttl = args.token_ttl
        self.issued: dict[str, float] = {}  # token -> expiry (monotonic)

        self.faults_lock = threading.Lock()
        self.commit_status: int | None = None
        self.commit_status_times = 0
        self.drop_answers = 0
        # Held commits, for kill tests: the next commit waits this long
        # before it is applied (`hold_before`), or is applied and then waits
        # this long before it is answered (`hold_after`); `holding` counts
        # the commits waiting right now.
        self.hold_before_ms = 0
        self.hold_after_ms = 0
        self.holding = 0
        self.commits: dict[str, int] = {}

    @property
    def auth_required(self) -> bool:
        return self.static_token is not None or self.client_id is not None

    def token_valid(self, token: str) -> bool:
        if self.static_token is not None and secrets.compare_digest(token, self.static_token):
            return True
        with self.faults_lock:
            expiry = self.issued.get(token)
            if expiry is not None and time.monotonic() >= expiry:
                del self.issued[token]
                expiry = None
        return expiry is not None

    def faults(self) -> dict:
        return {
            "commit_status": self.commit_status if self.commit_status_times else None,
            "times": self.commit_status_times,
            "drop_answer_after_commit": self.drop_answers,
            "hold_before_commit_ms": self.hold_before_ms,
            "hold_answer_after_commit_ms": self.hold_after_ms,
            "holding": self.holding,
        }

    def take(self, name: str) -> int:
        """Takes a pending hold (0 if none), counting it as holding."""
        with self.faults_lock:
            ms = getattr(self, name)
            if ms:
                setattr(self, name, 0)
                self.holding += 1
            return ms

    def hold(self, ms: int) -> None:
        try:
            time.sleep(ms / 1000)
        finally:
            with self.faults_lock:
                self.holding -= 1


def table_key(identifier: tuple[str, ...]) -> str:
    return ".".join(identifier)


def metadata_json(metadata) -> dict:
    # Serialized as pyiceberg writes the metadata file (by alias, nulls
    # left out), so the answer is the file's own content.
    return json.loads(metadata.model_dump_json())


def table_result(metadata_location: str | None, metadata) -> dict:
    result = {"metadata": metadata_json(metadata), "config": {}}
    if metadata_location is not None:
        result["metadata-location"] = metadata_location
    return result


def parse_namespace(segment: str) -> tuple[str, ...]:
    """A path segment (already percent-decoded) as namespace levels."""
    levels = tuple(segment.split(NAMESPACE_SEPARATOR))
    if not segment or any(not level for level in levels):
        raise ApiError(400, "BadRequestException", f"invalid namespace {segment!r}")
    return levels


def endpoints() -> list[str]:
    """What this server answers, as the config's `endpoints` list (so
    clients know HEAD and the multi-table commit are there). The spec
    writes them with a literal `{prefix}`, with or without a prefix."""
    base = "/v1/{prefix}"
    routes = [
        ("GET", "/namespaces"),
        ("POST", "/namespaces"),
        ("GET", "/namespaces/{namespace}"),
        ("HEAD", "/namespaces/{namespace}"),
        ("DELETE", "/namespaces/{namespace}"),
        ("POST", "/namespaces/{namespace}/properties"),
        ("GET", "/namespaces/{namespace}/tables"),
        ("POST", "/namespaces/{namespace}/tables"),
        ("GET", "/namespaces/{namespace}/tables/{table}"),
        ("HEAD", "/namespaces/{namespace}/tables/{table}"),
        ("POST", "/namespaces/{namespace}/tables/{table}"),
        ("DELETE", "/namespaces/{namespace}/tables/{table}"),
        ("POST", "/namespaces/{namespace}/register"),
        ("POST", "/tables/rename"),
        ("POST", "/transactions/commit"),
    ]
    return [f"{method} {base}{path}" for method, path in routes]


class Handler(BaseHTTPRequestHandler):
    # Keep-alive, as every REST client uses; every answer has a length.
    protocol_version = "HTTP/1.1"
    server_version = "weir-test-iceberg-rest"
    state: State  # set on the class by main()

    # --- plumbing -----------------------------------------------------------

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), format % args))

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def json_body(self, body: bytes):
        if not body:
            raise ApiError(400, "BadRequestException", "a JSON body is required")
        try:
            value = json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequestException", f"malformed JSON: {e}") from e
        if not isinstance(value, dict):
            raise ApiError(400, "BadRequestException", "the JSON body must be an object")
        return value

    def answer(self, code: int, body: dict | None = None, extra_headers: dict | None = None) -> None:
        data = b"" if body is None or self.command == "HEAD" else json.dumps(body).encode()
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        for name, value in (extra_headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def answer_error(self, code: int, kind: str, message: str, extra_headers: dict | None = None) -> None:
        self.answer(code, {"error": {"message": message, "type": kind, "code": code}}, extra_headers)

    def do_GET(self) -> None:
        self.dispatch()

    def do_HEAD(self) -> None:
        self.dispatch()

    def do_POST(self) -> None:
        self.dispatch()

    def do_DELETE(self) -> None:
        self.dispatch()

    def dispatch(self) -> None:
        # The body is read whatever the route, so the next request on a
        # kept-alive connection starts where it should.
        body = self.read_body()
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        # Split before decoding: a %2F inside a name is not a separator.
        segments = [unquote(s) for s in url.path.strip("/").split("/")] if url.path.strip("/") else []
        try:
            self.route(segments, query, body)
        except DropAnswer:
            self.log_message("fault: %s %s applied, connection closed without an answer", self.command, self.path)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except ApiError as e:
            self.answer_error(e.code, e.kind, e.message)
        except Exception as e:  # noqa: BLE001 (mapped to the spec's codes here)
            for kind_of, code, kind in ERROR_MAP:
                if isinstance(e, kind_of):
                    self.answer_error(code, kind, str(e))
                    return
            traceback.print_exc(file=sys.stderr)
            self.answer_error(500, type(e).__name__, f"{type(e).__name__}: {e}")

    # --- routes -------------------------------------------------------------

    def route(self, segments: list[str], query: dict, body: bytes) -> None:
        method = self.command
        if segments[:1] == ["test"]:
            return self.test_route(method, segments[1:], body)
        if segments[:1] != ["v1"]:
            raise ApiError(404, "NotFoundException", f"no route {method} {self.path}")
        rest = segments[1:]
        if rest == ["oauth", "tokens"] and method == "POST":
            return self.issue_token(body)
        self.authenticate()
        if rest == ["config"] and method == "GET":
            # `warehouse` is accepted and ignored: this server has one.
            overrides = {"prefix": self.state.prefix} if self.state.prefix else {}
            return self.answer(
                200, {"defaults": {}, "overrides": overrides, "endpoints": endpoints()}
            )
        if self.state.prefix is not None:
            if rest[:1] != [self.state.prefix]:
                raise ApiError(404, "NotFoundException", f"no route {method} {self.path} (prefix is {self.state.prefix})")
            rest = rest[1:]
        is_commit = method == "POST" and (
            (len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "tables")
            or rest == ["transactions", "commit"]
        )
        if is_commit:
            # Held outside the catalog lock: other requests go on meanwhile.
            ms = self.state.take("hold_before_ms")
            if ms:
                self.log_message("fault: %s %s held %d ms before it is applied", self.command, self.path, ms)
                self.state.hold(ms)
        self.deferred = None
        with self.state.catalog_lock:
            result = self.catalog_route(method, rest, query, body)
        if self.deferred is not None:
            status, payload, ms = self.deferred
            self.log_message("fault: %s %s applied, its answer held %d ms", self.command, self.path, ms)
            self.state.hold(ms)
            return self.answer(status, payload)
        return result

    def catalog_route(self, method: str, rest: list[str], query: dict, body: bytes) -> None:
        catalog = self.state.catalog
        n = len(rest)
        if rest == ["namespaces"]:
            if method == "GET":
                parent = parse_namespace(query["parent"]) if query.get("parent") else ()
                if parent and not catalog.namespace_exists(parent):
                    raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(parent)}")
                found = sorted(catalog.list_namespaces(parent))
                return self.answer(200, {"namespaces": [list(ns) for ns in found]})
            if method == "POST":
                request = self.json_body(body)
                namespace = request.get("namespace")
                if not isinstance(namespace, list) or not namespace or not all(
                    isinstance(level, str) and level for level in namespace
                ):
                    raise ApiError(400, "BadRequestException", "`namespace` must be a non-empty list of names")
                properties = request.get("properties") or {}
                catalog.create_namespace(tuple(namespace), {k: str(v) for k, v in properties.items()})
                stored = catalog.load_namespace_properties(tuple(namespace))
                return self.answer(200, {"namespace": namespace, "properties": stored})
        elif n >= 2 and rest[0] == "namespaces":
            namespace = parse_namespace(rest[1])
            if n == 2:
                if method in ("GET", "HEAD"):
                    properties = catalog.load_namespace_properties(namespace)
                    if method == "HEAD":
                        return self.answer(204)
                    return self.answer(200, {"namespace": list(namespace), "properties": properties})
                if method == "DELETE":
                    catalog.drop_namespace(namespace)
                    return self.answer(204)
            elif n == 3 and rest[2] == "properties" and method == "POST":
                request = self.json_body(body)
                summary = catalog.update_namespace_properties(
                    namespace, set(request.get("removals") or []), request.get("updates") or {}
                )
                return self.answer(
                    200, {"removed": summary.removed, "updated": summary.updated, "missing": summary.missing}
                )
            elif n == 3 and rest[2] == "tables":
                if method == "GET":
                    tables = sorted(catalog.list_tables(namespace))
                    return self.answer(
                        200, {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in tables]}
                    )
                if method == "POST":
                    return self.create_table(namespace, self.json_body(body))
            elif n == 3 and rest[2] == "register" and method == "POST":
                request = RegisterTableRequest.model_validate(self.json_body(body))
                if request.overwrite:
                    raise ApiError(501, "NotImplementedException", "register with overwrite is not supported")
                table = catalog.register_table(namespace + (request.name,), request.metadata_location)
                return self.answer(200, table_result(table.metadata_location, table.metadata))
            elif n == 4 and rest[2] == "tables":
                identifier = namespace + (rest[3],)
                if method in ("GET", "HEAD"):
                    # `snapshots=refs` may be asked; answering all is allowed.
                    table = catalog.load_table(identifier)
                    if method == "HEAD":
                        return self.answer(204)
                    return self.answer(200, table_result(table.metadata_location, table.metadata))
                if method == "DELETE":
                    if query.get("purgeRequested", "false").lower() == "true":
                        catalog.purge_table(identifier)
                    else:
                        catalog.drop_table(identifier)
                    return self.answer(204)
                if method == "POST":
                    return self.commit([(identifier, self.json_body(body))], single=True)
        elif rest == ["tables", "rename"] and method == "POST":
            request = self.json_body(body)
            try:
                source = tuple(request["source"]["namespace"]) + (request["source"]["name"],)
                destination = tuple(request["destination"]["namespace"]) + (request["destination"]["name"],)
            except (KeyError, TypeError) as e:
                raise ApiError(400, "BadRequestException", f"rename needs source and destination: {e}") from e
            catalog.rename_table(source, destination)
            return self.answer(204)
        elif rest == ["transactions", "commit"] and method == "POST":
            request = self.json_body(body)
            changes = request.get("table-changes")
            if not isinstance(changes, list) or not changes:
                raise ApiError(400, "BadRequestException", "`table-changes` must be a non-empty list")
            pairs = []
            for change in changes:
                ident = change.get("identifier") if isinstance(change, dict) else None
                if not isinstance(ident, dict) or "name" not in ident:
                    raise ApiError(400, "BadRequestException", "every table change needs an identifier")
                pairs.append((tuple(ident.get("namespace") or ()) + (ident["name"],), change))
            return self.commit(pairs, single=False)
        raise ApiError(404, "NotFoundException", f"no route {method} {self.path}")

    def create_table(self, namespace: tuple[str, ...], request: dict) -> None:
        catalog = self.state.catalog
        # pyiceberg's model has these as required-but-nullable; the spec
        # lets a client leave them out.
        for optional in ("location", "partition-spec", "write-order"):
            request.setdefault(optional, None)
        create = CreateTableRequest.model_validate(request)
        identifier = namespace + (create.name,)
        arguments = dict(
            schema=create.table_schema,
            location=create.location,
            partition_spec=create.partition_spec or UNPARTITIONED_PARTITION_SPEC,
            sort_order=create.write_order or UNSORTED_SORT_ORDER,
            properties=dict(create.properties),
        )
        if create.stage_create:
            # A staged create stores nothing: the client commits the table
            # later with `assert-create` and the same metadata as updates.
            if not catalog.namespace_exists(namespace):
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
            if catalog.table_exists(identifier):
                raise TableAlreadyExistsError(f"Table {'.'.join(identifier)} already exists")
            staged = catalog._create_staged_table(identifier, **arguments)  # noqa: SLF001 (pyiceberg's own staging)
            return self.answer(200, table_result(None, staged.metadata))
        table = catalog.create_table(identifier, **arguments)
        return self.answer(200, table_result(table.metadata_location, table.metadata))

    def commit(self, changes: list[tuple[tuple[str, ...], dict]], single: bool) -> None:
        """One table's commit (`single`) or a multi-table transaction."""
        catalog = self.state.catalog
        requests = []
        for identifier, body in changes:
            given = body.get("identifier")
            path_identifier = {"namespace": list(identifier[:-1]), "name": identifier[-1]}
            if given is None:
                body = {**body, "identifier": path_identifier}
            elif single and (list(given.get("namespace") or []), given.get("name")) != (
                path_identifier["namespace"],
                path_identifier["name"],
            ):
                raise ApiError(400, "BadRequestException", "the body's identifier is not the path's table")
            requests.append((identifier, CommitTableRequest.model_validate(body)))

        with self.state.faults_lock:
            status = None
            if self.state.commit_status_times > 0:
                self.state.commit_status_times -= 1
                status = self.state.commit_status
        if status is not None:
            self.log_message("fault: %s %s answered %d without being applied", self.command, self.path, status)
            kind = {503: "ServiceUnavailableException", 500: "ServerError", 502: "BadGateway", 504: "GatewayTimeout"}
            raise ApiError(status, kind.get(status, "InjectedFault"), f"injected fault: commit answered {status}")

        for identifier, request in requests:
            # The table must exist unless the commit creates it (a staged
            # create's `assert-create`); SqlCatalog would create it anyway.
            creates = any(isinstance(r, AssertCreate) for r in request.requirements)
            if not creates and not catalog.table_exists(identifier):
                raise NoSuchTableError(f"Table does not exist: {'.'.join(identifier)}")
            if creates and not catalog.namespace_exists(identifier[:-1]):
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(identifier[:-1])}")
        if not single:
            # All or nothing, as far as a catalog of single-table commits
            # allows: check every table's requirements (pyiceberg's checks)
            # before applying any. Under the catalog lock nothing moves in
            # between; only an I/O failure half-way would leave a part applied.
            for identifier, request in requests:
                current = None if not catalog.table_exists(identifier) else catalog.load_table(identifier).metadata
                for requirement in request.requirements:
                    requirement.validate(current)

        responses = []
        for identifier, request in requests:
            response = catalog.commit_table(CommitShim(identifier), request.requirements, request.updates)
            responses.append(response)
            with self.state.faults_lock:
                key = table_key(identifier)
                self.state.commits[key] = self.state.commits.get(key, 0) + 1

        with self.state.faults_lock:
            drop = self.state.drop_answers > 0
            if drop:
                self.state.drop_answers -= 1
        if drop:
            raise DropAnswer()
        if single:
            response = responses[0]
            payload = {"metadata-location": response.metadata_location, "metadata": metadata_json(response.metadata)}
            ms = self.state.take("hold_after_ms")
            if ms:
                # Answered once the catalog lock is released (`route`).
                self.deferred = (200, payload, ms)
                return None
            return self.answer(200, payload)
        return self.answer(204)

    # --- auth ---------------------------------------------------------------

    def authenticate(self) -> None:
        if not self.state.auth_required:
            return
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "NotAuthorizedException", "a bearer token is required")
        if not self.state.token_valid(token.strip()):
            raise ApiError(401, "NotAuthorizedException", "the bearer token is not valid or has expired")

    def issue_token(self, body: bytes) -> None:
        """OAuth2 client credentials (RFC 6749 4.4); errors in OAuth's own
        shape, `{"error", "error_description"}`."""

        def oauth_error(code: int, error: str, description: str) -> None:
            self.answer(code, {"error": error, "error_description": description})

        if self.state.client_id is None:
            return oauth_error(400, "unsupported_grant_type", "this server issues no tokens (no --client-id)")
        form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        if form.get("grant_type") != "client_credentials":
            return oauth_error(400, "unsupported_grant_type", f"grant_type {form.get('grant_type')!r}")
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        scheme, _, encoded = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "basic" and encoded:
            # client_secret_basic: the client in HTTP Basic auth.
            try:
                client_id, _, client_secret = base64.b64decode(encoded).decode().partition(":")
            except ValueError:
                return oauth_error(400, "invalid_request", "malformed Basic authorization")
            client_id, client_secret = unquote(client_id), unquote(client_secret)
        if not (
            client_id is not None
            and client_secret is not None
            and secrets.compare_digest(client_id, self.state.client_id)
            and secrets.compare_digest(client_secret, self.state.client_secret)
        ):
            return oauth_error(401, "invalid_client", "unknown client or wrong secret")
        token = secrets.token_urlsafe(24)
        with self.state.faults_lock:
            self.state.issued[token] = time.monotonic() + self.state.token_ttl
        answer = {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": self.state.token_ttl,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }
        if form.get("scope"):
            answer["scope"] = form["scope"]
        return self.answer(200, answer)

    # --- test-only ----------------------------------------------------------

    def test_route(self, method: str, rest: list[str], body: bytes) -> None:
        state = self.state
        if rest == ["faults"] and method == "POST":
            request = self.json_body(body)
            known = {
                "commit_status",
                "times",
                "drop_answer_after_commit",
                "hold_before_commit_ms",
                "hold_answer_after_commit_ms",
                "reset",
            }
            if set(request) - known:
                raise ApiError(400, "BadRequestException", f"unknown fault keys {sorted(set(request) - known)}")
            with state.faults_lock:
                if request.get("reset"):
                    state.commit_status, state.commit_status_times, state.drop_answers = None, 0, 0
                    state.hold_before_ms = state.hold_after_ms = 0
                if "commit_status" in request:
                    status = int(request["commit_status"])
                    if not 400 <= status <= 599:
                        raise ApiError(400, "BadRequestException", "commit_status must be a 4xx or 5xx status")
                    state.commit_status = status
                    state.commit_status_times = int(request.get("times", 1))
                if "drop_answer_after_commit" in request:
                    state.drop_answers = int(request["drop_answer_after_commit"])
                if "hold_before_commit_ms" in request:
                    state.hold_before_ms = int(request["hold_before_commit_ms"])
                if "hold_answer_after_commit_ms" in request:
                    state.hold_after_ms = int(request["hold_answer_after_commit_ms"])
                faults = state.faults()
            return self.answer(200, faults)
        if rest == ["faults"] and method == "GET":
            with state.faults_lock:
                return self.answer(200, state.faults())
        if rest == ["commits"] and method == "GET":
            with state.faults_lock:
                return self.answer(200, dict(sorted(state.commits.items())))
        raise ApiError(404, "NotFoundException", f"no test route {method} {self.path}")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Tests start many writers at once; the default backlog is 5.
    request_queue_size = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--db", required=True, help="the SQLite file of the catalog")
    parser.add_argument("--warehouse", required=True, help="file:///... or s3://bucket/...")
    parser.add_argument("--prefix", help="serve under /v1/PREFIX/ and say so in /v1/config")
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--s3-access-key")
    parser.add_argument("--s3-secret-key")
    parser.add_argument("--s3-region")
    parser.add_argument("--token", help="require Authorization: Bearer TOKEN")
    parser.add_argument("--client-id", help="issue tokens to this OAuth2 client")
    parser.add_argument("--client-secret")
    parser.add_argument("--token-ttl", type=int, default=3600, help="seconds an issued token is valid")
    args = parser.parse_args()
    if (args.client_id is None) != (args.client_secret is None):
        parser.error("--client-id and --client-secret go together")

    Handler.state = State(args)
    server = Server((args.host, args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
