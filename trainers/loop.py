"""The earlier home of `Scalars`, which user programs import as the README once showed
(`from trainers.loop import Scalars`); the code lives in trainers.common.loop."""
from trainers.common.loop import Scalars  # noqa: F401
