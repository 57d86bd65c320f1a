"""The environment's core: one episode (reset, step, close; its backend, metrics tracker, reward
and step log), how it is measured, rewarded and graded, and the in-process environment that Gym,
training, evaluation, agents and benches use.

    core/episode.py      Episode, observation_from, make_backend
    core/inprocess.py    InProcessEnv (reset / step / grade without HTTP)
    core/errors.py       the errors an episode raises, each with the HTTP status the server maps it to
    core/metrics.py      a window's metrics from a backend's WindowReport (one definition for both modes)
    core/reward.py       the step reward (the grader's objective, shaped per window)
    core/grader.py       an episode log's score in [0, 1]
    core/episode_log.py  EpisodeLog / StepRecord: what the grader reads and POST /grader accepts
    core/verify.py       a submitted log graded again by replaying it (sim mode)

It imports `shared/` (the contract between backends) and, lazily, the backend it needs (`sim/` or
`gateway/`); never `server/`, and never OpenEnv's web stack. `server/` wires it to HTTP and WebSocket.
"""
