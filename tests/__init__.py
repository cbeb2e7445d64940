"""The test suite. Imported before its conftest.py, so before any test process imports torch.

OpenMP's idle threads sleep at once in the test processes too, as in every engine process
(sluice/openmp_wait.py; libgomp reads the variable once, when torch loads it). With libgomp's
default spin, a test process's torch regions on a machine loaded far past its two cores spun
against descheduled peers at every barrier: two bundled-model tests that take ~30 s on a quiet
machine ran past pytest's 600 s timeout at load average 16 (test_speculative_engine's preemption
test in scaled_dot_product_attention, test_lora_equality's in the transformers reference).
"""

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()
