"""Create: what a submitted Sandbox asks the store to claim.

A create is a claim, never an upsert: nothing is stored, and creating a name that is
already claimed asks for a second claim (which the fleet may grant on another node).
The answer is the created sandbox as every read shows it (``store.object_of``).

The claim is read from the submitted object (:class:`SandboxObject`, a value of the
wrong JSON type being a 400 naming the field, as a Kubernetes API server answers it):

* name: ``metadata.name``, else ``metadata.generateName`` plus five random characters;
* template: the first container's image (``spec.podTemplate.spec.containers[0].image``),
  read as the e2b API reads a ``templateID`` (``templatenames.resolve``: an alias such as
  ``base`` names its template and size, any other name is a template a fresh node must
  serve); the template annotation is not read, so there is one way to say it;
* net: the ``sandbox.cocoonstack.io/net`` annotation on the object, else on the pod
  template, else ``none``; any other value than ``none`` or ``egress`` is 422;
* size: the first container's requests (else its limits): above 4 CPU or 8Gi is
  ``large``, above 1 CPU or 2Gi ``medium``, else ``small``; with neither, the alias's
  size (``small`` for a template named as itself);
* ttl: ``spec.shutdownTime`` when set (rounded up to whole seconds; a time not in the
  future is refused), else the ``sandbox.cocoonstack.io/ttl-seconds`` annotation, else the
  node's default.

Names, namespaces, labels and annotations are checked as Kubernetes checks them (a
namespace is an RFC 1123 label, annotations hold at most 256 KiB), and each failure is a
422 ``Invalid`` whose ``details.causes`` name the field. Every refusal names the object
(``details.name`` and the message): its name, or ``generateName <prefix>``.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import msgspec

from sandboxctl.apiserver.status import ApiError
from sandboxctl.apiserver.templatenames import resolve
from sandboxctl.core import wire
from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.model import NETS, PoolKey
from sandboxctl.core.names import SANDBOXES
from sandboxctl.core.timestamps import ZonedTime, format_rfc3339
from sandboxctl.core.wire import Model

ANNOTATION_NET: Final = "sandbox.cocoonstack.io/net"
ANNOTATION_TTL_SECONDS: Final = "sandbox.cocoonstack.io/ttl-seconds"

LARGE_CPU, LARGE_MEMORY = Decimal(4), Decimal(8 * 2**30)
MEDIUM_CPU, MEDIUM_MEMORY = Decimal(1), Decimal(2 * 2**30)

_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_MAX: Final = 253
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_MAX: Final = 63
_QUALIFIED: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ANNOTATIONS_MAX_BYTES: Final = 256 * 1024  # all keys and values together, as Kubernetes
_SHOWN: Final = 64  # characters of a bad value quoted back
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # what the API server draws from
_QUANTITY: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
)
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip


# --- the submitted object, as far as a claim reads it ------------------------------------

Quantity = str | int | float  # "500m", "2Gi", 4, 1.5
Served = Callable[[str], bool]  # whether a fresh node serves a template


class ObjectMeta(Model, frozen=True):
    """What a create reads of an object's metadata; the name is checked as Kubernetes
    checks it (422), so it may arrive as any value."""

    name: Any = None
    generateName: Any = None
    namespace: Any = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class Resources(Model, frozen=True):
    requests: dict[str, Quantity] = msgspec.field(default_factory=dict)
    limits: dict[str, Quantity] = msgspec.field(default_factory=dict)


class Container(Model, frozen=True):
    image: str = ""
    resources: Resources = Resources()


class PodSpec(Model, frozen=True):
    containers: tuple[Container, ...] = ()


class PodTemplate(Model, frozen=True):
    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()


class SandboxSpec(Model, frozen=True):
    podTemplate: PodTemplate = PodTemplate()
    shutdownTime: ZonedTime | None = None


class SandboxObject(Model, frozen=True):
    """A submitted Sandbox; every field this server does not read is ignored."""

    apiVersion: Any = None
    kind: Any = None
    metadata: ObjectMeta = ObjectMeta()
    spec: SandboxSpec = SandboxSpec()


@dataclass(frozen=True, slots=True)
class CreateRequest:
    namespace: str
    name: str
    key: PoolKey  # the image as its template, the size its resources ask for
    ttl_seconds: int
    sized: bool = False  # whether the container asked for resources (else the alias's size)
    subject: str = ""  # how a refusal names the object (see ``subject_of``)

    def claim_key(self, aliases: Mapping[str, tuple[str, str]], served: Served) -> PoolKey:
        """The pool the claim asks for: the image read as the e2b API reads a
        ``templateID`` (``templatenames.resolve``); a size from the container's resources
        wins over the alias's. 422 when the image names no template a fresh node serves."""
        image = self.key.template
        found = resolve(image, aliases, served)
        if found is None or not served(found.template):
            raise unknown_template(image, found.template if found else None, self.subject)
        return PoolKey(found.template, self.key.net, self.key.size if self.sized else found.size)


