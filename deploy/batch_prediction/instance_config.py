"""Which fields of a batch prediction's input go to the model, and what of each instance its
output line keeps: Vertex AI's `BatchPredictionJob.instanceConfig` (v1), for the local twin and
the Vertex job alike.

- `key_field`: a field that identifies the instance. It is not sent to the model, and each
  output line has `"key": <its value>` instead of the `"instance"`.
- `included_fields`: only these fields are sent to the model (the others are dropped).
- `excluded_fields`: these fields are not sent to the model (a label, an id).
Included and excluded fields are exclusive, as on Vertex. A CSV row's key is its text.

Instances are objects (a JSON object per line, a CSV row under its header, a table's row). A
JSON line that is an array is the values of `included_fields`, in their order (as Vertex
orders an array instance by includedFields); without them it names nothing and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from deploy.cloud import api


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    key_field: str | None = None
    included_fields: tuple[str, ...] = ()
    excluded_fields: tuple[str, ...] = ()

    def __post_init__(self):
        if self.included_fields and self.excluded_fields:
            raise api.DeployError(
                "--included_fields and --excluded_fields are exclusive (as in Vertex AI's "
                "instanceConfig): name the fields to send, or those to drop."
            )
        if self.key_field is not None and not self.key_field:
            raise api.DeployError("--key_field is empty: name the field that identifies a row.")
        if self.key_field and self.key_field in self.included_fields:
            raise api.DeployError(
                f"--key_field={self.key_field} is never sent to the model: leave it out of "
                "--included_fields."
            )

    @classmethod
    def of(
        cls,
        key_field: str | None = None,
        included_fields: Sequence[str] = (),
        excluded_fields: Sequence[str] = (),
    ) -> InstanceConfig:
        return cls(key_field or None, tuple(included_fields), tuple(excluded_fields))

    def sent(self, names: Iterable[str]) -> list[str]:
        """Of the fields `names` (in their order), those that go to the model."""
        if self.included_fields:
            return [n for n in names if n in self.included_fields]
        return [n for n in names if n not in self.excluded_fields and n != self.key_field]

    def as_object(self, instance: list) -> tuple[dict | None, str | None]:
        """(an array instance as an object, None), or (None, why it cannot be one)."""
        if self.key_field:
            return None, f"an array instance has no field '{self.key_field}' (--key_field)."
        if not self.included_fields:
            return None, (
                "an array instance: name its values, in order, with --included_fields "
                "(Vertex's instanceConfig.includedFields), or write objects."
            )
        if len(instance) != len(self.included_fields):
            return None, (
                f"{len(instance)} values, but --included_fields names "
                f"{len(self.included_fields)} ({', '.join(self.included_fields)})."
            )
        return dict(zip(self.included_fields, instance)), None

    def dropped_by(self, name: str) -> str:
        """The flag that keeps field `name` from the model."""
        if name == self.key_field:
            return "--key_field"
        return "--included_fields" if self.included_fields else "--excluded_fields"

    def for_model(self, instance: dict) -> dict:
        """The instance as the model gets it."""
        return {k: instance[k] for k in self.sent(instance)}

    def outputs(self, instance: dict, prediction: dict, key=None) -> dict:
        """An output line: the key (`key`, read apart) or the instance, and the prediction."""
        if self.key_field:
            return {"key": key, "prediction": prediction}
        return {"instance": instance, "prediction": prediction}

    def body(self) -> dict:
        """The job's `instanceConfig` (empty: none)."""
        body: dict = {}
        if self.key_field:
            body["keyField"] = self.key_field
        if self.included_fields:
            body["includedFields"] = list(self.included_fields)
        if self.excluded_fields:
            body["excludedFields"] = list(self.excluded_fields)
        return body
