"""Providers of candidate kernel source: template, anthropic, sampling (see :mod:`.base`)."""

from modulelens.providers.base import GenerationRequest, Provider, build_messages, extract_code, get_provider

__all__ = ["GenerationRequest", "Provider", "build_messages", "extract_code", "get_provider"]
