"""The stand-in in a background thread of the calling process, for tests."""

from __future__ import annotations

from llmserve_env.sim.standin.app import StandinConfig, build_app
from llmserve_env.sim.standin.faults import cut_on_drop
from llmserve_env.tools.launch import ThreadServer


class BackgroundStandin:
    """The stand-in on 127.0.0.1 (a free port) in a daemon thread: `with BackgroundStandin(cfg) as s: s.base_url`."""

    def __init__(self, config: StandinConfig | None = None, port: int = 0):
        """`port`: 0 for a free one; a given one brings a stopped stand-in back where clients look for it."""
        self.config = config or StandinConfig()
        self.app = build_app(self.config)
        self._server = ThreadServer(cut_on_drop(self.app), lifespan="off", name="standin", port=port)
        self.port = self._server.port
        self.base_url = f"{self._server.url}/v1"

    def __enter__(self) -> BackgroundStandin:
        self._server.start(timeout_s=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
