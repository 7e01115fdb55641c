"""Official Python SDK (mcp 2.x) OAuth client for scenario m (m-py-oauth.mjs drives it).

The SDK's OAuthClientProvider (an httpx2.Auth) does discovery (401 -> protected resource
metadata -> authorization server metadata), dynamic registration, authorization with PKCE
and the token request; its redirect_handler here is a headless GET of the authorization URL
whose redirect carries the code, and its callback_handler hands that code back. Then, on
one session (mode="legacy": initialize handshake, Mcp-Session-Id): tools/list, a tool call
with progress, a wait past the access token's lifetime, and a call that the provider must
precede with a refresh (it refreshes before a request once its token has expired), still on
the same session. Finally a second user (another registered client) and his token on the
first user's session, raw.

One JSON line per event on stdout.

usage: python py_oauth_client.py URL ACCESS_TTL_SECONDS
"""

import json
import sys
import time
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

url = sys.argv[1]
access_ttl = float(sys.argv[2])
REDIRECT = "http://localhost:9/oauth/callback"
t0 = time.monotonic()
sessions: dict[str, str] = {}


def emit(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, "ms": int((time.monotonic() - t0) * 1000), **fields}), flush=True)


class Storage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def user(name: str) -> tuple[OAuthClientProvider, Storage, httpx2.AsyncClient]:
    storage = Storage()
    pending: dict[str, AuthorizationCodeResult] = {}

    async def redirect_handler(authorization_url: str) -> None:
        q = parse_qs(urlparse(authorization_url).query)
        async with httpx2.AsyncClient() as http:
            r = await http.get(authorization_url)
        emit("http", who=name, method="GET", url=authorization_url.split("?")[0], status=r.status_code,
             resource=q.get("resource", [None])[0])
        back = parse_qs(urlparse(r.headers.get("location", "")).query)
        if "code" not in back:
            raise RuntimeError(f"authorization answered {r.status_code} {r.headers.get('location')} {r.text[:200]}")
        pending["r"] = AuthorizationCodeResult(code=back["code"][0], state=back.get("state", [None])[0],
                                               iss=back.get("iss", [None])[0])

    async def callback_handler() -> AuthorizationCodeResult:
        return pending.pop("r")

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name=name,
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="client_secret_post",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )

    async def on_response(response: httpx2.Response) -> None:
        req = response.request
        if response.headers.get("mcp-session-id"):
            sessions.setdefault(name, response.headers["mcp-session-id"])
        authz = req.headers.get("authorization", "")
        body = None
        if req.method == "POST" and req.headers.get("content-type", "").startswith("application/json"):
            try:
                body = json.loads(req.content).get("method")
            except Exception:
                body = None
        if req.method == "POST" and req.url.path == "/token":
            body = parse_qs(req.content.decode()).get("grant_type", [None])[0]
        emit("http", who=name, method=req.method, url=str(req.url.copy_with(query=None)), status=response.status_code,
             session=req.headers.get("mcp-session-id"), token=authz[7:] if authz.startswith("Bearer ") else None,
             body=body, www_authenticate=response.headers.get("www-authenticate"))

    http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=300),
                              event_hooks={"response": [on_response]})
    return provider, storage, http


async def main() -> None:
    _, alice_store, alice_http = user("alice")
    async with alice_http:
        async with Client(streamable_http_client(url, http_client=alice_http), mode="legacy") as client:
            emit("connected", protocol=str(client.protocol_version), server=str(client.server_info.name))
            tools = (await client.list_tools()).tools
            emit("tools", names=[t.name for t in tools])
            first_token = alice_store.tokens.access_token if alice_store.tokens else None

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                emit("progress", progress=progress, total=total)

            res = await client.call_tool("slow-count", {"steps": 4, "interval_ms": 250}, read_timeout_seconds=30,
                                         progress_callback=on_progress)
            emit("result", result=json.loads(res.model_dump_json(exclude_none=True)), token=first_token)

            # Past the access token's lifetime: the provider refreshes before the next request.
            await anyio.sleep(access_ttl + 1.5)
            emit("expired", token=first_token)
            try:
                res = await client.call_tool("echo", {"message": "after the refresh"}, read_timeout_seconds=30)
                emit("echo", result=json.loads(res.model_dump_json(exclude_none=True)),
                     token=alice_store.tokens.access_token if alice_store.tokens else None)
            except Exception as e:  # noqa: BLE001
                emit("echo-error", error=f"{type(e).__name__}: {e}")
            session_id = sessions.get("alice")

            # A second user (another registered client): his own session, then his token on alice's.
            _, bob_store, bob_http = user("bob")
            async with bob_http:
                async with Client(streamable_http_client(url, http_client=bob_http), mode="legacy") as bob:
                    await bob.list_tools()
                    emit("bob-connected", client_id=bob_store.client_info.client_id if bob_store.client_info else None,
                         alice_client_id=alice_store.client_info.client_id if alice_store.client_info else None)
            bob_token = bob_store.tokens.access_token if bob_store.tokens else ""
            headers = {"authorization": f"Bearer {bob_token}", "mcp-session-id": session_id or "",
                       "mcp-protocol-version": str(client.protocol_version),
                       "accept": "application/json, text/event-stream", "content-type": "application/json"}
            async with httpx2.AsyncClient(timeout=10) as raw:
                r = await raw.post(url, headers=headers, content=json.dumps({"jsonrpc": "2.0", "id": 77, "method": "tools/list"}))
                emit("bob-on-alice", method="POST", status=r.status_code, session=session_id, body=r.text[:200])
                async with raw.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as g:
                    emit("bob-on-alice", method="GET", status=g.status_code, session=session_id)
            # Whatever bob got, the session is still alice's.
            try:
                res = await client.call_tool("echo", {"message": "still alice's"}, read_timeout_seconds=30)
                emit("alice-after-bob", result=json.loads(res.model_dump_json(exclude_none=True)))
            except Exception as e:  # noqa: BLE001
                emit("alice-after-bob", error=f"{type(e).__name__}: {e}")
    emit("closed")


def run() -> None:
    try:
        anyio.run(main)
    except BaseException as e:  # noqa: BLE001
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]
        emit("error", error=f"{type(e).__name__}: {e}")
        sys.exit(1)


run()
