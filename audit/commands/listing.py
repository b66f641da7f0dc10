"""`audit list`: the built-in variants, transformers' attention functions (hf:) of this
environment, and the presets."""
from __future__ import annotations

import argparse
from typing import Sequence

HELP = "print the built-in variants, the hf: names of this environment, the merge functions and the presets"
DESCRIPTION = HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` takes no arguments."""


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..workload.presets import presets
    from ..workload.variants import builtin_variants

    print("variants:")
    for v in builtin_variants().values():
        print(f"  {v.name:<18} {v.description}")
    print("  package.module:function  your own (see docs/variants.md)")
    from ..workload import hf
    if hf.transformers_version() is None:
        print("  hf:NAME            transformers' attention functions: pip install 'attn-audit[hf]'")
    else:
        print(f"\ntransformers {hf.transformers_version()} attention functions (hf:MODULE:NAME: one your MODULE "
              f"registers; hf:MODEL{hf.MODEL_EAGER_SUFFIX}: a model's own eager function, e.g. hf:gpt_oss.eager, "
              "which takes sinks):")
        for name in hf.hf_names():
            why = hf.unavailable(name.removeprefix(hf.HF_PREFIX))
            print(f"  {name:<24} {'not here: ' + why if why else 'available'}")
    from ..workload.merge_mistakes import MERGE_MISTAKES
    from ..workload.merges import CONTROL_PREFIX, TORCH_MERGE
    print("\nmerge functions (run --merge-fn; docs/numerics.md, Merging partial attention):")
    print(f"  {'reference':<34} the audit's float64 merge: reads -inf and +inf as an empty part")
    print(f"  {TORCH_MERGE:<34} torch's context-parallel merge (_SDPAMerger), as it ships")
    for name, mistake in MERGE_MISTAKES.items():
        print(f"  {CONTROL_PREFIX + name:<34} negative control: {mistake.title}")
    print("  module:attr                        your own: declare_merge(...) (see docs/variants.md)")
    print("\npresets:")
    for p in presets().values():
        print(f"  {p.name:<8} {p.description}")
    return 0