def create_request(namespace: str, body: object, now: datetime) -> CreateRequest:
    """Read a submitted Sandbox (read, or plain JSON values); ApiError 400/422 names the
    field that is wrong, and the object (``subject_of``)."""
    submitted = _read(body)
    subject = subject_of(submitted.metadata)
    try:
        return _create_request(namespace, submitted, now, subject)
    except ApiError as error:
        raise named(error, subject) from None


def _create_request(
    namespace: str, submitted: SandboxObject, now: datetime, subject: str
) -> CreateRequest:
    _check_type(submitted)
    metadata = submitted.metadata
    check_namespace(namespace)
    if metadata.namespace not in (None, "", namespace):
        raise ApiError(
            400,
            "the namespace of the provided object does not match the namespace sent on "
            f"the request ({metadata.namespace!r} vs {namespace!r})",
        )
    pod = submitted.spec.podTemplate
    first = _first_container(pod.spec)
    _check_metadata(metadata, "metadata")
    _check_metadata(pod.metadata, "spec.podTemplate.metadata")
    key = PoolKey.of(first.image, _net(metadata, pod.metadata), pool_size(first))
    sized = bool(first.resources.requests or first.resources.limits)
    return CreateRequest(
        namespace, _name(metadata), key, _ttl(submitted, now), sized=sized, subject=subject
    )


def subject_of(metadata: ObjectMeta) -> str:
    """How a refusal names the submitted object: its name, else ``generateName <prefix>``
    (the name is generated only once the object is accepted), else empty (it has none)."""
    name, prefix = metadata.name, metadata.generateName
    if name:
        return name if isinstance(name, str) else json.dumps(name)
    if prefix:
        return f"generateName {prefix if isinstance(prefix, str) else json.dumps(prefix)}"
    return ""


def named(error: ApiError, subject: str) -> ApiError:
    """``error`` naming the object it refused, in its message and its ``details.name``
    (kubectl prints ``The sandboxes "<name>" is invalid`` from the details)."""
    if not subject:
        return error
    who = f"{SANDBOXES.kind} {json.dumps(subject)}"
    unnamed = f"{SANDBOXES.kind} is invalid"
    if error.message.startswith(unnamed):
        message = who + error.message.removeprefix(SANDBOXES.kind)
    else:
        message = f"{who}: {error.message}"
    details = {"name": subject, "group": SANDBOXES.group, "kind": SANDBOXES.plural}
    return ApiError(error.code, message, error.reason, details | error.details)


def _read(body: object) -> SandboxObject:
    if isinstance(body, SandboxObject):
        return body
    try:
        return wire.decode(SandboxObject, body)
    except wire.WireError as error:
        if not error.field:
            raise ApiError(400, "the request body must be a Sandbox object") from None
        raise ApiError(400, str(error)) from None


def _check_type(submitted: SandboxObject) -> None:
    for field, given, expected in (
        ("apiVersion", submitted.apiVersion, SANDBOXES.api_version),
        ("kind", submitted.kind, SANDBOXES.kind),
    ):
        if given not in (None, "", expected):
            raise ApiError(400, f"{field} {given!r} is not {expected!r}")


def _first_container(pod: PodSpec) -> Container:
    if not pod.containers:
        raise _invalid(
            "spec.podTemplate.spec.containers",
            "Required value: one container",
            "FieldValueRequired",
        )
    first = pod.containers[0]
    if not first.image:
        raise _invalid(
            "spec.podTemplate.spec.containers[0].image",
            "Required value: the template to claim from",
            "FieldValueRequired",
        )
    return first


def _net(metadata: ObjectMeta, pod: ObjectMeta) -> str | None:
    """The claim's net: the object's annotation, else the pod template's."""
    net = metadata.annotations.get(ANNOTATION_NET) or pod.annotations.get(ANNOTATION_NET)
    if net and net not in NETS:
        where = (
            "metadata" if metadata.annotations.get(ANNOTATION_NET) else "spec.podTemplate.metadata"
        )
        raise _invalid(
            f"{where}.annotations[{ANNOTATION_NET}]",
            f"Unsupported value: {_shown(net)}: supported values: "
            + ", ".join(f'"{n}"' for n in NETS),
            "FieldValueNotSupported",
        )
    return net


