#!/usr/bin/env python3
"""grpo_step.py — memplan --trainer grpo against TRL's GRPOTrainer on the CPU (real tensors).

  python3 bench/accuracy/grpo_step.py [--memplan ./memplan] [--out FILE.md] [--rows-out FILE]

dpo_step.py's tiny Llama (hidden 256, 2 layers, vocabulary 32000, written into each row as
config_json) runs two GRPO iterations of TRL 1.16.0 on real CPU tensors under dpo_step.RealTracker
(every storage an op makes, 512-byte rounded as CUDA's caching allocator counts
memory_allocated; parameters, buffers, the reference copy and the optimizer state registered).
Each iteration is what GRPOTrainer runs for one generation batch (steps_per_generation 1, the
default, so the generation batch is the micro-batch):

  1. generation (grpo_trainer.py:1861-1875): transformers' generate on the policy under
     torch.no_grad, gradient checkpointing off (trl models/utils.py:135-137), with the
     GenerationConfig TRL builds (:1155-1173: do_sample, max_new_tokens = max_completion_length,
     temperature 1, top_p 1, top_k 0, no min_p, repetition_penalty 1), the policy in train mode as
     TRL leaves it.  The eos id is one the vocabulary never samples, so every completion runs to
     max_new_tokens (the longest, the case memory is planned for);
  2. beta > 0: the reference's per-token log-probs (:2710-2735) through GRPOTrainer's own
     _get_per_token_logps_and_entropies under torch.no_grad (a frozen copy; under PEFT the adapter
     disabled with TRL's use_adapter), before any graph;
  3. the policy step: GRPOTrainer._compute_loss (:3020-) on a stand-in for the trainer that holds
     what it reads (GRPOConfig's defaults: loss_type "dapo", epsilon 0.2, importance_sampling_level
     "token", no entropy bonus, top_entropy_quantile 1; one process), then backward, AdamW
     (foreach) and zero_grad(set_to_none=True) as the Trainer's loop runs them.

The policy and reference carry TRL's fused LM head as GRPOTrainer.__init__ patches them
(add_fused_lm_head, outputs log_probs and entropy, :1068-1077).  Iteration 2's peaks are compared
with `memplan estimate CONFIG --trainer grpo ... --workspace 0 --use-cache off --json`:
memory.phases.generation (the generate call's peak), memory.phases.reference_forward (step 2's
with-block), memory.phases.policy_step (the rest), and the whole peak.

CPU against CUDA (memplan plans CUDA), each set to CUDA's:
  * TRL's fused head: loss_heads.trl_cuda_branches, as dpo_step.py (the compact gather, no Triton
    launch, CUDA's in-place addmm);
  * bool-mask indexing's nonzero indices: dpo_step.RealTracker;
  * SDPA: torch_step's CUDA-kernel patch; dropout 0 in the config.
Rows go to bench/accuracy/rows/grpo_step.jsonl (tests/replay_accuracy.py replays them).  Needs
torch, transformers, peft, trl.  Not part of make test.
"""
import collections
import gc
import os
import sys
import types
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from dpo_step import (CONFIG, RealTracker, autocast_forward, build, cli, prepare,  # noqa: E402
                      ref_copy, run_table, track_models)
from loss_heads import trl_cuda_branches  # noqa: E402
from torch_step import backward_and_step  # noqa: E402


