"""LoRA adapters on the base model: PEFT folders read and checked (adapter_config.py,
adapter_folder.py, source.py), laid out for the fused linears (weights.py), and one step's
per-row low-rank products on the torch path and the CPU kernels (batch.py, csrc/lora.h).
Residency and scheduling limits are the engine's (engine/adapters.py); routing by adapter is
routing's (docs/LORA.md)."""
