"""One module per tool; importing this package registers them all (the order is the CLI's)."""

from modulelens.tools import (  # noqa: F401, I001  (CLI order)
    capture_module,
    replay_module,
    list_captures,
    show_capture,
    tag_capture,
    export_repro,
    capture_ops,
    list_op_cards,
    show_op_card,
    replay_op_card,
    profile,
    generate_kernel,
    validate_kernel,
    install_skills,
    gather_stats,
)
