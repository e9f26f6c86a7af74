"""The `--json` report, schema 1 (README.md, "JSON output (schema 1)"), as dataclasses.

One dataclass per JSON object, one field per key, named as the key.  A key the report writes only
in some cases (README: "only when ...", src/report/report.c) is an optional field: None when the
report leaves it out.  A key that is always written but may be null (suggest's recommendation) is a
plain Optional field.  Keys a newer memplan adds (the schema adds keys, never renames them) land in
`extra` of their object, so an older package still reads a newer binary's report; to_dict() gives
the report back as it was read.  tests/py_api.py holds these classes equal, field by field, to
real reports of the bundled models and to README's contract.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union, get_type_hints

from ._errors import SchemaError

SCHEMA = 1


def _opt():
    """a key the report writes only in some cases: None when absent"""
    return field(default=None, metadata={"optional": True})


def _key(name):
    """an optional key that is a Python keyword: the field is name + "_" (Model.class_ is "class")"""
    return field(default=None, metadata={"optional": True, "key": name})


def json_key(f):
    """the report's key of field f"""
    return f.metadata.get("key", f.name)


def _extra():
    """keys this package does not know (a newer memplan's): kept, never compared"""
    return field(default_factory=dict, compare=False, repr=False, metadata={"extra": True})


@dataclass
class Model:
    name: str
    source: str  # "memplan" | "hf"
    path: str
    n_layers: int  # blocks
    class_: Optional[str] = _key("class")  # HF configs naming one: architectures[0], after --head
    params: Optional[int] = _opt()
    trainable_params: Optional[int] = _opt()
    unused_params: Optional[int] = _opt()  # multimodal checkpoints: the vision tower and projector
    extra: Dict[str, Any] = _extra()


@dataclass
class Finetune:
    mode: str  # full | lora | qlora | freeze
    base_quant: str
    lora_r: Optional[int] = _opt()
    lora_alpha: Optional[float] = _opt()
    lora_dropout: Optional[float] = _opt()
    lora_targets: Optional[str] = _opt()
    adapter_params: Optional[int] = _opt()
    double_quant: Optional[bool] = _opt()
    quant_storage: Optional[str] = _opt()  # bnb 4-bit: uint8 | bfloat16 | float16 | float32
    extra: Dict[str, Any] = _extra()


@dataclass
class Images:  # --images: a multimodal checkpoint stepped with images (Gemma 3, Mistral 3, Qwen2-VL)
    per_sample: int
    # each image's tokens in seq_len: mm_tokens_per_image; Mistral 3: rows x (columns + 1);
    # Qwen: patches / merge^2; Llama 4: the tiles' patch tokens and separators
    tokens_each: int
    height: int  # each image's pixels as the step runs it, after the processor's resize (--image-size)
    width: int
    patches: int  # each image's (Llama 4: every tile's, the class token not counted)
    vision_layers: int
    image_size: Optional[int] = _opt()  # vision_config.image_size (Gemma 3, Mistral 3; Qwen has none)
    asked_height: Optional[int] = _opt()  # --image-size as given (absent: the default)
    asked_width: Optional[int] = _opt()
    tiles: Optional[int] = _opt()  # Llama 4: the tiles an image runs as (its canvas's, + the global one)


@dataclass
class Moe:
    layers: int
    experts: int
    top_k: int
    capacity: float
    routing: str
    experts_implementation: str
    capacity_changes_memory: bool
    routed_rows: Optional[int] = _opt()
    rows_per_expert: Optional[int] = _opt()
    busiest_expert_rows: Optional[int] = _opt()
    ep: Optional[int] = _opt()  # --ep
    experts_per_rank: Optional[int] = _opt()
    received_rows_per_rank: Optional[int] = _opt()
    extra: Dict[str, Any] = _extra()


@dataclass
class Experts:
    ep: int
    efsdp: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    gathered_unit_bytes: int
    extra: Dict[str, Any] = _extra()


@dataclass
class Parallel:
    strategy: str
    gpus: int
    nodes: int
    world: int
    offload: str
    offload_device: str
    rank: int
    ep: Optional[int] = _opt()  # --ep (1: none)
    host_bytes: Optional[int] = _opt()  # suggest's candidates
    comm_s: Optional[float] = _opt()
    exposed_comm_s: Optional[float] = _opt()
    offload_s: Optional[float] = _opt()
    extra: Dict[str, Any] = _extra()


