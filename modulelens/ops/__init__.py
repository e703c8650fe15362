"""Operator cards: the aten operators a module runs, grouped into runtime-compatible variants.

Other packages import only the names below, from ``modulelens.ops``; each is imported from its
module on first use (they pull torch).
"""

from modulelens.faces import lazy_face

_FACE = {
    # Cards and opsets: the records, their ids, opening and running them.
    "KIND": "model", "CardSample": "model", "OpCard": "model", "OpSetManifest": "model", "as_card": "model",
    "is_card_id": "model", "parse_card_id": "model",
    "open_card": "cards", "open_opset": "cards", "require_tensor_inputs": "cards", "resolved_card_id": "cards",
    "run_card": "cards", "sample_call": "cards",
    # Recording the operators of a captured module, and resolving them.
    "RecordOptions": "build", "record_opset": "build",
    "classify": "recorder", "resolve_op": "recorder", "variant_key": "recorder",
    # Replaying a card; what is told about opsets and cards.
    "CardReplay": "replay", "replay_card": "replay",
    "OpsetEntry": "opsets", "opset_entries": "opsets",
    "CardDetail": "summary", "OpSetSummary": "summary", "describe_card": "summary", "summarize_opset": "summary",
}
__all__ = list(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
