"""Engine settings: one plain dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.config import DEVICE_NAMES, Settings, is_device_name
from sluice.engine.batching_window import BatchingWindow
from sluice.engine.policy import ADMISSION_POLICIES, POLICIES, AdmissionPolicy, SchedulingPolicy
from sluice.models.kernels import KernelChoice, KVCacheDtype, Numerics

# The settings an engine takes from the server's Settings (same names on both sides). The one
# mapping: `sluice serve` (inline or spawning a worker), `sluice worker` and the worker flags all
# go through it.
ENGINE_SETTINGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_gib",
    "kv_idle_gib",
    "kv_spill_gib",
    "kv_spill_dir",
    "max_model_len",
    "scheduling_policy",
    "admission_policy",
    "enable_prefix_caching",
    "kernels",
    "numerics",
    "device",
    "batching_window",
    "batching_window_ms",
    "threads",
    "decode_split_rows",
    "speculative_tokens",
    "kv_cache_dtype",
    "max_loras",
    "max_cpu_loras",
    "max_lora_rank",
    "lora_s3_endpoint",
)

# One source for the defaults other modules report before an engine exists (EngineStats).
# 8, not 16: on CPU a smaller block costs no measurable throughput and halves the unfilled
# tail per request (KV waste 4.6 % -> 2.2 % on bench/serving/engine_throughput.py, docs/BENCHMARKS.md)
DEFAULT_BLOCK_SIZE = 8
# LoRA: 8 adapters a step as SGLang's max_loras_per_batch (what an 8-adapter step costs against the
# base step: docs/BENCHMARKS.md, "LoRA"); twice that resident (~20 MB each in fp32 at rank 16 on
# every linear of the bundled model); rank 64 at most.
DEFAULT_MAX_LORAS = 8
DEFAULT_MAX_CPU_LORAS = 16
DEFAULT_MAX_LORA_RANK = 64
# Speculative decoding: proposals verified per decode at most (0 = off), and the cap.
SPECULATIVE_TOKENS_DEFAULT = 0
MAX_SPECULATIVE_TOKENS = 16


@dataclass(slots=True)
class EngineConfig:
    block_size: int = DEFAULT_BLOCK_SIZE
    # KV pool size: an explicit block count wins, then kv_cache_gib; with neither, the pool holds
    # what max_num_seqs requests of max_model_len tokens can use, capped at kv_memory_fraction of
    # the memory available at start-up (docs/ENGINE.md, "The KV block manager").
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None
    kv_memory_fraction: float = 0.5
    # Pool memory is touched on first use. A never-used block is handed out only while less than
    # kv_idle_gib of used memory sits free (held by no request: the prefix cache of finished
    # requests); beyond that, the least recently used free block is reused. So resident KV is at
    # most the peak held + kv_idle_gib. None = use untouched memory first, always (cache keeps most).
    # 64 MiB: the bundled model's serve + worker stay under 1 GB at 32 streams (docs/BENCHMARKS.md);
    # shared prompts of running requests are held, so they are cached whatever this is.
    kv_idle_gib: float | None = 0.0625
    # The prefix cache's second tier (engine/kv_spill.py): once the engine has sat idle, the
    # used free blocks' K/V goes to an unnamed file of at most kv_spill_gib in kv_spill_dir (None:
    # the system's temporary directory) and all of the KV memory above the held blocks is given
    # back; a later prefix hit reads them back instead of recomputing them. 0 = off: kv_idle_gib
    # then stays resident at rest as the cache. CPU only (device memory is not given back).
    kv_spill_gib: float = 1.0
    kv_spill_dir: str | None = None
    max_num_seqs: int = 64  # cap on running sequences
    max_num_batched_tokens: int = 512  # token budget of one step (decodes cost 1 each)
    long_prefill_threshold: int = 0  # cap on one request's prefill chunk per step; 0 = budget
    max_model_len: int | None = None  # context window; default: the model's, capped by the pool
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    admission_policy: AdmissionPolicy = AdmissionPolicy.OPTIMISTIC
    watermark: float = 0.01  # optimistic: fraction of blocks left free when admitting
    enable_prefix_caching: bool = True
    share_prefix_across_tenants: bool = False
    seed: int = 0  # seeds the draws for requests that give no seed of their own
    # exact: fp32 arithmetic (greedy output equals transformers'); fast: int8 activations x
    # 4-bit weights as llama.cpp computes (CPU kernels only; see docs/ENGINE.md)
    numerics: str = "exact"
    # auto: K/V stored in the model's dtype (fp32 on the CPU: exact); float16: half the KV memory
    # and half the attention's reads at long context, not exact (models/kernels KVCacheDtype;
    # the deviation is in docs/BENCHMARKS.md, "16-bit K/V cache"). Opt-in, for fast numerics.
    kv_cache_dtype: str = "auto"
    # auto: the CPU kernels when they build; torch: the portable path. Read by whoever loads the
    # model for this engine (load_model(kernels=...)), carried here so that one mapping
    # (Settings -> EngineConfig -> a worker's --engine-config) brings it everywhere.
    kernels: str = "auto"
    # Where the model and its KV pool live: auto (CUDA when torch sees a device, else CPU), cpu,
    # cuda, cuda:N. Like `kernels`, read by whoever loads the model (load_model(device=...));
    # the engine itself follows the model's device (models/device.py, docs/ENGINE.md).
    device: str = "auto"
    # Dynamic batching window (engine/batching_window.py): while decodes run, admit new prompts at
    # once (flush), or hold them up to batching_window_ms to prefill several in one step (hold),
    # or hold only while load makes it pay, never past batching_window_ms (adaptive).
    batching_window: BatchingWindow = BatchingWindow.FLUSH
    batching_window_ms: float = 100.0
    # adaptive: the hold ends once this many new prompts per running decode are waiting
    batching_window_ratio: float = 0.25
    # torch threads of this engine's forward passes (intra-op: GEMMs and the CPU kernels).
    # 0 = auto: torch's default (one per core) for a worker alone; `sluice serve` gives each of
    # its local workers an equal share of the cores instead (routing/fleet/replica_launch.py), since
    # two OpenMP teams spinning on the same cores slow each other down many times over.
    threads: int = 0
    # CPU kernels: decode calls of at least this many rows (and 64K multiply-adds) split over the
    # worker's threads on the kernels' helper pool; 0 = every decode call on the engine's thread.
    # On by default from one row (one stream's linears included) since the pool keeps its helpers
    # spinning through a decode step and rests whenever they do not get a core (csrc/helper_pool.h):
    # served on 2 cores beside the gateway, 1 stream 0.55 -> 0.82-0.85x llama.cpp's tok/s and 32 streams
    # 1.20 -> 1.70x, and with the other core taken a step stayed at 1.00x of serial
    # (docs/BENCHMARKS.md, "The second core, by default"). A worker with one thread has no helpers.
    decode_split_rows: int = 1
    # CUDA graphs for decode-only steps (engine/decode_graphs.py): captured per batch-size and
    # block-count bucket on first use, then replayed. Only on a CUDA device (ignored, with a log
    # line, on the CPU). Off until measured on a GPU (docs/BENCHMARKS.md, "GPU"); an engine
    # setting only for now (bench/serving/engine_throughput.py --set cuda_graphs=true), not a server flag.
    cuda_graphs: bool = False
    # Speculative decoding without a draft model (engine/speculative.py): a decode may verify up to
    # this many tokens proposed from the request's own context (n-gram lookup) in its step, per
    # request, only while its acceptance rate makes it pay; 0 = off. Exact: output is unchanged.
    speculative_tokens: int = SPECULATIVE_TOKENS_DEFAULT
    # LoRA (docs/LORA.md): distinct adapters among the running requests (so in any step) at most;
    # 0 = this engine serves no adapters. Adapters kept resident (weights loaded once, shared by
    # every request; least recently used evicted beyond this, never one in use). The largest rank
    # it loads. Where s3:// adapters are fetched from (None: AWS, or AWS_ENDPOINT_URL).
    max_loras: int = DEFAULT_MAX_LORAS
    max_cpu_loras: int = DEFAULT_MAX_CPU_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    lora_s3_endpoint: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        return cls(**{name: getattr(settings, name) for name in ENGINE_SETTINGS if getattr(settings, name) is not None})

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        try:  # accept the flags' and the settings' strings
            self.scheduling_policy = SchedulingPolicy(self.scheduling_policy)
        except ValueError:
            raise ValueError(f"scheduling_policy must be one of {', '.join(POLICIES)}") from None
        try:
            self.admission_policy = AdmissionPolicy(self.admission_policy)
        except ValueError:
            raise ValueError(f"admission_policy must be one of {', '.join(ADMISSION_POLICIES)}") from None
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if self.numerics not in tuple(Numerics):
            raise ValueError(f"numerics must be one of {', '.join(Numerics)}")
        if self.kv_cache_dtype not in tuple(KVCacheDtype):
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KVCacheDtype)}")
        if self.kernels not in tuple(KernelChoice):
            raise ValueError(f"kernels must be one of {', '.join(KernelChoice)}")
        if not is_device_name(self.device):
            raise ValueError(f"device must be {DEVICE_NAMES}, not {self.device!r}")
        if self.threads < 0:
            raise ValueError("threads must be >= 0 (0 = auto)")
        if not 0 <= self.decode_split_rows <= 64:
            raise ValueError("decode_split_rows must be 0 (off) to 64")
        if not 0 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_tokens must be 0 (off) to {MAX_SPECULATIVE_TOKENS}")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0 (0 = no LoRA adapters)")
        if self.max_cpu_loras < max(1, self.max_loras):
            raise ValueError("max_cpu_loras must be >= max_loras (and >= 1): a step's adapters must all be resident")
        if not 1 <= self.max_lora_rank <= 1024:
            raise ValueError("max_lora_rank must be 1 to 1024")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError("num_kv_blocks must be >= 2")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be > 0")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ValueError("kv_memory_fraction must be in (0, 1]")
        if self.kv_idle_gib is not None and self.kv_idle_gib < 0:
            raise ValueError("kv_idle_gib must be >= 0")
        if self.kv_spill_gib < 0:
            raise ValueError("kv_spill_gib must be >= 0 (0 = no spill tier)")
        try:
            self.batching_window = BatchingWindow(self.batching_window)  # accept the flag's string
        except ValueError:
            raise ValueError(f"batching_window must be one of {', '.join(BatchingWindow)}") from None
        if self.batching_window_ms < 0:
            raise ValueError("batching_window_ms must be >= 0")
        if self.batching_window_ratio <= 0:
            raise ValueError("batching_window_ratio must be > 0")
