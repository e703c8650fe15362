"""Kernel backends (cpp, cuda, triton), the candidate contract and the template library.

Other packages import only the names below, from ``modulelens.kernels``; each is imported from
its module on first use, so that importing one module (a backend table, a sandboxed candidate's
runtime) does not import the backends' implementations or torch.
"""

from modulelens.faces import lazy_face

# The modules a candidate process imports (a sandbox worker preloads them before it forks).
CANDIDATE_RUNTIME = ("modulelens.kernels.backends", "modulelens.kernels.module_candidates",
                     "modulelens.kernels.build_cache", "modulelens.kernels.module_builds")

_FACE = {
    # Kernel sources and the candidate contract (the docstring of each module states it).
    "BackendName": "source", "CPP_KEYWORDS": "source", "KernelSource": "source", "read_source_file": "source",
    "operator_mismatch": "entry_arity",
    "CANDIDATE_CONTRACT": "source:__doc__", "MODULE_CANDIDATE_CONTRACT": "module_candidates:__doc__",
    # Backends and their builds.
    "CompileError": "backends", "get_backend": "backends", "LIB_SUFFIX": "backends.compiler",
    "summarize_errors": "backends.compiler", "import_library": "backends.compiler", "compiler_version": "backends.cpp", "machine_tag": "backends.cpp",
    "default_build_dir": "build_cache", "publish_dir": "build_cache", "published_build": "build_cache",
    "read_build": "build_cache", "read_loaded_build": "build_cache", "published_mismatch": "build_cache",
    "BUILD_CHECKSUM": "build_cache:CHECKSUM", "publish_build": "build_cache", "use_shared_builds": "build_cache",
    "triton_interpreting": "backends.triton:interpreting",
    "builds_in_process": "build_cache", "module_build_address": "module_builds", "route_load_inline": "module_builds",
    # Stored candidates: op kernels and whole modules (ModelNew).
    "CANDIDATES": "candidates", "CandidateManifest": "candidates", "candidate_manifest": "candidates",
    "candidate_name": "candidates", "load_candidate": "candidates", "save_agent_candidate": "candidates",
    "save_candidate": "candidates",
    "MODULE_BACKEND": "module_candidates", "ModuleCandidate": "module_candidates",
    "ModuleCandidateManifest": "module_candidates", "ModuleTarget": "module_candidates",
    "construct": "module_candidates", "is_module_candidate": "module_candidates", "load_class": "module_candidates",
    "load_module_candidate": "module_candidates", "module_candidate_name": "module_candidates",
    "save_module_candidate": "module_candidates",
    # Library operators a module candidate keeps (partial fusion).
    "LibraryOps": "library_ops", "declared_library_ops": "library_ops", "KEEPABLE_LIBRARY_OPS": "library_ops:KEEPABLE",
    # Shape rules a kernel declares.
    "ShapeRule": "shape_rules", "VariableDim": "shape_rules", "declared_rule": "shape_rules",
    "probe_sizes": "shape_rules",
    # Templates: per operator card, and the pointwise-chain family for whole modules.
    "render_template": "templates:render", "template_variants": "templates:variants",
    "template_params": "templates:variant_params",
    "MODULE_TEMPLATE_FAMILY": "module_templates:FAMILY", "MODULE_TEMPLATE_VARIANTS": "module_templates:VARIANTS",
    "NotFusable": "module_templates", "pointwise_chain": "module_templates", "render_pointwise": "module_templates",
    # The fusing family: library calls kept, the pointwise and normalisation segments between them fused.
    "FUSION_TEMPLATE_FAMILY": "fusion_template:FAMILY", "FUSION_TEMPLATE_VARIANTS": "fusion_template:VARIANTS",
    "FusionPlan": "fusion_template", "fusion_plan": "fusion_template", "render_fused": "fusion_template",
}
__all__ = ["CANDIDATE_RUNTIME", *_FACE]
__getattr__, __dir__ = lazy_face(__name__, _FACE)
