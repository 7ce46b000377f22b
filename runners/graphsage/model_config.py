"""The code-free description of a GraphSAGE network, stored with every ``graphsage:<version>``.

It is enough to rebuild both the PyG training model and the dense served model from a state dict,
without pickled code, and the runner checks FeatureTensors against it before serving.
"""

from __future__ import annotations

import dataclasses
from typing import Any

AGGREGATORS = ("mean", "pool", "lstm")
TASKS = ("multiclass", "multilabel")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    in_dim: int
    hidden_dim: int
    num_classes: int
    fanout: tuple[int, ...] = (25, 10)
    aggregator: str = "mean"
    task: str = "multiclass"
    dropout: float = 0.3

    def __post_init__(self) -> None:
        if self.aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {self.aggregator!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not self.fanout or any(k <= 0 for k in self.fanout):
            raise ValueError(f"fanout must be positive integers, got {self.fanout}")

    @property
    def num_layers(self) -> int:
        return len(self.fanout)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fanout"] = list(self.fanout)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["fanout"] = tuple(int(k) for k in kwargs.get("fanout", (25, 10)))
        return cls(**kwargs)
