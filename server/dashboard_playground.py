"""OpenEnv's Playground tab (single `reset`/`step` calls from a form), built so that it works as is.

OpenEnv builds the Playground's form from the action's JSON schema, and a required number with no
default starts at 0: `batch_cap 0` and `kv_budget_fraction 0`, so "Run step" failed with two
validation errors. Here the form is built from a schema whose knobs default to a valid action (the
heuristic's first action for the first task); the schema the API serves is untouched. Its "Same call
in Python" panel said `http://localhost:8000` whatever the port: the page fills in the URL it was
served from.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from llmserve_env.server.dashboard_text import server_url
from llmserve_env.shared.models import ServeAction
from openenv.core.env_server.gradio_ui import build_gradio_app

OPENENV_PLACEHOLDER_URL = "http://localhost:8000"


class PlaygroundManager:
    """OpenEnv's web manager as the Playground sees it: the same environment and calls, but an action
    class whose schema gives each knob a starting value (for the form only)."""

    def __init__(self, manager: Any, start: ServeAction):
        self._manager = manager
        knobs = start.knobs()
        base = manager.action_cls

        class PlaygroundAction(base):  # type: ignore[valid-type, misc]  # the server's own action class
            @classmethod
            def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
                schema = base.model_json_schema(*args, **kwargs)
                for name, value in knobs.items():
                    if name in schema.get("properties", {}):
                        schema["properties"][name]["default"] = value
                return schema

        self.action_cls = PlaygroundAction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def build_playground(manager: Any, action_fields: list[dict[str, Any]], metadata: Any, is_chat_env: bool,
                     quick_start_md: str, start: ServeAction) -> gr.Blocks:
    playground = build_gradio_app(PlaygroundManager(manager, start), action_fields, metadata, is_chat_env,
                                  title=getattr(metadata, "name", "LLMServeEnv"), quick_start_md=quick_start_md)
    code_panels = [b for b in playground.blocks.values()
                   if isinstance(b, gr.Markdown) and OPENENV_PLACEHOLDER_URL in str(b.value or "")]

    def with_url(request: gr.Request) -> str:
        headers = {k.lower(): v for k, v in dict(getattr(request, "headers", None) or {}).items()}
        return str(panel.value).replace(OPENENV_PLACEHOLDER_URL, server_url(headers))

    if code_panels:  # OpenEnv shows one; its text names the placeholder URL
        panel = code_panels[0]
        with playground:
            playground.load(with_url, outputs=panel, queue=False)
    return playground
