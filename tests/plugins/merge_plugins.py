"""Merge functions declared as a user declares a library's (docs/variants.md), for `run --merge-fn
merge_plugins:NAME`: the stand-ins of tests/plugins/merge_standins.py in FlashInfer's and vLLM's forms."""
from merge_standins import merge_attn_states, merge_state, merge_state_nan_on_empty

from audit.workload.merge_functions import declare_merge

flashinfer_merge_state = declare_merge(merge_state, form="flashinfer")
flashinfer_nan_on_empty = declare_merge(merge_state_nan_on_empty, form="flashinfer")
vllm_merge_attn_states = declare_merge(merge_attn_states, form="vllm")
