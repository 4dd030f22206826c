"""Which sandboxes a list or watch wants: a namespace and label and field selectors."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandboxctl.core.sandboxes import sandbox_fields, sandbox_labels
from sandboxctl.core.selectors import SANDBOX_FIELDS, FieldSelector, LabelSelector
from sandboxctl.core.snapshot import Located


@dataclass(frozen=True, slots=True)
class Query:
    """``namespace`` None means all namespaces."""

    namespace: str | None = None
    labels: LabelSelector = field(default_factory=lambda: LabelSelector.parse(""))
    fields: FieldSelector = field(
        default_factory=lambda: FieldSelector.parse("", allowed=SANDBOX_FIELDS)
    )

    @classmethod
    def parse(cls, namespace: str | None, labels: str = "", fields: str = "") -> Query:
        """Parse selectors; InvalidValueError (400) names what is wrong."""
        return cls(
            namespace or None,
            LabelSelector.parse(labels),
            FieldSelector.parse(fields, allowed=SANDBOX_FIELDS, resource="sandboxes"),
        )

    @property
    def pin(self) -> tuple[str, str] | None:
        """(namespace, name) that a namespaced query with ``metadata.name=<x>`` follows."""
        if self.namespace is None:
            return None
        name = self.fields.exact("metadata.name")
        return (self.namespace, name) if name else None

    @property
    def selects_all_in_namespace(self) -> bool:
        return self.labels.empty and self.fields.empty

    def accepts(self, located: Located) -> bool:
        namespace, _ = located.entry.namespaced_name
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.selects_all_in_namespace:
            return True
        return self.labels.matches(sandbox_labels(located)) and self.fields.matches(
            sandbox_fields(located)
        )
