"""The environment runtime: one episode (reset, step, close; its backend, metrics tracker, reward
and step log) and the in-process environment that Gym, training, evaluation, agents and benches use.

    runtime/episode.py    Episode, observation_from, make_backend
    runtime/inprocess.py  InProcessEnv (reset / step / grade without HTTP)
    runtime/errors.py     the errors an episode raises, each with the HTTP status the server maps it to

It imports `shared/` and, lazily, the backend it needs (`sim/` or `gateway/`); never `server/`, and
never OpenEnv's web stack. `server/` wires it to HTTP and WebSocket.
"""