@dataclass
class RecipeSetting:
    value: str
    key: str
    line: int
    source: str  # "recipe" | "trainer default" | "command line" | "not used"
    extra: Dict[str, Any] = _extra()


@dataclass
class Recipe:
    format: str
    trainer: str
    path: str
    format_from: str
    settings: Dict[str, RecipeSetting]  # by option name: "batch", "grad-accum", ...
    unknown_keys: List[str]
    extra: Dict[str, Any] = _extra()


@dataclass
class Grpo:
    completion_length: int  # max_completion_length
    num_generations: int
    num_iterations: int
    beta: float
    temperature: float  # generate's sampling temperature
    top_p: float  # its warpers: top_p (1: none), top_k (0: none), min_p (None: none)
    top_k: int
    min_p: Optional[float]
    repetition_penalty: float  # generate's repetition penalty (1: none)
    vllm: str  # "none" (transformers' generate) | "colocate" | "server"
    old_logprobs_forward: bool  # the policy's no-grad forward for the old log-probs runs
    steps_per_generation: Optional[int] = _opt()  # given; absent: TRL's default, the accumulation
    vllm_gpu_memory_utilization: Optional[float] = _opt()  # colocate only
    vllm_correction: Optional[bool] = _opt()  # with vLLM: vllm_importance_sampling_correction
    ds3_gather_for_generation: Optional[bool] = _opt()  # --ds3-gather (ZeRO-3: every parameter gathered)
    extra: Dict[str, Any] = _extra()


@dataclass
class Config:
    loss: str
    label_fraction: float
    # estimate and check (suggest's config holds loss, label_fraction, packing, trainer and recipe only)
    batch: Optional[int] = _opt()
    seq_len: Optional[int] = _opt()
    target_seq_len: Optional[int] = _opt()  # encoder-decoders
    images: Optional[Images] = _opt()  # --images only
    precision: Optional[str] = _opt()
    optimizer: Optional[str] = _opt()
    optimizer_hf: Optional[str] = _opt()  # the TrainingArguments optim
    checkpoint: Optional[str] = _opt()
    attention: Optional[str] = _opt()
    torch: Optional[str] = _opt()  # --torch only: "2.11"
    sdpa_kernel: Optional[str] = _opt()  # only where SDPA runs its math kernel: "math"
    grad_accumulation: Optional[bool] = _opt()
    moe: Optional[Moe] = _opt()
    use_cache: Optional[bool] = _opt()
    finetune: Optional[Finetune] = _opt()
    parallel: Optional[Parallel] = _opt()
    recipe: Optional[Recipe] = _opt()
    trainer: Optional[str] = _opt()  # --trainer other than sft: "dpo", "kto", "kto-apo", "orpo", "grpo"
    sequences: Optional[int] = _opt()  # the sequences the model runs (DPO: 2 per pair)
    reference: Optional[str] = _opt()  # DPO's reference: "copy" | "adapter-disabled" | "none"
    disable_dropout: Optional[bool] = _opt()  # --trainer other than sft: TRL's disable_dropout as planned
    grpo: Optional[Grpo] = _opt()  # --trainer grpo: GRPOConfig's generation settings as planned
    packing: Optional[str] = _opt()  # --packing / --padding-free: "rows" | "padding-free"
    tokens_per_micro_batch: Optional[int] = _opt()  # estimate and check, with packing
    extra: Dict[str, Any] = _extra()


@dataclass
class Target:
    name: str
    how: str
    memory_bytes: int
    capacity_bytes: int
    context_bytes: int
    fits: Optional[bool] = _opt()  # estimate --gpu
    usable_bytes: Optional[int] = _opt()
    margin_pct: Optional[float] = _opt()
    fits_allocated: Optional[bool] = _opt()  # the two verdicts (estimate --gpu, plan with a target)
    device_simulated: Optional[bool] = _opt()
    fits_device: Optional[bool] = _opt()
    device_bytes: Optional[int] = _opt()  # peak reserved + context
    allocator_limit_bytes: Optional[int] = _opt()
    expandable_segments_would_fit: Optional[bool] = _opt()  # only when true
    extra: Dict[str, Any] = _extra()


@dataclass
class CommPerStep:
    allgather_bytes: float
    reducescatter_bytes: float
    allreduce_bytes: float
    pcie_bytes: float
    comm_s: float
    exposed_comm_s: float
    offload_s: float
    extra: Dict[str, Any] = _extra()


