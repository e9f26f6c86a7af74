#!/usr/bin/env python3
"""kto_step.py — memplan --trainer kto against TRL's KTOTrainer step on the CPU (real tensors).

  python3 bench/accuracy/kto_step.py [--memplan ./memplan] [--out FILE.md] [--rows-out FILE]
                                    [--model CONFIG.json] [--apo]

The tiny Llama of dpo_step.py (its CONFIG, written into each row as config_json), or with --model a
Llama config.json (models/hf/llama-3.2-1b.json: the 1B-class rows, ONE_B_SETTINGS), runs two training
steps of TRL 1.16.0's KTOTrainer on real CPU tensors under dpo_step.RealTracker (torch_step's
LiveTracker: every storage an op makes, 512-byte rounded as CUDA's caching allocator counts
memory_allocated; parameters, buffers, the reference copy and the optimizer state registered),
and step 2's peak is compared with `memplan estimate CONFIG --trainer kto ... --workspace 0
--use-cache off --json` (memory.peak_allocated_bytes), and the reference's forwards' own peak (TRL's
with-block around them, kto_trainer.py:1426-1436) with memory.phases.reference_forward.

What runs is TRL's own code: the loss is trl.KTOTrainer._compute_loss (trainer/kto_trainer.py
:1370-1563) with its _compute_kl_logps (:1337-1368), called on a stand-in for the trainer object
that holds what those methods read (KTOConfig's defaults: loss_type "kto" so the KL term is
computed, beta 0.1, weights 1; an accelerator that is one process), with the batch KTO's collator
makes (kto_trainer.py:304-420: prompt + completion rows, completion_mask, a bool label per
example, half desirable; the KL rows, each prompt with the next example's completion; no padding:
every row full length).  The models are patched as KTOTrainer.__init__ patches them:
add_fused_lm_head on the policy (its base model under PEFT) with the outputs KTO asks for
(log_probs, entropy, mean_logits; :966-969) and on the reference copy (:970-972).  The reference
is what __init__ makes (:919-938): a full copy in the policy's dtype (full fine-tuning), none with
PEFT (the adapter disabled in the step: use_adapter(model, None)), none with
precompute_ref_log_probs (the batch carries ref_logps and ref_KL_logps).  Then loss.backward(),
AdamW(foreach).step(), zero_grad(set_to_none=True), as the Trainer's training_step and loop run
them.  CPU against CUDA: as dpo_step.py says (the fused head's CUDA branches, bool-mask indices,
SDPA, dropout 0).

With --apo, KTOConfig's loss_type "apo_zero_unpaired" (memplan --trainer kto-apo): the stand-in's
calculate_KL is False as __init__ sets it (kto_trainer.py:815, 836), so the batch has no KL rows, no
KL forward runs and the reference runs once; one example a device is allowed (:844).

Rows go to bench/accuracy/rows/kto_step.jsonl (tests/replay_accuracy.py replays them: figures
peak, ref_forward_peak).  Needs torch, transformers, peft, trl.  Not part of make test.
"""
import collections
import json
import os
import sys
import types
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402

import rowlib  # noqa: E402
import dpo_step  # noqa: E402  (its model, tracker and patches; torch_step's SDPA / mask patches)
from loss_heads import trl_cuda_branches  # noqa: E402


class Stub:
    """What KTOTrainer._compute_loss and _compute_kl_logps read of the trainer (KTOConfig's defaults,
    one process)."""

    def __init__(self, model, ref_model, precompute, ckpt):
        from trl import KTOTrainer
        self.model = model
        self.ref_model = ref_model
        self.precompute_ref_logps = precompute
        self.calculate_KL = not APO  # loss_type "kto"; "apo_zero_unpaired" none (kto_trainer.py:815, 836)
        self.loss_type = "apo_zero_unpaired" if APO else "kto"
        self.aux_loss_enabled = False
        self.beta = 0.1
        self.desirable_weight = 1.0
        self.undesirable_weight = 1.0
        self._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        self._total_train_tokens = 0
        self._tp_size = 1
        self._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, self)
        self.args = types.SimpleNamespace(gradient_checkpointing_kwargs={"use_reentrant": False} if ckpt else None)
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                                 gather=lambda t: t, gather_for_metrics=lambda t: t)