class Stub:
    """What GRPOTrainer._compute_loss and _get_per_token_logps_and_entropies read of the trainer
    (GRPOConfig's defaults, one process)."""

    def __init__(self, model, ref_model, precompute, ckpt, beta=0.0, steps=1):
        from trl import GRPOTrainer
        self.model = model
        self.ref_model = ref_model
        self.beta = beta
        self.loss_type = "dapo"
        self.epsilon_low = self.epsilon_high = 0.2
        self.importance_sampling_level = "token"
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self.vllm_importance_sampling_correction = True
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        self.args = types.SimpleNamespace(delta=None, steps_per_generation=steps, use_bias_correction_kl=False,
                                          gradient_checkpointing_kwargs={"use_reentrant": False} if ckpt else None)
        acc = types.SimpleNamespace(device=torch.device("cpu"), num_processes=1, sync_gradients=True, is_main_process=True,
                                    unwrap_model=lambda m: m, gather=lambda t: t, gather_for_metrics=lambda t: t,
                                    reduce=lambda t, reduction="sum": t)
        acc.autocast = lambda: torch.autocast("cpu", enabled=False)
        self.accelerator = acc
        self._get_per_token_logps_and_entropies = types.MethodType(
            GRPOTrainer._get_per_token_logps_and_entropies, self)