def pool_size(container: Container) -> str:
    """``small``, ``medium`` or ``large`` from a container's requests, else its limits."""
    amounts = container.resources.requests or container.resources.limits
    cpu = _quantity(amounts.get("cpu"), "cpu")
    memory = _quantity(amounts.get("memory"), "memory")
    if cpu > LARGE_CPU or memory > LARGE_MEMORY:
        return "large"
    if cpu > MEDIUM_CPU or memory > MEDIUM_MEMORY:
        return "medium"
    return "small"


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``1.5``, ``2Gi``, ``1e9``) as a number."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise InvalidValueError(f"quantity {text!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)")
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * Decimal(1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    try:
        return number.scaleb(int(suffix[1:]))
    except (ValueError, InvalidOperation) as error:
        raise InvalidValueError(f"quantity {text!r} has a bad exponent") from error


def check_namespace(namespace: str) -> None:
    """422 unless ``namespace`` is an RFC 1123 label, as Kubernetes names namespaces."""
    if len(namespace) > _LABEL_MAX or not _LABEL.fullmatch(namespace):
        raise _invalid(
            "metadata.namespace",
            f"Invalid value: {_shown(namespace)}: a lowercase RFC 1123 label of at most "
            f"{_LABEL_MAX} characters must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character",
        )


def unknown_template(image: str, template: str | None = None, subject: str = "") -> ApiError:
    """The 422 for an image that names no template a fresh node serves (``template``:
    what the alias ``image`` stands for)."""
    what = f"the alias of template {_shown(template)}" if template and template != image else ""
    problem = f"Not found: {_shown(image)}: no node serves " + (what or "this template")
    return named(
        _invalid("spec.podTemplate.spec.containers[0].image", problem, "FieldValueNotFound"),
        subject,
    )


def _name(metadata: ObjectMeta) -> str:
    name = metadata.name
    if not name:
        prefix = metadata.generateName
        if not prefix:
            raise _invalid(
                "metadata.name",
                "Required value: name or generateName is required",
                "FieldValueRequired",
            )
        if not isinstance(prefix, str):
            raise _invalid("metadata.generateName", "must be a string")
        name = prefix + "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    if not isinstance(name, str) or len(name) > _NAME_MAX or not _NAME.fullmatch(name):
        raise _invalid(
            "metadata.name",
            f"Invalid value: {_shown(name)}: a lowercase RFC 1123 subdomain of at most "
            f"{_NAME_MAX} characters must consist of lower case alphanumeric characters, '-' "
            "or '.', and must start and end with an alphanumeric character",
        )
    return name


def _ttl(submitted: SandboxObject, now: datetime) -> int:
    shutdown = submitted.spec.shutdownTime
    if shutdown is not None:
        seconds = math.ceil((shutdown - now).total_seconds())
        if seconds <= 0:
            at = format_rfc3339(shutdown)
            raise ApiError(400, f"spec.shutdownTime {at} is not in the future")
        return seconds
    text = submitted.metadata.annotations.get(ANNOTATION_TTL_SECONDS)
    if text is None or text == "":
        return 0
    if not text.isascii() or not text.isdigit():
        raise ApiError(
            400, f"annotation {ANNOTATION_TTL_SECONDS} {text!r}: expected whole seconds, e.g. 300"
        )
    return int(text)


def _check_metadata(metadata: ObjectMeta, where: str) -> None:
    """Labels and annotations, as Kubernetes checks them."""
    for key in metadata.annotations:
        _qualified_key(key, f"{where}.annotations")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise _invalid(
            f"{where}.annotations",
            f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes",
            "FieldValueTooLong",
        )
    for key, value in metadata.labels.items():
        _qualified_key(key, f"{where}.labels")
        if len(value) > _LABEL_MAX or not _LABEL_VALUE.fullmatch(value):
            raise _invalid(
                f"{where}.labels",
                f"Invalid value: {_shown(value)}: a label value has at most {_LABEL_MAX} "
                "characters, alphanumeric, '-', '_' or '.', starting and ending alphanumeric",
            )


def _qualified_key(key: str, where: str) -> None:
    """A label or annotation key: an optional DNS-subdomain prefix and '/', then a name
    of at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    good = (
        0 < len(name) <= _LABEL_MAX
        and bool(_QUALIFIED.fullmatch(name))
        and (not slash or (0 < len(prefix) <= _NAME_MAX and bool(_NAME.fullmatch(prefix))))
    )
    if not good:
        raise _invalid(
            where,
            f"Invalid value: {_shown(key)}: a key is a name of at most {_LABEL_MAX} "
            "alphanumeric characters, '-', '_' or '.', optionally after a DNS subdomain "
            "prefix and '/'",
        )


def _shown(value: str) -> str:
    """A value as a message quotes it: at most a few dozen characters."""
    text = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
    return json.dumps(text)


def _quantity(value: Quantity | None, resource: str) -> Decimal:
    if value is None:
        return Decimal(0)
    try:
        return parse_quantity(str(value))
    except InvalidValueError as error:
        raise _invalid(f"resources {resource}", str(error)) from None


def _invalid(field: str, problem: str, reason: str = "FieldValueInvalid") -> ApiError:
    cause = {"reason": reason, "message": problem, "field": field}
    return ApiError(
        422,
        f"Sandbox is invalid: {field}: {problem}",
        details={"kind": SANDBOXES.plural, "group": SANDBOXES.group, "causes": [cause]},
    )