def kto_inputs(vocab, n, seq, prompt, precompute, dev):
    """The batch KTO's collator makes (kto_trainer.py:304-420), no padding: n full rows, the first
    half desirable, and n KL rows (each prompt with the next example's completion)."""
    ids = torch.randint(0, vocab, (n, seq), device=dev)
    comp = torch.zeros_like(ids)
    comp[:, prompt:] = 1
    kl = torch.cat([ids[:, :prompt], ids.roll(1, 0)[:, prompt:]], 1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": comp,
              "label": torch.tensor([i < (n + 1) // 2 for i in range(n)])}  # (kto_trainer.py:205)
    if not APO:  # the KL rows exist only with the KL term (kto_trainer.py:1146)
        inputs.update({"KL_input_ids": kl, "KL_attention_mask": torch.ones_like(kl),
                       "KL_completion_mask": comp.clone()})
    if precompute:
        inputs["ref_logps"] = torch.zeros(n, device=dev)
        if not APO:
            inputs["ref_KL_logps"] = torch.zeros(n, device=dev)
    return inputs


def build(config, prec):
    """The Llama of config in bf16 (memplan's bf16), or fp32 for bf16 autocast (amp-bf16)."""
    cfg = transformers.LlamaConfig(**{k: v for k, v in config.items()
                                      if k not in ("model_type", "architectures") and not k.startswith("_")})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16 if prec == "bf16" else torch.float32)
    return model, cfg


def kto_step(config, ft, ckpt, n, seq, prompt, precompute, prec="bf16"):
    """Step 2's peak of TRL's KTO step, and the reference forwards' own peak (0: none)."""
    from trl import KTOTrainer
    model, cfg = build(config, prec)
    add_fused_lm_head = trl_cuda_branches()
    ref = dpo_step.ref_copy(cfg, model) if ft == "full" and not precompute else None  # kto_trainer.py:919-938
    # kto_trainer.py:966-969: the policy's head outputs; the reference's its defaults
    model, stub, opt = dpo_step.prepare(model, ref, ft, ckpt, precompute, add_fused_lm_head,
                                        ("log_probs", "entropy", "mean_logits"), Stub)
    if prec == "amp-bf16":
        for m in (model, ref):
            if m is not None:
                dpo_step.autocast_forward(m)
    import trl.trainer.kto_trainer as kt
    return dpo_step.measured_steps(kt, model, ref, opt,
                                   lambda: kto_inputs(cfg.vocab_size, n, seq, prompt, precompute, torch.device("cpu")),
                                   lambda inputs: KTOTrainer._compute_loss(stub, model, inputs, False))


def memplan_args(ft, ckpt, n, seq, frac, precompute, prec="bf16"):
    a = dpo_step.memplan_args(ft, ckpt, n, seq, frac, precompute, prec)
    a[a.index("dpo")] = "kto-apo" if APO else "kto"
    return a


# (finetune, checkpoint, examples, seq, prompt tokens, precompute_ref_log_probs); seq - 1 = 2 x the
# completion so that the label fraction is exact (0.5)
SETTINGS = [("full", "none", 4, 257, 129, False), ("full", "layers", 4, 257, 129, False),
            ("full", "none", 4, 257, 129, True), ("lora", "layers", 4, 257, 129, False),
            ("lora", "none", 4, 257, 129, False), ("full", "none", 2, 513, 1, False),
            ("full", "layers", 8, 129, 65, False)]
AMP_SETTINGS = [("full", "none", 4, 257, 129, False), ("lora", "layers", 4, 257, 129, False)]
# --model (a 1B-class Llama: real tensors on the CPU, a few minutes a row)
ONE_B_SETTINGS = [("lora", "layers", 2, 129, 65, False), ("full", "none", 2, 129, 65, False)]
# --apo: loss_type "apo_zero_unpaired" (memplan --trainer kto-apo): no KL term, one example a device is
# enough
APO = False
APO_SETTINGS = [("full", "none", 4, 257, 129, False), ("full", "layers", 4, 257, 129, False),
                ("full", "none", 4, 257, 129, True), ("lora", "layers", 4, 257, 129, False),
                ("lora", "none", 1, 513, 257, False), ("full", "none", 1, 513, 1, False)]
APO_AMP_SETTINGS = [("lora", "layers", 4, 257, 129, False)]
ONE_B_APO_SETTINGS = [("lora", "layers", 2, 129, 65, False)]


def main():
    global APO
    APO = "--apo" in sys.argv
    if APO:
        sys.argv.remove("--apo")
    a = dpo_step.cli("kto_step", __doc__, want_model=True)
    config, name = dpo_step.CONFIG, "tiny Llama (dpo_step.py CONFIG)"
    todo = [s + ("bf16",) for s in (APO_SETTINGS if APO else SETTINGS)] + \
        [s + ("amp-bf16",) for s in (APO_AMP_SETTINGS if APO else AMP_SETTINGS)]
    if a.model:
        with open(a.model) as f:
            config = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
        name = os.path.relpath(os.path.abspath(a.model), rowlib.ROOT)
        todo = [s + ("bf16",) for s in (ONE_B_APO_SETTINGS if APO else ONE_B_SETTINGS)]
    dpo_step.run_table(a, "kto_step", config, name, todo,
                       lambda *s: kto_step(config, *s), memplan_args, "examples")

if __name__ == "__main__":
    main()