def scored_inputs(stub, model, ref, prompts, pmask, completion, n, K, beta, gc_kw, phase,
                  names=("old", "reference")):
    """What GRPOTrainer._generate_and_score_completions does after generate (grpo_trainer.py:
    2632-2735): with K > 1 (over an accumulation of 1) the policy's old log-probs, with beta > 0
    the reference's (the frozen copy ref, or the adapter disabled), each a micro-batch (n) at a time
    under torch.no_grad with checkpointing off, each run through phase(name, fn) (names: the
    two phases'); then the first micro-batch's inputs for _compute_loss, and the concatenated ids
    and mask (the caller holds them through the step, as the recorded runs did; TRL frees them when
    _generate_and_score_completions returns: 2 x b x s int64 more at the step's peak)."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter
    C = completion.size(1)
    cmask = torch.ones_like(completion, dtype=torch.int32)
    ids = torch.cat([prompts, completion], dim=1)
    am = torch.cat([pmask, cmask], dim=1)

    def logps(m, adapter_off=False):
        with torch.no_grad(), disable_gradient_checkpointing(model, gc_kw):
            if adapter_off:
                with use_adapter(model, adapter_name=None):
                    return stub._get_per_token_logps_and_entropies(m, ids, am, C, batch_size=n)[0]
            return stub._get_per_token_logps_and_entropies(m, ids, am, C, batch_size=n)[0]
    first = slice(0, n)
    inputs = {"prompt_ids": prompts[first], "prompt_mask": pmask[first], "completion_ids": completion[first],
              "completion_mask": cmask[first], "advantages": torch.randn(n, device=completion.device),
              "num_items_in_batch": cmask[first].sum()}
    if K > 1:  # grpo_trainer.py:2641-2655: accumulation 1 % (K x num_iterations 1) != 0
        inputs["old_per_token_logps"] = phase(names[0], lambda: logps(model))[first]
    if beta > 0:
        inputs["ref_per_token_logps"] = phase(names[1], lambda: logps(ref) if ref is not None
                                              else logps(model, adapter_off=True))[first]
    return inputs, (ids, am)


def cuda_sort_buffers():
    """torch.sort as CUDA's stable sort allocates for TopPLogitsWarper's (b, v) fp32 scores, v > 4096
    (its in-place small sort below): after the CPU sort has made the values and int64 indices, the
    buffers CUDA's holds beside them at its highest point are allocated and freed (uint8 tensors of
    their sizes), from torch's aten/src/ATen/native/cuda/SortStable.cu and
    ATen/cuda/cub-RadixSortPairs.cuh and CCCL's DeviceRadixSort temporaries (an alternate keys and
    values buffer when the sort takes more than one pass; histograms not counted):
      one row or v >= 1,000,000: an int64 iota of v and cub's v fp32 + v int64;
      2 to 127 rows: two int2 arrays, the keys output radix_sort_pairs makes, cub's n fp32 + n int2;
      128 rows and more: an int64 reverse index and cub's n fp32 + n int64.
    The CPU has none of these (the CUDA-only bytes memplan models); the GPU kit measures them."""
    import contextlib
    orig = torch.sort

    def sort(x, *a, **k):
        # a non-contiguous input (the repetition penalty's [..., :v] view): CUDA's sort first makes
        # a dense copy of it, alive through the sort (Sort.cpp sort_cuda_kernel); the CPU's does not
        dense = torch.empty(x.shape, dtype=x.dtype) if x.dim() == 2 and not x.is_contiguous() else None
        out = orig(x, *a, **k)
        if x.dim() == 2 and x.dtype == torch.float32 and x.shape[-1] > 4096:
            b, v = x.shape
            c = max(1, min(b, (2 ** 31 - 1) // v))
            n = c * v
            sizes = ([8 * v, 12 * v] if c == 1 or v >= 1000000 else
                     [8 * n, 8 * n, 4 * n, 12 * n] if c < 128 else [8 * n, 12 * n])
            bufs = [torch.empty(s, dtype=torch.uint8) for s in sizes]
            del bufs
        del dense
        return out

    @contextlib.contextmanager
    def patched():
        torch.sort = sort
        try:
            yield
        finally:
            torch.sort = orig
    return patched()


def grpo_step(ft, ck, batch, seq, prompt, beta, prec="bf16", steps_per_generation=1, temperature=1.0,
              top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, gen_pad=0):
    """Iteration 2's peaks: (whole, where, reference with-block's, generation's, old log-probs').
    steps_per_generation K > 1 (the accumulation is 1): generate makes batch x K completions, the
    old log-probs and the reference's run over them a micro-batch at a time, and the policy's step
    takes the first micro-batch.  temperature, top_p, top_k, min_p, repetition_penalty: GRPOConfig's,
    into TRL's GenerationConfig (top_p below 1 under cuda_sort_buffers).  gen_pad > 0: the first
    prompt's first gen_pad positions are padding in the mask generate gets (so transformers keeps
    the mask and hands the repetition penalty its padding lengths, as with TRL's left-padded
    prompts of unequal lengths, utils.py:2899-2906); the step's inputs stay unpadded."""
    from transformers import GenerationConfig
    from trl import GRPOTrainer
    K = steps_per_generation
    model, cfg = build(prec)
    add_fused_lm_head = trl_cuda_branches()
    ref = ref_copy(cfg, model) if ft == "full" and beta > 0 else None  # grpo_trainer.py:983-1003
    model, _, opt = prepare(model, ref, ft, ck, False, add_fused_lm_head, ("log_probs", "entropy"))
    stub = Stub(model, ref, False, ck == "layers", beta, K)
    if prec == "amp-bf16":
        for m in (model, ref):
            if m is not None:
                autocast_forward(m)
    C = seq - prompt
    gen_cfg = GenerationConfig(max_new_tokens=C, do_sample=True, pad_token_id=0, bos_token_id=1,
                               eos_token_id=[cfg.vocab_size + 7], temperature=temperature, top_p=top_p, top_k=top_k,
                               min_p=min_p, repetition_penalty=repetition_penalty, cache_implementation=None,
                               disable_compile=True)
    tr = RealTracker()
    peaks = {}

    def phase(name, fn):
        before = (tr.peak, tr.peak_at)
        tr.phase = name
        tr.peak = tr.cur
        out = fn()
        peaks[name] = tr.peak
        if before[0] > tr.peak:
            tr.peak, tr.peak_at = before
        return out

    with tr:
        track_models(tr, model, ref)
        for it in (1, 2):
            if it == 2:
                for st in opt.state.values():
                    if "step" in st and isinstance(st["step"], torch.Tensor):
                        tr.forget(st["step"])
                gc.collect()
                tr.peak, tr.peak_at = tr.cur, "step-start"
                peaks.clear()
            prompts = torch.randint(3, cfg.vocab_size, (batch * K, prompt))
            pmask = torch.ones_like(prompts)

            def generate():
                was = model.is_gradient_checkpointing
                if was:  # models/utils.py:135-137 and :153-154
                    model.gradient_checkpointing_disable()
                import contextlib
                gmask = pmask.clone()
                gmask[0, :gen_pad] = 0
                with torch.no_grad(), (cuda_sort_buffers() if top_p < 1 else contextlib.nullcontext()):
                    out = model.generate(input_ids=prompts, attention_mask=gmask, generation_config=gen_cfg)
                del gmask
                if was:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                return out
            out = phase("generation", generate)
            completion = out[:, prompt:].contiguous()
            del out
            gc_kw = {"use_reentrant": False} if ck == "layers" else None
            inputs, held = scored_inputs(stub, model, ref, prompts, pmask, completion, batch, K, beta, gc_kw, phase)
            tr.phase = "forward"
            backward_and_step(tr, GRPOTrainer._compute_loss(stub, model, inputs), opt)
            del inputs, completion, held
    return tr.peak, tr.peak_at, peaks.get("reference", 0), peaks.get("generation", 0), peaks.get("old", 0)


