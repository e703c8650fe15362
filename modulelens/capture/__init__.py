"""Tracing internals: constructor-argument recording, value/tensor serialisation, the tracer."""
