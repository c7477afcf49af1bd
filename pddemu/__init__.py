"""pddemu: an emulator of cross-datacenter prefill/decode-disaggregated LLM serving."""