def memplan_args(ft, ck, batch, seq, prompt, beta, prec="bf16", steps_per_generation=1, temperature=1.0,
                 top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, gen_pad=0):
    a = ["--trainer", "grpo", "--batch", str(batch), "--seq", str(seq), "--completion-length", str(seq - prompt),
         "--num-generations", str(batch), "--steps-per-generation", str(steps_per_generation), "--precision", prec, "--checkpoint", ck, "--workspace", "0",
         "--use-cache", "off", "--json"]
    if beta > 0:
        a += ["--beta", repr(beta)]
    if temperature != 1.0:
        a += ["--temperature", repr(temperature)]
    if top_p < 1.0:
        a += ["--top-p", repr(top_p)]
    if top_k:
        a += ["--top-k", str(top_k)]
    if min_p is not None:
        a += ["--min-p", repr(min_p)]
    if repetition_penalty != 1.0:
        a += ["--repetition-penalty", repr(repetition_penalty)]
    if ft == "lora":
        a += ["--finetune", "lora", "--lora-r", "16", "--lora-targets", "all-linear"]
    return a


# (finetune, checkpoint, completions, seq = prompt + completion, prompt tokens, beta)
SETTINGS = [("full", "none", 8, 256, 128, 0.0), ("full", "layers", 8, 256, 128, 0.0),
            ("full", "none", 8, 528, 512, 0.0), ("full", "none", 8, 528, 16, 0.0),
            ("full", "layers", 4, 1040, 16, 0.0), ("full", "none", 8, 256, 128, 0.04),
            ("lora", "layers", 8, 256, 128, 0.0), ("lora", "none", 8, 528, 16, 0.04)]
AMP_SETTINGS = [("full", "none", 8, 256, 128, 0.0), ("lora", "layers", 8, 528, 16, 0.0)]
# a sampling temperature of 0.7: TemperatureLogitsWarper's scores at each decoding step
T_SETTINGS = [("full", "none", 8, 528, 16, 0.0, "bf16"), ("lora", "none", 8, 528, 16, 0.0, "bf16"),
              ("full", "none", 8, 256, 128, 0.0, "amp-bf16")]
# steps_per_generation 2 over an accumulation of 1: the policy's old log-probs forward
K_SETTINGS = [("full", "none", 4, 256, 128, 0.0, "bf16"), ("full", "layers", 4, 528, 16, 0.04, "bf16"),
              ("lora", "layers", 4, 528, 16, 0.04, "bf16"), ("full", "none", 4, 256, 128, 0.0, "amp-bf16"),
              ("lora", "layers", 4, 528, 16, 0.0, "amp-bf16")]


