"""/docs served from this package, so the API page renders with no network (FastAPI's self-hosted docs).

FastAPI's /docs page loads Swagger UI's script and stylesheet from a CDN: offline, or behind a
firewall, it was a blank page. Here the assets come from the `swagger-ui-bundle-v2` wheel (Swagger UI
5.x, which renders the OpenAPI 3.1 that FastAPI writes; 4.x refuses it), mounted at /docs/assets,
and /docs is FastAPI's own page pointed at them. /redoc (whose script also comes from a CDN) is
removed rather than left blank: /docs documents the same schema.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

ASSETS = "/docs/assets"
ASSET_DIR = Path(swagger_ui_path)


def install(app: FastAPI) -> None:
    """Replace FastAPI's CDN-backed /docs (and drop /redoc) with the page on the packaged assets."""
    replaced = {"/docs", "/docs/oauth2-redirect", "/redoc"}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in replaced]
    openapi_url = app.openapi_url or "/openapi.json"
    redirect = "/docs/oauth2-redirect"

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            oauth2_redirect_url=redirect,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route(redirect, oauth2_redirect, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS, StaticFiles(directory=ASSET_DIR), name="swagger-ui-assets")
    app.docs_url = "/docs"
    app.redoc_url = None
