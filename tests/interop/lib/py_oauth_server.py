"""An OAuth-protected MCP server built with the official Python SDK (mcp 2.x), for scenario m.

Two HTTP servers in one process, both on 127.0.0.1, both naming themselves http://localhost:<port>:

- the resource server: an MCPServer with AuthSettings (issuer_url, resource_server_url,
  required_scopes) and a TokenVerifier that asks the authorization server's /introspect
  (RFC 7662) about each token, so the SDK serves the protected resource metadata at
  /.well-known/oauth-protected-resource/mcp and answers 401 with `resource_metadata`;
  the SDK binds each session to the principal that opened it (client_id, iss, sub).
- a tiny authorization server: the SDK's own AS routes (create_auth_routes: metadata,
  /register, /authorize with PKCE, /token, /revoke) over an in-memory provider written
  here (the installed SDK ships no demo one), which approves every authorization at once
  (no login page), issues short-lived access tokens (--access-ttl) with refresh tokens,
  and /introspect.

With --own-as the MCP server is its own authorization server (the SDK's
auth_server_provider: the AS routes on the MCP server's origin, the 2025-03-26
layout) and --public-url names the URL clients use (a proxy in front): the
server writes that URL as its resource and its origin as the issuer, the usual
production setup where a server is told its public URL.

Tools: `echo` and `slow-count` (progress notifications, `steps` x `interval_ms`).

usage: python py_oauth_server.py --port P --auth-port A [--access-ttl S] [--validate-resource]
       python py_oauth_server.py --port P --own-as --public-url http://HOST:PORT/mcp [--access-ttl S]
"""

import argparse
import secrets
import sys
import time

import anyio
import httpx2
import uvicorn
from pydantic import AnyHttpUrl, AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

SCOPE = "mcp"


class DemoProvider:
    """In-memory OAuthAuthorizationServerProvider: every authorization is approved at once;
    the resource owner is named after the registered client (`user:<client_name>`)."""

    def __init__(self, access_ttl: int) -> None:
        self.access_ttl = access_ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info
        log(f"registered client {client_info.client_id} ({client_info.client_name})")

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=f"user:{client.client_name}",
        )
        log(f"authorized {client.client_id} for resource={params.resource}")
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str):
        c = self.codes.get(authorization_code)
        return c if c and c.client_id == client.client_id else None

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None) -> OAuthToken:
        access = "at-" + secrets.token_urlsafe(24)
        refresh = "rt-" + secrets.token_urlsafe(24)
        exp = int(time.time()) + self.access_ttl
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes, expires_at=exp,
                                          resource=resource, subject=subject)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource,
                                             subject=subject)
        log(f"issued {access[:10]}… to {client_id} ({subject}), resource={resource}, expires in {self.access_ttl}s")
        return OAuthToken(access_token=access, expires_in=self.access_ttl, scope=" ".join(scopes),
                          refresh_token=refresh)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode):
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource,
                           authorization_code.subject)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str):
        r = self.refresh.get(refresh_token)
        return r if r and r.client_id == client.client_id else None

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        if self.refresh.pop(refresh_token.token, None) is None:
            raise TokenError(error="invalid_grant", error_description="refresh token already used")
        log(f"refresh for {client.client_id}")
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource,
                           refresh_token.subject)

    async def load_access_token(self, token: str) -> AccessToken | None:
        t = self.access.get(token)
        if t is None or (t.expires_at is not None and t.expires_at < time.time()):
            return None
        return t

    async def revoke_token(self, token) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


class IntrospectionVerifier:
    """TokenVerifier: RFC 7662 introspection at the authorization server."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def verify_token(self, token: str) -> AccessToken | None:
        async with httpx2.AsyncClient(timeout=5) as http:
            r = await http.post(self.endpoint, data={"token": token})
        if r.status_code != 200:
            return None
        data = r.json()
        if not data.get("active"):
            return None
        return AccessToken(token=token, client_id=data["client_id"], scopes=data.get("scope", "").split(),
                           expires_at=data.get("exp"), resource=data.get("aud"), subject=data.get("sub"),
                           claims={"iss": data.get("iss")})


def log(msg: str) -> None:
    print(f"[py-oauth-server] {msg}", file=sys.stderr, flush=True)


def add_tools(mcp: MCPServer) -> None:
    @mcp.tool(name="echo")
    def echo(message: str) -> str:
        return f"echo: {message}"

    @mcp.tool(name="slow-count")
    async def slow_count(steps: int, interval_ms: int, ctx: Context) -> str:
        for i in range(1, steps + 1):
            await anyio.sleep(interval_ms / 1000)
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
        return f"counted to {steps}"


def serve_own_as(args: argparse.Namespace, provider: DemoProvider) -> None:
    public = AnyHttpUrl(args.public_url)
    issuer = f"{public.scheme}://{public.host}:{public.port}"
    mcp = MCPServer(
        "py-oauth-server",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=public,
            required_scopes=[SCOPE],
            client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]),
            revocation_options=RevocationOptions(enabled=True),
            validate_token_resource=False,
        ),
    )
    add_tools(mcp)
    log(f"MCP server on 127.0.0.1:{args.port}, its own authorization server; it names itself {public} (issuer {issuer})")
    uvicorn.run(mcp.streamable_http_app(), host="127.0.0.1", port=args.port, log_level="warning")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--auth-port", type=int)
    ap.add_argument("--own-as", action="store_true", help="the MCP server is its own authorization server")
    ap.add_argument("--public-url", help="with --own-as: the URL clients use for /mcp")
    ap.add_argument("--access-ttl", type=int, default=3600)
    ap.add_argument("--validate-resource", action="store_true",
                    help="AuthSettings.validate_token_resource: accept only tokens issued for this server's own URL")
    args = ap.parse_args()
    provider = DemoProvider(args.access_ttl)
    if args.own_as:
        serve_own_as(args, provider)
        return
    rs_url = f"http://localhost:{args.port}/mcp"
    as_url = f"http://localhost:{args.auth_port}"

    async def introspect(request: Request) -> JSONResponse:
        form = await request.form()
        t = await provider.load_access_token(str(form.get("token", "")))
        if t is None:
            return JSONResponse({"active": False})
        return JSONResponse({"active": True, "client_id": t.client_id, "scope": " ".join(t.scopes), "exp": t.expires_at,
                             "aud": t.resource, "sub": t.subject, "iss": as_url + "/"})

    as_routes = create_auth_routes(
        provider=provider,
        issuer_url=AnyHttpUrl(as_url),
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]),
        revocation_options=RevocationOptions(enabled=True),
    )
    as_app = Starlette(routes=[*as_routes, Route("/introspect", introspect, methods=["POST"])])

    mcp = MCPServer(
        "py-oauth-server",
        token_verifier=IntrospectionVerifier(f"{as_url}/introspect"),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(as_url),
            resource_server_url=AnyHttpUrl(rs_url),
            required_scopes=[SCOPE],
            validate_token_resource=args.validate_resource,
        ),
    )

    add_tools(mcp)
    rs_app = mcp.streamable_http_app()

    async def serve() -> None:
        servers = [
            uvicorn.Server(uvicorn.Config(as_app, host="127.0.0.1", port=args.auth_port, log_level="warning")),
            uvicorn.Server(uvicorn.Config(rs_app, host="127.0.0.1", port=args.port, log_level="warning")),
        ]
        log(f"resource server {rs_url}, authorization server {as_url}/ (access tokens live {args.access_ttl}s)")
        async with anyio.create_task_group() as tg:
            for s in servers:
                tg.start_soon(s.serve)

    anyio.run(serve)


if __name__ == "__main__":
    main()
