"""/docs renders offline: its Swagger UI script and stylesheet come from this server (the packaged
`swagger-ui-bundle-v2` wheel), not from a CDN; /redoc, whose script only a CDN had, is gone.
The page rendering with the network blocked is checked in Chromium by
tests/test_dashboard_browser.py::test_docs_render_with_the_network_blocked."""

from __future__ import annotations

import re


def test_docs_page_names_only_this_servers_assets(client):
    page = client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") for s in sources), sources  # nothing from another host
    for path in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert path in sources
        asset = client.get(path)
        assert asset.status_code == 200 and len(asset.content) > 10_000, path
    assert "/openapi.json" in page.text
    assert client.get("/redoc").status_code == 404


def test_swagger_ui_is_a_version_that_reads_openapi_3_1(client):
    """Swagger UI 4 (the `swagger-ui-bundle` package) shows 'does not specify a valid version field'
    for FastAPI's OpenAPI 3.1; 5.x renders it."""
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.\d+\.\d+"', bundle)
    assert version and int(version.group(1)) >= 5, version