@dataclass
class PhasePeak:
    peak_allocated_bytes: int
    tmp_bytes: Optional[int] = _opt()  # reference_forward: its own temporaries at its peak
    peak_event: Optional[str] = _opt()
    prefill_peak_bytes: Optional[int] = _opt()  # generation (--trainer grpo): the prompts' forward
    decode_peak_bytes: Optional[int] = _opt()  # generation: the last decoding step
    kv_cache_bytes: Optional[int] = _opt()  # generation: the DynamicCache at the last token
    sequences: Optional[int] = _opt()  # generation: sequences generated at once
    gather: Optional[str] = _opt()  # generation under ZeRO-3/FSDP2: "whole" (GatheredParameters) or "per-unit"
    gathered_bytes: Optional[int] = _opt()  # generation: the parameters gathered at a decoding step
    extra: Dict[str, Any] = _extra()


@dataclass
class Phases:
    policy_step: PhasePeak  # --trainer dpo / kto: forward, loss, backward, optimizer step
    reference_forward: Optional[PhasePeak] = _opt()  # the reference model's no-grad forward
    generation: Optional[PhasePeak] = _opt()  # --trainer grpo: transformers' generate
    old_logprobs_forward: Optional[PhasePeak] = _opt()  # --trainer grpo: the policy's no-grad forward
    extra: Dict[str, Any] = _extra()


@dataclass
class Allocator:
    settings: str  # PYTORCH_CUDA_ALLOC_CONF syntax ("" = torch's defaults)
    source: str  # "--alloc-conf" | "PYTORCH_CUDA_ALLOC_CONF" | "PYTORCH_ALLOC_CONF" | "default"
    simulated: bool
    reserved_fragmentation_bytes: Optional[int] = _opt()
    num_alloc_retries: Optional[int] = _opt()
    failed_allocations: Optional[int] = _opt()
    extra: Dict[str, Any] = _extra()


@dataclass
class Nccl:
    source: str  # "model" (NCCL's buffers from its source's rules) | "profile" (nccl_overhead_mib) | "none"
    why: str  # "" when counted, else why not ("profile has no nccl_channels", "--ep's ...")
    comms: int  # NCCL communicators a rank holds
    channels: int  # collective channels a communicator connects
    peers: int  # connections per channel (ring 1; the tree's other neighbour 1 more)
    peer_bytes: int  # one connection, its receive and send sides
    nvls_bytes: int  # NVLink SHARP's buffer per communicator (0: none)
    ep_p2p_channels: int  # --ep: P2P channels per peer of the EP group's all-to-all (0: no --ep)
    ep_bytes: int  # --ep: the EP group's send/recv connections (in the total)
    efsdp_bytes: int  # --ep: the efsdp group's connections and NVLS (in the total)
    buffsize_bytes: int  # NCCL_BUFFSIZE (Simple's buffer per connection)
    env: str  # the NCCL_* variables read, space-separated ("" for none)
    extra: Dict[str, Any] = _extra()


@dataclass
class Memory:
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    input_bytes: int
    module_buffers_bytes: int
    workspace_bytes: int
    optimizer_tmp_bytes: int
    peak_allocated_bytes: int  # compare torch.cuda.max_memory_allocated()
    peak_requested_bytes: int
    peak_reserved_bytes: int
    overhead_bytes: int  # CUDA context (and NCCL's, with data parallelism)
    peak_device_bytes: int
    peak_event: str
    peak_phase: str
    fwd_flops: float
    bwd_flops: float
    recompute_flops: float
    dequant_bytes: Optional[float] = _opt()  # a quantized base: the step's dequantization traffic
    host_pinned_bytes: Optional[int] = _opt()  # --checkpoint layers[:N]+offload
    ckpt_offload_pcie_bytes: Optional[float] = _opt()
    act_offload_pcie_bytes: Optional[int] = _opt()  # --act-offload (host_pinned_bytes its pinned RAM)
    sac_policy: Optional[str] = _opt()  # --checkpoint layers[:N]+sac[:NAME]
    sac_layer_bytes: Optional[int] = _opt()
    sac_layers: Optional[int] = _opt()
    sac_keep: Optional[List[str]] = _opt()  # layers+sac:auto: the ops kept ("sdpa", "mm:J")
    world: Optional[int] = _opt()  # data parallelism: per rank
    buffers_bytes: Optional[int] = _opt()
    host_bytes: Optional[int] = _opt()
    nvme_bytes: Optional[int] = _opt()
    nccl_overhead_bytes: Optional[int] = _opt()
    nccl: Optional[Nccl] = _opt()  # data parallelism: how nccl_overhead_bytes was found
    comm_per_step: Optional[CommPerStep] = _opt()
    load_bytes: Optional[int] = _opt()  # FSDP2 with a 4-bit base: the model whole on each GPU when loaded
    experts: Optional[Experts] = _opt()  # --ep: the experts' share per rank
    ref_weights_bytes: Optional[int] = _opt()  # --trainer dpo / kto: the reference copy, resident
    phases: Optional[Phases] = _opt()  # --trainer dpo / kto / grpo: each phase's peak
    vllm_bytes: Optional[int] = _opt()  # --trainer grpo --vllm F: the colocated engine's share
    allocator: Optional[Allocator] = _opt()  # the caching allocator's settings and what it did
    device_reserved_bytes: Optional[int] = _opt()  # when simulated
    extra: Dict[str, Any] = _extra()


