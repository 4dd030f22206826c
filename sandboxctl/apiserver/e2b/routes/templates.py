"""Health and the templates the fleet serves: ``GET /health``, ``/templates``,
``/v2/templates``, ``/templates/{id}`` and ``/templates/aliases/{alias}``."""

from __future__ import annotations

from starlette.responses import Response

from sandboxctl.apiserver.e2b.service import E2bError, Service, Tenant
from sandboxctl.apiserver.e2b.templates import TemplateAlias, template_body, with_builds_body
from sandboxctl.serving.apps import answer, no_content


def health() -> Response:
    return no_content()  # no key needed


async def template_alias(e2b: Service, _: Tenant, alias: str) -> Response:
    if alias in e2b.config.aliases:
        return answer(TemplateAlias(e2b.template_of(alias)))
    if alias in await e2b.call(e2b.store.templates):  # a template's name is its own alias
        return answer(TemplateAlias(alias))
    raise E2bError(404, f"template alias {alias!r} not found")


async def templates(e2b: Service, _: Tenant) -> Response:
    now = e2b.store.now()
    names = await e2b.call(e2b.store.templates)
    entries = await e2b.call(e2b.store.template_entries)
    return answer([template_body(e2b.config, name, now, entries.get(name)) for name in names])


async def one_template(e2b: Service, _: Tenant, template_id: str) -> Response:
    name = e2b.template_of(template_id)
    if name not in await e2b.call(e2b.store.templates):
        raise E2bError(404, f"template {template_id!r} not found")
    entries = await e2b.call(e2b.store.template_entries)
    return answer(with_builds_body(e2b.config, name, e2b.store.now(), entries.get(name)))
