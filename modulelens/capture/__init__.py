"""Capturing a module call and getting it back.

``spec`` (the value-spec format) and ``values`` (encoding and decoding values with their
tensors); ``tracer`` and ``init_args`` (finding the call, recording constructor arguments);
``runner`` (running user code with the tracer) and ``worker`` (doing so in a worker process,
with :mod:`modulelens.workers`); ``manifest``, ``artifact`` and ``summary`` (the stored
capture); ``replay`` and ``sources`` (rebuilding it); ``repro`` (standalone KernelBench files).

Other packages import only the names below, from ``modulelens.capture``; each is imported from
its module on first use (they pull torch), so importing one module of the package stays cheap.
"""

from modulelens.faces import lazy_face

# The modules a process that replays captures imports (a sandbox worker preloads them before it forks).
REPLAY_RUNTIME = ("modulelens.capture.replay",)

_FACE = {
    # Capturing: in the caller's process, in a worker process, and the helpers of a user script.
    "capture": "runner", "record_constructors": "runner", "run_user_file": "runner", "script_error": "runner",
    "ScriptCaptureOptions": "worker", "capture_script": "worker",
    "autocast_regions": "tracer", "rng_states": "tracer", "set_rng_states": "tracer",
    "current_settings": "numerics", "describe_settings": "numerics", "recorded_settings": "numerics",
    # The stored capture and what is told about it.
    "KIND": "manifest", "CaptureManifest": "manifest", "capture_manifest": "manifest",
    "load_tensors": "artifact",
    "CaptureEntry": "summary", "CaptureSummary": "summary", "TensorInfo": "summary",
    "capture_entries": "summary", "capture_warnings": "summary", "summarize": "summary",
    # Getting it back: replay, the module's sources, standalone repro files.
    "LoadedCapture": "replay", "BUFFER_PREFIX": "leafcall", "replayed_state": "leafcall",
    "Resolver": "sources", "ReproFile": "repro", "check_repro": "repro", "check_seconds_for": "repro", "write_repro": "repro",
    # The value-spec format and values with their tensors.
    "SpecVisitor": "spec", "TensorSpec": "spec", "ValueKind": "spec", "mapping_items": "spec", "sequence_items": "spec",
    "Decoder": "values", "Encoder": "values", "TensorSink": "values", "TensorSource": "values",
    "class_path": "values", "dtype_name": "values", "flatten": "values", "keyed_tensors": "values",
    "keyed_values": "values", "layout_differences": "values", "sharing_groups": "values", "parse_dtype": "values", "tensors_in": "values",
}
__all__ = ["REPLAY_RUNTIME", *_FACE]
__getattr__, __dir__ = lazy_face(__name__, _FACE)