@dataclass
class Layer:
    index: int
    name: str
    type: str
    params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    output_bytes: int
    fwd_flops: float
    bwd_flops: float
    checkpointed: bool
    extra: Dict[str, Any] = _extra()


@dataclass
class Plan:
    strategy: str
    checkpoints: List[int]
    segments: List[List[int]]  # [start, end)
    multilevel: bool
    activation_peak_bytes: int
    recompute_flops: float
    overhead_pct: float
    extra: Dict[str, Any] = _extra()


@dataclass
class Check:
    fits: bool
    shortfall_bytes: int  # the larger of the two levels' shortfalls
    usable_bytes: int
    capacity_bytes: int
    peak_device_bytes: int
    fits_allocated: Optional[bool] = _opt()  # the two verdicts (target's fields too)
    device_simulated: Optional[bool] = _opt()
    fits_device: Optional[bool] = _opt()
    device_bytes: Optional[int] = _opt()  # peak reserved + context
    allocator_limit_bytes: Optional[int] = _opt()
    expandable_segments_would_fit: Optional[bool] = _opt()  # only when true
    extra: Dict[str, Any] = _extra()


@dataclass
class RecipeChange:
    setting: str  # "batch" | "grad-accum"
    key: str  # the recipe's key ("per_device_train_batch_size")
    line: int  # its line in the file; 0: absent, added
    from_: str = field(metadata={"key": "from"})  # its value now (the trainer's default where absent)
    to: str  # the plan's value
    extra: Dict[str, Any] = _extra()


@dataclass
class GrpoLimits:
    max_completion_length: int  # the longest completion that still fits the plan (the prompt kept)
    at_least: bool  # every length searched (up to 1,048,576) fits: a lower bound
    max_vllm_fraction: Optional[float] = _opt()  # with --vllm F: its largest share that still fits
    extra: Dict[str, Any] = _extra()


@dataclass
class Candidate:
    micro_batch: int
    grad_accum: int
    global_batch: int
    precision: str
    finetune: str
    fits: bool
    plan: Plan
    peak_device_bytes: int
    peak_allocated_bytes: int
    capacity_bytes: int
    usable_bytes: int
    headroom_pct: float
    samples_per_s: float
    source: str  # "probe" | "estimate"
    peak_event: str
    probed: bool
    probe_oom: bool
    parallel: Optional[Parallel] = _opt()
    probe_samples_per_s: Optional[float] = _opt()
    probe_step_ms: Optional[float] = _opt()
    probe_peak_allocated_bytes: Optional[int] = _opt()
    fits_device: Optional[bool] = _opt()  # where the allocator was simulated
    device_bytes: Optional[int] = _opt()  # peak reserved + context
    host_pinned_bytes: Optional[int] = _opt()  # --checkpoint layers+offload, --act-offload
    tokens_per_micro_batch: Optional[int] = _opt()  # --packing / --padding-free (the recommendation)
    recipe_changes: Optional[List[RecipeChange]] = _opt()  # suggest --recipe (the recommendation)
    grpo_limits: Optional[GrpoLimits] = _opt()  # suggest --trainer grpo (the recommendation)
    extra: Dict[str, Any] = _extra()


def _run_info():
    """the run that made a report (not part of the schema)"""
    return field(default=None, compare=False, repr=False, metadata={"run": True})


@dataclass
class Report:
    schema: int
    command: str
    version: str
    model: Model
    config: Config


@dataclass
class EstimateReport(Report):
    memory: Memory
    layers: List[Layer]
    target: Optional[Target] = _opt()
    plan: Optional[Plan] = _opt()  # a checkpoint strategy other than none
    extra: Dict[str, Any] = _extra()
    run: Any = _run_info()

    @property
    def peak_device_bytes(self):
        return self.memory.peak_device_bytes


