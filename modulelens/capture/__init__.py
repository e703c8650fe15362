"""Capturing a module call and getting it back.

``spec`` (the value-spec format) and ``values`` (encoding and decoding values with their
tensors); ``tracer`` and ``init_args`` (finding the call, recording constructor arguments);
``runner`` (running user code with the tracer) and ``worker`` (doing so in a worker process,
with :mod:`modulelens.workers`); ``manifest``, ``artifact`` and ``summary`` (the stored
capture); ``replay`` and ``sources`` (rebuilding it); ``repro`` (standalone KernelBench files).
"""
