"""Grade from the command line: a task's reference points, an episode log as written, or an episode
log replayed (what POST /grader does).

    python -m llmserve_env.tools.grade references --task adversarial_multitenant --seed 0
    python -m llmserve_env.tools.grade grade LOG.json            # as written (unverified)
    python -m llmserve_env.tools.grade verify LOG.json           # replayed; exit 2 when it does not replay

Apart from core/grader.py and core/verify.py (which it calls) so that the library defines no command
line, and the grader, which the replay's episode imports, never imports the replay back.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from llmserve_env.core.episode_log import EpisodeLog
from llmserve_env.core.errors import EnvError
from llmserve_env.core.grader import compute_references, grade_episode
from llmserve_env.core.verify import grade_log
from llmserve_env.shared.tasks import UnknownTaskError
from llmserve_env.shared.workloads import resolve_task
from pydantic import ValidationError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmserve_env.tools.grade",
                                     description="Grader reference points, or grade an episode log (JSON).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ref = sub.add_parser("references", help="print the floor and upper bound of a task and seed")
    ref.add_argument("--task", required=True)
    ref.add_argument("--seed", type=int, default=0)
    grade = sub.add_parser("grade", help="grade an EpisodeLog JSON file as written (unverified)")
    grade.add_argument("log")
    verify = sub.add_parser("verify", help="replay a sim-mode EpisodeLog JSON file and grade the replay "
                                           "(what POST /grader does); exit 2 when it does not replay")
    verify.add_argument("log", help="an EpisodeLog JSON file (what POST /grader takes as episode_log)")
    verify.add_argument("--allow-real", action="store_true",
                        help="grade a mode: real log as submitted (verified: false) instead of refusing it")
    args = parser.parse_args(argv)
    if args.cmd == "verify":
        return verify_file(args.log, allow_real=args.allow_real)
    if args.cmd == "references":
        task = resolve_task(args.task)
        refs = compute_references(task, args.seed)
        print(json.dumps({"task_id": task.task_id, "seed": args.seed, **asdict(refs),
                          "capacity": task.capacity().describe()}, indent=2))
    else:
        with open(args.log, encoding="utf-8") as f:
            result = grade_episode(EpisodeLog.model_validate_json(f.read()))
        print(result.model_dump_json(indent=2))
    return 0


def verify_file(path: str, allow_real: bool = False) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            log = EpisodeLog.model_validate_json(f.read())
        result = grade_log(log, allow_real=allow_real)
    except OSError as exc:
        print(f"error: cannot read {path!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: {path!r} is not an EpisodeLog: {exc.error_count()} error(s), first: "
              f"{exc.errors(include_url=False)[0]['msg']}", file=sys.stderr)
        return 2
    except UnknownTaskError as exc:
        print(f"error: refused: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except (ValueError, EnvError) as exc:  # GradeError, TraceError; a backend failing on the actions
        print(f"error: refused: {exc}", file=sys.stderr)
        return 2
    print(result.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