@dataclass
class CheckReport(Report):
    target: Target
    check: Check
    memory: Memory
    plan: Plan
    extra: Dict[str, Any] = _extra()
    run: Any = _run_info()

    @property
    def fits(self):
        return self.check.fits

    @property
    def headroom_bytes(self):
        """usable bytes less the peak at the level that decides (negative: check's shortfall_bytes):
        the device level's peak reserved + context where the simulated allocator fails"""
        k = self.check
        need = k.peak_device_bytes
        if k.device_simulated and k.fits_device is False and (k.device_bytes or 0) > need:
            need = k.device_bytes
        return k.usable_bytes - need


@dataclass
class SuggestReport(Report):
    recommendation: Optional[Candidate]  # null when nothing fits
    candidates: List[Candidate]
    global_batch_met: bool
    note: str
    alternatives: List[str]
    probes: int
    probe_capacity_bytes: int
    probe_note: str
    target: Optional[Target] = _opt()
    extra: Dict[str, Any] = _extra()
    run: Any = _run_info()


REPORTS = {"estimate": EstimateReport, "check": CheckReport, "suggest": SuggestReport}


# ---- reading and writing ---------------------------------------------------------------------------

_HINTS = {}


def _hints(cls):
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = get_type_hints(cls)
    return h


def schema_fields(cls):
    """the fields of cls that are keys of the report (not extra, not run)"""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("extra") and not f.metadata.get("run")]


def _origin(tp):
    return getattr(tp, "__origin__", None)


def _read(tp, v, where):
    if _origin(tp) is Union:  # Optional[X]
        if v is None:
            return None
        tp = [a for a in tp.__args__ if a is not type(None)][0]  # noqa: E721
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise SchemaError("%s: expected an object" % where)
        return from_dict(tp, v, where)
    if _origin(tp) in (list, List):
        if not isinstance(v, list):
            raise SchemaError("%s: expected an array" % where)
        return [_read(tp.__args__[0], x, "%s[%d]" % (where, i)) for i, x in enumerate(v)]
    if _origin(tp) in (dict, Dict):
        if not isinstance(v, dict):
            raise SchemaError("%s: expected an object" % where)
        return {k: _read(tp.__args__[1], x, "%s.%s" % (where, k)) for k, x in v.items()}
    if tp is Any:
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SchemaError("%s: expected a number, got %r" % (where, v))
        return float(v)
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError("%s: expected an integer, got %r" % (where, v))
        return v
    if not isinstance(v, tp):
        raise SchemaError("%s: expected %s, got %r" % (where, tp.__name__, v))
    return v


def from_dict(cls, d, where=""):
    """cls (a dataclass of this module) from the JSON object d; keys it lacks go to extra"""
    hints = _hints(cls)
    kw = {}
    for f in schema_fields(cls):
        k = json_key(f)
        path = "%s.%s" % (where, k) if where else k
        if k in d:
            kw[f.name] = _read(hints[f.name], d[k], path)
        elif not f.metadata.get("optional"):
            raise SchemaError("%s: missing" % path)
    names = {json_key(f) for f in schema_fields(cls)}
    if any(f.metadata.get("extra") for f in dataclasses.fields(cls)):
        kw["extra"] = {k: v for k, v in d.items() if k not in names}
    return cls(**kw)


def _write(v):
    if dataclasses.is_dataclass(v):
        return to_dict(v)
    if isinstance(v, list):
        return [_write(x) for x in v]
    if isinstance(v, dict):
        return {k: _write(x) for k, x in v.items()}
    return v


def to_dict(obj):
    """the JSON object obj was read from: its keys (optional ones only when present) and extra"""
    out = {}
    for f in schema_fields(type(obj)):
        v = getattr(obj, f.name)
        if v is None and f.metadata.get("optional"):
            continue
        out[json_key(f)] = _write(v)
    out.update(getattr(obj, "extra", None) or {})
    return out


def read_report(command, d):
    """the report of command from its parsed --json output"""
    if not isinstance(d, dict):
        raise SchemaError("the report is not a JSON object")
    if d.get("schema") != SCHEMA:
        raise SchemaError("schema %r: this package reads schema %d" % (d.get("schema"), SCHEMA))
    cls = REPORTS.get(command)
    if cls is None:
        raise SchemaError("no report class for the command %r" % command)
    return from_dict(cls, d)
