"""The contract's models as OpenEnv's `Action`/`Observation`/`State` subclasses, for `create_app`.

`shared.models` stays free of OpenEnv (so nothing but the server loads its web stack); these
subclasses add OpenEnv's base classes for its type bounds and nothing else: the same fields, the
same validation (an integer written as a whole float, 52.0, is taken as the integer on the wire,
as server/bodies.py does for HTTP bodies), the same wire format. An action parsed by OpenEnv's routes is a `WireAction`,
which is a `ServeAction`, so the runtime takes it as it is.
"""

from __future__ import annotations

from typing import Any

from llmserve_env.server.bodies import whole_floats_fixed
from llmserve_env.shared.models import ServeAction, ServeObservation, ServeState
from openenv.core.env_server.types import Action, Observation, State
from pydantic import ConfigDict, ValidationError, ValidatorFunctionWrapHandler, model_validator


class WireAction(ServeAction, Action):
    __doc__ = ServeAction.__doc__
    model_config = ConfigDict(title="ServeAction")  # the schema keeps the contract's name

    @model_validator(mode="wrap")
    @classmethod
    def _whole_floats(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The WebSocket's actions, as HTTP's (server/bodies.py): 52.0 is the integer 52 on the wire.
        try:
            return handler(data)
        except ValidationError as exc:
            fixed = whole_floats_fixed(exc, data) if isinstance(data, dict) else None
            if fixed is None:
                raise
            return handler(fixed)


class WireObservation(ServeObservation, Observation):
    __doc__ = ServeObservation.__doc__
    model_config = ConfigDict(title="ServeObservation")  # the schema keeps the contract's name


class WireState(ServeState, State):
    __doc__ = ServeState.__doc__
    model_config = ConfigDict(title="ServeState")  # the schema keeps the contract's name
