"""The plug-in protocol: a user's `package.module:function` (and transformers' `hf:NAME`) as a Variant.

A plug-in is a callable of the variant contract (variant_contract.py) that declares what it takes
in attributes (docs/variants.md): `audit_supports` (the FEATURES and CALL_FORMS it takes; what it
does not name it is not given: undeclared means unsupported), `audit_causal_alignment`,
`audit_returns` with `audit_lse_includes_sink`, and `audit_page_size`. load_plugin reads them,
declare_plugin writes them (audit.adapt, for a declared kernel).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

from ..core.errors import UsageError
from .torch_kernels import _first_line
from .variant_contract import CALL_FORMS, FEATURES, LSE_DEVICES, Variant

SUPPORTS_ATTRIBUTE = "audit_supports"
ALIGNMENT_ATTRIBUTE = "audit_causal_alignment"
RETURNS_ATTRIBUTE = "audit_returns"
LSE_SINK_ATTRIBUTE = "audit_lse_includes_sink"
PAGE_SIZE_ATTRIBUTE = "audit_page_size"
CAUSAL_ALIGNMENTS: tuple[str, ...] = ("top-left", "bottom-right")
# What the returned (out, lse) may be: RETURNS of a plug-in's `audit_returns` and audit.adapt's returns.
PLUGIN_RETURNS: tuple[str, ...] = ("out", "out_lse")


def is_plugin_name(name: str) -> bool:
    """A user's `package.module:function` (hf: names are transformers' functions, not plug-ins)."""
    from .hf import is_hf_name
    return ":" in name and not is_hf_name(name)


def hf_variant(spec: str) -> Variant:
    """`hf:NAME` -> the Variant of transformers' attention function NAME (audit.workload.hf)."""
    from . import hf
    name = spec[len(hf.HF_PREFIX):]
    hf.check_name(name)
    return Variant(spec, f"transformers' {name} attention function, called as a model calls it "
                         f"(mask from masking_utils, KV-cache causal alignment)",
                   lambda: hf.build(name), compiled=hf.split(name)[1] == "flex_attention", family="plugin",
                   unsupported=hf.capabilities(name), causal_alignment="bottom-right", upstream="transformers")


def load_plugin(spec: str) -> Variant:
    """`package.module:function` -> Variant; UsageError with a clear message on failure."""
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--variant: {spec!r} is not of the form package.module:function")
    if os.getcwd() not in sys.path:  # the console script does not put cwd on sys.path
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
        raise UsageError(f"--variant: cannot import module {module_name!r} for {spec!r}: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise UsageError(f"--variant: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise UsageError(f"--variant: {spec!r} is a {type(fn).__name__}, not a callable")
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    description = doc[0] if doc else f"user plug-in {spec}"
    forms = tuple(f for f in _declared_supports(spec, fn) if f in CALL_FORMS)
    page_size = getattr(fn, PAGE_SIZE_ATTRIBUTE, None)
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise UsageError(f"--variant: {spec}.{PAGE_SIZE_ATTRIBUTE} is {page_size!r}; allowed: a positive integer")
    return Variant(spec, description, lambda: fn, family="plugin", unsupported=_undeclared(spec, fn), forms=forms,
                   page_size=page_size, upstream=module_name.partition(".")[0],
                   causal_alignment=_declared_alignment(spec, fn), **declared_returns(f"--variant: {spec}", fn))


def declare_plugin(fn: Callable[..., Any], *, supports: Iterable[str], page_size: int | None,
                   causal_alignment: str, returns: str, lse_includes_sink: bool) -> Callable[..., Any]:
    """`fn` with the plug-in attributes load_plugin reads back: the features and layouts it takes,
    its page size, its causal alignment, what it returns and whether its lse counts the sink."""
    setattr(fn, SUPPORTS_ATTRIBUTE, tuple(supports))
    setattr(fn, PAGE_SIZE_ATTRIBUTE, page_size)
    setattr(fn, ALIGNMENT_ATTRIBUTE, causal_alignment)
    setattr(fn, RETURNS_ATTRIBUTE, returns)
    setattr(fn, LSE_SINK_ATTRIBUTE, lse_includes_sink)
    return fn


def declared_returns(where: str, fn: Any) -> dict[str, Any]:
    """Variant fields from a callable's `audit_returns` ("out", the default, or "out_lse": it
    returns (out, lse) on every device) and `audit_lse_includes_sink` (its lse counts the sink)."""
    returns = getattr(fn, RETURNS_ATTRIBUTE, "out")
    if returns not in PLUGIN_RETURNS:
        raise UsageError(f"{where}.{RETURNS_ATTRIBUTE} is {returns!r}; allowed: {', '.join(PLUGIN_RETURNS)}")
    includes_sink = getattr(fn, LSE_SINK_ATTRIBUTE, False)
    if not isinstance(includes_sink, bool):
        raise UsageError(f"{where}.{LSE_SINK_ATTRIBUTE} is {includes_sink!r}; allowed: True, False")
    return {"lse_on": LSE_DEVICES if returns == "out_lse" else (), "lse_includes_sink": includes_sink}


def _declared_alignment(spec: str, fn: Any) -> str:
    """A plug-in's causal alignment: its `audit_causal_alignment` attribute, top-left without one."""
    declared = getattr(fn, ALIGNMENT_ATTRIBUTE, "top-left")
    if declared not in CAUSAL_ALIGNMENTS:
        raise UsageError(f"--variant: {spec}.{ALIGNMENT_ATTRIBUTE} is {declared!r}; allowed: "
                         f"{', '.join(CAUSAL_ALIGNMENTS)}")
    return declared


def _declared_supports(spec: str, fn: Any) -> tuple[str, ...]:
    """A plug-in's `audit_supports`, checked: names from FEATURES and CALL_FORMS."""
    declared = getattr(fn, SUPPORTS_ATTRIBUTE, ())
    allowed = FEATURES + CALL_FORMS
    if isinstance(declared, str) or not isinstance(declared, Iterable):
        raise UsageError(f"--variant: {spec}.{SUPPORTS_ATTRIBUTE} is {declared!r}; expected a tuple of "
                         f"feature names from: {', '.join(allowed)}")
    declared = tuple(declared)
    unknown = [f for f in declared if f not in allowed]
    if unknown:
        raise UsageError(f"--variant: {spec}.{SUPPORTS_ATTRIBUTE} names unknown feature(s) "
                         f"{', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")
    return declared


def _undeclared(spec: str, fn: Any) -> dict[str, str]:
    """A plug-in's unsupported features: those its `audit_supports` attribute does not name.

    Undeclared means unsupported: a plug-in written for k and v of H heads could broadcast
    an MQA cell's single key/value head and look right by accident, or ignore a score_mod
    keyword it swallows with **kwargs, so the audit never guesses.
    """
    declared = _declared_supports(spec, fn)
    return {f: f"the plug-in does not declare it (add {f!r} to {spec}.{SUPPORTS_ATTRIBUTE}; "
               "docs/variants.md)" for f in FEATURES if f not in declared}