# the other sampling warpers (transformers' TopK/TopP/MinPLogitsWarper at each decoding step), and
# RepetitionPenaltyLogitsProcessor before them (its b x (v + 1) padded scores, gathered over the
# b x (prompt + generated) ids; its output a view the next warper reads)
W_SETTINGS = [("full", "none", 8, 528, 16, 0.0, "bf16", {"top_k": 50}),
              ("full", "none", 8, 528, 16, 0.0, "bf16", {"min_p": 0.1}),
              ("full", "none", 8, 528, 16, 0.0, "bf16", {"top_p": 0.9}),
              ("lora", "none", 8, 528, 16, 0.0, "bf16", {"top_p": 0.9}),
              ("full", "none", 8, 528, 16, 0.0, "bf16", {"temperature": 0.7, "top_k": 50, "top_p": 0.9,
                                                         "min_p": 0.1}),
              # the repetition penalty before the warpers (128 new tokens, for this box's time); the
              # prompts' mask all ones as in the rows above, so transformers drops it and the processor
              # gets no padding lengths (no positions or masked ids): memplan, which plans the padded
              # case TRL's prompts of unequal lengths make, is 5,120 B above torch's processor here
              ("full", "none", 8, 144, 16, 0.0, "bf16", {"repetition_penalty": 1.1}),
              ("full", "none", 8, 144, 16, 0.0, "bf16", {"repetition_penalty": 1.1, "top_p": 0.9})]


def processor_only():
    """RepetitionPenaltyLogitsProcessor alone on b x v fp32 scores and b x L ids, with the padding
    lengths generate hands it (b int64, made before the call), under the bench's tracker: its peak
    over what was alive before it against memplan's formula (generate.c warper_bytes: the largest
    of clamp's, where's and scatter's moments)."""
    from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor
    r = lambda x: (x + 511) // 512 * 512  # noqa: E731
    for b, L, v in ((8, 527, 32000), (8, 16, 32000), (2, 527, 1000), (8, 511, 151936)):
        ids, scores = torch.randint(0, v, (b, L)), torch.randn(b, v)
        tr = RealTracker()
        with tr:
            lengths = torch.zeros(b, dtype=torch.int64)
            procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.1, prompt_ignore_length=lengths)])
            tr.peak = base = tr.cur
            out = procs(ids, scores)
            peak = tr.peak - base
        del out
        pos, i64, f32, bo, pad = r(8 * L), r(8 * b * L), r(4 * b * L), r(b * L), r(4 * b * (v + 1))
        model = max(pos + 2 * i64, pos + i64 + pad + 4 * f32 + bo, pos + i64 + 2 * pad + f32)
        print("b %d, L %d, v %d: torch %d B, memplan's formula %d B, diff %+d B" % (b, L, v, peak, model,
                                                                                model - peak), flush=True)


def main():
    if "--processor-only" in sys.argv:  # (RepetitionPenaltyLogitsProcessor alone: printed, no rows)
        return processor_only()
    warpers_only = "--warpers-only" in sys.argv  # (the W_SETTINGS rows alone, into --rows-out)
    if warpers_only:
        sys.argv.remove("--warpers-only")
    rep_only = "--repetition-only" in sys.argv  # (the repetition penalty's rows alone)
    if rep_only:
        sys.argv.remove("--repetition-only")
    a = cli("grpo_step", __doc__)
    todo = [s + ("bf16",) for s in SETTINGS] + [s + ("amp-bf16",) for s in AMP_SETTINGS]
    todo += [s + ({"steps_per_generation": 2},) for s in K_SETTINGS]
    todo += [s + ({"temperature": 0.7},) for s in T_SETTINGS]
    todo = W_SETTINGS if warpers_only else todo + W_SETTINGS
    if rep_only:
        todo = [s for s in W_SETTINGS if "repetition_penalty" in s[7]]
    run_table(a, "grpo_step", CONFIG, "tiny Llama (dpo_step.py CONFIG)", todo, grpo_step, memplan_args,
              "completions", generation=True)


if __name__ == "__main__":
    main()
