"""The provider protocol and the table of providers.

A provider turns a :class:`~modulelens.providers.request.GenerationRequest` (an operator card, a
backend, optionally a parent candidate with its validation report) into a
:class:`~modulelens.kernels.source.KernelSource` whose ``provenance`` says where it came from.
Providers: ``template`` (offline, deterministic), ``anthropic`` (the Anthropic Messages API) and
``sampling`` (MCP sampling: the connected client's own model). The LLM providers also write a
``ModelNew`` for a whole captured module (:class:`ModuleProvider`, from a
:class:`~modulelens.providers.module_request.ModuleRequest`). The fourth source of candidates,
the agent itself, needs no provider: it passes its source to ``validate_kernel``.

The table names each provider's class by module path and is imported only when the provider is
asked for, so this module imports no implementation. LLM providers share
:mod:`modulelens.providers.prompting` (prompts and code extraction), re-exported here.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from modulelens.errors import ModuleLensError, tool_call
from modulelens.kernels.module_candidates import ModuleCandidate
from modulelens.kernels.source import KernelSource
from modulelens.providers.module_request import ModuleRequest
from modulelens.providers.prompting import build_messages, describe_arguments, extract_code, prompt_sha256
from modulelens.providers.request import GenerationRequest, lineage

__all__ = [
    "PROVIDERS",
    "GenerationRequest",
    "ModuleProvider",
    "Provider",
    "build_messages",
    "describe_arguments",
    "extract_code",
    "get_provider",
    "lineage",
    "prompt_sha256",
]

# name -> "module:class" of its implementation
PROVIDERS: dict[str, str] = {
    "template": "modulelens.providers.template:TemplateProvider",
    "anthropic": "modulelens.providers.anthropic:AnthropicProvider",
    "sampling": "modulelens.providers.sampling:SamplingProvider",
}


@runtime_checkable
class Provider(Protocol):
    name: str

    def generate(self, req: GenerationRequest, ctx: Any) -> KernelSource:
        """One candidate for ``req``; raises ModuleLensError with a hint when it cannot."""
        ...


@runtime_checkable
class ModuleProvider(Protocol):
    """A provider that also writes module-level candidates (``anthropic``, ``sampling``)."""

    name: str

    def generate_module(self, req: ModuleRequest, ctx: Any) -> ModuleCandidate:
        """One ``ModelNew`` for ``req``; raises ModuleLensError with a hint when it cannot."""
        ...


def get_provider(name: str) -> Provider:
    """A fresh instance of the provider called ``name`` (see :data:`PROVIDERS`)."""
    if name not in PROVIDERS:
        raise ModuleLensError(
            f"unknown provider {name!r}",
            f"use one of: {', '.join(PROVIDERS)}; or write the kernel yourself and pass it to "
            f"{tool_call('validate_kernel', source='k.cpp', target='blk/6', backend='cpp')}",
        )
    module, _, cls = PROVIDERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
