"""Our hops on one `POST /step`: the calls into this package's own functions that one HTTP step makes.

    python scripts/step_hops.py                   # the hops, in call order, then a JSON line
    python scripts/step_hops.py --against main    # the same on git revision REV's package, for before/after

The app is built in process (sim mode) and driven through httpx's ASGI transport on one thread, one
`/reset`, then one `/step` traced with `sys.setprofile`. A hop is a Python call whose code lives in
this package (the folder `llmserve_env` is imported from): FastAPI, Starlette, pydantic and OpenEnv
frames are not counted, but a call of ours that they make is. The backend's window is one hop: the
calls below `run_window` (the simulator's own work, the same on any route) are not counted, nor are
those below the metrics tracker, the reward and the metrics' `to_dict` (the step's work, not its
plumbing), nor comprehensions; so the figure counts the layers a request passes through. Last line:
one JSON object, `step_hops` (every call counted), `step_hop_functions` (distinct functions) and
`step_hops_from_route` (from the route handler down, without the ASGI guards' receive/send wrappers).
In scripts/, not bench/: it builds the app in process, and the benches start the server as a process
(tests/test_runtime.py holds them to it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/against.py, run from anywhere

# Below these, calls are the step's work, not its plumbing: one hop each, their insides not counted.
LEAVES = ("run_window", "MetricsTracker.observe", "GradeReward.step", "WindowMetrics.to_dict", "TenantStats.to_dict")


def traced_step() -> list[tuple[int, str]]:
    import os

    os.environ.setdefault("LLMSERVE_MODE", "sim")
    os.environ.setdefault("ENABLE_WEB_INTERFACE", "false")
    import httpx
    import llmserve_env
    from llmserve_env.server.app import build_app

    root = str(Path(llmserve_env.__file__).resolve().parent)
    app = build_app()
    hops: list[tuple[int, str]] = []

    async def drive() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.post("/reset", json={"task_id": "static_workload", "seed": 0})
            r.raise_for_status()
            episode_id = r.json()["observation"]["episode_id"]
            action = {"batch_cap": 64, "kv_budget_fraction": 0.9, "speculation_depth": 0,
                      "quantization_tier": "FP16", "prefill_decode_split": False, "priority_routing": False}
            body = {"action": action, "episode_id": episode_id}
            await client.post("/step", json=body)  # warm: first-call caches are not the route's path
            stack: list[bool] = []  # per open Python frame: is it a hop of ours
            skip_from: list[int] = []  # stack heights at which a leaf's insides start

            def profile(frame: types.FrameType, event: str, arg: Any) -> None:
                if event == "call":
                    code = frame.f_code
                    ours = (not skip_from and code.co_filename.startswith(root) and not code.co_name.startswith("<")
                            and "/.venv/" not in code.co_filename)
                    if ours:
                        rel = Path(code.co_filename).relative_to(root).with_suffix("").as_posix()
                        hops.append((sum(stack), f"{rel}:{code.co_qualname}"))
                        if code.co_qualname.endswith(LEAVES) or rel.startswith(("sim/", "gateway/")):
                            skip_from.append(len(stack) + 1)
                    stack.append(ours)
                elif event == "return" and stack:
                    if skip_from and len(stack) == skip_from[-1]:
                        skip_from.pop()
                    stack.pop()

            sys.setprofile(profile)
            try:
                r = await client.post("/step", json=body)
            finally:
                sys.setprofile(None)
            r.raise_for_status()

    asyncio.run(drive())
    return hops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/step_hops.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", metavar="REV", help="also count on git revision REV's package")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.against:
        from against import alternate, check_rev

        bad = check_rev(args.against)
        if bad:
            ap.error(f"argument --against: {bad}")
        rounds = alternate(__file__, ["--child"], args.against, rounds=1)
        before, after = rounds["before"][0], rounds["after"][0]
        print(f"{'figure':<22} {'before':>8} {'after':>8}")
        for key in after:
            print(f"{key:<22} {before[key]:>8} {after[key]:>8}")
        print(json.dumps({**after, **{f"{k}_before": v for k, v in before.items()}}))
        return 0
    hops = traced_step()
    if not args.child:
        for i, (depth, name) in enumerate(hops, 1):
            print(f"{i:3d} {'  ' * depth}{name}")
    # From the route handler down: the hops a step takes once the server's ASGI guards (methods,
    # WebSocket frames, body size and time, strict bodies) and their receive/send wrappers have passed it.
    # (the handler: server/routes.py's StepRoute, which answers /step ahead of the router, or the route)
    route = next((i for i, (_, n) in enumerate(hops) if n.startswith("server/routes")
                  and n.endswith((".step", "StepRoute.__call__"))), 0)
    in_route = [n for _, n in hops[route:] if "limited_receive" not in n and "guarded_send" not in n]
    print(json.dumps({"step_hops": len(hops), "step_hop_functions": len({n for _, n in hops}),
                      "step_hops_from_route": len(in_route)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
