"""The contract's models as OpenEnv's `Action`/`Observation`/`State` subclasses, for `create_app`.

`shared.models` stays free of OpenEnv (so nothing but the server loads its web stack); these
subclasses add OpenEnv's base classes for its type bounds and nothing else: the same fields, the
same validation, the same wire format. An action parsed by OpenEnv's routes is a `WireAction`,
which is a `ServeAction`, so the runtime takes it as it is.
"""

from __future__ import annotations

from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState
from openenv.core.env_server.types import Action, Observation, State
from pydantic import ConfigDict


class WireAction(ServeAction, Action):
    __doc__ = ServeAction.__doc__
    model_config = ConfigDict(title="ServeAction")  # the schema keeps the contract's name


class WireObservation(ServeObservation, Observation):
    __doc__ = ServeObservation.__doc__
    model_config = ConfigDict(title="ServeObservation")  # the schema keeps the contract's name


class WireState(ServeState, State):
    __doc__ = ServeState.__doc__
    model_config = ConfigDict(title="ServeState")  # the schema keeps the contract's name
